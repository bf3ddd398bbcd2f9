"""txn.effect against a real store: recording, replay, divergence, modes in doubt, retries."""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal import (
    EffectDivergenceError,
    EffectInDoubtError,
    EffectNotAppliedError,
    EffectNotFoundError,
    EffectSettledError,
    failpoints,
)
from agentwal.errors import InvalidKeyError, TransactionClosedError, UnencodableValueError
from agentwal.testing import expire_effects_on_next_fold, intercept_effect_writes

from .downstream import Downstream


def step(store: agentwal.Store, down: Downstream, mode: str, *, run: str = "r",
         args: Any = None, commit: bool = True, **kw: Any) -> Any:
    """One agent step: an effect, its result stored; commit or roll back."""
    with store.begin(run) as txn:
        r = txn.effect("op", down.call, mode=mode, args=args if args is not None else {"n": 1},
                       **kw)
        txn["last"] = r
        if not commit:
            txn.rollback()
    return r


def lose_outcome(store: agentwal.Store, down: Downstream, mode: str, **kw: Any) -> None:
    """The downstream applies, then the process 'dies' before the outcome is recorded."""
    failpoints.arm("after_effect_call", "raise")
    with pytest.raises(failpoints.FailpointFired):
        step(store, down, mode, **kw)
    failpoints.disarm()


# -- arguments -------------------------------------------------------------------------

def test_mode_is_required_and_checked(store: agentwal.Store, down: Downstream) -> None:
    with store.begin("r") as txn:
        with pytest.raises(TypeError):
            txn.effect("op", down.call)  # type: ignore[call-arg]
        with pytest.raises(ValueError, match="mode must be one of"):
            txn.effect("op", down.call, mode="twice")
        assert txn.effect("op", down.call, mode=agentwal.EffectMode.AT_LEAST_ONCE)["key"]


def test_exactly_once_without_probe_or_idempotent_is_refused_before_anything_runs(
        store: agentwal.Store, down: Downstream) -> None:
    with store.begin("r") as txn, pytest.raises(ValueError, match="exactly_once needs"):
        txn.effect("op", down.call, mode="exactly_once")
    assert down.calls() == 0 and store.effects() == []


@pytest.mark.parametrize("kw, exc", [
    ({"mode": "at_most_once", "retries": 1}, ValueError),
    ({"mode": "at_least_once", "retries": -1}, ValueError),
    ({"mode": "at_least_once", "backoff": -1.0}, ValueError),
    ({"mode": "at_least_once", "args": object()}, UnencodableValueError),
    ({"mode": "at_least_once", "key": ""}, InvalidKeyError),
    ({"mode": "at_least_once", "probe": 3}, TypeError),
])
def test_bad_arguments_change_nothing(store: agentwal.Store, down: Downstream,
                                      kw: dict[str, Any], exc: type[Exception]) -> None:
    with store.begin("r") as txn, pytest.raises(exc):
        txn.effect("op", down.call, **kw)
    assert down.calls() == 0 and store.effects() == []


def test_bad_name_and_fn(store: agentwal.Store, down: Downstream) -> None:
    with store.begin("r") as txn:
        with pytest.raises(InvalidKeyError):
            txn.effect("", down.call, mode="at_least_once")
        with pytest.raises(TypeError):
            txn.effect("op", "not callable", mode="at_least_once")  # type: ignore[arg-type]


def test_closed_transaction(store: agentwal.Store, down: Downstream) -> None:
    txn = store.begin("r")
    txn.rollback()
    with pytest.raises(TransactionClosedError):
        txn.effect("op", down.call, mode="at_least_once")
    with pytest.raises(TransactionClosedError):
        txn.defer("op", mode="at_least_once")


# -- recording and replay ---------------------------------------------------------------

def test_context_and_record(store: agentwal.Store, down: Downstream) -> None:
    seen: list[agentwal.EffectContext] = []

    def fn(ctx: agentwal.EffectContext) -> str:
        seen.append(ctx)
        return "ok"

    with store.begin("r") as txn:
        assert txn.effect("op", fn, mode="at_least_once", args={"a": [1, 2]}) == "ok"
    (ctx,) = seen
    assert ctx.attempt == 1 and ctx.run == "r" and ctx.args == {"a": [1, 2]}
    assert ctx.key.isascii() and len(ctx.key) <= 64 and ctx.name == "op"
    (e,) = store.effects()
    assert (e.effect_id, e.key, e.status, e.attempts, e.result, e.checkpoint, e.ordinal) == (
        ctx.effect_id, ctx.key, "done", 1, "ok", 0, 0)
    assert e.age >= 0 and e.updated_at >= e.created_at


