"""asyncio agents: txn.effect refuses async callables, txn.aeffect, store.abegin, acommit."""

from __future__ import annotations

import asyncio
import functools
import threading
import warnings
from collections import Counter
from typing import Any

import pytest

import agentwal
from agentwal import failpoints
from agentwal import ledger as ledger_module
from agentwal.testing import effect_locks

from .downstream import Downstream

# -- txn.effect refuses what it cannot await ------------------------------------------------


class _AsyncCallable:
    def __init__(self, down: Downstream) -> None:
        self.down = down

    async def __call__(self, ctx: agentwal.EffectContext) -> Any:
        return self.down.call(ctx)


def _async_fns(down: Downstream) -> dict[str, Any]:
    async def coroutine_fn(ctx: agentwal.EffectContext) -> Any:
        return down.call(ctx)

    async def with_extra(ctx: agentwal.EffectContext, extra: int) -> Any:
        return down.call(ctx)

    return {
        "coroutine function": coroutine_fn,
        "object with async __call__": _AsyncCallable(down),
        "partial of a coroutine function": functools.partial(with_extra, extra=1),
        "partial of a partial": functools.partial(functools.partial(with_extra), extra=1),
    }


@pytest.mark.parametrize("kind", list(_async_fns(Downstream("/nonexistent"))))
@pytest.mark.parametrize("mode", ["at_most_once", "at_least_once"])
def test_effect_refuses_an_async_fn_before_anything_is_recorded(
        store: agentwal.Store, down: Downstream, kind: str, mode: str) -> None:
    fn = _async_fns(down)[kind]
    with store.begin("r") as txn:
        with pytest.raises(TypeError, match="aeffect"):
            txn.effect("op", fn, mode=mode)
        # The refusal used no position: the next effect is the step's first.
        assert txn.effect("op", down.call, mode="at_least_once")["key"]
    assert down.calls() == 1
    [entry] = store.effects()
    assert entry.status == "done" and entry.ordinal == 0


def test_effect_refuses_an_async_probe_before_anything_is_recorded(
        store: agentwal.Store, down: Downstream) -> None:
    async def probe(ctx: agentwal.EffectContext) -> Any:
        return agentwal.UNKNOWN

    with pytest.raises(TypeError, match="aeffect"), store.begin("r") as txn:
        txn.effect("op", down.call, mode="exactly_once", probe=probe)
    assert down.calls() == 0 and store.effects() == []


@pytest.mark.parametrize("mode", ["at_most_once", "at_least_once"])
def test_effect_refuses_a_returned_coroutine_and_records_no_outcome(
        store: agentwal.Store, down: Downstream, mode: str) -> None:
    async def send(ctx: agentwal.EffectContext) -> Any:
        return down.call(ctx)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "coroutine ... was never awaited" fails the test
        with pytest.raises(TypeError, match="aeffect"), store.begin("r") as txn:
            txn.effect("op", lambda ctx: send(ctx), mode=mode)
    assert down.calls() == 0  # the coroutine was closed, never run
    [entry] = store.effects()
    # The call of the plain function happened (its intent is durable); no outcome was made up.
    assert entry.status == "in_doubt" and entry.attempts == 1 and entry.error is None


def test_effect_refuses_a_probe_returning_a_coroutine_and_leaves_the_entry(
        store: agentwal.Store, down: Downstream) -> None:
    failpoints.arm("after_effect_call", "raise")  # an attempt in doubt for the probe to ask
    with pytest.raises(failpoints.FailpointFired), store.begin("r") as txn:
        txn.effect("op", down.call, mode="exactly_once", probe=down.probe)
    failpoints.disarm()
    [before] = store.effects()

    async def ask(ctx: agentwal.EffectContext) -> Any:
        return down.probe(ctx)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="aeffect"), store.begin("r") as txn:
            txn.effect("op", down.call, mode="exactly_once", probe=lambda ctx: ask(ctx))
    assert store.effects() == [before] and down.calls() == 1


