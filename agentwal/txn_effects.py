"""A transaction's effects: ``effect``, ``aeffect`` and ``defer``, and their positions.

Theory of operation: one part of :class:`agentwal.Transaction` (a base class
it inherits), split from ``txn.py`` so each module keeps one concern. The
n-th ``effect`` of a transaction is positioned at its *anchor*: the base
checkpoint of the step's first attempt (``store.transact``,
``store.begin(run, retry_of=txn)``), or of an uncommitted earlier attempt
the store finds (``StepHooks.txn_adopt``), else the transaction's own base.
:meth:`EffectSteps._effect_request` checks the arguments (nothing is
recorded before they pass), takes the next position and derives its key;
the ledger (``ledger.py``, through ``StepHooks.txn_effect``) runs it. Each
key that reached the ledger is noted (``_made``), so the commit carries it
and always makes a checkpoint. ``defer`` only buffers an outbox entry that
commits with the transaction. ``check_effect_args`` is shared with
``store.effect`` on both backends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from .aio import is_async_callable
from .backend import View
from .codec import encode_value
from .effects import Deferred, EffectContext, EffectMode, args_digest, derive_key
from .errors import BackendUnsupportedError, ConflictError, EffectDivergenceError
from .ledger import Request
from .types import check_key

if TYPE_CHECKING:
    from .txn import StepHooks, Transaction

__all__ = ["EffectSteps", "check_effect_args"]


class EffectSteps:
    """The effects of :class:`agentwal.Transaction`: positioned, recorded calls and the outbox."""

    run: str
    _view: View
    _hooks: StepHooks
    _deferred: list[Deferred]
    _effects_made: int
    _effect_names: dict[str, int]
    _effect_keys: list[str]
    _effect_names_made: list[str]
    _anchor: tuple[int, int] | None
    _chain: object
    _anchored: bool
    _adopted: bool

    if TYPE_CHECKING:  # on Transaction
        def _check(self) -> None: ...

    def effect(self, name: str, fn: Callable[[EffectContext], Any], *,
               mode: EffectMode | str, args: Any = None, key: str | None = None,
               probe: Callable[[EffectContext], Any] | None = None, idempotent: bool = False,
               retries: int = 0,
               retry_on: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError),
               backoff: float = 0.1, transactional: bool = False) -> Any:
        """Call ``fn(ctx)`` under an explicit contract, recorded in the effects ledger.

        The intent is made durable before ``fn`` runs and the outcome when it
        returns or raises, whatever the store's durability mode; the record is
        autonomous (a rollback of this transaction keeps it). At the same
        position (this run, this transaction's base checkpoint, the n-th effect)
        or the same business ``key``, a recorded result is returned without a
        call. See ``docs/effects.md`` for the table of crash windows.

        Args:
            name: what the effect is (``"charge-card"``); part of its key.
            fn: called as ``fn(ctx)`` with an :class:`EffectContext`; returns a
                CBOR-encodable result.
            mode: ``"at_most_once"``, ``"at_least_once"`` or ``"exactly_once"``.
            args: recorded with the intent and passed as ``ctx.args``.
            key: a business idempotency key (dedups across steps, runs and
                forks); default: derived from the position.
            probe: ``probe(ctx)`` asks the downstream whether an effect in doubt
                was applied: its result, :data:`agentwal.NOT_APPLIED` or
                :data:`agentwal.UNKNOWN`.
            idempotent: the downstream dedups by ``ctx.key``.
            retries: extra attempts (same key) on the exceptions in ``retry_on``,
                each recorded, with ``backoff`` seconds doubling between them.
            transactional: on PostgreSQL, with ``mode="exactly_once"``: ``fn``
                gets ``ctx.conn`` inside the database transaction that records
                the outcome, so the rows it writes there and the ledger entry
                commit together (or, when ``fn`` raises, neither does, and
                nothing is recorded): never in doubt, no probe needed. Other
                backends raise ``BackendUnsupportedError``.

        Returns:
            The result of ``fn`` (or of the probe, or the recorded one).

        Raises:
            ValueError: a bad mode; ``exactly_once`` without ``probe`` or
                ``idempotent=True``; ``retries`` with ``at_most_once``.
            EffectInDoubtError: the outcome of an earlier attempt is unknown and
                the mode forbids calling again; nothing was called.
            EffectNotAppliedError: an at_most_once effect was not applied.
            EffectDivergenceError: this position or key has a record of another
                name, args or mode; nothing was called.
            UnencodableValueError: bad args (nothing ran) or an unstorable result.
            DiskFullError, DurabilityError: a record could not be made durable.
            Whatever ``fn`` raised (recorded as ``failed``).

        Example::

            receipt = txn.effect("charge-card", charge, mode="exactly_once",
                                 args={"amount": 4900}, idempotent=True)
        """
        if transactional:
            in_txn = self._transactional_hook(mode, retries)
            req = self._effect_request(name, fn, mode=mode, args=args, key=key, probe=probe,
                                       idempotent=idempotent, retries=0, retry_on=retry_on,
                                       backoff=backoff, allow_async=False, transactional=True)
            with self._recording(req):
                return in_txn(self._view, req)
        req = self._effect_request(name, fn, mode=mode, args=args, key=key, probe=probe,
                                   idempotent=idempotent, retries=retries, retry_on=retry_on,
                                   backoff=backoff, allow_async=False)
        with self._recording(req):
            return self._hooks.txn_effect(self._view, req)

    def _transactional_hook(self, mode: object, retries: int) -> Callable[..., Any]:
        """The store's ``txn_effect_transactional``, or the error saying why there is none."""
        self._check()
        if mode not in (EffectMode.EXACTLY_ONCE, "exactly_once"):
            raise ValueError("transactional=True is for mode='exactly_once' (the business rows "
                             "and the outcome commit together)")
        if retries:
            raise ValueError("transactional=True takes no retries: a failed call rolls back "
                             "and records nothing, so the step itself is retried")
        hook: Callable[..., Any] | None = getattr(self._hooks, "txn_effect_transactional", None)
        if hook is None:
            raise BackendUnsupportedError(
                "txn.effect(transactional=True)", "local",
                "It needs the business tables in the same database as the ledger: open the "
                "store on PostgreSQL, or use mode='exactly_once' with idempotent=True or a probe.")
        return hook

    def _effect_request(self, name: str, fn: Callable[[EffectContext], Any], *,
                        mode: EffectMode | str, args: Any, key: str | None,
                        probe: Callable[[EffectContext], Any] | None, idempotent: bool,
                        retries: int, retry_on: tuple[type[BaseException], ...],
                        backoff: float, allow_async: bool,
                        transactional: bool = False) -> Request:
        """Check the arguments of ``effect``/``aeffect`` and take the next position."""
        self._check()
        req_mode, args_raw = check_effect_args(name, fn, mode=mode, args=args, key=key,
                                               probe=probe,
                                               idempotent=idempotent or transactional,
                                               retries=retries, backoff=backoff,
                                               allow_async=allow_async, where="txn")
        if self._anchor is None:
            base, epoch = self._view.base, self._view.epoch
            if self._effects_made == 0:
                found = self._hooks.txn_adopt(self.run, base, name, args_digest(args_raw),
                                              req_mode, epoch, key)
                if found is not None:
                    base, self._adopted = found, True
            self._anchor = (base, epoch)
        base, epoch = self._anchor
        ordinal = self._effects_made
        nth = self._effect_names.get(name, 0)
        self._effects_made += 1
        self._effect_names[name] = nth + 1
        keyed = key is not None
        if key is None:
            key = derive_key(self._hooks.store_id, self.run, base, name, nth, epoch=epoch)
        req = Request(name, fn, req_mode, args_raw, key, self.run, base, ordinal, probe,
                      bool(idempotent), retries, tuple(retry_on), float(backoff), keyed)
        if not keyed:  # a business key is shared on purpose; a position is one step's
            txn = cast("Transaction", self)
            req.claim = lambda: self._hooks.txn_claim(txn, base, chain=self._chain,
                                                      inherited=self._inherited)
        return req

    @contextlib.contextmanager
    def _recording(self, req: Request) -> Iterator[None]:
        """Around running ``req``: note its key as this step's, or give the anchor back."""
        try:
            yield
        except (EffectDivergenceError, ConflictError):
            # Refused before anything of this step was recorded at the key; a step
            # that recorded nothing yet has no positions to hand to its retry.
            if not self._effect_keys and not self._anchored:
                self._anchor, self._adopted = None, False
            raise
        except BaseException:
            self._made(req.name, req.key)
            raise
        self._made(req.name, req.key)

    @property
    def _inherited(self) -> bool:
        """True if this step's effect positions were an earlier attempt's (retry or adoption)."""
        return self._anchored or self._adopted

    def _made(self, name: str, key: str) -> None:
        """Note that an effect of this step reached the ledger at ``key``."""
        if key not in self._effect_keys:
            self._effect_keys.append(key)
        self._effect_names_made.append(name)

    def defer(self, name: str, *, mode: EffectMode | str, args: Any = None,
              key: str | None = None, idempotent: bool = False) -> None:
        """Add an outbox entry that commits atomically with this transaction.

        A committed entry is run by ``store.dispatch(handlers)`` in commit
        order under the same mode rules as :meth:`effect`; a rolled-back
        transaction (or ``rollback_to`` a savepoint before it) leaves nothing.

        Raises:
            ValueError: a bad mode. UnencodableValueError: bad args.
            InvalidKeyError: a bad name or key.
        """
        self._check()
        req_mode = _check_mode(mode)
        check_key(name, "effect name")
        if key is not None:
            check_key(key, "effect key")
        args_raw = encode_value(f"args of deferred effect {name!r}", args)
        self._deferred.append((name, req_mode.value, args_raw, key, bool(idempotent)))

    async def aeffect(self, name: str, fn: Callable[[EffectContext], Any], *,
                      mode: EffectMode | str, args: Any = None, key: str | None = None,
                      probe: Callable[[EffectContext], Any] | None = None,
                      idempotent: bool = False, retries: int = 0,
                      retry_on: tuple[type[BaseException], ...] = (ConnectionError,
                                                                   TimeoutError),
                      backoff: float = 0.1) -> Any:
        """:meth:`effect` for asyncio code: ``fn`` and ``probe`` may be ``async def``.

        Same arguments, positions, keys, records and errors as :meth:`effect`
        (a sync and an async step meeting the same position see the same
        entry). ``fn(ctx)`` and ``probe(ctx)`` are called on the event loop
        and awaited when they return an awaitable; every ledger read and
        write (intent, outcome, probe result) runs in the loop's default
        executor, so its fsync never stalls other tasks; retries wait with
        ``asyncio.sleep``. The arguments are checked before anything is
        recorded, as for :meth:`effect`.

        Cancelling the awaiting task while ``fn`` runs leaves the intent
        without an outcome: the entry is ``in_doubt``, exactly as if the
        process had died during the call, and the next attempt follows its
        mode's rule. A cancellation that arrives during a ledger write takes
        effect once that write has finished.

        Raises:
            What :meth:`effect` raises, and ``asyncio.CancelledError``.

        Example::

            async with store.abegin("run-42") as txn:
                answer = await txn.aeffect("llm-call", ask_model, mode="at_least_once",
                                           args={"prompt": prompt})
                txn["answer"] = answer
        """
        # On the loop, before the first await: effects started together (asyncio.gather)
        # take their positions in the order they were started, the same on every re-run.
        # (A step's first effect reads a few ledger positions here: memory and LMDB reads.)
        req = self._effect_request(name, fn, mode=mode, args=args, key=key, probe=probe,
                                   idempotent=idempotent, retries=retries, retry_on=retry_on,
                                   backoff=backoff, allow_async=True)
        with self._recording(req):
            return await self._hooks.txn_aeffect(self._view, req)


def _check_mode(mode: object) -> EffectMode:
    try:
        return EffectMode(mode)
    except ValueError:
        raise ValueError(f"mode must be one of {[m.value for m in EffectMode]}, "
                         f"not {mode!r}") from None


def check_effect_args(name: str, fn: object, *, mode: object, args: Any, key: str | None,
                      probe: object, idempotent: bool, retries: int, backoff: float,
                      allow_async: bool, where: str) -> tuple[EffectMode, bytes]:
    """Check what an effect call was given; its mode and encoded args, or a clear error.

    Shared by ``txn.effect``/``txn.aeffect`` and ``store.effect``/``store.aeffect``
    (``where`` says which, for the messages; ``store.effect`` needs a business
    ``key``). Nothing is recorded before it passes.
    """
    if where == "store" and not isinstance(key, str):
        raise TypeError("store.effect needs key=, a business key (str): with no "
                        "transaction there is no position to derive one from")
    req_mode = _check_mode(mode)
    check_key(name, "effect name")
    if not callable(fn):
        raise TypeError("fn must be callable as fn(ctx)")
    if probe is not None and not callable(probe):
        raise TypeError("probe must be callable as probe(ctx)")
    if not allow_async:
        for what, f in (("fn", fn), ("probe", probe)):
            if is_async_callable(f):
                raise TypeError(
                    f"{what} of effect {name!r} is async ({f!r}); {where}.effect calls it "
                    "synchronously and could not await it. In async code use "
                    f"`await {where}.aeffect(...)`. Nothing was recorded.")
    if req_mode is EffectMode.EXACTLY_ONCE and probe is None and not idempotent:
        raise ValueError("exactly_once needs probe= (to ask the downstream whether an "
                         "attempt in doubt was applied) or idempotent=True (the downstream "
                         "dedups by ctx.key); without either it cannot be exactly once")
    if not isinstance(retries, int) or retries < 0:
        raise ValueError("retries must be an int >= 0")
    if retries and req_mode is EffectMode.AT_MOST_ONCE:
        raise ValueError("at_most_once never calls twice, so it cannot retry; use "
                         "at_least_once or exactly_once")
    if backoff < 0:
        raise ValueError("backoff must be >= 0")
    if key is not None:
        check_key(key, "effect key")
    return req_mode, encode_value(f"args of effect {name!r}", args)