def test_rolled_back_step_rerun_returns_the_record_without_a_call(
        store: agentwal.Store, down: Downstream) -> None:
    first = step(store, down, "at_most_once", commit=False)
    assert store.effects()[0].status == "done"  # autonomous: the rollback kept it
    again = step(store, down, "at_most_once")
    assert again == first and down.calls() == 1


def test_keys_are_the_same_after_reopen_and_new_after_a_commit(tmp_path: Path,
                                                               down: Downstream) -> None:
    with agentwal.open(tmp_path / "s") as s:
        k1 = step(s, down, "at_least_once", commit=False)["key"]
    with agentwal.open(tmp_path / "s") as s:
        assert step(s, down, "at_least_once")["key"] == k1  # from checkpoint 0 again
        assert down.calls() == 1
        k2 = step(s, down, "at_least_once")["key"]  # from checkpoint 1: a new position
    assert k2 != k1 and down.calls() == 2


def test_ordinals_per_name(store: agentwal.Store, down: Downstream) -> None:
    with store.begin("r") as txn:
        a = txn.effect("op", down.call, mode="at_least_once", args=1)
        b = txn.effect("op", down.call, mode="at_least_once", args=2)
        c = txn.effect("other", down.call, mode="at_least_once", args=3)
    assert len({a["key"], b["key"], c["key"]}) == 3
    assert [e.ordinal for e in sorted(store.effects(), key=lambda e: e.ordinal or 0)] == [0, 1, 2]


def test_business_key_dedups_across_steps_and_runs(store: agentwal.Store,
                                                  down: Downstream) -> None:
    a = step(store, down, "exactly_once", idempotent=True, key="order-42")
    b = step(store, down, "exactly_once", idempotent=True, key="order-42", run="other")
    assert a == b and a["key"] == "order-42" and down.calls() == 1


def test_divergent_args_at_a_position(store: agentwal.Store, down: Downstream) -> None:
    step(store, down, "at_least_once", args={"n": 1}, commit=False)
    with pytest.raises(EffectDivergenceError, match="different args") as info:
        step(store, down, "at_least_once", args={"n": 2})
    assert info.value.effect_id == store.effects()[0].effect_id
    assert down.calls() == 1


def test_divergent_name_at_a_position(store: agentwal.Store, down: Downstream) -> None:
    step(store, down, "at_least_once", commit=False)
    with store.begin("r") as txn, pytest.raises(EffectDivergenceError, match="'op'"):
        txn.effect("something-else", down.call, mode="at_least_once")
    assert down.calls() == 1


def test_divergent_mode_with_a_business_key(store: agentwal.Store, down: Downstream) -> None:
    step(store, down, "at_least_once", key="k1")
    with pytest.raises(EffectDivergenceError, match="mode"):
        step(store, down, "at_most_once", key="k1")


def test_concurrent_callers_of_one_key_call_once(store: agentwal.Store,
                                                down: Downstream) -> None:
    gate = threading.Barrier(4)
    results: list[Any] = []

    def worker() -> None:
        gate.wait()
        with store.begin("r") as txn:
            results.append(txn.effect("op", down.call, mode="at_most_once", key="shared"))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert down.calls() == 1 and len(results) == 4 and len({str(r) for r in results}) == 1


# -- failures and retries ----------------------------------------------------------------

def test_fn_raising_is_recorded_failed_and_propagates(store: agentwal.Store,
                                                     down: Downstream) -> None:
    down.fail_before_apply = True
    with pytest.raises(ConnectionError):
        step(store, down, "at_least_once")
    (e,) = store.effects(status="failed")
    assert e.attempts == 1 and e.error == "ConnectionError: downstream unreachable"
    assert store.head("r") is None  # the step rolled back


def test_failed_then_next_attempt_per_mode(store: agentwal.Store, down: Downstream) -> None:
    down.lose_response = True
    for mode, kw in (("at_most_once", {}), ("at_least_once", {}),
                     ("exactly_once", {"idempotent": True})):
        with pytest.raises(TimeoutError):
            step(store, down, mode, run=mode, **kw)
    down.lose_response = False
    with pytest.raises(EffectInDoubtError, match="TimeoutError"):
        step(store, down, "at_most_once", run="at_most_once")
    assert step(store, down, "at_least_once", run="at_least_once")
    down.dedup = True
    assert step(store, down, "exactly_once", run="exactly_once", idempotent=True)
    calls = {e.run: e.attempts for e in store.effects()}
    assert calls == {"at_most_once": 1, "at_least_once": 2, "exactly_once": 2}
    assert down.calls() == 5