def test_a_step_refused_for_a_returned_coroutine_can_go_on_with_aeffect(
        store: agentwal.Store, down: Downstream) -> None:
    async def send(ctx: agentwal.EffectContext) -> Any:
        return down.call(ctx)

    with pytest.raises(TypeError), store.begin("r") as txn:
        txn.effect("op", lambda ctx: send(ctx), mode="at_least_once")

    async def main() -> Any:
        async with store.abegin("r") as txn:
            return await txn.aeffect("op", send, mode="at_least_once")

    result = asyncio.run(main())
    assert down.calls() == 1 and result["key"] == store.effects()[0].key
    [entry] = store.effects()
    assert entry.status == "done" and entry.attempts == 2


# -- helpers --------------------------------------------------------------------------------


class AsyncDownstream:
    """An in-memory async service counting calls and applications per idempotency key."""

    def __init__(self, *, dedup: bool = False) -> None:
        self.dedup = dedup
        self.calls: Counter[str] = Counter()
        self.applied: Counter[str] = Counter()
        self.lose_response = False

    async def call(self, ctx: agentwal.EffectContext) -> dict[str, Any]:
        self.calls[ctx.key] += 1
        await asyncio.sleep(0)  # the loop runs other tasks in the middle of the call
        if not (self.dedup and self.applied[ctx.key]):
            self.applied[ctx.key] += 1
        if self.lose_response:
            raise TimeoutError("the response was lost")
        return {"key": ctx.key, "args": ctx.args}

    async def probe(self, ctx: agentwal.EffectContext) -> Any:
        await asyncio.sleep(0)
        if self.applied[ctx.key]:
            return {"key": ctx.key, "args": ctx.args, "probed": True}
        return agentwal.NOT_APPLIED


class Gate:
    """An async effect function whose call stays open until ``release`` is set."""

    def __init__(self, result: Any, attempts: list[int] | None = None) -> None:
        self.result = result
        self.attempts = attempts if attempts is not None else []
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, ctx: agentwal.EffectContext) -> Any:
        self.attempts.append(ctx.attempt)
        self.started.set()
        await self.release.wait()
        return self.result


async def one_step(store: agentwal.Store, fake: AsyncDownstream, mode: str, *,
                   run: str = "r", commit: bool = True, **kw: Any) -> Any:
    async with store.abegin(run) as txn:
        r = await txn.aeffect("op", fake.call, mode=mode, args={"n": 1}, **kw)
        txn["last"] = r
        if not commit:
            txn.rollback()
    return r


def lose_outcome(store: agentwal.Store, fake: AsyncDownstream, mode: str, **kw: Any) -> None:
    """The call applies, then the process 'dies' before its outcome is recorded."""
    failpoints.arm("after_effect_call", "raise")
    with pytest.raises(failpoints.FailpointFired):
        asyncio.run(one_step(store, fake, mode, **kw))
    failpoints.disarm()
    [entry] = store.effects()
    assert entry.status == "in_doubt" and entry.attempts == 1


# -- aeffect: recording and replay ----------------------------------------------------------


def test_aeffect_records_and_a_step_rerun_from_its_checkpoint_gets_the_result(
        store: agentwal.Store) -> None:
    fake = AsyncDownstream()
    first = asyncio.run(one_step(store, fake, "at_least_once", commit=False))
    again = asyncio.run(one_step(store, fake, "at_least_once"))
    assert first == again and sum(fake.calls.values()) == 1
    [entry] = store.effects()
    assert entry.status == "done" and entry.result == first and entry.checkpoint == 0
    assert store.get("r", "last") == first


def test_aeffect_accepts_plain_functions_and_functions_returning_awaitables(
        store: agentwal.Store) -> None:
    fake = AsyncDownstream()

    async def main() -> list[Any]:
        async with store.abegin("r") as txn:
            return [
                await txn.aeffect("plain", lambda ctx: ctx.attempt, mode="at_least_once"),
                await txn.aeffect("lambda", lambda ctx: fake.call(ctx), mode="at_most_once"),
                await txn.aeffect("object", _AsyncCallable(Downstream(str(store.path) + ".j")),
                                  mode="at_least_once"),
                await txn.aeffect("partial", functools.partial(fake.call), mode="at_least_once"),
            ]

    plain, from_lambda, from_object, from_partial = asyncio.run(main())
    assert plain == 1 and from_lambda["key"] != from_partial["key"] and from_object["key"]
    assert {e.status for e in store.effects()} == {"done"}


