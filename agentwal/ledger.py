"""The effects executor: runs an effect or an outbox entry under its mode's contract.

Theory of operation: ``effects.py`` decides, this module acts. For one
request it takes a per-key lock (one executor per key in this process; the
writer lock makes this process the only one), reads the ledger entry, and
follows :func:`~agentwal.effects.decide` step by step::

    look up ─▶ divergence? raise ─▶ recorded? return ─▶ in doubt? mode rule
    ─▶ intent (durable) ─▶ fn(ctx) ─▶ outcome (durable) ─▶ return result

Crash windows ("if we die here, the next attempt sees ..."):

- before the intent is durable: no entry, or the entry as it was; the call
  did not happen: the next attempt calls (``attempt`` unchanged).
- intent durable, before or during ``fn``: ``in_doubt`` with ``attempts``
  counting this call; the mode's rule decides (``decide``).
- ``fn`` returned, before the outcome is durable: the same ``in_doubt``; the
  downstream may have applied it, which is why at_most_once never calls again
  and exactly_once needs a probe or an idempotent downstream.
- outcome durable: ``done``; every later attempt returns the recorded result.

Every record is a durable write through ``backend.LedgerStore.record_effect``
(locally a ``REC_EFFECT`` WAL record, fsynced whatever the store's durability
mode, visible once durable; on PostgreSQL a synchronous row write fenced by
the step's lease, :attr:`Request.fence`). Each write is a compare-and-set on
the entry the executor last read or wrote for that key: the per-key lock
below keeps this process's executors apart, and the compare-and-set keeps
any other writer of the ledger (another host's worker) from being
overwritten blindly. An intent
that loses the race is decided again from the entry that won (nothing was
called yet); an outcome that loses it leaves the entry in doubt. The module
does no I/O of its own.

The decisions are one generator (``Ledger._steps``, sans-IO like h11's
state machine): it yields the operations it needs (read an entry, write
one, call ``fn``, call ``probe``, sleep before a retry) and is sent their
results, or has their exceptions thrown in. ``_drive`` runs it in the
calling thread (``txn.effect``, dispatch); ``_adrive`` runs it for asyncio
(``txn.aeffect``): reads and writes in executor threads, ``fn``/``probe``
awaited, ``asyncio.sleep``. Both hold the same per-position and per-key
locks (``aio.OwnerLock``: a thread or a task is the holder), so a sync and
an async step meeting one key take turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import inspect
import os
import socket
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from . import failpoints
from .aio import OwnerLock, discard, off_loop
from .backend import EffectRace, LedgerStore
from .codec import encode_value, loads
from .effects import (
    CALL,
    DIVERGED,
    IN_DOUBT,
    NOT_APPLIED_ERR,
    PROBE,
    RETURN,
    EffectContext,
    EffectMode,
    EffectRecord,
    after_probe,
    archive_key,
    args_digest,
    decide,
    effect_id_for,
)
from .errors import (
    ConflictError,
    CorruptionError,
    DiskFullError,
    DurabilityError,
    EffectDivergenceError,
    EffectInDoubtError,
    EffectNotAppliedError,
    EffectNotFoundError,
    EffectNotRetirableError,
    EffectSettledError,
    StoreClosedError,
    UnencodableValueError,
)

if TYPE_CHECKING:
    from .txn import Transaction

__all__ = ["DispatchReport", "Ledger", "PositionOwners", "Request", "moved_on"]



class PositionOwners:
    """Which live transaction owns the effect positions at each ``(run, checkpoint)``.

    Positions at a checkpoint belong to one step. Both stores keep one of
    these and call it under their own lock: :meth:`check` refuses a second
    live transaction begun from the same checkpoint that is not a retry in
    the same chain (``chain``: an object every attempt of one step shares);
    :meth:`take` records ``txn`` as the owner (weakly; dead and finished
    owners are pruned once there are many).
    """

    _PRUNE_AT = 4096

    def __init__(self) -> None:
        #: (run, checkpoint) -> (the owner, weakly; its step's chain)
        self._owners: dict[tuple[str, int], tuple[weakref.ref[Transaction], object]] = {}

    def owner(self, run: str, base: int) -> Transaction | None:
        held = self._owners.get((run, base))
        return held[0]() if held is not None else None

    def check(self, txn: Transaction, base: int, chain: object) -> None:
        """Raise ``ConflictError`` if another live step owns the positions at ``base``."""
        held = self._owners.get((txn.run, base))
        other = held[0]() if held is not None else None
        if (held is not None and other is not None and other is not txn
                and other.state == "active" and held[1] is not chain):
            raise ConflictError(txn.run, reason=(
                f"another transaction on this run, begun from checkpoint {base}, is "
                "calling effects there; nothing was called or recorded. Two steps cannot "
                "run from one checkpoint: retry once it commits (store.transact does)."))

    def take(self, txn: Transaction, base: int, chain: object) -> None:
        """Record ``txn`` (of the step ``chain``) as the owner of the positions at ``base``."""
        if self.owner(txn.run, base) is txn:
            return
        if len(self._owners) > self._PRUNE_AT:
            self._owners = {k: held for k, held in self._owners.items()
                            if (t := held[0]()) is not None and t.state == "active"}
        self._owners[(txn.run, base)] = (weakref.ref(txn), chain)


def moved_on(run: str, base: int, head: object) -> ConflictError:
    """The refusal of a step begun at ``base`` after the run moved on to ``head``."""
    return ConflictError(run, reason=(
        f"the run moved on from checkpoint {base} (where this transaction began) to "
        f"{head}; its effect positions there belong to the step that committed. Nothing "
        "was called or recorded; retry the step from the new head (store.transact does)."))


@dataclass
class Request:
    """One call of ``txn.effect`` (or one outbox entry being dispatched)."""

    name: str
    fn: Callable[[EffectContext], Any]
    mode: EffectMode
    args_raw: bytes
    key: str
    run: str
    checkpoint: int
    ordinal: int | None
    probe: Callable[[EffectContext], Any] | None = None
    idempotent: bool = False
    retries: int = 0
    retry_on: tuple[type[BaseException], ...] = ()
    backoff: float = 0.1
    keyed: bool = False  # a business key (key=), not derived from the position
    digest: str = ""  # of args_raw unless given (an outbox entry keeps its own)
    #: called under the position's lock before anything else: raises
    #: ConflictError if the position is not the caller's to use (txn.effect)
    claim: Callable[[], None] | None = None
    #: the lease epoch the call is made under, passed on as ctx.fencing_token
    fencing_token: int | None = None
    #: what every ledger write of the call is fenced by (``record_effect``'s ``fence``:
    #: PostgreSQL's lease of the step; None where the writer lock fences writers)
    fence: object | None = None

    def __post_init__(self) -> None:
        if not self.digest:
            self.digest = args_digest(self.args_raw)


@dataclass(frozen=True, slots=True)
class DispatchReport:
    """What one ``store.dispatch`` pass did, by effect id.

    Attributes:
        done: entries whose handler ran (or whose result was already recorded).
        failed: ``(effect_id, error)`` for handlers that raised; the entry is
            ``failed`` and later entries of the same run wait for the next pass.
        in_doubt: ``(effect_id, reason)`` for entries the mode forbids retrying.
        skipped: ``(effect_id, reason)`` for entries left pending (no handler,
            no probe for an exactly_once entry, or an earlier entry of the run
            did not finish).
    """

    done: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    in_doubt: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True if every entry looked at is now done."""
        return not (self.failed or self.in_doubt or self.skipped)