def test_retries_on_listed_exceptions_each_recorded(store: agentwal.Store,
                                                   down: Downstream) -> None:
    fails = iter([ConnectionError("1"), TimeoutError("2")])
    attempts: list[int] = []

    def flaky(ctx: agentwal.EffectContext) -> str:
        attempts.append(ctx.attempt)
        err = next(fails, None)
        if err is not None:
            raise err
        return "third time"

    with store.begin("r") as txn:
        assert txn.effect("op", flaky, mode="at_least_once", retries=2, backoff=0) == "third time"
    assert attempts == [1, 2, 3]
    (e,) = store.effects()
    assert e.status == "done" and e.attempts == 3


def test_retries_stop_at_the_limit_and_at_unlisted_errors(store: agentwal.Store) -> None:
    def always(ctx: agentwal.EffectContext) -> None:
        raise ConnectionError("down")

    with store.begin("r") as txn:
        with pytest.raises(ConnectionError):
            txn.effect("a", always, mode="at_least_once", retries=2, backoff=0)

        def bad(ctx: agentwal.EffectContext) -> None:
            raise ValueError("not retryable")

        with pytest.raises(ValueError):
            txn.effect("b", bad, mode="at_least_once", retries=5, backoff=0)
    attempts = {e.name: e.attempts for e in store.effects()}
    assert attempts == {"a": 3, "b": 1}


def test_exactly_once_retry_probes_first(store: agentwal.Store, down: Downstream) -> None:
    down.lose_response = True  # applied, answer lost: the probe must find it
    tries = iter([True, False])

    def fn(ctx: agentwal.EffectContext) -> Any:
        down.lose_response = next(tries)
        return down.call(ctx)

    with store.begin("r") as txn:
        r = txn.effect("op", fn, mode="exactly_once", probe=down.probe, retries=3, backoff=0)
    assert r["key"] and down.calls() == 1 and down.applications() == 1


def test_unstorable_result_is_recorded_failed(store: agentwal.Store) -> None:
    with store.begin("r") as txn, pytest.raises(UnencodableValueError):
        txn.effect("op", lambda ctx: object(), mode="at_least_once")
    (e,) = store.effects()
    assert e.status == "failed" and "UnencodableValueError" in (e.error or "")


# -- in doubt ------------------------------------------------------------------------------

def test_in_doubt_at_most_once(store: agentwal.Store, down: Downstream) -> None:
    lose_outcome(store, down, "at_most_once")
    (e,) = store.effects(status="in_doubt")
    assert e.attempts == 1
    with pytest.raises(EffectInDoubtError) as info:
        step(store, down, "at_most_once")
    assert info.value.effect_id == e.effect_id and info.value.key == e.key
    assert down.calls() == 1


def test_in_doubt_at_most_once_probe_applied(store: agentwal.Store, down: Downstream) -> None:
    lose_outcome(store, down, "at_most_once")
    r = step(store, down, "at_most_once", probe=down.probe)
    assert r == {"key": r["key"], "args": {"n": 1}} and down.calls() == 1
    assert store.effects()[0].status == "done"


def test_in_doubt_at_most_once_probe_not_applied(store: agentwal.Store,
                                                down: Downstream) -> None:
    failpoints.arm("effect_after_intent", "raise")  # dies before the call
    with pytest.raises(failpoints.FailpointFired):
        step(store, down, "at_most_once")
    with pytest.raises(EffectNotAppliedError):
        step(store, down, "at_most_once", probe=down.probe)
    assert store.effects()[0].status == "not_applied"
    with pytest.raises(EffectNotAppliedError):  # and stays so, without probing again
        step(store, down, "at_most_once", probe=down.probe)
    assert down.calls() == 0 and down.per_key("probe").total() == 1


def test_in_doubt_at_most_once_probe_unknown(store: agentwal.Store, down: Downstream) -> None:
    lose_outcome(store, down, "at_most_once")
    down.probe_says = "unknown"
    with pytest.raises(EffectInDoubtError):
        step(store, down, "at_most_once", probe=down.probe)
    assert down.calls() == 1