@pytest.mark.parametrize("first", ["sync", "async"])
def test_sync_and_async_steps_meet_the_same_position(store: agentwal.Store,
                                                     down: Downstream, first: str) -> None:
    async def async_call(ctx: agentwal.EffectContext) -> Any:
        return down.call(ctx)

    def sync_step() -> Any:
        with store.begin("r") as txn:
            r = txn.effect("op", down.call, mode="at_least_once", args={"n": 1})
            txn.rollback()
        return r

    async def async_step() -> Any:
        async with store.abegin("r") as txn:
            r = await txn.aeffect("op", async_call, mode="at_least_once", args={"n": 1})
            txn.rollback()
        return r

    steps = [sync_step, lambda: asyncio.run(async_step())]
    if first == "async":
        steps.reverse()
    assert steps[0]() == steps[1]()
    assert down.calls() == 1 and len(store.effects()) == 1


def test_aeffect_checks_its_arguments_before_anything_is_recorded(
        store: agentwal.Store) -> None:
    fake = AsyncDownstream()

    async def main() -> None:
        async with store.abegin("r") as txn:
            with pytest.raises(ValueError, match="exactly_once needs"):
                await txn.aeffect("op", fake.call, mode="exactly_once")
            with pytest.raises(ValueError, match="mode must be one of"):
                await txn.aeffect("op", fake.call, mode="twice")
            with pytest.raises(TypeError, match="fn must be callable"):
                await txn.aeffect("op", 3, mode="at_least_once")  # type: ignore[arg-type]

    asyncio.run(main())
    assert not fake.calls and store.effects() == []


def test_aeffect_divergence_is_refused(store: agentwal.Store) -> None:
    fake = AsyncDownstream()
    asyncio.run(one_step(store, fake, "at_least_once", commit=False))

    async def other_args() -> None:
        async with store.abegin("r") as txn:
            await txn.aeffect("op", fake.call, mode="at_least_once", args={"n": 2})

    with pytest.raises(agentwal.EffectDivergenceError):
        asyncio.run(other_args())
    assert sum(fake.calls.values()) == 1


# -- aeffect in doubt, per mode -------------------------------------------------------------


def test_aeffect_in_doubt_at_most_once_is_not_called_again(store: agentwal.Store) -> None:
    fake = AsyncDownstream()
    lose_outcome(store, fake, "at_most_once")
    with pytest.raises(agentwal.EffectInDoubtError):
        asyncio.run(one_step(store, fake, "at_most_once"))
    assert sum(fake.calls.values()) == 1


def test_aeffect_in_doubt_at_least_once_calls_again(store: agentwal.Store) -> None:
    fake = AsyncDownstream()
    lose_outcome(store, fake, "at_least_once")
    asyncio.run(one_step(store, fake, "at_least_once"))
    [entry] = store.effects()
    assert entry.status == "done" and entry.attempts == 2
    assert fake.calls[entry.key] == 2 and fake.applied[entry.key] == 2


def test_aeffect_in_doubt_exactly_once_idempotent_applies_once(store: agentwal.Store) -> None:
    fake = AsyncDownstream(dedup=True)
    lose_outcome(store, fake, "exactly_once", idempotent=True)
    asyncio.run(one_step(store, fake, "exactly_once", idempotent=True))
    [entry] = store.effects()
    assert entry.status == "done" and fake.calls[entry.key] == 2
    assert fake.applied[entry.key] == 1


def test_aeffect_in_doubt_async_probe_finds_the_applied_call(store: agentwal.Store) -> None:
    fake = AsyncDownstream()
    lose_outcome(store, fake, "exactly_once", probe=fake.probe)
    r = asyncio.run(one_step(store, fake, "exactly_once", probe=fake.probe))
    assert r["probed"] is True
    [entry] = store.effects()
    assert entry.status == "done" and entry.result == r
    assert fake.calls[entry.key] == 1 and fake.applied[entry.key] == 1


def test_aeffect_async_probe_saying_not_applied_calls_again(store: agentwal.Store) -> None:
    fake = AsyncDownstream()
    failpoints.arm("effect_after_intent", "raise")  # dies before the call
    with pytest.raises(failpoints.FailpointFired):
        asyncio.run(one_step(store, fake, "exactly_once", probe=fake.probe))
    failpoints.disarm()
    r = asyncio.run(one_step(store, fake, "exactly_once", probe=fake.probe))
    assert "probed" not in r
    [entry] = store.effects()
    assert entry.attempts == 2 and fake.calls[entry.key] == 1


