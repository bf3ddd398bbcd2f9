"""The sync and the async runner of the effects driver are the same contract.

``txn.effect`` and ``txn.aeffect`` carry out one generator of decisions
(``Ledger._steps``) with different I/O. Hypothesis draws a scenario (steps of
every mode, a downstream that fails, times out after applying or answers,
retries, a simulated crash in an effect window, commit or rollback) and runs
it twice on fresh stores: every step through ``txn.effect``, then every step
through ``txn.aeffect`` with an async ``fn`` and probe (or, in a third run, a
random mix of the two). The property is one line: the three runs leave the
same ledger, the same downstream journal and the same outcomes, keys aside
(they depend on the store's id) and numbered in the order they appear.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import agentwal
from agentwal import failpoints

MODES = {
    "amo": ("at_most_once", {}),
    "amo_probe": ("at_most_once", {"probe": True}),
    "alo": ("at_least_once", {}),
    "eo_idem": ("exactly_once", {"idempotent": True}),
    "eo_probe": ("exactly_once", {"probe": True}),
}
WINDOWS = (None, "effect_before_intent", "effect_after_intent", "after_effect_call",
           "effect_after_outcome", "effect_before_retry")

step_st = st.fixed_dictionaries({
    "effect": st.sampled_from(sorted(MODES)),
    "run": st.sampled_from(["a", "b"]),
    "answers": st.lists(st.sampled_from(["ok", "refused", "lost"]), min_size=1, max_size=3),
    "retries": st.integers(0, 2),
    "crash": st.sampled_from(WINDOWS),
    "commit": st.booleans(),
})


class World:
    """The downstream: a journal of calls and applications, answers scripted per call."""

    def __init__(self) -> None:
        self.journal: list[tuple[str, str, int]] = []
        self.applied: set[str] = set()
        self.script: list[str] = []

    def call(self, ctx: agentwal.EffectContext) -> Any:
        answer = self.script.pop(0) if self.script else "ok"
        self.journal.append(("call", ctx.key, ctx.attempt))
        if answer == "refused":
            raise ConnectionError("refused")
        if ctx.key not in self.applied or ctx.name.startswith("alo"):
            self.journal.append(("apply", ctx.key, ctx.attempt))
        self.applied.add(ctx.key)
        if answer == "lost":
            raise TimeoutError("the answer was lost")
        return {"key": ctx.key, "attempt": ctx.attempt}

    def probe(self, ctx: agentwal.EffectContext) -> Any:
        self.journal.append(("probe", ctx.key, ctx.attempt))
        if ctx.key in self.applied:
            return {"key": ctx.key, "probed": True}
        return agentwal.NOT_APPLIED

    async def acall(self, ctx: agentwal.EffectContext) -> Any:
        await asyncio.sleep(0)
        return self.call(ctx)

    async def aprobe(self, ctx: agentwal.EffectContext) -> Any:
        await asyncio.sleep(0)
        return self.probe(ctx)


def _kw(world: World, step: dict[str, Any], use_async: bool) -> dict[str, Any]:
    mode, extra = MODES[step["effect"]]
    kw: dict[str, Any] = {"mode": mode, "args": {"run": step["run"]}, "backoff": 0}
    if extra.get("probe"):
        kw["probe"] = world.aprobe if use_async else world.probe
    if extra.get("idempotent"):
        kw["idempotent"] = True
    if mode != "at_most_once":
        kw["retries"] = step["retries"]
    return kw


class _Rollback(Exception):
    pass


def _outcome(exc: BaseException | None, result: Any) -> Any:
    return type(exc).__name__ if exc is not None else result


async def _astep(store: agentwal.Store, world: World, step: dict[str, Any]) -> Any:
    async with store.abegin(step["run"]) as txn:
        r = await txn.aeffect(step["effect"], world.acall, **_kw(world, step, True))
        txn["last"] = r
        if not step["commit"]:
            raise _Rollback
    return r


def _sstep(store: agentwal.Store, world: World, step: dict[str, Any]) -> Any:
    with store.begin(step["run"]) as txn:
        r = txn.effect(step["effect"], world.call, **_kw(world, step, False))
        txn["last"] = r
        if not step["commit"]:
            raise _Rollback
    return r


def play(steps: list[dict[str, Any]], how: list[bool]) -> tuple[Any, ...]:
    """Run ``steps`` (``how[i]``: the i-th through aeffect) on a fresh store."""
    d = tempfile.mkdtemp(prefix="awal-runners-")
    world = World()
    outcomes: list[Any] = []
    try:
        with agentwal.open(d + "/s", durability="none") as store:
            for step, use_async in zip(steps, how, strict=True):
                world.script = list(step["answers"])
                if step["crash"] is not None:
                    failpoints.arm(step["crash"], "raise")
                result, exc = None, None
                try:
                    result = (asyncio.run(_astep(store, world, step)) if use_async
                              else _sstep(store, world, step))
                except (agentwal.Error, ConnectionError, TimeoutError, _Rollback,
                        failpoints.FailpointFired) as e:
                    exc = e
                finally:
                    failpoints.disarm()
                outcomes.append(_outcome(exc, result))
            ledger = [(e.name, e.run, e.checkpoint, e.ordinal, e.status, e.attempts,
                       e.result, (e.error or "").split(":")[0])
                      for e in sorted(store.effects(),
                                      key=lambda e: (e.run, e.checkpoint, e.ordinal or 0))]
            heads = [getattr(store.head(r), "id", 0) for r in ("a", "b")]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return _renumber((outcomes, world.journal, ledger, heads))


def _renumber(value: Any) -> Any:
    """Replace every effect key by its number in order of appearance."""
    seen: dict[str, str] = {}

    def walk(v: Any) -> Any:
        if isinstance(v, str) and v.startswith("awe-"):
            return seen.setdefault(v, f"key#{len(seen)}")
        if isinstance(v, dict):
            return {k: walk(x) for k, x in sorted(v.items())}
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x) for x in v)
        return v

    return walk(value)


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(step_st, min_size=1, max_size=5), mix=st.lists(st.booleans(),
                                                                      min_size=5, max_size=5))
def test_sync_and_async_runners_leave_the_same_ledger_and_world(
        steps: list[dict[str, Any]], mix: list[bool]) -> None:
    sync = play(steps, [False] * len(steps))
    assert play(steps, [True] * len(steps)) == sync
    assert play(steps, mix[:len(steps)]) == sync