def test_in_doubt_at_least_once_calls_again_with_the_same_key(store: agentwal.Store,
                                                             down: Downstream) -> None:
    lose_outcome(store, down, "at_least_once")
    r = step(store, down, "at_least_once")
    assert down.calls(r["key"]) == 2 and down.applications(r["key"]) == 2
    assert [e["attempt"] for e in down.events() if e["kind"] == "call"] == [1, 2]


def test_in_doubt_exactly_once_idempotent(store: agentwal.Store, down: Downstream) -> None:
    down.dedup = True
    lose_outcome(store, down, "exactly_once", idempotent=True)
    r = step(store, down, "exactly_once", idempotent=True)
    assert down.calls() == 2 and down.applications(r["key"]) == 1


@pytest.mark.parametrize("window", ["effect_after_intent", "after_effect_call"])
def test_in_doubt_exactly_once_probe(store: agentwal.Store, down: Downstream,
                                     window: str) -> None:
    failpoints.arm(window, "raise")
    with pytest.raises(failpoints.FailpointFired):
        step(store, down, "exactly_once", probe=down.probe)
    r = step(store, down, "exactly_once", probe=down.probe)
    assert down.applications(r["key"]) == 1 and down.calls() == 1


def test_in_doubt_exactly_once_probe_unknown(store: agentwal.Store, down: Downstream) -> None:
    lose_outcome(store, down, "exactly_once", probe=down.probe)
    down.probe_says = "unknown"
    with pytest.raises(EffectInDoubtError):
        step(store, down, "exactly_once", probe=down.probe)
    down.dedup = True
    r = step(store, down, "exactly_once", probe=down.probe, idempotent=True)
    assert down.applications(r["key"]) == 1


def test_probe_exception_leaves_the_entry_in_doubt(store: agentwal.Store,
                                                  down: Downstream) -> None:
    lose_outcome(store, down, "at_most_once")

    def broken(ctx: agentwal.EffectContext) -> Any:
        raise ConnectionError("probe down")

    with pytest.raises(ConnectionError):
        step(store, down, "at_most_once", probe=broken)
    assert store.effects()[0].status == "in_doubt"


# -- resolving -----------------------------------------------------------------------------

def test_resolve_with_a_result(store: agentwal.Store, down: Downstream) -> None:
    lose_outcome(store, down, "at_most_once")
    (e,) = store.effects(status="in_doubt")
    done = store.resolve_effect(e.effect_id, result={"found": "in the bank's dashboard"},
                                by="ops")
    assert done.status == "resolved" and done.resolved_by == "ops"
    assert done.resolved_at is not None and done.resolved_at >= e.updated_at
    assert step(store, down, "at_most_once") == {"found": "in the bank's dashboard"}
    assert down.calls() == 1
    with pytest.raises(EffectSettledError):
        store.resolve_effect(e.effect_id, not_applied=True)


def test_resolve_not_applied(store: agentwal.Store, down: Downstream) -> None:
    lose_outcome(store, down, "at_most_once", run="r")
    lose_outcome(store, down, "at_least_once", run="r2")
    for e in store.effects(status="in_doubt"):
        got = store.resolve_effect(e.effect_id, not_applied=True)
        assert got.status == "not_applied" and got.resolved_by and "pid" in got.resolved_by
    with pytest.raises(EffectNotAppliedError):
        step(store, down, "at_most_once", run="r")
    step(store, down, "at_least_once", run="r2")  # told it never happened: calls again
    assert down.calls() == 3


def test_resolve_errors(store: agentwal.Store, down: Downstream) -> None:
    step(store, down, "at_least_once")
    (e,) = store.effects()
    with pytest.raises(EffectNotFoundError):
        store.resolve_effect("ef-nope", result=1)
    with pytest.raises(EffectSettledError):
        store.resolve_effect(e.effect_id, result=1)
    with pytest.raises(ValueError):
        store.resolve_effect(e.effect_id)
    with pytest.raises(ValueError):
        store.resolve_effect(e.effect_id, result=1, not_applied=True)


def test_effects_filters(store: agentwal.Store, down: Downstream) -> None:
    step(store, down, "at_least_once", run="a")
    lose_outcome(store, down, "at_least_once", run="b")
    assert [e.run for e in store.effects(run="a")] == ["a"]
    assert [e.run for e in store.effects(status="in_doubt")] == ["b"]
    assert store.effects(run="a", status="in_doubt") == []
    with pytest.raises(ValueError):
        store.effects(status="lost")