# -- retries -------------------------------------------------------------------------------


def test_aeffect_retries_wait_with_asyncio_sleep(store: agentwal.Store,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fails = [ConnectionError("1"), TimeoutError("2")]
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(seconds: float, *a: Any) -> Any:
        waits.append(seconds)
        return await real_sleep(0, *a)

    def no_blocking_sleep(seconds: float) -> None:
        raise AssertionError("time.sleep in an asyncio effect would stall the loop")

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    monkeypatch.setattr(ledger_module.time, "sleep", no_blocking_sleep)

    async def flaky(ctx: agentwal.EffectContext) -> str:
        if fails:
            raise fails.pop(0)
        return f"attempt {ctx.attempt}"

    async def main() -> Any:
        async with store.abegin("r") as txn:
            return await txn.aeffect("op", flaky, mode="at_least_once", retries=3,
                                     backoff=0.5)

    assert asyncio.run(main()) == "attempt 3"
    assert waits == [0.5, 1.0]
    [entry] = store.effects()
    assert entry.status == "done" and entry.attempts == 3


def test_aeffect_retries_stop_at_unlisted_errors(store: agentwal.Store) -> None:
    async def bad(ctx: agentwal.EffectContext) -> None:
        raise ValueError("not retryable")

    async def main() -> None:
        async with store.abegin("r") as txn:
            await txn.aeffect("op", bad, mode="at_least_once", retries=5, backoff=0)

    with pytest.raises(ValueError, match="not retryable"):
        asyncio.run(main())
    [entry] = store.effects()
    assert entry.status == "failed" and entry.attempts == 1 and "ValueError" in entry.error


# -- cancellation ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode, kw, next_attempt", [
    ("at_most_once", {}, "in doubt"),
    ("at_least_once", {}, "calls"),
    ("exactly_once", {"idempotent": True}, "calls"),
])
def test_cancelled_while_fn_runs_leaves_the_call_in_doubt(
        store: agentwal.Store, mode: str, kw: dict[str, Any], next_attempt: str) -> None:
    calls: list[int] = []

    async def main() -> None:
        hangs = Gate(None, calls)  # never released: the call never answers
        task = asyncio.create_task(one_step_with(store, hangs, mode, **kw))
        await hangs.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    [entry] = store.effects()
    assert calls == [1] and entry.status == "in_doubt" and entry.attempts == 1
    assert store.head("r") is None  # the step's transaction rolled back

    async def answers(ctx: agentwal.EffectContext) -> str:
        calls.append(ctx.attempt)
        return "answered"

    if next_attempt == "in doubt":
        with pytest.raises(agentwal.EffectInDoubtError):
            asyncio.run(one_step_with(store, answers, mode, **kw))
        assert calls == [1]
    else:
        assert asyncio.run(one_step_with(store, answers, mode, **kw)) == "answered"
        assert calls == [1, 2] and store.effects()[0].status == "done"


async def one_step_with(store: agentwal.Store, fn: Any, mode: str, **kw: Any) -> Any:
    async with store.abegin("r") as txn:
        r = await txn.aeffect("op", fn, mode=mode, **kw)
        txn["last"] = r
    return r


def test_cancelled_during_the_intent_write_waits_for_it_and_calls_nothing(
        store: agentwal.Store) -> None:
    writing, finish = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow_fsync(_name: str) -> None:
        writing.set()
        assert finish.wait(10)

    async def fn(ctx: agentwal.EffectContext) -> None:
        calls.append(ctx.attempt)

    async def main() -> None:
        failpoints.arm("before_fsync", "call", fn=slow_fsync)
        task = asyncio.create_task(one_step_with(store, fn, "at_least_once"))
        while not writing.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done()  # the task waits for the write it started
        finish.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    [entry] = store.effects()
    assert calls == [] and entry.status == "in_doubt" and entry.attempts == 1


# -- the loop is never blocked by a ledger write or a commit -------------------------------


