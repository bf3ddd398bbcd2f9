"""Running a step with retries: ``transact``, ``atransact`` and ``abegin``, for every store.

Theory of operation: a *step* is ``fn(txn)`` on one run, committed at its
end; on ``ConflictError`` it is run again from the run's new head, with a
new transaction that is a retry of the last (``begin(run, retry_of=)``), so
its effects meet what earlier attempts recorded (``txn.py``). Attempts wait
a short random pause, doubling up to 50 ms. A ``LeaseLostError`` (a
``ConflictError`` of a leased backend) ends the loop: another worker owns
the run; so does a conflict because the run was deleted
(``ConflictError.deleted``): redone, the step would start a new run. Any
other exception rolls the attempt back and propagates.

:class:`StepsAPI` is a base class of both ``agentwal.Store`` and
``PostgresStore``: it needs ``begin(run, retry_of=)`` and
``_count_retry()`` (what ``stats()["retries"]`` counts) and nothing else of
a store, so it imports nothing of a backend.
"""

from __future__ import annotations

import abc
import asyncio
import inspect
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from . import aio, failpoints
from .errors import ConflictError, LeaseLostError
from .txn import Begin, Transaction

__all__ = ["StepsAPI"]

T = TypeVar("T")


class _StepAttempts:
    """The bookkeeping of ``transact``/``atransact``: one step's attempts, one at a time."""

    def __init__(self, store: StepsAPI, run: str, fn: object, retries: int) -> None:
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError("retries must be an int >= 0")
        if not callable(fn):
            raise TypeError("fn must be callable as fn(txn)")
        self.store, self.run, self.retries = store, run, retries
        self.prev: Transaction | None = None
        self.attempt = 0

    def begin(self) -> Transaction:
        """The next attempt's transaction, a retry of the last one."""
        self.attempt += 1
        return self.store.begin(self.run, retry_of=self.prev)

    def conflicted(self, txn: Transaction, exc: ConflictError) -> float:
        """``txn`` raised ``exc``: raise it if the retries are spent, else the pause to take."""
        if txn.state == "active":
            txn.rollback()
        if (txn.state == "committed" or self.attempt > self.retries
                or isinstance(exc, LeaseLostError) or exc.deleted):
            # A lost lease: another worker owns the run; a deleted run: redoing the
            # step would make a new run of it. Either way redoing the step is wrong.
            raise exc
        self.store._count_retry()
        failpoints.hit("step_before_retry")
        self.prev = txn
        return random.random() * min(0.001 * 2.0 ** (self.attempt - 1), 0.05)

    @staticmethod
    def abort(txn: Transaction) -> None:
        """Any other exception: roll the attempt back (the caller re-raises)."""
        if txn.state == "active":
            txn.rollback()