# -- persistence ------------------------------------------------------------------------------

def test_ledger_survives_folds_wal_truncation_and_reopen(tmp_path: Path,
                                                         down: Downstream) -> None:
    path = tmp_path / "s"
    with agentwal.open(path, durability="none", wal_max_bytes=4096 * 16,
                       segment_bytes=16384) as s:
        results = [step(s, down, "at_most_once", run=f"r{i}", commit=False) for i in range(40)]
        lose_outcome(s, down, "at_most_once", run="doubt")
        s.snapshot()
        for _ in range(40):  # many more records: the effect records' segments go away
            with s.begin("pad") as txn:
                txn["x"] = "y" * 3000
        assert s.stats()["segments_removed"] > 0
    with agentwal.open(path, readonly=True) as ro:
        assert len(ro.effects(status="done")) == 40
        assert len(ro.effects(status="in_doubt")) == 1
    with agentwal.open(path) as s:
        again = [step(s, down, "at_most_once", run=f"r{i}") for i in range(40)]
        assert again == results
        with pytest.raises(EffectInDoubtError):
            step(s, down, "at_most_once", run="doubt")
    assert down.calls() == 41


def test_retention_expires_settled_entries_only(tmp_path: Path, down: Downstream) -> None:
    import datetime as dt

    path = tmp_path / "s"
    with agentwal.open(path, effect_retention=dt.timedelta(0)) as s:
        step(s, down, "at_least_once", run="done", key="biz")  # business key, settled
        lose_outcome(s, down, "at_most_once", run="doubt")
        with s.begin("failed") as txn, pytest.raises(ValueError):
            txn.effect("op", lambda ctx: (_ for _ in ()).throw(ValueError("x")),
                       mode="at_least_once", key="f")
        defer_pending = s.begin("pending")
        defer_pending.defer("mail", mode="at_least_once")
        defer_pending.commit()
        s.snapshot()
        assert sorted(e.run for e in s.effects()) == ["doubt", "failed", "pending"]
    with agentwal.open(path, effect_retention=None) as s:
        step(s, down, "at_least_once", run="kept", key="biz2")
        s.snapshot()
        assert sorted(e.run for e in s.effects()) == ["doubt", "failed", "kept", "pending"]
    with pytest.raises(ValueError):
        agentwal.open(path, effect_retention=dt.timedelta(seconds=-1))


def test_retention_keeps_position_entries_a_step_can_still_meet(tmp_path: Path,
                                                               down: Downstream) -> None:
    # Regression: expiry dropped settled position entries by age alone, so a step
    # re-run from the same checkpoint after the retention called at_most_once again.
    import datetime as dt

    path = tmp_path / "s"
    with agentwal.open(path, effect_retention=dt.timedelta(0)) as s:
        with s.begin("r") as txn:
            txn["started"] = True
        step(s, down, "at_most_once", commit=False)  # settled at checkpoint 1, not committed
        s.snapshot()
        assert len(s.effects()) == 1
        step(s, down, "at_most_once")  # the re-run: the record, no second call
        assert down.calls() == 1
        expire_effects_on_next_fold(s)  # expiry runs at most hourly: let the next fold run it
        s.snapshot()  # the head is now 2: position 1 can never be met again
        assert s.effects() == []


def test_stats_count_effect_records_apart_from_commits(store: agentwal.Store,
                                                      down: Downstream) -> None:
    step(store, down, "at_least_once")
    st = store.stats()
    assert (st["commits"], st["effect_records"]) == (1, 2)  # intent + outcome, one commit


