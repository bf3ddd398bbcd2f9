"""asyncio agents: txn.effect refuses async callables, txn.aeffect, store.abegin, acommit."""

from __future__ import annotations

import asyncio
import functools
import warnings
from typing import Any

import pytest

import agentwal

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

    with store.begin("r") as txn, pytest.raises(TypeError, match="aeffect"):
        txn.effect("op", down.call, mode="exactly_once", probe=probe)
    assert down.calls() == 0 and store.effects() == []


@pytest.mark.parametrize("mode", ["at_most_once", "at_least_once"])
def test_effect_refuses_a_returned_coroutine_and_records_no_outcome(
        store: agentwal.Store, down: Downstream, mode: str) -> None:
    async def send(ctx: agentwal.EffectContext) -> Any:
        return down.call(ctx)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "coroutine ... was never awaited" fails the test
        with store.begin("r") as txn, pytest.raises(TypeError, match="aeffect"):
            txn.effect("op", lambda ctx: send(ctx), mode=mode)
    assert down.calls() == 0  # the coroutine was closed, never run
    [entry] = store.effects()
    # The call of the plain function happened (its intent is durable); no outcome was made up.
    assert entry.status == "in_doubt" and entry.attempts == 1 and entry.error is None


def test_a_step_refused_for_a_returned_coroutine_can_go_on_with_aeffect(
        store: agentwal.Store, down: Downstream) -> None:
    async def send(ctx: agentwal.EffectContext) -> Any:
        return down.call(ctx)

    with store.begin("r") as txn, pytest.raises(TypeError):
        txn.effect("op", lambda ctx: send(ctx), mode="at_least_once")

    async def main() -> Any:
        async with store.abegin("r") as txn:
            return await txn.aeffect("op", send, mode="at_least_once")

    result = asyncio.run(main())
    assert down.calls() == 1 and result["key"] == store.effects()[0].key
    [entry] = store.effects()
    assert entry.status == "done" and entry.attempts == 2
