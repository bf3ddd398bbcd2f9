"""Effects on PostgreSQL: the local ledger's rules over the fenced, compare-and-set table."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import agentwal
from agentwal import EffectContext, EffectInDoubtError, LeaseLostError
from agentwal.postgres import PostgresStore


def test_a_recorded_effect_is_not_called_again(pgstore: PostgresStore) -> None:
    calls: list[int] = []

    def charge(ctx: EffectContext) -> dict[str, Any]:
        calls.append(ctx.attempt)
        return {"receipt": ctx.args["amount"]}

    def step(txn: Any) -> Any:
        return txn.effect("charge", charge, mode="exactly_once", args={"amount": 5},
                          idempotent=True)

    txn = pgstore.begin("r")
    assert step(txn) == {"receipt": 5}
    txn.rollback()  # the record is autonomous: it survives the rollback
    again = pgstore.begin("r")
    assert step(again) == {"receipt": 5} and calls == [1]
    ckpt = again.commit()
    assert ckpt is not None and ckpt.id == 1  # an effect-only step makes a checkpoint
    [entry] = pgstore.effects(run="r")
    assert entry.status == "done" and entry.committed_in == 1 and entry.attempts == 1


def test_an_intent_without_outcome_is_in_doubt(pgstore: PostgresStore) -> None:
    class Crash(BaseException):
        pass

    def dies(ctx: EffectContext) -> None:
        raise Crash  # as if the process died inside the call: no outcome is recorded

    txn = pgstore.begin("r")
    with pytest.raises(Crash):
        txn.effect("mail", dies, mode="at_most_once")
    txn.rollback()
    [entry] = pgstore.effects(status="in_doubt")
    retry = pgstore.begin("r")
    with pytest.raises(EffectInDoubtError):
        retry.effect("mail", dies, mode="at_most_once")
    retry.rollback()
    settled = pgstore.resolve_effect(entry.effect_id, result="sent by hand")
    assert settled.status == "resolved"
    with pgstore.begin("r") as txn:
        assert txn.effect("mail", dies, mode="at_most_once") == "sent by hand"


def test_deferred_effects_are_dispatched_once(pgstore: PostgresStore) -> None:
    with pgstore.begin("r") as txn:
        txn["order"] = 1
        txn.defer("email", mode="at_least_once", args={"to": "a@example.com"})
    rolled = pgstore.begin("r")
    rolled.defer("email", mode="at_least_once", args={"to": "never"})
    rolled.rollback()
    sent: list[Any] = []
    report = pgstore.dispatch({"email": lambda ctx: sent.append(ctx.args) or "ok"})
    assert sent == [{"to": "a@example.com"}] and len(report.done) == 1
    pgstore.dispatch({"email": lambda ctx: sent.append(ctx.args)})
    assert len(sent) == 1
    [entry] = pgstore.effects(run="r")
    assert entry.deferred and entry.status == "done"


def test_aeffect_is_fenced_like_effect(open_pg: Callable[..., PostgresStore]) -> None:
    a, b = open_pg(worker_id="A"), open_pg(worker_id="B")
    txn = a.begin("r")
    a.release("r")
    b.lease("r")

    async def fn(ctx: EffectContext) -> str:
        raise AssertionError("a worker without the lease must not call")

    with pytest.raises(LeaseLostError):
        asyncio.run(txn.aeffect("call", fn, mode="at_least_once"))
    assert a.effects() == []


def test_rollback_to_and_fork_report_the_effects_made_since(pgstore: PostgresStore) -> None:
    with pgstore.begin("r") as txn:
        txn["k"] = 0
    with pgstore.begin("r") as txn:  # positioned at checkpoint 1: after it
        txn.effect("charge", lambda ctx: "ok", mode="at_least_once")
    back = pgstore.rollback_to("r", 1)
    assert [e.name for e in back.effects_after] == ["charge"]
    first = pgstore.fork("r", 2, "f")
    assert first.effects_after == ()  # nothing was made after checkpoint 2


def test_the_fencing_token_is_the_lease_epoch(open_pg: Callable[..., PostgresStore],
                                               tmp_path: Any) -> None:
    a, b = open_pg(worker_id="a"), open_pg(worker_id="b")
    seen: list[int | None] = []

    def call(ctx: EffectContext) -> None:
        seen.append(ctx.fencing_token)

    with a.begin("r") as txn:
        txn.effect("first", call, mode="at_least_once")
    asyncio.run(_aeffect(a, call))
    a.release("r")
    with b.begin("r") as txn:  # a new holder: a higher token
        txn.effect("third", call, mode="at_least_once")
    assert seen == [1, 1, 2]  # a's first lease on the run, then b's
    with agentwal.open(str(tmp_path / "local.awal"), durability="none") as local, \
            local.begin("r") as txn:
        txn.effect("local", call, mode="at_least_once")
    assert isinstance(seen[3], int)  # a local store's one worker holds its runs' leases


async def _aeffect(store: PostgresStore, call: Callable[[EffectContext], None]) -> None:
    txn = store.begin("r")
    await txn.aeffect("second", call, mode="at_least_once")
    txn.commit()


def test_store_effect_is_fenced_and_refused_read_only(open_pg: Callable[..., PostgresStore]
                                                      ) -> None:
    a, b = open_pg(worker_id="a"), open_pg(worker_id="b")
    tokens: list[int | None] = []

    def call(ctx: EffectContext) -> str:
        tokens.append(ctx.fencing_token)
        return "ok"

    assert a.effect("r", "notify", call, key="n/1", mode="at_least_once") == "ok"
    assert a.effect("r", "notify", call, key="n/1", mode="at_least_once") == "ok"  # recorded
    assert tokens == [1]
    with pytest.raises(agentwal.LeaseHeldError):  # a holds the run
        b.effect("r", "notify", call, key="n/2", mode="at_least_once")
    reader = open_pg(worker_id="r", readonly=True)
    with pytest.raises(agentwal.ReadOnlyError):
        reader.effect("r", "notify", call, key="n/3", mode="at_least_once")
    assert tokens == [1] and [e.key for e in a.effects(run="r")] == ["n/1"]


def test_dispatch_runs_under_each_runs_lease(open_pg: Callable[..., PostgresStore]) -> None:
    owner, dispatcher = open_pg(worker_id="owner"), open_pg(worker_id="dispatcher")
    for run in ("held", "free"):
        with owner.begin(run) as txn:
            txn.defer("mail", mode="at_least_once", args={"run": run})
    owner.release("free")
    sent: list[tuple[str, int | None]] = []

    def mail(ctx: EffectContext) -> None:
        sent.append((ctx.args["run"], ctx.fencing_token))

    report = dispatcher.dispatch({"mail": mail})
    assert sent == [("free", 2)] and len(report.done) == 1  # the dispatcher's lease: epoch 2
    [(_eid, why)] = report.skipped
    assert "'owner'" in why  # the run's owner dispatches its own entries
    assert dispatcher.stats()["leases_held"] == []  # the lease it took for this is given back
    assert [e.run for e in owner.effects(status="pending")] == ["held"]
    assert len(owner.dispatch({"mail": mail}).done) == 1
    assert sent == [("free", 2), ("held", 1)]  # the owner's lease on "held": epoch 1