class _Read(NamedTuple):
    """Op: the ledger entry at ``key`` (answer: EffectRecord or None)."""

    key: str


class _Write(NamedTuple):
    """Op: make ``entry`` durable if the key still holds ``expect`` (answer: it as stored).

    A lost race is thrown in as :class:`~agentwal.backend.EffectRace`.
    """

    entry: EffectRecord
    expect: EffectRecord | None


class _Call(NamedTuple):
    """Op: call ``fn(ctx)`` (answer: its result; its exception is thrown in)."""

    ctx: EffectContext


class _Probe(NamedTuple):
    """Op: call ``probe(ctx)`` (answer: what it said)."""

    ctx: EffectContext


class _Sleep(NamedTuple):
    """Op: wait ``seconds`` before a retry (answer: None)."""

    seconds: float


class _Done(NamedTuple):
    """Not an op: the driver finished with ``value``."""

    value: Any


_Op = _Read | _Write | _Call | _Probe | _Sleep
_Steps = Generator[_Op, Any, Any]


def _resume(steps: _Steps, answer: Any, error: BaseException | None) -> _Op | _Done:
    """Send ``answer`` (or throw ``error``) into the driver; its next op, or what it returned."""
    try:
        return steps.send(answer) if error is None else steps.throw(error)
    except StopIteration as stop:
        return _Done(stop.value)