class Ticker:
    """A task that counts its turns on the loop; ``wait_ticks`` is for other threads."""

    def __init__(self) -> None:
        self.ticks = 0
        self._want = 0
        self._reached = threading.Event()

    async def run(self) -> None:
        while True:
            self.ticks += 1
            if self._want and self.ticks >= self._want:
                self._reached.set()
            await asyncio.sleep(0.001)

    def wait_ticks(self, n: int, timeout: float) -> bool:
        """From a worker thread: block until the ticker has ticked ``n`` more times."""
        self._reached.clear()
        self._want = self.ticks + n
        return self._reached.wait(timeout)


def blocked_fsync(ticker: Ticker, seen: list[bool], timeout: float) -> Any:
    """A failpoint action: the fsync lasts until the loop has ticked 20 times (or timeout)."""
    def action(_name: str) -> None:
        seen.append(ticker.wait_ticks(20, timeout))

    return action


def test_acommit_and_aeffect_writes_do_not_block_the_loop(tmp_path: Any) -> None:
    store = agentwal.open(tmp_path / "s", durability="sync")

    async def main() -> None:
        ticker = Ticker()
        ticking = asyncio.create_task(ticker.run())
        seen: list[bool] = []
        try:
            failpoints.arm("before_fsync", "call", fn=blocked_fsync(ticker, seen, 10.0),
                           times=3)
            async with store.abegin("r") as txn:
                await txn.aeffect("op", lambda ctx: "ok", mode="at_least_once")  # 2 fsyncs
                txn["k"] = 1
            # acommit is the third: each fsync lasted until the loop ticked 20 times.
        finally:
            ticking.cancel()
        assert seen == [True, True, True]

    try:
        asyncio.run(main())
        assert store.get("r", "k") == 1
    finally:
        store.close()


def test_a_sync_commit_on_the_loop_blocks_it(tmp_path: Any) -> None:
    """The control: the same slow fsync through txn.commit() gets no tick at all."""
    store = agentwal.open(tmp_path / "s", durability="sync")

    async def main() -> None:
        ticker = Ticker()
        ticking = asyncio.create_task(ticker.run())
        await asyncio.sleep(0)
        seen: list[bool] = []
        try:
            failpoints.arm("before_fsync", "call", fn=blocked_fsync(ticker, seen, 0.2))
            before = ticker.ticks
            with store.begin("r") as txn:
                txn["k"] = 1
            assert ticker.ticks == before  # nothing ran on the loop during the commit
        finally:
            ticking.cancel()
        assert seen == [False]

    try:
        asyncio.run(main())
    finally:
        store.close()


# -- transactions: abegin, acommit -----------------------------------------------------------


def test_abegin_commits_on_a_clean_exit_and_rolls_back_on_an_exception(
        store: agentwal.Store) -> None:
    async def main() -> None:
        async with store.abegin("r") as txn:
            txn["k"] = 1
        assert txn.state == "committed" and txn.checkpoint is not None
        with pytest.raises(KeyError):
            async with store.abegin("r") as txn:
                txn["k"] = 2
                raise KeyError("boom")
        assert txn.state == "rolled_back"
        txn = await store.abegin("r")
        txn["k"] = 3
        ckpt = await txn.acommit()
        assert ckpt is not None and ckpt.id == 2 and txn.state == "committed"
        with pytest.raises(agentwal.errors.TransactionClosedError):
            await txn.acommit()

    asyncio.run(main())
    assert store.get("r", "k") == 3


def test_acommit_conflict_rolls_back_and_applies_nothing(store: agentwal.Store) -> None:
    async def main() -> None:
        a, b = await store.abegin("r"), await store.abegin("r")
        for txn in (a, b):
            txn["n"] = txn.get("n", 0) + 1
        await a.acommit()
        with pytest.raises(agentwal.ConflictError):
            await b.acommit()
        assert b.state == "rolled_back"

    asyncio.run(main())
    assert store.get("r", "n") == 1 and len(store.history("r")) == 1


def test_abegin_refuses_bad_input_at_the_call(store: agentwal.Store) -> None:
    with pytest.raises(agentwal.errors.InvalidKeyError):
        store.abegin("")