class StepsAPI(abc.ABC):
    """``transact``/``atransact``/``abegin`` over a store's ``begin``."""

    @abc.abstractmethod
    def begin(self, run: str, *, retry_of: Transaction | None = None,
              prefetch: Iterable[str] = ()) -> Transaction:
        """Each store's own (``Store.begin``, ``PostgresStore.begin``)."""

    @abc.abstractmethod
    def _count_retry(self) -> None:
        """Count one retried attempt (``stats()["retries"]``)."""

    def transact(self, run: str, fn: Callable[[Transaction], T], *, retries: int = 10) -> T:
        """Run one step, ``fn(txn)``, and commit it, redoing it on ``ConflictError``.

        Each attempt gets a new transaction that reads the run as it is then;
        its effects are positioned at the first attempt's base checkpoint, so
        an effect an earlier attempt already made returns its recorded result
        (or raises ``EffectDivergenceError`` if the retry asks for it with
        other args) and is never called a second time under a new key.
        ``fn`` may commit or roll back the transaction itself; otherwise a
        normal return commits it and an exception rolls it back.

        Args:
            run: the run id.
            fn: the step, called as ``fn(txn)`` once per attempt; must be safe
                to call again (its effects are, through the ledger).
            retries: attempts after the first (>= 0).

        Returns:
            What ``fn`` returned on the attempt that committed.

        Raises:
            ConflictError: the last attempt still conflicted (after
                ``retries`` retries); nothing of any attempt was committed.
            Whatever ``fn`` raised (the attempt is rolled back, not retried).
            LeaseLostError (a ConflictError, on a leased backend): another
                worker took the run; raised at once, never retried.
            ConflictError with ``deleted`` set: the run was deleted
                (``delete_run``) while the step ran; raised at once, never
                retried (its effects stay recorded under the deleted run).
            ValueError: bad ``retries``. TypeError: ``fn`` is a coroutine
                function (use ``await store.atransact(run, fn)``).
            And what ``begin`` and ``commit`` raise.

        Example::

            def step(txn):
                inbox = txn.get("inbox", [])
                receipt = txn.effect("charge", charge, mode="exactly_once",
                                     args={"amount": 4900}, idempotent=True)
                txn["receipt"] = receipt
                return receipt

            receipt = store.transact("run-42", step)
        """
        if inspect.iscoroutinefunction(fn):
            raise TypeError("store.transact runs a synchronous step; for an async step use "
                            "`await store.atransact(run, step)`")
        steps = _StepAttempts(self, run, fn, retries)
        while True:
            txn = steps.begin()
            try:
                result = fn(txn)
                if txn.state == "active":
                    txn.commit()
                return result
            except ConflictError as exc:
                time.sleep(steps.conflicted(txn, exc))
            except BaseException:
                steps.abort(txn)
                raise

    async def atransact(self, run: str, fn: Callable[[Transaction], Awaitable[T]], *,
                        retries: int = 10) -> T:
        """:meth:`transact` for asyncio: ``await fn(txn)``, then ``await txn.acommit()``.

        The same contract as ``transact`` (a redone step's effects meet what
        its first attempt recorded, through ``await txn.aeffect(...)`` or
        ``txn.effect``); the commit's write and fsync run off the event loop
        and the pause between attempts is an ``asyncio.sleep``.

        Raises:
            What ``transact`` raises. TypeError: ``fn`` is not a coroutine
            function (use ``transact``).

        Example::

            async def step(txn):
                reply = await txn.aeffect("llm", ask, mode="at_least_once")
                txn["reply"] = reply
                return reply

            reply = await store.atransact("run-42", step)
        """
        if not inspect.iscoroutinefunction(fn) and not aio.is_async_callable(fn):
            raise TypeError("store.atransact awaits an async step (async def step(txn)); "
                            "for a synchronous one use store.transact(run, step)")
        steps = _StepAttempts(self, run, fn, retries)
        while True:
            txn = steps.begin()
            try:
                result = await fn(txn)
                if txn.state == "active":
                    await txn.acommit()
                return result
            except ConflictError as exc:
                await asyncio.sleep(steps.conflicted(txn, exc))
            except BaseException:
                steps.abort(txn)
                raise

    def abegin(self, run: str, *, retry_of: Transaction | None = None) -> Begin:
        """:meth:`begin` for asyncio code; use as ``async with store.abegin(run) as txn:``.

        Takes the arguments of :meth:`begin` (``retry_of=`` positions a retried
        step's effects where its first attempt's were). A clean exit commits
        with ``await txn.acommit()`` (validation, write and fsync off the
        event loop); an exception rolls back and propagates.
        ``txn = await store.abegin(run)`` gives the transaction, to finish by
        hand or with ``async with txn:``. Beginning locally takes no I/O (a
        snapshot of memory and an LMDB read transaction), nor do ``txn.get``
        and the other reads, so they stay synchronous (on PostgreSQL, the
        lease and the head are fetched at the call: two short round trips).

        Raises:
            What :meth:`begin` raises, at the call.

        Example::

            async with store.abegin("run-42") as txn:
                txn["step"] = txn.get("step", 0) + 1
        """
        return Begin(self.begin(run, retry_of=retry_of))