def _refuse_awaitable(value: Any, req: Request, what: str) -> None:
    """Raise TypeError if a sync ``fn``/``probe`` returned an awaitable (closing a coroutine)."""
    if not inspect.isawaitable(value):
        return
    discard(value)
    if what == "fn":
        left = (f"This attempt's intent (key {req.key!r}) stays in doubt, as the function "
                "that returned it did run: an at_least_once or idempotent exactly_once step "
                "calls it again through aeffect; otherwise settle it with "
                "store.resolve_effect.")
    else:
        left = "The entry is as it was; nothing was recorded."
    raise TypeError(
        f"{what} of effect {req.name!r} returned {type(value).__name__} {value!r}, which "
        "txn.effect cannot await (a coroutine is closed, so none of it ran). In async code "
        f"call `await txn.aeffect(...)`. {left}")


class _Raced(Exception):
    """An intent lost its compare-and-set to ``found``: decide again from it."""

    def __init__(self, found: EffectRecord | None) -> None:
        super().__init__(found)
        self.found = found


class _FnFailed(Exception):
    """``fn`` raised ``exc`` (already recorded as ``failed``)."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(exc)
        self.exc = exc


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name on this system: still say which process
        user = "?"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


class Ledger:
    """Runs effects for one store; shared by its threads."""

    def __init__(self, store: LedgerStore) -> None:
        #: the ledger storage it reads and writes (``agentwal.testing`` may wrap it)
        self.store = store
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, ...], tuple[OwnerLock, int]] = {}

    def lock_count(self) -> int:
        """How many per-key and per-position locks are held or waited on now."""
        with self._guard:
            return len(self._locks)

    def _lock(self, name: tuple[str, ...]) -> OwnerLock:
        """The lock named ``name`` (a key or a position), counted as used until ``_unlock``."""
        with self._guard:
            lock, users = self._locks.get(name, (None, 0))
            lock = lock or OwnerLock()
            self._locks[name] = (lock, users + 1)
        return lock

    def _unlock(self, name: tuple[str, ...]) -> None:
        with self._guard:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    @contextlib.contextmanager
    def _locked(self, name: tuple[str, ...]) -> Iterator[None]:
        """Hold the lock named ``name`` in this thread; reentrant in one thread."""
        lock = self._lock(name)
        try:
            owner = lock.acquire()
            try:
                yield
            finally:
                lock.release(owner)
        finally:
            self._unlock(name)

    @contextlib.asynccontextmanager
    async def _alocked(self, name: tuple[str, ...]) -> AsyncIterator[None]:
        """Hold the lock named ``name`` in this task, waiting without blocking the loop."""
        lock = self._lock(name)
        try:
            owner = await lock.aacquire()
            try:
                yield
            finally:
                lock.release(owner)
        finally:
            self._unlock(name)

    # -- running ------------------------------------------------------------------

    def run(self, req: Request) -> Any:
        """Run ``req`` under its mode; returns the (recorded) result.

        The position (run, checkpoint, ordinal) and then the key are locked, so
        checking a position and claiming it with an intent is atomic, and one
        executor at a time works on a key in this process.

        Raises:
            EffectDivergenceError, EffectInDoubtError, EffectNotAppliedError,
            whatever ``fn`` raised (recorded as ``failed``), and the store's
            DiskFullError / DurabilityError if a record cannot be made durable.
        """
        pos = ("pos", req.run, str(req.checkpoint), str(req.ordinal))
        with self._locked(pos), self._locked(("key", req.key)):
            return self._drive(req, self._prepare(req))

    async def arun(self, req: Request) -> Any:
        """:meth:`run` for asyncio code: ``fn`` and ``probe`` may be async, and every
        ledger read and write runs in an executor thread, so no fsync stalls the loop.

        The locks are the same ones :meth:`run` takes, held by the awaiting
        task; a task waiting for one does not block the loop.

        Raises:
            What :meth:`run` raises, and ``CancelledError`` (see ``docs/effects.md``
            for what a cancelled call leaves in the ledger).
        """
        pos = ("pos", req.run, str(req.checkpoint), str(req.ordinal))
        async with self._alocked(pos), self._alocked(("key", req.key)):
            return await self._adrive(req, await off_loop(self._prepare, req))

    def _prepare(self, req: Request) -> EffectRecord | None:
        """Under the locks: claim the position, read the key's entry, check the position."""
        if req.claim is not None:
            req.claim()
        entry = self.store.effect(req.key)
        if req.ordinal is not None:
            self._check_position(req)
        return entry

    def _check_position(self, req: Request) -> None:
        assert req.ordinal is not None
        there = self.store.effect_at(req.run, req.checkpoint, req.ordinal)
        if there is not None and there != req.key:
            other = self.store.effect(there)
            if other is not None and other.status == "retired":
                return  # set aside by retire_effect: the position is free
            what = (f"{other.name!r} ({other.effect_id}, args {_brief(other.args)})"
                    if other is not None else f"key {there!r}")
            raise EffectDivergenceError(
                other.effect_id if other is not None else None, req.key,
                f"effect #{req.ordinal} of run {req.run!r} from checkpoint {req.checkpoint} "
                f"was recorded as {what}, and now {req.name!r} (key {req.key!r}, args "
                f"{_brief(loads(req.args_raw))}) is asked for there; nothing was called. "
                "The step is not deterministic: make it call the same effects in the same "
                "order, or, if its code changed on purpose, set the recorded effect aside "
                "with store.retire_effect(effect_id) (`agentwal retire`).")

    # -- the driver: one generator of decisions, two runners (module docstring) --
    # Whatever a runner sends back, the crash windows, records and errors are
    # the same: the runners only carry out the ops.

    def _drive(self, req: Request, entry: EffectRecord | None) -> Any:
        """Run ``req`` from ``entry`` in this thread (the sync runner)."""
        steps = self._steps(req, entry)
        op = _resume(steps, None, None)
        while not isinstance(op, _Done):
            try:
                if isinstance(op, _Read):
                    answer: Any = self.store.effect(op.key)
                elif isinstance(op, _Write):
                    answer = self.store.record_effect(op.entry, expect=op.expect,
                                                      fence=req.fence)
                elif isinstance(op, _Call):
                    answer = req.fn(op.ctx)
                elif isinstance(op, _Probe):
                    assert req.probe is not None
                    answer = req.probe(op.ctx)
                else:
                    time.sleep(op.seconds)
                    answer = None
            except BaseException as exc:
                op = _resume(steps, None, exc)
            else:
                op = _resume(steps, answer, None)
        return op.value

    async def _adrive(self, req: Request, entry: EffectRecord | None) -> Any:
        """Run ``req`` from ``entry`` for asyncio code (the async runner)."""
        steps = self._steps(req, entry)
        op = _resume(steps, None, None)
        while not isinstance(op, _Done):
            try:
                if isinstance(op, _Read):
                    answer: Any = await off_loop(self.store.effect, op.key)
                elif isinstance(op, _Write):
                    answer = await off_loop(self.store.record_effect, op.entry,
                                            expect=op.expect, fence=req.fence)
                elif isinstance(op, (_Call, _Probe)):
                    call = req.fn if isinstance(op, _Call) else req.probe
                    assert call is not None
                    answer = call(op.ctx)
                    while inspect.isawaitable(answer):
                        answer = await answer
                else:
                    await asyncio.sleep(op.seconds)
                    answer = None
            except BaseException as exc:
                op = _resume(steps, None, exc)
            else:
                op = _resume(steps, answer, None)
        return op.value

    def _steps(self, req: Request, entry: EffectRecord | None) -> _Steps:
        """The decisions for ``req`` met with ``entry`` (``effects.decide`` step by step)."""
        digest = req.digest
        retries_left = req.retries
        step = decide(entry, name=req.name, digest=digest, mode=req.mode,
                      has_probe=req.probe is not None, idempotent=req.idempotent)
        while True:
            if step == DIVERGED:
                assert entry is not None
                raise EffectDivergenceError(entry.effect_id, entry.key,
                                            _diverged(entry, req, digest))
            if step == RETURN:
                assert entry is not None
                return entry.result
            if step == IN_DOUBT:
                assert entry is not None
                raise EffectInDoubtError(entry.effect_id, entry.key, _in_doubt(entry))
            if step == NOT_APPLIED_ERR:
                assert entry is not None
                if entry.status != "not_applied":
                    yield _Write(entry.replace(status="not_applied"), entry)
                raise EffectNotAppliedError(
                    entry.effect_id, entry.key,
                    f"effect {entry.name!r} ({entry.effect_id}, key {entry.key!r}) was not "
                    "applied and is at_most_once, so it is not called again. Take another "
                    "path, or record what happened with store.resolve_effect(effect_id, "
                    "result=...).")
            if step == PROBE:
                assert entry is not None and req.probe is not None
                answer = yield _Probe(self._context(req, entry, entry.attempts))
                _refuse_awaitable(answer, req, "probe")
                step = after_probe(answer, req.mode, req.idempotent)
                if step == RETURN:
                    encode_value(f"probe result of effect {req.name!r}", answer)
                    entry = yield _Write(entry.replace(status="done", result=answer, error=None),
                                         entry)
                continue
            assert step == CALL
            try:
                return (yield from self._call(req, entry, digest))
            except _Raced as raced:  # nothing was called: decide again from the winner
                entry = raced.found
                step = decide(entry, name=req.name, digest=digest, mode=req.mode,
                              has_probe=req.probe is not None, idempotent=req.idempotent)
            except _FnFailed as failed:
                exc = failed.exc
                if retries_left <= 0 or not isinstance(exc, req.retry_on):
                    raise exc from None
                retries_left -= 1
                yield _Sleep(min(req.backoff * 2 ** (req.retries - retries_left - 1), 30.0))
                failpoints.hit("effect_before_retry")
                entry = yield _Read(req.key)
                step = decide(entry, name=req.name, digest=digest, mode=req.mode,
                              has_probe=req.probe is not None, idempotent=req.idempotent)

    def _call(self, req: Request, entry: EffectRecord | None, digest: str) -> _Steps:
        """One attempt: durable intent, the call, durable outcome.

        An exception from ``fn`` comes out wrapped in :class:`_FnFailed` (after
        it is recorded), so retries never catch the engine's own errors. An
        awaitable returned to the sync runner is refused with no outcome: the
        intent stays in doubt, as the plain function that made it did run.
        """
        now = time.time()
        stored = entry  # what the key holds: the intent's compare-and-set expects it
        if entry is not None and entry.status == "retired":
            yield from self._archive(entry)
            entry = None
        if entry is None:
            entry = EffectRecord(
                effect_id_for(req.key), req.key, req.name, req.mode, req.run, req.checkpoint,
                req.ordinal, False, "in_doubt", 1, loads(req.args_raw), digest,
                idempotent=req.idempotent, created_at=now, updated_at=now,
                keyed=req.keyed)
        else:
            entry = entry.replace(status="in_doubt", attempts=entry.attempts + 1)
        failpoints.hit("effect_before_intent")
        try:
            entry = yield _Write(entry, stored)
        except EffectRace as race:
            raise _Raced(race.found) from None
        failpoints.hit("effect_after_intent")
        try:
            result = yield _Call(self._context(req, entry, entry.attempts))
        except Exception as exc:
            failpoints.hit("after_effect_call")
            yield from self._outcome(entry.replace(status="failed", error=_describe(exc)), entry)
            raise _FnFailed(exc) from exc
        _refuse_awaitable(result, req, "fn")
        failpoints.hit("after_effect_call")
        try:
            done = yield from self._outcome(entry.replace(status="done", result=result,
                                                          error=None), entry)
        except UnencodableValueError as exc:
            # The call happened; its result cannot be kept. Record that, loudly.
            yield from self._outcome(entry.replace(status="failed", error=_describe(exc)), entry)
            raise
        failpoints.hit("effect_after_outcome")
        return done.result

    def _archive(self, entry: EffectRecord) -> _Steps:
        """Keep a retired entry under an archive key before its key is reused."""
        akey = archive_key(entry.key, entry.updated_at, entry.attempts)
        there = yield _Read(akey)  # a crash after archiving leaves it there already
        yield _Write(entry.replace(
            key=akey, effect_id=effect_id_for(akey), ordinal=None, retired_from=entry.key,
            updated_at=entry.updated_at), there)

    def _outcome(self, entry: EffectRecord, intent: EffectRecord
                 ) -> Generator[_Op, Any, EffectRecord]:
        """Record the outcome of a call that happened (over ``intent``, as stored).

        A store failure, or another writer's entry where the intent was,
        leaves the entry in doubt.
        """
        try:
            recorded: EffectRecord = yield _Write(entry, intent)
            return recorded
        except EffectRace as exc:
            raise EffectInDoubtError(
                entry.effect_id, entry.key,
                f"effect {entry.name!r} ({entry.effect_id}) was called, but another writer "
                f"changed its entry meanwhile ({exc}), so its outcome was not recorded; it "
                "stays in doubt. Check the downstream and settle it with "
                "store.resolve_effect.") from None
        except (DiskFullError, DurabilityError, StoreClosedError) as exc:
            raise EffectInDoubtError(
                entry.effect_id, entry.key,
                f"effect {entry.name!r} ({entry.effect_id}) was called, but its outcome "
                f"could not be recorded ({exc}); it stays in doubt. Fix the store, then "
                "check the downstream and settle it with store.resolve_effect.") from exc

    def _context(self, req: Request, entry: EffectRecord, attempt: int) -> EffectContext:
        return EffectContext(entry.key, entry.effect_id, entry.run, attempt,
                             loads(req.args_raw), entry.name, entry.mode, req.fencing_token)

    # -- the outbox ---------------------------------------------------------------

    def dispatch(self, handlers: dict[str, Callable[[EffectContext], Any]], *,
                 probes: dict[str, Callable[[EffectContext], Any]] | None = None,
                 run: str | None = None, limit: int | None = None,
                 tokens: dict[str, int] | None = None,
                 fences: dict[str, object] | None = None) -> DispatchReport:
        """Run committed outbox entries in commit order (see ``Store.dispatch``).

        ``tokens`` maps a run to the lease epoch its entries are dispatched
        under (PostgreSQL), handed to the handlers as ``ctx.fencing_token``;
        ``fences`` maps a run to what its entries' ledger writes are fenced by
        (:attr:`Request.fence`).
        """
        tokens = tokens or {}
        fences = fences or {}
        probes = probes or {}
        report = DispatchReport()
        held: dict[str, str] = {}  # run -> why its later entries wait
        count = 0
        for entry in self.store.outbox():
            if run is not None and entry.run != run:
                continue
            if limit is not None and count >= limit:
                break
            count += 1
            eid = entry.effect_id
            if entry.run in held:
                report.skipped.append((eid, held[entry.run]))
                continue
            handler = handlers.get(entry.name)
            probe = probes.get(entry.name)
            why = None
            if handler is None:
                why = f"no handler for {entry.name!r}"
            elif (entry.mode is EffectMode.EXACTLY_ONCE and probe is None
                  and not entry.idempotent):
                why = (f"{entry.name!r} is exactly_once: give a probe (probes=) or defer it "
                       "with idempotent=True")
            if why is not None:
                report.skipped.append((eid, why))
                held[entry.run] = f"waits for {eid} ({why})"
                continue
            assert handler is not None
            req = Request(entry.name, handler, entry.mode, encode_value("args", entry.args),
                          entry.key, entry.run, entry.checkpoint, None, probe,
                          entry.idempotent, digest=entry.args_digest,
                          fencing_token=tokens.get(entry.run), fence=fences.get(entry.run))
            try:
                with self._locked(("key", entry.key)):
                    self._drive(req, self.store.effect(entry.key))
                report.done.append(eid)
            except (EffectInDoubtError, EffectNotAppliedError) as exc:
                report.in_doubt.append((eid, str(exc)))
                held[entry.run] = f"waits for {eid} (in doubt)"
            except (DiskFullError, DurabilityError, StoreClosedError, CorruptionError):
                raise  # the store failed, not the handler
            except Exception as exc:
                report.failed.append((eid, _describe(exc)))
                held[entry.run] = f"waits for {eid} (failed)"
        return report

    # -- settling -----------------------------------------------------------------

    def resolve(self, effect_id: str, *, result: Any, not_applied: bool,
                by: str | None) -> EffectRecord:
        """Settle an unsettled entry by hand (see ``Store.resolve_effect``)."""

        def settle(entry: EffectRecord) -> EffectRecord:
            if entry.status in ("done", "resolved", "retired") or (
                    entry.status == "not_applied" and not_applied):
                raise EffectSettledError(effect_id, entry.status)
            if not_applied:
                return entry.replace(status="not_applied", resolved_by=by or _who(),
                                     resolved_at=time.time())
            encode_value(f"result of effect {entry.name!r}", result)
            return entry.replace(status="resolved", result=result, resolved_by=by or _who(),
                                 resolved_at=time.time())

        return self._settle(effect_id, settle)

    def retire(self, effect_id: str, *, by: str | None) -> EffectRecord:
        """Set an entry aside, keeping it as history (see ``Store.retire_effect``)."""

        def set_aside(entry: EffectRecord) -> EffectRecord:
            if entry.status == "retired":
                raise EffectNotRetirableError(effect_id, "it is retired already")
            if entry.deferred:
                raise EffectNotRetirableError(
                    effect_id, "it is an outbox entry (txn.defer), which holds no step's "
                    "position. Settle it with store.resolve_effect(effect_id, result=...) or "
                    "(effect_id, not_applied=True) instead")
            return entry.replace(status="retired", retired_status=entry.status,
                                 resolved_by=by or _who(), resolved_at=time.time())

        return self._settle(effect_id, set_aside)

    def _settle(self, effect_id: str, change: Callable[[EffectRecord], EffectRecord]
                ) -> EffectRecord:
        """Write ``change(entry)`` over the entry with ``effect_id``, under its key's lock.

        The write expects the entry just read; if another writer changed it
        in between, read it again and decide again.
        """
        entry = self.find(effect_id)
        with self._locked(("key", entry.key)):
            while True:
                stored = self.store.effect(entry.key)
                new = change(stored or entry)
                if new.ordinal is not None and not self._holds_position(new):
                    # Its run was deleted (delete_run freed the position, and a run made
                    # again under the id may use it): written back without a position.
                    new = new.replace(ordinal=None)
                try:
                    return self.store.record_effect(new, expect=stored)
                except EffectRace:
                    continue

    def _holds_position(self, entry: EffectRecord) -> bool:
        """True if ``entry``'s position is still its own (or shared only with retired ones)."""
        assert entry.ordinal is not None
        there = self.store.effect_at(entry.run, entry.checkpoint, entry.ordinal)
        if there is None or there == entry.key:
            return there is not None
        other = self.store.effect(there)
        return other is not None and other.status == "retired"

    def find(self, effect_id: str) -> EffectRecord:
        """The entry with ``effect_id``; :class:`EffectNotFoundError` if none."""
        if not isinstance(effect_id, str):
            raise TypeError("effect_id must be str")
        for e in self.store.effects():
            if e.effect_id == effect_id:
                return e
        raise EffectNotFoundError(effect_id)