def test_many_tasks_on_many_runs_and_on_one_run(store: agentwal.Store) -> None:
    """An asyncio agent: 8 runs of 4 steps each, and 4 workers contending on one run.

    Every step of the runs calls an async effect; each key is called once. The
    workers read-modify-write one counter and retry on ConflictError by hand
    (effects in transactions that conflict are store.transact's business, tested
    with it), so every increment lands once.
    """
    fake = AsyncDownstream()
    runs, steps, workers, increments = 8, 4, 4, 3

    async def agent(run: str) -> None:
        for _ in range(steps):
            async with store.abegin(run) as txn:
                n = txn.get("step", 0)
                r = await txn.aeffect("tool", fake.call, mode="at_least_once",
                                      args={"run": run, "step": n})
                txn["step"] = n + 1
                txn[f"result/{n}"] = r

    conflicts = 0

    async def worker(w: int) -> None:
        nonlocal conflicts
        for i in range(increments):
            while True:
                try:
                    async with store.abegin("shared") as txn:
                        total = txn.get("total", 0)
                        await asyncio.sleep(0)  # let the others read the same total
                        txn["total"] = total + 1
                        txn[f"by/{w}/{i}"] = True
                    break
                except agentwal.ConflictError:
                    conflicts += 1

    async def main() -> None:
        await asyncio.gather(*(agent(f"run-{k}") for k in range(runs)),
                             *(worker(w) for w in range(workers)))

    asyncio.run(main())
    for k in range(runs):
        assert store.get(f"run-{k}", "step") == steps
        assert len(store.history(f"run-{k}")) == steps
    assert store.get("shared", "total") == workers * increments
    assert conflicts > 0  # the workers really met each other
    assert sum(k.startswith("by/") for k in store.state("shared")) == workers * increments
    assert len(fake.calls) == runs * steps
    assert set(fake.calls.values()) == {1} and set(fake.applied.values()) == {1}
    assert {e.status for e in store.effects()} == {"done"}
    assert not effect_locks(store)


def test_a_sync_effect_on_the_loop_meeting_a_running_aeffect_raises_instead_of_hanging(
        store: agentwal.Store, down: Downstream) -> None:
    async def main() -> None:
        slow = Gate("slow")

        async def holder() -> Any:
            async with store.abegin("a") as txn:
                return await txn.aeffect("op", slow, mode="at_least_once", key="shared-key")

        task = asyncio.create_task(holder())
        await slow.started.wait()
        with store.begin("b") as txn, pytest.raises(RuntimeError, match="aeffect"):
            txn.effect("op", down.call, mode="at_least_once", key="shared-key")
        slow.release.set()
        assert await task == "slow"

    asyncio.run(main())
    assert down.calls() == 0


def test_tasks_on_one_key_wait_for_each_other_without_blocking_the_loop(
        store: agentwal.Store) -> None:
    """Two tasks with the same business key: one calls, the other gets its result."""
    fake = AsyncDownstream()

    async def step(run: str) -> Any:
        async with store.abegin(run) as txn:
            return await txn.aeffect("pay", fake.call, mode="at_most_once", key="order-7")

    async def main() -> list[Any]:
        return list(await asyncio.gather(step("a"), step("b"), step("c")))

    results = asyncio.run(main())
    assert results[0] == results[1] == results[2] and fake.calls["order-7"] == 1


def test_a_task_waits_for_a_thread_holding_the_key_without_blocking_the_loop(
        store: agentwal.Store) -> None:
    in_call, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow(ctx: agentwal.EffectContext) -> str:
        calls.append("thread")
        in_call.set()
        assert release.wait(10)
        return "from the thread"

    def in_thread() -> None:
        with store.begin("a") as txn:
            txn.effect("pay", slow, mode="at_most_once", key="order-9")

    async def fn(ctx: agentwal.EffectContext) -> str:
        calls.append("task")
        return "from the task"

    async def main() -> Any:
        thread = threading.Thread(target=in_thread)
        thread.start()
        while not in_call.is_set():
            await asyncio.sleep(0.001)
        async with store.abegin("b") as txn:
            waiting = asyncio.create_task(
                txn.aeffect("pay", fn, mode="at_most_once", key="order-9"))
            for _ in range(20):  # the loop runs on while the task waits for the key
                await asyncio.sleep(0)
            assert not waiting.done()
            release.set()
            result = await waiting
        thread.join()
        return result

    assert asyncio.run(main()) == "from the thread" and calls == ["thread"]


