"""agentwal.aio: async callables, off_loop's cancellation rule, OwnerLock in threads and tasks."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import warnings
from typing import Any
from unittest import mock

import pytest

from agentwal.aio import OwnerLock, discard, is_async_callable, off_loop


async def _coro_fn(x: Any) -> Any:
    return x


def _plain(x: Any) -> Any:
    return x


class _AsyncCall:
    async def __call__(self, x: Any) -> Any:
        return x

    async def method(self, x: Any) -> Any:
        return x


class _SyncCall:
    def __call__(self, x: Any) -> Any:
        return x


@pytest.mark.parametrize("fn, expected", [
    (_coro_fn, True),
    (_AsyncCall(), True),
    (_AsyncCall().method, True),
    (functools.partial(_coro_fn), True),
    (functools.partial(functools.partial(_AsyncCall()), 1), True),
    (mock.AsyncMock(), True),
    (_plain, False),
    (lambda x: _coro_fn(x), False),  # known only once called: txn.effect checks the result
    (_SyncCall(), False),
    (_AsyncCall, False),  # calling the class makes an instance, not a coroutine
    (functools.partial(_plain), False),
    (len, False),
    (None, False),
])
def test_is_async_callable(fn: Any, expected: bool) -> None:
    assert is_async_callable(fn) is expected


def test_discard_closes_a_coroutine_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        coro = _coro_fn(1)
        discard(coro)
        assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED
        discard(object())  # anything else is left alone


def test_off_loop_returns_and_raises_like_the_call() -> None:
    def boom() -> None:
        raise KeyError("k")

    async def main() -> None:
        assert await off_loop(_plain, 7) == 7
        assert await off_loop(dict, a=1) == {"a": 1}
        with pytest.raises(KeyError):
            await off_loop(boom)
        assert await off_loop(threading.get_ident) != threading.get_ident()

    asyncio.run(main())


def test_off_loop_cancelled_waits_for_the_call_then_raises() -> None:
    started, finish = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow() -> str:
        started.set()
        assert finish.wait(10)
        finished.append(True)
        return "done"

    async def main() -> None:
        task = asyncio.create_task(off_loop(slow))
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        for _ in range(10):
            await asyncio.sleep(0)
        assert not task.done()  # still waiting for the thread
        finish.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished == [True]

    asyncio.run(main())


def test_owner_lock_is_reentrant_for_its_thread_and_excludes_others() -> None:
    lock = OwnerLock()
    me = lock.acquire()
    assert lock.acquire() is me  # reentrant
    got: list[str] = []

    def other() -> None:
        owner = lock.acquire()
        got.append("other")
        lock.release(owner)

    t = threading.Thread(target=other)
    t.start()
    lock.release(me)
    assert got == [] and lock._holder is me  # still held once
    lock.release(me)
    t.join(10)
    assert got == ["other"]


def test_owner_lock_tasks_take_turns_and_a_thread_wakes_a_waiting_task() -> None:
    lock = OwnerLock()
    order: list[str] = []

    async def task(name: str, hold: asyncio.Event | None) -> None:
        owner = await lock.aacquire()
        assert await lock.aacquire() is owner  # reentrant for the task
        order.append(name)
        if hold is not None:
            await hold.wait()
        lock.release(owner)
        lock.release(owner)

    async def main() -> None:
        hold = asyncio.Event()
        first = asyncio.create_task(task("first", hold))
        await asyncio.sleep(0)
        second = asyncio.create_task(task("second", None))
        for _ in range(5):
            await asyncio.sleep(0)
        assert order == ["first"]  # the loop runs on; the second task waits
        hold.set()
        await asyncio.gather(first, second)
        assert order == ["first", "second"]

        held = threading.Event()
        release = threading.Event()

        def in_thread() -> None:
            owner = lock.acquire()
            held.set()
            release.wait(10)
            lock.release(owner)

        t = threading.Thread(target=in_thread)
        t.start()
        while not held.is_set():
            await asyncio.sleep(0.001)
        waiting = asyncio.create_task(task("after the thread", None))
        await asyncio.sleep(0)
        assert not waiting.done()
        release.set()
        await waiting
        t.join()
        assert order[-1] == "after the thread"

    asyncio.run(main())


def test_owner_lock_refuses_to_hang_the_loop_on_its_own_task() -> None:
    lock = OwnerLock()

    async def main() -> None:
        owner = await lock.aacquire()
        with pytest.raises(RuntimeError, match="hang the loop"):
            lock.acquire()  # a sync caller on this loop's thread
        lock.release(owner)
        lock.release(lock.acquire())  # free again: a sync caller gets it at once

    asyncio.run(main())
