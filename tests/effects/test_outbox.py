"""The outbox: txn.defer commits with the state; store.dispatch runs it in commit order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal import ReadOnlyError, failpoints
from agentwal.testing import crash as crash_store

from .downstream import Downstream


class _Crash(BaseException):
    """Not an Exception: dispatch does not catch it, as it could not catch a kill."""


def defer(store: agentwal.Store, run: str, *items: tuple[str, str, Any],
          **kw: Any) -> agentwal.Checkpoint | None:
    with store.begin(run) as txn:
        for name, mode, args in items:
            txn.defer(name, mode=mode, args=args, **kw)
    return txn.checkpoint


def test_deferred_entries_commit_with_the_transaction(store: agentwal.Store) -> None:
    ck = defer(store, "r", ("mail", "at_least_once", {"to": "a"}))
    assert ck is not None and ck.id == 1  # a defer alone makes a checkpoint
    (e,) = store.effects()
    assert (e.status, e.deferred, e.checkpoint, e.attempts, e.args) == (
        "pending", True, 1, 0, {"to": "a"})
    assert e.order == (ck.lsn, 0) and e.key.startswith("awd-")


def test_rolled_back_transaction_defers_nothing(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.defer("mail", mode="at_least_once")
        txn.rollback()
    with pytest.raises(RuntimeError), store.begin("r") as txn:
        txn.defer("mail", mode="at_least_once")
        raise RuntimeError("step failed")
    assert store.effects() == [] and store.dispatch({"mail": lambda c: 1}).done == []


def test_savepoint_rollback_drops_later_defers(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.defer("a", mode="at_least_once")
        sp = txn.savepoint()
        txn.defer("b", mode="at_least_once")
        txn.rollback_to(sp)
        txn.defer("c", mode="at_least_once")
    assert sorted(e.name for e in store.effects()) == ["a", "c"]


def test_conflicting_commit_defers_nothing(store: agentwal.Store) -> None:
    t1, t2 = store.begin("r"), store.begin("r")
    t1.get("x")
    t2["x"] = 1
    t2.commit()
    t1["x"] = 2
    t1.defer("mail", mode="at_least_once")
    with pytest.raises(agentwal.ConflictError):
        t1.commit()
    assert store.effects() == []


def test_dispatch_in_commit_order_once(store: agentwal.Store, down: Downstream) -> None:
    for i in range(3):
        defer(store, "r" if i != 1 else "s", ("mail", "at_least_once", {"i": i}))
    seen: list[int] = []

    def handler(ctx: agentwal.EffectContext) -> str:
        seen.append(ctx.args["i"])
        return f"sent {ctx.args['i']}"

    report = store.dispatch({"mail": handler})
    assert seen == [0, 1, 2] and report.ok and len(report.done) == 3
    assert {e.result for e in store.effects()} == {"sent 0", "sent 1", "sent 2"}
    again = store.dispatch({"mail": handler})
    assert again.done == [] and again.ok and seen == [0, 1, 2]


def test_missing_handler_stays_pending_and_holds_the_run(store: agentwal.Store) -> None:
    defer(store, "r", ("nobody", "at_least_once", 1), ("mail", "at_least_once", 2))
    defer(store, "s", ("mail", "at_least_once", 3))
    sent: list[int] = []
    report = store.dispatch({"mail": lambda ctx: sent.append(ctx.args)})
    assert sent == [3] and not report.ok
    assert [why for _id, why in report.skipped] == [
        "no handler for 'nobody'", f"waits for {report.skipped[0][0]} (no handler for 'nobody')"]
    assert sorted(e.status for e in store.effects()) == ["done", "pending", "pending"]
    report = store.dispatch({"mail": lambda ctx: sent.append(ctx.args), "nobody": lambda c: 0})
    assert report.ok and sent == [3, 2]


def test_failing_handler_is_recorded_and_retried_next_pass(store: agentwal.Store) -> None:
    defer(store, "r", ("mail", "at_least_once", 1), ("mail", "at_least_once", 2))
    calls: list[int] = []

    def flaky(ctx: agentwal.EffectContext) -> str:
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise ConnectionError("smtp down")
        return "ok"

    report = store.dispatch({"mail": flaky})
    assert [err for _id, err in report.failed] == ["ConnectionError: smtp down"]
    assert len(report.skipped) == 1  # the second entry of the run waits
    assert store.effects(status="failed")[0].error == "ConnectionError: smtp down"
    report = store.dispatch({"mail": flaky})
    assert report.ok and calls == [1, 2, 1]


def test_at_most_once_deferred_after_a_failure_is_in_doubt(store: agentwal.Store) -> None:
    defer(store, "r", ("sms", "at_most_once", 1))

    def down(ctx: agentwal.EffectContext) -> None:
        raise TimeoutError("no answer")

    assert store.dispatch({"sms": down}).failed
    report = store.dispatch({"sms": lambda ctx: "never"})
    assert report.in_doubt and "in doubt" in report.in_doubt[0][1]
    (e,) = store.effects()
    assert e.attempts == 1
    store.resolve_effect(e.effect_id, not_applied=True)
    assert store.dispatch({"sms": lambda ctx: "never"}).ok  # settled: nothing left
    assert store.effects()[0].status == "not_applied"


def test_exactly_once_deferred_needs_a_probe_or_idempotent(store: agentwal.Store,
                                                          down: Downstream) -> None:
    defer(store, "r", ("pay", "exactly_once", {"amount": 5}))
    report = store.dispatch({"pay": down.call})
    assert "exactly_once" in report.skipped[0][1] and down.calls() == 0
    report = store.dispatch({"pay": down.call}, probes={"pay": down.probe})
    assert report.ok and down.applications() == 1
    defer(store, "r", ("pay", "exactly_once", {"amount": 6}), idempotent=True)
    assert store.dispatch({"pay": down.call}).ok and down.applications() == 2


def test_deferred_business_key_dedups(store: agentwal.Store, down: Downstream) -> None:
    defer(store, "r", ("mail", "at_least_once", {"to": "a"}), key="welcome-a")
    defer(store, "s", ("mail", "at_least_once", {"to": "a"}), key="welcome-a")
    assert len(store.effects()) == 1
    store.dispatch({"mail": down.call})
    assert down.calls() == 1


def test_dispatch_run_and_limit(store: agentwal.Store, down: Downstream) -> None:
    for run in ("a", "b", "a"):
        defer(store, run, ("mail", "at_least_once", run))
    assert len(store.dispatch({"mail": down.call}, run="b").done) == 1
    assert len(store.dispatch({"mail": down.call}, limit=1).done) == 1
    assert len(store.dispatch({"mail": down.call}).done) == 1
    assert down.calls() == 3
    with pytest.raises(ValueError):
        store.dispatch({}, limit=-1)


def test_dispatch_survives_fold_and_reopen(tmp_path: Path, down: Downstream) -> None:
    path = tmp_path / "s"
    with agentwal.open(path) as s:
        for i in range(5):
            defer(s, "r", ("mail", "at_least_once", i))
        s.snapshot()
        defer(s, "r", ("mail", "at_least_once", 5))
        s.dispatch({"mail": down.call}, limit=2)
    with agentwal.open(path) as s:
        assert [e.args for e in s.effects(status="pending")] == [2, 3, 4, 5]
        s.snapshot()
        assert s.dispatch({"mail": down.call}).ok
        s.snapshot()
    with agentwal.open(path) as s:
        assert s.dispatch({"mail": down.call}).done == []
        assert len(s.effects(status="done")) == 6
    assert down.calls() == 6


def test_dispatch_needs_a_writer(tmp_path: Path) -> None:
    agentwal.open(tmp_path / "s").close()
    with agentwal.open(tmp_path / "s", readonly=True) as ro, pytest.raises(ReadOnlyError):
        ro.dispatch({})


def test_dispatch_killed_in_doubt_window_at_least_once(store: agentwal.Store,
                                                      down: Downstream) -> None:
    defer(store, "r", ("mail", "at_least_once", 1))
    failpoints.arm("after_effect_call", "raise", exc=_Crash)  # like a process dying there
    with pytest.raises(_Crash):
        store.dispatch({"mail": down.call})
    assert store.effects()[0].status == "in_doubt"
    assert store.dispatch({"mail": down.call}).ok
    assert down.calls() == 2


def test_business_key_defer_committed_while_a_fold_is_frozen_is_not_redone(
        store: agentwal.Store, down: Downstream) -> None:
    # Regression: the duplicate check looked at the active memtable and LMDB but
    # not at a frozen one, so a second defer with the same business key, committed
    # while a fold had frozen the table holding the first, came back as pending.
    defer(store, "r", ("mail", "at_least_once", {"to": "a"}), key="biz-1")
    assert store.dispatch({"mail": down.call}).ok

    def commit_again(_name: str) -> None:
        defer(store, "s", ("mail", "at_least_once", {"to": "a"}), key="biz-1")

    failpoints.arm("fold_after_freeze", "call", fn=commit_again)
    store.snapshot()
    assert [e.status for e in store.effects()] == ["done"]
    assert store.dispatch({"mail": down.call}).done == []
    assert down.calls() == 1


def test_known_business_key_is_decided_at_commit_and_logged(tmp_path: Path,
                                                           down: Downstream) -> None:
    # The duplicate is dropped before the commit record is written, so replay
    # after a crash re-creates exactly what the live store had (and publishing
    # never reads LMDB: a damaged ledger cannot break an acknowledged batch).
    path = tmp_path / "s"
    s = agentwal.open(path, durability="none")
    defer(s, "r", ("mail", "at_least_once", {"to": "a"}), key="biz-1")
    s.dispatch({"mail": down.call})
    s.snapshot()  # the done entry is in LMDB now
    defer(s, "s", ("mail", "at_least_once", {"to": "a"}), key="biz-1")
    crash_store(s)  # crash: the second commit is replayed from the log
    with agentwal.open(path) as s2:
        assert [e.status for e in s2.effects()] == ["done"]
        assert s2.dispatch({"mail": down.call}).done == []
    assert down.calls() == 1


def test_business_key_with_other_inputs_refuses_the_commit(store: agentwal.Store) -> None:
    defer(store, "r", ("mail", "at_least_once", {"to": "a"}), key="biz-1")
    with pytest.raises(agentwal.EffectDivergenceError, match="biz-1"):
        defer(store, "r", ("mail", "at_least_once", {"to": "b"}), key="biz-1")
    # twice in one transaction too
    with pytest.raises(agentwal.EffectDivergenceError), store.begin("t") as txn:
        txn.defer("sms", mode="at_most_once", args=1, key="biz-2")
        txn.defer("sms", mode="at_most_once", args=2, key="biz-2")
    assert store.head("t") is None and len(store.effects()) == 1