def test_oversized_entries_are_refused_not_logged(store: agentwal.Store,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: effect records skipped the record-size limit, so an entry the
    # reader refuses (and recovery would drop as a torn tail) could be fsynced.
    import agentwal.local.commit

    monkeypatch.setattr(agentwal.local.commit, "MAX_RECORD_PAYLOAD", 65536 + 4096)
    calls: list[int] = []
    with store.begin("r") as txn:
        with pytest.raises(UnencodableValueError):  # the intent: nothing is called
            txn.effect("big-args", lambda ctx: calls.append(1), mode="at_least_once",
                       args=random.Random(1).randbytes(8000))  # incompressible
        with pytest.raises(UnencodableValueError):  # the outcome: recorded as failed
            txn.effect("big-result",
                       lambda ctx: calls.append(2) or random.Random(2).randbytes(8000),
                       mode="at_least_once")
    assert calls == [2]
    assert [(e.name, e.status) for e in store.effects()] == [("big-result", "failed")]


def test_retry_on_never_catches_the_stores_own_errors(store: agentwal.Store) -> None:
    # Regression: retry_on=(Exception,) retried a failed intent write and the
    # retry tripped an assertion.
    def full(*_a: Any) -> Any:
        raise agentwal.DiskFullError("wal", "simulated: no room")

    with (intercept_effect_writes(store, full), store.begin("r") as txn,
          pytest.raises(agentwal.DiskFullError)):
        txn.effect("op", lambda ctx: 1, mode="at_least_once", retries=3,
                   retry_on=(Exception,), backoff=0)


def test_outcome_that_cannot_be_recorded_is_reported_in_doubt(store: agentwal.Store) -> None:
    writes: list[str] = []

    def second_fails(write: Any, entry: Any, expect: Any) -> Any:
        writes.append(entry.status)
        if len(writes) == 2:
            raise agentwal.DiskFullError("wal", "simulated: no room")
        return write(entry, expect)

    with (intercept_effect_writes(store, second_fails), store.begin("r") as txn,
          pytest.raises(EffectInDoubtError, match="was called")):
        txn.effect("op", lambda ctx: 1, mode="at_least_once")
    assert store.effects()[0].status == "in_doubt"


def test_results_and_listings_are_copies(store: agentwal.Store) -> None:
    # Regression: the caller got the ledger's own objects, so changing a result
    # changed what a re-run in the same process returned.
    first = step_value = None
    with store.begin("r") as txn:
        first = txn.effect("op", lambda ctx: {"items": (1, 2)}, mode="at_least_once")
        txn.rollback()
    assert first == {"items": [1, 2]}  # as a replay after a restart reads it
    first["items"].append(3)
    store.effects()[0].result["items"].append(4)
    with store.begin("r") as txn:
        step_value = txn.effect("op", lambda ctx: None, mode="at_least_once")
    assert step_value == {"items": [1, 2]}


def test_effects_listing_while_another_thread_records(store: agentwal.Store) -> None:
    # Regression: listing iterated the live memtable dict: "dictionary changed size".
    # A 10 µs GIL switch interval: the listing loop is preempted far more often (more
    # chances to catch the race) and the writer, back from each fsync, gets the GIL in
    # microseconds instead of waiting out the 5 ms default behind a loop that never
    # blocks (which made this test take 13-16 s for its 20 commits).
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    stop = threading.Event()
    errors: list[BaseException] = []
    made: list[int] = []

    def writer() -> None:
        i = 0
        while not stop.is_set():
            with store.begin(f"w{i % 5}") as txn:  # each commit: a new position
                txn["i"] = txn.effect("op", lambda ctx: 1, mode="at_least_once", key=f"k{i}")
            i += 1
            made.append(i)

    t = threading.Thread(target=writer)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while len(made) < 20 and time.monotonic() < deadline:
            try:
                store.effects()
                store.dispatch({})
            except BaseException as exc:  # any failure is the bug
                errors.append(exc)
                break
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old_interval)
    assert errors == [] and len(made) >= 20


def test_reentrant_effect_on_the_same_key_does_not_deadlock(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        def outer(ctx: agentwal.EffectContext) -> Any:
            return store.effects(status="in_doubt")[0].key == ctx.key

        assert txn.effect("op", outer, mode="at_least_once") is True


def test_position_is_claimed_atomically(store: agentwal.Store) -> None:
    # Two transactions from the same checkpoint asking for different effects at
    # position 0: one records, the other diverges; the winner's record stays valid.
    gate = threading.Barrier(2)
    outcomes: list[str] = []

    def worker(name: str) -> None:
        txn = store.begin("r")
        gate.wait()
        try:
            txn.effect(name, lambda ctx: time.sleep(0.05) or name, mode="at_least_once")
            outcomes.append("ran")
        except EffectDivergenceError:
            outcomes.append("diverged")
        finally:
            txn.rollback()

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["diverged", "ran"]
    (e,) = store.effects()
    with store.begin("r") as txn:  # the winner's re-run still gets its record
        assert txn.effect(e.name, lambda ctx: "again", mode="at_least_once") == e.name


def test_run_created_again_after_delete_run_does_not_reuse_old_results(
        store: agentwal.Store, down: Downstream) -> None:
    first = step(store, down, "at_most_once")
    store.delete_run("r")
    second = step(store, down, "at_most_once")
    assert down.calls() == 2 and second["key"] != first["key"]
