"""The store facade's effects API: the ledger listing, ``dispatch``, ``resolve_effect``, ...

Theory of operation: one part of :class:`agentwal.Store` (a base class it
inherits), split from ``store.py`` to keep each module to one concern. The
effects executor is ``ledger.Ledger`` (``engine.ledger``) over the engine's
``backend.LedgerStore``; these methods check their arguments (a bad one
changes nothing), carry the contracts, and call it. The listing's filter and
sort, and ``_effects_after`` (what a rollback or fork reports), are the same
for every backend. Like ``store.py``, it imports nothing of ``agentwal.local``
at run time.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from .aio import off_loop
from .effects import EffectContext, EffectMode, EffectRecord, check_listing, effects_after, listing
from .errors import ReadOnlyError
from .ledger import DispatchReport, Ledger, Request
from .txn import check_effect_args
from .types import (
    Checkpoint,
    check_key,
)

if TYPE_CHECKING:
    from .local.engine import Engine

__all__ = ["EffectsAPI", "StandaloneEffects"]

_UNSET: Any = object()


class StandaloneEffects(abc.ABC):
    """``store.effect``/``store.aeffect`` over a store's ledger (``Store`` and ``PostgresStore``).

    A store gives its effects executor and the checked request of one call
    (``_standalone``, which on a leased backend also takes the run's lease
    and sets ``Request.fence``).
    """

    #: True where building the request reads the backend over a network
    #: (``aeffect`` then builds it off the event loop)
    _standalone_does_io: ClassVar[bool] = False

    @abc.abstractmethod
    def _effect_ledger(self) -> Ledger:
        """The store's effects executor."""

    @abc.abstractmethod
    def _standalone(self, run: str, name: str, fn: Callable[[EffectContext], Any], *,
                    key: str, mode: EffectMode | str, args: Any,
                    probe: Callable[[EffectContext], Any] | None, idempotent: bool,
                    retries: int, retry_on: tuple[type[BaseException], ...], backoff: float,
                    allow_async: bool) -> Request:
        """The checked, keyed ledger request of one ``store.effect`` call (no position)."""

    def effect(self, run: str, name: str, fn: Callable[[EffectContext], Any], *, key: str,
               mode: EffectMode | str, args: Any = None,
               probe: Callable[[EffectContext], Any] | None = None, idempotent: bool = False,
               retries: int = 0,
               retry_on: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError),
               backoff: float = 0.1) -> Any:
        """Run an effect that belongs to no transaction, identified by its business ``key``.

        For code whose steps are not agentwal transactions but have an
        identity of their own (a LangGraph task, a queue message id, a
        workflow step): the entry is listed under ``run``
        (``store.effects(run=run)``), has no position (``ordinal`` None) and
        is never ``uncommitted``; everything else is ``txn.effect``'s contract
        (durable intent before ``fn``, outcome after, the mode's rule in doubt,
        a recorded result returned without a call, ``EffectDivergenceError``
        for other inputs under the same key). ``ctx.run`` is ``run``.

        On a leased backend (PostgreSQL) it runs under this worker's lease on
        ``run`` (taken if it does not hold it): its intent and outcome are
        fenced by the lease like a step's, and ``ctx.fencing_token`` is the
        lease's epoch.

        Raises:
            What ``txn.effect`` raises; ReadOnlyError, StoreClosedError;
            LeaseHeldError (on a leased backend: another worker holds ``run``).

        Example::

            receipt = store.effect("thread-7", "charge", charge, key=f"charge/{task_id}",
                                   mode="exactly_once", idempotent=True)
        """
        req = self._standalone(run, name, fn, key=key, mode=mode, args=args, probe=probe,
                               idempotent=idempotent, retries=retries, retry_on=retry_on,
                               backoff=backoff, allow_async=False)
        return self._effect_ledger().run(req)

    async def aeffect(self, run: str, name: str, fn: Callable[[EffectContext], Any], *,
                      key: str, mode: EffectMode | str, args: Any = None,
                      probe: Callable[[EffectContext], Any] | None = None,
                      idempotent: bool = False, retries: int = 0,
                      retry_on: tuple[type[BaseException], ...] = (ConnectionError,
                                                                   TimeoutError),
                      backoff: float = 0.1) -> Any:
        """:meth:`effect` for asyncio (``fn`` and ``probe`` may be coroutine functions;
        ledger reads and writes run off the event loop, as for ``txn.aeffect``)."""
        def build() -> Request:
            return self._standalone(run, name, fn, key=key, mode=mode, args=args, probe=probe,
                                    idempotent=idempotent, retries=retries, retry_on=retry_on,
                                    backoff=backoff, allow_async=True)

        req = await off_loop(build) if self._standalone_does_io else build()
        return await self._effect_ledger().arun(req)


