"""asyncio support: store work off the event loop, and a lock both threads and tasks hold.

Theory of operation: the engine is synchronous (group commit waits on a
condition, a ledger write fsyncs). asyncio code reaches it through three
small pieces, and nothing here decides anything about effects or commits:

- :func:`off_loop` runs one blocking engine call in the loop's default
  executor. Once started, the call is never abandoned: a cancellation that
  arrives while it runs takes effect when it has returned (its result is
  dropped and ``CancelledError`` raised), so a ledger write or a commit is
  never still running in a thread after the task that asked for it has
  moved on and released its locks.
- :class:`OwnerLock` is a reentrant lock whose owner is either a thread
  (``txn.effect``) or an asyncio task (``txn.aeffect``). A task waits for it
  without blocking its loop; a thread waits on a condition. A thread that
  would wait on its own loop's task raises instead of hanging the loop.

Also :func:`is_async_callable`, which says up front whether calling ``fn``
makes a coroutine (what ``txn.effect`` refuses).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["OwnerLock", "discard", "is_async_callable", "off_loop"]

T = TypeVar("T")


def is_async_callable(fn: object) -> bool:
    """True if calling ``fn`` returns a coroutine: an ``async def``, an object whose
    ``__call__`` is one, or a ``functools.partial`` of either."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn):
        return False
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the type's, not the instance's
    return call is not None and inspect.iscoroutinefunction(call)


def discard(awaitable: object) -> None:
    """Close a coroutine (or generator-based awaitable) that will never be awaited, so its
    body never runs and Python warns of nothing; other awaitables are left as they are."""
    if inspect.iscoroutine(awaitable) or inspect.isgenerator(awaitable):
        awaitable.close()


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the loop's default executor; a cancellation waits for it.

    Raises:
        Whatever ``fn`` raised; ``CancelledError`` (once ``fn`` has returned or
        raised) if the awaiting task was cancelled meanwhile.
    """
    call = functools.partial(fn, *args, **kwargs)
    future = asyncio.get_running_loop().run_in_executor(None, call)
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait((future,))  # wait() never cancels what it waits for
        except asyncio.CancelledError:
            cancelled = True  # fn runs on in its thread: let it finish, then give up
    if cancelled:
        if not future.cancelled():
            future.exception()  # retrieved: its outcome is for the caller to look up
        raise asyncio.CancelledError
    return future.result()


class OwnerLock:
    """A lock held by one thread or one asyncio task at a time, reentrant for its holder."""

    __slots__ = ("_cond", "_depth", "_holder", "_waiters")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holder: object = None
        self._depth = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def _take(self, owner: object) -> bool:
        if self._holder is None or self._holder is owner:
            self._holder = owner
            self._depth += 1
            return True
        return False

    def acquire(self) -> object:
        """Take the lock for this thread (blocking); returns the owner to release with.

        Raises:
            RuntimeError: a task of the loop running in this thread holds it, so
                waiting would hang the loop (a sync ``txn.effect`` on the loop
                meeting an ``aeffect`` of the same key).
        """
        owner = threading.current_thread()
        with self._cond:
            while not self._take(owner):
                holder = self._holder
                if isinstance(holder, asyncio.Task) and _loop_here() is holder.get_loop():
                    raise RuntimeError(
                        "an asyncio task of this thread's event loop holds this effect's "
                        "key (an aeffect is running it), so waiting for it here (a sync "
                        "txn.effect, resolve_effect or retire_effect called on the loop) "
                        "would hang the loop; in async code use await txn.aeffect(...), "
                        "or make the call from another thread (asyncio.to_thread)")
                self._cond.wait()
        return owner

    async def aacquire(self) -> object:
        """Take the lock for the current task, waiting without blocking the loop."""
        loop = asyncio.get_running_loop()
        owner: object = asyncio.current_task() or threading.current_thread()
        while True:
            with self._cond:
                if self._take(owner):
                    return owner
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
            await waiter  # woken by release(); a cancellation here holds nothing

    def release(self, owner: object) -> None:
        """Release one level of ``owner``'s hold; the last one wakes every waiter."""
        with self._cond:
            assert self._holder is owner, "released by a thread or task that does not hold it"
            self._depth -= 1
            if self._depth:
                return
            self._holder = None
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there
                loop.call_soon_threadsafe(_wake, waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _loop_here() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