def _diverged(entry: EffectRecord, req: Request, digest: str) -> str:
    what = []
    if entry.name != req.name:
        what.append(f"name {entry.name!r} -> {req.name!r}")
    if entry.args_digest != digest:
        what.append("different args")
    if entry.mode != req.mode:
        what.append(f"mode {entry.mode.value} -> {req.mode.value}")
    recorded = f"recorded {entry.name!r} ({entry.mode.value}) with args {_brief(entry.args)}"
    asked = f"asked {req.name!r} ({req.mode.value}) with args {_brief(loads(req.args_raw))}"
    return (f"effect {entry.effect_id} (key {entry.key!r}) was recorded with other inputs "
            f"({', '.join(what)}: {recorded}; {asked}); nothing was called. Re-run the step "
            "with the same inputs; if its code changed on purpose, set the recorded effect "
            "aside with store.retire_effect(effect_id) (`agentwal retire`), which keeps it as "
            "history and frees its position; a business key= must name one request.")


def _brief(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _in_doubt(entry: EffectRecord) -> str:
    last = f"; last error: {entry.error}" if entry.error else ""
    return (f"effect {entry.name!r} ({entry.effect_id}, key {entry.key!r}, {entry.mode.value}) "
            f"is in doubt after {entry.attempts} attempt(s){last}: it may or may not have "
            "reached the downstream, and its mode forbids calling it again blindly. Check the "
            "downstream, then store.resolve_effect(effect_id, result=...) or "
            "(effect_id, not_applied=True).")