class EffectsAPI(StandaloneEffects):
    """``Store``'s effects ledger: list, dispatch the outbox, resolve, retire, run."""

    _engine: Engine
    path: str
    readonly: bool

    if TYPE_CHECKING:  # on Store, from HistoryAPI
        def head(self, run: str) -> Checkpoint | None: ...

    # -- effects --------------------------------------------------------------------

    def effects(self, run: str | None = None, status: str | None = None) -> list[EffectRecord]:
        """Entries of the effects ledger, oldest first, optionally of one run or status.

        Args:
            run: only entries recorded by this run.
            status: only ``pending``, ``in_doubt``, ``done``, ``failed``,
                ``not_applied`` or ``resolved`` entries.

        Raises:
            ValueError: an unknown status. StoreClosedError, CorruptionError.

        Example::

            for e in store.effects(status="in_doubt"):
                print(e.effect_id, e.name, e.attempts, e.error)
        """
        check_listing(run, status)
        found = self._engine.effectlog.entries() if run is None and status is None else \
            self._engine.effectlog.query(run, status)
        return listing(found, run, status)

    def dispatch(self, handlers: dict[str, Callable[[EffectContext], Any]], *,
                 probes: dict[str, Callable[[EffectContext], Any]] | None = None,
                 run: str | None = None, limit: int | None = None) -> DispatchReport:
        """Run committed outbox entries (``txn.defer``) in commit order.

        Each entry runs like ``txn.effect`` under its mode, with
        ``handler(ctx)`` and the deferred args in ``ctx.args``; done entries
        are skipped, so dispatch is safe to run again after a crash. An entry
        whose handler raises is recorded ``failed`` and the run's later entries
        wait for the next pass; an entry without a handler stays pending.

        Args:
            handlers: effect name -> ``handler(ctx)``.
            probes: effect name -> ``probe(ctx)`` for entries in doubt
                (required for exactly_once entries not deferred idempotent).
            run: only this run's entries. limit: at most this many entries.

        Returns:
            A :class:`DispatchReport` (``done``, ``failed``, ``in_doubt``, ``skipped``).

        Raises:
            ReadOnlyError, StoreClosedError, DiskFullError, DurabilityError.
        """
        self._engine.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        if run is not None:
            check_key(run, "run id")
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        return self._engine.ledger.dispatch(dict(handlers), probes=probes, run=run, limit=limit)

    def resolve_effect(self, effect_id: str, *, result: Any = _UNSET, not_applied: bool = False,
                       by: str | None = None) -> EffectRecord:
        """Settle an entry in doubt (or failed, or pending) by hand, durably.

        Give ``result=`` (what the downstream did: status ``resolved``, and
        the next attempt returns it) or ``not_applied=True`` (it never
        happened: at_most_once raises ``EffectNotAppliedError`` at the next
        attempt, the other modes call again). ``by`` names who decided
        (default: user@host and pid); the time is recorded.

        Raises:
            ValueError: neither or both of ``result`` and ``not_applied``.
            EffectNotFoundError, EffectSettledError, UnencodableValueError,
            ReadOnlyError, StoreClosedError.
        """
        self._engine.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        if (result is _UNSET) == (not not_applied):
            raise ValueError("give exactly one of result=... or not_applied=True")
        return self._engine.ledger.resolve(effect_id, result=None if result is _UNSET else result,
                                    not_applied=not_applied, by=by)

    def _effect_ledger(self) -> Ledger:
        return self._engine.ledger

    def _standalone(self, run: str, name: str, fn: Callable[[EffectContext], Any], *,
                    key: str, mode: EffectMode | str, args: Any,
                    probe: Callable[[EffectContext], Any] | None, idempotent: bool,
                    retries: int, retry_on: tuple[type[BaseException], ...], backoff: float,
                    allow_async: bool) -> Request:
        """The ledger request of a ``store.effect``: checked, keyed, with no position."""
        check_key(run, "run id")
        self._engine.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        req_mode, args_raw = check_effect_args(name, fn, mode=mode, args=args, key=key,
                                               probe=probe, idempotent=idempotent,
                                               retries=retries, backoff=backoff,
                                               allow_async=allow_async, where="store")
        head = self.head(run)
        return Request(name, fn, req_mode, args_raw, key, run, head.id if head else 0, None,
                       probe, bool(idempotent), retries, tuple(retry_on), float(backoff), True)

    def retire_effect(self, effect_id: str, *, by: str | None = None) -> EffectRecord:
        """Set a recorded effect aside, keeping it as history, and free its position.

        For a step whose code changed on purpose: the effect recorded at its
        position (or under its business key) now raises
        ``EffectDivergenceError``, and no outcome settles that. A retired entry
        keeps everything it recorded (status ``retired``, the old status in
        ``retired_status``, who and when in ``resolved_by``/``resolved_at``);
        the next call at its position or key is a fresh call (when that call
        reuses the key, the old entry is first copied to an archive key with
        ``retired_from`` naming it). Retire only what you have checked at the
        downstream: the fresh call really runs.

        Raises:
            EffectNotFoundError: no such entry.
            EffectNotRetirableError (a ValueError): already retired, or an outbox
                entry (settle those with ``resolve_effect``).
            ReadOnlyError, StoreClosedError, DiskFullError, DurabilityError.

        Example::

            store.retire_effect("ef-3f2a...")
        """
        self._engine.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        return self._engine.ledger.retire(effect_id, by=by)

    def _effects_after(self, run: str, cid: int) -> tuple[EffectRecord, ...]:
        """``run``'s ledger entries made after checkpoint ``cid`` that the world may hold."""
        return effects_after(self.effects(run=run), cid)