def test_cancelled_while_waiting_for_the_key_records_nothing(store: agentwal.Store) -> None:
    fake = AsyncDownstream()

    async def main() -> None:
        slow = Gate("first")

        async def step(run: str, fn: Any) -> Any:
            async with store.abegin(run) as txn:
                return await txn.aeffect("op", fn, mode="at_least_once", key="k")

        holder = asyncio.create_task(step("a", slow))
        await slow.started.wait()
        waiter = asyncio.create_task(step("b", fake.call))
        for _ in range(5):
            await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        slow.release.set()
        assert await holder == "first"

    asyncio.run(main())
    [entry] = store.effects()
    assert entry.attempts == 1 and entry.status == "done" and not fake.calls
    assert not effect_locks(store)  # the cancelled waiter left no lock behind


def test_a_conflicted_async_step_retried_with_retry_of_charges_once(
        store: agentwal.Store) -> None:
    """The double charge of issue 9, written for asyncio: a message arrives mid-step."""
    fake = AsyncDownstream(dedup=True)
    with store.begin("r") as txn:
        txn["inbox"] = []
    attempts = 0

    async def web_handler(charging: asyncio.Event) -> None:
        await charging.wait()
        async with store.abegin("r") as txn:
            txn["inbox"] = [*txn.get("inbox", []), "hello"]

    async def charge(ctx: agentwal.EffectContext, charging: asyncio.Event) -> Any:
        charging.set()
        for _ in range(5):  # the handler commits while the charge is in flight
            await asyncio.sleep(0)
        return await fake.call(ctx)

    async def agent_step() -> Any:
        nonlocal attempts
        charging = asyncio.Event()
        handler = asyncio.create_task(web_handler(charging))
        txn = await store.abegin("r")
        while True:
            attempts += 1
            try:
                async with txn:
                    seen = len(txn.get("inbox", []))
                    receipt = await txn.aeffect(
                        "charge", functools.partial(charge, charging=charging),
                        mode="exactly_once", idempotent=True, args={"amount": 4900})
                    txn["receipt"] = receipt
                    txn["seen"] = seen
                break
            except agentwal.ConflictError:
                txn = await store.abegin("r", retry_of=txn)
        await handler
        return receipt

    receipt = asyncio.run(agent_step())
    assert attempts == 2  # the first attempt met the handler's commit
    assert fake.calls[receipt["key"]] == 1 and sum(fake.applied.values()) == 1
    assert store.get("r", "seen") == 1 and store.get("r", "receipt") == receipt


def test_effects_gathered_in_one_step_take_positions_in_start_order(
        store: agentwal.Store) -> None:
    """Parallel tool calls: positions follow the order the calls were started, not the
    order they finish, so the step re-run meets every recorded result."""
    fake = AsyncDownstream()

    async def step(fail: bool) -> list[Any]:
        second_done = asyncio.Event()

        async def slow_first(ctx: agentwal.EffectContext) -> Any:
            await second_done.wait()  # finishes last
            return await fake.call(ctx)

        async def quick(ctx: agentwal.EffectContext) -> Any:
            r = await fake.call(ctx)
            second_done.set()
            return r

        async with store.abegin("r") as txn:
            results = await asyncio.gather(
                txn.aeffect("search", slow_first, mode="at_least_once", args={"q": 1}),
                txn.aeffect("search", quick, mode="at_least_once", args={"q": 2}),
                txn.aeffect("fetch", quick, mode="at_least_once", args={"url": "u"}))
            txn["results"] = results
            if fail:
                raise ConnectionError("a later tool is down")
        return list(results)

    with pytest.raises(ConnectionError):
        asyncio.run(step(fail=True))
    assert asyncio.run(step(fail=False)) == store.get("r", "results")
    assert sum(fake.calls.values()) == 3  # the re-run got all three from the ledger
    by_ordinal = sorted(store.effects(), key=lambda e: e.ordinal or 0)
    assert [(e.name, e.args) for e in by_ordinal] == [
        ("search", {"q": 1}), ("search", {"q": 2}), ("fetch", {"url": "u"})]
