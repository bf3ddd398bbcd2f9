"""The store facade: the public API of a local store, checked and delegated.

Theory of operation: :class:`Store` is what ``agentwal.open`` returns. Each
public method checks its arguments (a bad one raises a typed error and
changes nothing), carries the contract in its docstring, and delegates the
work to the embedded engine (``agentwal.local.engine.Engine``: views, the
commit pipeline, folds, retention, blobs, the ledger's storage, verify,
backup). What is the same for every backend stays here: decoding stored
values, a rollback's or fork's ``effects_after``, the effects listing's
filter and ``transact``'s retry loop.

The engine is imported when a store is opened, not when this module is: the
facade depends on the backend seam, not on the engine's modules
(``tests/unit/test_layout.py`` holds it to that). A :class:`Transaction`
from ``begin`` reads and commits through the engine's ``backend.RunStore``
(``engine.backend``) and reaches the rest of it (effects, blobs) through
the hooks ``txn.StepHooks`` names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import inspect
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from . import aio, failpoints
from .codec import DecodedValues, decode_stored
from .effects import STATUSES, EffectContext, EffectMode, EffectRecord, effects_after
from .errors import ConflictError, ReadOnlyError, TreePathError
from .format import DEFAULT_SEGMENT_BYTES, FIRST_SEGMENT_BYTES, MIN_SEGMENT_BYTES
from .io import FileSystem, OsFileSystem
from .ledger import DispatchReport, Request
from .retention import CompactReport, Policy, check_args, policy_args
from .tree import split_relpath
from .txn import Begin, Transaction, check_effect_args, check_retry_of
from .types import (
    Checkpoint,
    Diff,
    Durability,
    Progress,
    TreeDiff,
    TreeFile,
    check_checkpoint_id,
    check_key,
)

if TYPE_CHECKING:
    from .local.backup import BackupReport
    from .local.blobs import BlobReader
    from .local.engine import Engine
    from .local.recovery import Lost
    from .local.verify import VerifyReport
    from .treeio import RestoreReport

__all__ = ["Store", "open"]

_UNSET: Any = object()
T = TypeVar("T")
#: ``_checkpoint_id(cid)``: ``cid`` if it can be a checkpoint id, else TypeError
_checkpoint_id = check_checkpoint_id

def open(
    path: str | os.PathLike[str],
    *,
    durability: Durability | str = Durability.SYNC,
    readonly: bool = False,
    wal_max_bytes: int = 64 << 20,
    fs: FileSystem | None = None,
    sync_interval: float = 0.1,
    segment_bytes: int | None = None,
    map_size: int | None = None,
    effect_retention: datetime.timedelta | None = datetime.timedelta(days=30),
    retain: Policy | tuple[Policy, ...] | None = None,
    recover: str | None = None,
) -> Store:
    """Open (or create) the store in directory ``path`` and recover it.

    Args:
        path: the store directory; created if missing (unless ``readonly``).
        durability: ``"sync"`` (default), ``"async"`` or ``"none"``.
        readonly: open without the writer lock; sees the committed state as of
            the open (or the last ``refresh()``); writes raise ``ReadOnlyError``.
        wal_max_bytes: fold the log into LMDB once it holds this many bytes.
        fs: the file system for the WAL and control file (default: the OS).
        sync_interval: seconds between background syncs in ``async`` mode.
        segment_bytes: size of each preallocated WAL segment (default: the
            first 64 KiB, each next one twice the last, up to a quarter of
            ``wal_max_bytes``, at most 16 MiB).
        map_size: initial LMDB map size (address space, not disk; default
            twice the snapshot file, at least 64 MiB). A full map is doubled
            when no read is open.
        effect_retention: how long settled effects-ledger entries (done,
            resolved, not applied) are kept after their last update, so their
            keys still dedup (default 30 days; None keeps them forever).
            Entries in doubt, failed or pending are never dropped.
        retain: an automatic retention policy, ``agentwal.KeepLast(n)``,
            ``agentwal.KeepFor(timedelta)`` or a tuple of both (a checkpoint
            either keeps is kept), applied (``compact(keep_last=...,
            older_than=...)``, never ``vacuum``) at ``close()``, at
            ``snapshot()``, and by the fold thread after 1000 commits or a
            minute since its last pass. None (default): history is kept
            until ``compact()`` is called.
        recover: ``"prefix"`` opens a damaged store read-only up to the last
            intact record before the damage in its log, instead of raising
            ``CorruptionError``; ``store.lost`` then says what could not be
            read (None: nothing). Damage to LMDB itself still raises.

    Returns:
        An open :class:`Store` (also a context manager).

    Raises:
        StoreLockedError: another process has it open for writing.
        StoreNotFoundError: ``readonly`` and there is no store at ``path``, or
            the parent directory of ``path`` does not exist.
        NotAStoreError: ``path`` is a file, or a directory of other files
            (never turned into a store).
        CorruptionError: a file of the store is damaged, or the log lacks
            records LOGMARK says were acknowledged; nothing was changed.
        StoreLimitError: no address space or file descriptor left.
        DiskFullError: no space to create the store or repair the log.
        DurabilityError: an I/O error (a failed write or fsync) while opening.
        ValueError: a bad argument.

    Example::

        with agentwal.open("state.awal") as store:
            with store.begin("run-1") as txn:
                txn["step"] = 1
    """
    mode = Durability(durability)
    if wal_max_bytes < MIN_SEGMENT_BYTES:
        raise ValueError(f"wal_max_bytes must be at least {MIN_SEGMENT_BYTES}")
    if sync_interval <= 0:
        raise ValueError("sync_interval must be positive")
    first_segment = segment_bytes
    if segment_bytes is None:
        segment_bytes = max(MIN_SEGMENT_BYTES * 16, min(DEFAULT_SEGMENT_BYTES, wal_max_bytes // 4))
        first_segment = FIRST_SEGMENT_BYTES
    if segment_bytes < MIN_SEGMENT_BYTES:
        raise ValueError(f"segment_bytes must be at least {MIN_SEGMENT_BYTES}")
    if effect_retention is not None and effect_retention.total_seconds() < 0:
        raise ValueError("effect_retention must not be negative")
    keep_last, older_than = policy_args(retain)
    if recover not in (None, "prefix"):
        raise ValueError(f"recover must be None or 'prefix', not {recover!r}")
    if recover is not None:
        if retain is not None:
            raise ValueError("recover='prefix' opens read-only: no retain=")
        readonly = True
    if readonly and retain is not None:
        raise ValueError("retain= needs a writable store (readonly=False)")
    from .local.engine import open_engine  # the engine loads with the first store

    engine = open_engine(os.fspath(path), mode, readonly=readonly, wal_max_bytes=wal_max_bytes,
                         fs=fs or OsFileSystem(), sync_interval=sync_interval,
                         segment_bytes=segment_bytes, map_size=map_size,
                         effect_retention=None if effect_retention is None
                         else effect_retention.total_seconds(),
                         retain=None if retain is None else (keep_last, older_than),
                         first_segment_bytes=first_segment, recover_prefix=recover == "prefix")
    return Store(engine)


class _StepAttempts:
    """The bookkeeping of ``transact``/``atransact``: one step's attempts, one at a time."""

    def __init__(self, store: Store, run: str, fn: object, retries: int) -> None:
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
        if txn.state == "committed" or self.attempt > self.retries:
            raise exc
        self.store._engine.counters["retries"] += 1
        failpoints.hit("step_before_retry")
        self.prev = txn
        return random.random() * min(0.001 * 2.0 ** (self.attempt - 1), 0.05)

    @staticmethod
    def abort(txn: Transaction) -> None:
        """Any other exception: roll the attempt back (the caller re-raises)."""
        if txn.state == "active":
            txn.rollback()


class Store:
    """An open agentwal store. Get one from :func:`agentwal.open`; share it between threads."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.path = engine.path
        self.durability = engine.durability
        self.readonly = engine.readonly
        self.wal_max_bytes = engine.wal_max_bytes
        #: small values lately read, decoded (``get``): a repeated read skips CBOR
        self._decoded = DecodedValues()

    @property
    def store_id(self) -> Any:
        """The store's identity (a UUID, from its CONTROL file)."""
        return self._engine.store_id

    @property
    def lost(self) -> Lost | None:
        """With ``open(recover="prefix")``: what the log holds past its intact prefix.

        A ``Lost`` (``first_lsn``, ``last_lsn``, ``where``, ``reason``,
        ``checkpoints`` found intact after the damage, ``effects``), or None
        when the log read to its end (and always for other opens).
        """
        return self._engine.lost

    # -- transactions ---------------------------------------------------------------

    def begin(self, run: str, *, retry_of: Transaction | None = None) -> Transaction:
        """Begin a write transaction on ``run`` (created by its first commit).

        The transaction reads a consistent snapshot taken now; use it as a
        context manager (commit on clean exit, roll back on exception) or call
        ``commit()`` / ``rollback()``.

        Args:
            run: the run id.
            retry_of: the transaction of an earlier attempt of the same step
                that did not commit (it raised ``ConflictError``, or was rolled
                back): the new transaction reads the run as it is now, but its
                effects are positioned where that attempt's were, so they meet
                what it recorded (results reused, never a second call under a
                new key). ``store.transact`` does this for you.

        Raises:
            InvalidKeyError: ``run`` is not a valid id.
            ValueError: ``retry_of`` is still active, committed, of another
                run or of another store. TypeError: it is not a Transaction.
            ReadOnlyError: the store is read-only.
            StoreClosedError: the store is closed.

        Example::

            txn = store.begin("run-42")
            while True:
                try:
                    with txn:
                        step(txn)
                    break
                except agentwal.ConflictError:
                    txn = store.begin("run-42", retry_of=txn)
        """
        check_key(run, "run id")
        self._engine.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        backend = self._engine.backend
        if retry_of is not None:
            check_retry_of(retry_of, backend, run)
        return Transaction(backend, backend.begin(run), self._engine, retry_of=retry_of)

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

    # -- durability and folding -----------------------------------------------------

    def sync(self) -> None:
        """Make every acknowledged commit durable now (a no-op in ``sync`` mode).

        Raises:
            DurabilityError: the fsync failed; the store accepts no more commits.
        """
        self._engine.sync()

    def snapshot(self) -> None:
        """Fold the WAL into LMDB now and remove the segments it covers.

        Raises:
            ReadOnlyError: the store is read-only.
            DiskFullError: LMDB had no room; the WAL still holds everything and
                the store keeps working (the next fold tries again).
            DurabilityError: LMDB's write or sync failed; the WAL still holds
                everything, but the store accepts no more commits until reopened.
        """
        self._engine.snapshot()

    # -- reads ----------------------------------------------------------------------

    def get(self, run: str, key: str, default: Any = None, *, at: int | None = None) -> Any:
        """The value of ``key`` in ``run`` (latest, or at checkpoint ``at``), or ``default``.

        Args:
            run: the run id.
            key: the key.
            default: returned when the key is absent (at that checkpoint).
            at: a checkpoint id of the run; None reads the latest commit.

        Raises:
            InvalidKeyError: bad run id or key. CorruptionError: damaged value.
            RunNotFoundError: ``at`` is given and the run has no checkpoint.
            CheckpointNotFoundError: the run has no checkpoint ``at``.

        Example::

            plan_then = store.get("run-42", "plan", at=3)
        """
        check_key(run, "run id")
        check_key(key)
        if at is not None:
            raw = self._engine.runs.value(run, key, _checkpoint_id(at))
            return default if raw is None else decode_stored(raw, self.path, f"{run!r}/{key!r}")
        raw = self._engine.runs.value(run, key, None)
        return default if raw is None else self._decoded.decode(run, key, raw, self.path)

    def state(self, run: str, *, at: int | None = None) -> dict[str, Any]:
        """The run's state as a new dict: the latest, or as of checkpoint ``at``.

        Any checkpoint can be read, folded or not; a folded one is rebuilt
        from one manifest and at most ``history.MANIFEST_EVERY - 1`` deltas.

        Raises:
            RunNotFoundError: the run has no checkpoint.
            CheckpointNotFoundError: the run has no checkpoint ``at``.
            CorruptionError: a record needed is damaged.

        Example::

            before = store.state("run-42", at=7)
        """
        check_key(run, "run id")
        raw = self._engine.runs.state_raw(run, None if at is None else _checkpoint_id(at))
        return {k: decode_stored(b, self.path, f"{run!r}/{k!r}")
                for k, b in sorted(raw.items()) if b is not None}

    def head(self, run: str) -> Checkpoint | None:
        """The run's latest checkpoint, or None if it has none."""
        check_key(run, "run id")
        return self._engine.runs.head(run)

    def history(self, run: str, *, limit: int | None = None,
                before: int | None = None) -> list[Checkpoint]:
        """The run's checkpoints, newest first (at most ``limit``; ids below ``before``).

        Args:
            run: the run id (an unknown run has no history: ``[]``).
            limit: at most this many.
            before: a checkpoint id of the run: only older checkpoints (to page
                back: ``before=page[-1].id``); one compaction dropped is fine.

        Raises:
            RunNotFoundError / CheckpointNotFoundError: ``before`` is not an id
                between 1 and the run's head.
            ValueError: a negative ``limit``.

        Example::

            page = store.history("run-42", limit=20)
            older = store.history("run-42", limit=20, before=page[-1].id)
        """
        check_key(run, "run id")
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        upto = None if before is None else _checkpoint_id(before)
        return self._engine.runs.history(run, limit, upto)

    def diff(self, run: str, a: int, b: int) -> Diff:
        """What changed in ``run`` from checkpoint ``a`` to checkpoint ``b``.

        Returns:
            A :class:`Diff`: keys added, removed and changed (values decoded;
            ``changed[key] == (value at a, value at b)``). ``a`` may be newer
            than ``b``; the diff then reads backwards.

        Raises:
            RunNotFoundError: no such run.
            CheckpointNotFoundError: ``a`` or ``b`` is not a checkpoint of the run.

        Example::

            d = store.diff("run-42", 5, 9)
            print(sorted(d.changed))
        """
        check_key(run, "run id")
        return self._engine.runs.diff(run, _checkpoint_id(a), _checkpoint_id(b))

    # -- writes beside transactions -------------------------------------------------

    def rollback_to(self, run: str, checkpoint: int) -> Checkpoint:
        """Make a new checkpoint whose state equals the state at ``checkpoint``.

        The new checkpoint's parent is the run's head (history is kept) and
        its metadata is ``{"rollback_to": checkpoint}``. It is an ordinary
        commit: durable as the store's mode says, and visible once it returns.

        State is restored; the world is not. The returned checkpoint's
        ``effects_after`` lists the effects made after ``checkpoint`` that the
        outside world may still hold; steps re-run from the new checkpoint
        meet new effect keys and call again, unless they use a business
        ``key=`` (see ``docs/effects.md``).

        Raises:
            RunNotFoundError / CheckpointNotFoundError: no such run or checkpoint.
            ConflictError: a commit on the run raced this one; nothing was
                applied, call it again.
            ReadOnlyError, DiskFullError, DurabilityError: as for a commit.

        Example::

            store.rollback_to("run-42", 7)
            assert store.state("run-42") == store.state("run-42", at=7)
        """
        check_key(run, "run id")
        cid = _checkpoint_id(checkpoint)
        ckpt = self._engine.runs.rollback_to(run, cid)
        return dataclasses.replace(ckpt, effects_after=self._effects_after(run, cid))

    def fork(self, run: str, checkpoint: int, new_run: str) -> Checkpoint:
        """Start ``new_run`` from the state of ``run`` at ``checkpoint``.

        The new run's first checkpoint (id 1, no parent) has
        ``origin == (run, checkpoint)`` and that state; from then on the two
        runs are independent. A fork waits for a fold, compaction, ``verify``
        or ``backup`` in progress, so a compaction (which keeps every fork's
        origin by default) always sees it.

        Returns:
            The new run's first checkpoint; its ``effects_after`` lists the
            source run's effects made after ``checkpoint`` that the outside
            world may still hold (the fork's steps meet new effect keys).

        Raises:
            RunNotFoundError / CheckpointNotFoundError: no such run or checkpoint.
            RunExistsError: ``new_run`` already has a checkpoint.
            InvalidKeyError: a bad run id.
            ReadOnlyError, DiskFullError, DurabilityError: as for a commit.

        Example::

            store.fork("run-42", 7, "run-42-b")
        """
        check_key(run, "run id")
        check_key(new_run, "run id")
        cid = _checkpoint_id(checkpoint)
        ckpt = self._engine.runs.fork(run, cid, new_run)
        return dataclasses.replace(ckpt, effects_after=self._effects_after(run, cid))

    # -- deletion and retention -----------------------------------------------------

    def delete_run(self, run: str) -> None:
        """Delete ``run``: its state, checkpoints and history, durably.

        When it returns the deletion is on disk (its WAL record is fsynced in
        every durability mode) and the run is gone for every read: ``head``
        is None, ``state``/``get(at=)``/``diff`` raise ``RunNotFoundError``,
        ``history`` is empty and ``runs()`` does not list it. A transaction
        on the run begun before the deletion cannot commit
        (``ConflictError``). The next fold removes the run from LMDB and frees
        the history objects only it used (the fold thread is woken for it).
        A commit to the same id afterwards starts a new run at checkpoint 1.

        Not deleted: the run's effects-ledger entries (the outside world saw
        those effects; committed outbox entries are still dispatched, settle
        them with ``resolve_effect`` to cancel them), and runs forked from it
        (their state is their own; their ``origin`` keeps naming this run).

        Raises:
            RunNotFoundError: the run has no checkpoint.
            InvalidKeyError: a bad run id.
            ReadOnlyError, StoreClosedError, DiskFullError, DurabilityError: as
                for a commit (nothing deleted).

        Example::

            store.delete_run("run-42")
            assert store.head("run-42") is None
        """
        check_key(run, "run id")
        self._engine.runs.delete_run(run)

    def compact(self, *, keep_last: int | None = None,
                older_than: datetime.timedelta | None = None,
                runs: list[str] | tuple[str, ...] | set[str] | None = None,
                vacuum: bool = False, keep_fork_origins: bool = True,
                progress: Progress | None = None) -> CompactReport:
        """Drop old checkpoints and free the history only they used.

        Per run (every run, or those in ``runs``) the checkpoints kept are:
        the head; the last ``keep_last`` ids; those younger than
        ``older_than``; and, with ``keep_fork_origins``, every checkpoint a
        fork's ``origin`` names. With both ``keep_last`` and ``older_than`` a
        checkpoint either keeps is kept; with neither, nothing is dropped.
        Dropped checkpoints then raise ``CheckpointNotFoundError`` from
        ``state(at=)``, ``get(at=)``, ``diff``, ``rollback_to`` and ``fork``,
        and ``history()`` lists only the kept ones. Kept ones read as before:
        where a kept checkpoint follows a dropped one a new manifest is
        written for it first, and its record keeps the dropped parent's hash.

        The WAL is folded first; then one LMDB write transaction drops
        everything (a crash leaves all of it or none). Commits continue
        meanwhile (they are newer than what is dropped). ``vacuum=True`` then
        rewrites the LMDB file compactly so it shrinks on disk: reads and
        commits of this process wait for the file swap (milliseconds), after
        the reads already open have finished (at most 10 s; otherwise
        ``StoreBusyError`` and no vacuum). A vacuum is refused
        (``StoreBusyError``) while another process has the store open (a
        read-only store maps the file being replaced) or another store of
        this process shares it.

        Args:
            keep_last: keep each run's last ``keep_last`` checkpoints (>= 1).
            older_than: drop only checkpoints older than this ``timedelta``.
            runs: compact only these runs (default: all).
            vacuum: also shrink the LMDB file.
            keep_fork_origins: never drop a checkpoint a fork started from.
            progress: ``progress(phase, done, total)``, called in this thread
                as the work goes: ``("fold", 0|1, 1)``, ``("runs", runs done,
                runs)``, then with ``vacuum`` ``("vacuum: LMDB copy and swap", 0|1, 1)``. It runs
                while the store holds its fold lock: keep it quick and do not
                call the store from it; what it raises propagates.

        Returns:
            A :class:`CompactReport` (checkpoints dropped, bytes of LMDB
            values freed, per-run counts, file size before and after).

        Raises:
            RunNotFoundError: a run in ``runs`` does not exist.
            TypeError / ValueError: a bad argument.
            StoreBusyError: ``vacuum`` could not get the file to itself (the
                compaction is done; call again with ``vacuum=True``).
            ReadOnlyError, StoreClosedError, DiskFullError, DurabilityError,
            CorruptionError: as for ``snapshot()``; nothing was dropped (except
                when ``vacuum``'s copy raised them: the compaction is done, the
                file is as it was).

        Example::

            report = store.compact(keep_last=100, vacuum=True)
            print(report.checkpoints_dropped, report.bytes_freed)
        """
        self._engine.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        check_args(keep_last, older_than)
        selected: list[str] | None = None
        if runs is not None:
            if isinstance(runs, str):
                raise TypeError("runs is a list of run ids, not one str")
            selected = sorted({check_key(r, "run id") for r in runs})
        return self._engine.maintenance.compact(selected, keep_last, older_than, vacuum,
                                               keep_fork_origins, progress)

    def copy_runs(self, dest: Any, runs: Any = None, *, progress: Progress | None = None) -> Any:
        """Copy ``runs`` (default all) with their history and ledger into store ``dest``.

        Either store may be local or PostgreSQL: see :func:`agentwal.transfer.copy_runs`.
        ``progress`` is told ``("checkpoints", copied, total)`` as it goes.
        """
        from .transfer import copy_runs

        return copy_runs(self, dest, runs, progress=progress)

    def runs(self) -> list[str]:
        """Every run id with at least one checkpoint, sorted."""
        return self._engine.runs.names()

    def refresh(self) -> None:
        """Read-only stores: catch up with what the writer has committed since."""
        self._engine.refresh()

    # -- blobs and trees ------------------------------------------------------------

    def open_blob(self, run: str, key: str, *, at: int | None = None,
                  verify: bool = True) -> BlobReader:
        """A read-only binary stream of the blob ``key`` holds (latest, or at checkpoint ``at``).

        The file's size is checked now; with ``verify`` (the default), reading
        it to the end also checks its SHA-256 against the reference, and the
        read that reaches the end raises ``CorruptionError`` on a mismatch
        (``reader.verify()`` checks the whole file at any time).

        Args:
            run: the run id.
            key: a key whose value was stored with ``txn.put_blob``.
            at: a checkpoint id of the run; None reads the latest commit.
            verify: check the content's SHA-256 as it is read to the end.

        Returns:
            A :class:`~agentwal.local.blobs.BlobReader` (a ``io.RawIOBase``; ``.ref``
            is the BlobRef); close it, or use it as a context manager.

        Raises:
            RunNotFoundError: the run has no checkpoint.
            CheckpointNotFoundError: the run has no checkpoint ``at``.
            MissingKeyError: the key has no value (at that checkpoint).
            NotABlobError: the value was not stored with ``put_blob`` (also a
                ``TypeError``); read it with ``get``.
            CorruptionError: the blob file is missing or has the wrong size
                (or, while reading, the wrong content), or the reference is damaged.
            InvalidKeyError, StoreClosedError.

        Example::

            with store.open_blob("train", "weights", at=12) as f:
                shutil.copyfileobj(f, out)
        """
        return self._engine.blobrefs.open_blob(run, key, at, verify)

    def restore_tree(self, run: str, key: str, dest: str | os.PathLike[str], *,
                     at: int | None = None) -> RestoreReport:
        """Make directory ``dest`` exactly the tree ``key`` holds (latest, or at checkpoint ``at``).

        Changed files are written atomically (temp file, fsync, rename) with
        their permission bits; links are recreated as links; entries the tree
        lacks are removed, except paths its exclude rules match and the
        store's own directory. No link on disk is ever followed, and a tree
        holding a name that could escape ``dest`` is refused before anything
        is written. A restore interrupted by a crash (or an error) is
        finished by running it again.

        Args:
            run: the run id.
            key: a key whose value was stored with ``txn.put_tree``.
            dest: the directory to restore into (created if missing).
            at: a checkpoint id of the run; None restores the latest commit's tree.

        Returns:
            A :class:`~agentwal.treeio.RestoreReport` (files written, removed, unchanged).

        Raises:
            RunNotFoundError, CheckpointNotFoundError, MissingKeyError.
            NotATreeError: the value was not stored with ``put_tree``.
            UnsafeTreeError: the stored tree could escape ``dest``; nothing written.
            CorruptionError: a tree object or file is missing or damaged.
            RestoreError, DiskFullError: ``dest`` cannot be written; run again once fixed.
            InvalidKeyError, StoreClosedError.

        Example::

            store.restore_tree("agent", "workspace", "repo/", at=12)
        """
        self._engine.check_open()
        return self._engine.blobrefs.restore_tree(run, key, dest, at)

    def open_tree_file(self, run: str, key: str, relpath: str, *,
                       at: int | None = None) -> BlobReader:
        """A read-only binary stream of one file of the tree ``key`` holds.

        Args:
            run: the run id.
            key: a key whose value was stored with ``txn.put_tree``.
            relpath: the file's path from the tree's root, ``/``-separated.
            at: a checkpoint id of the run; None reads the latest commit.

        Returns:
            A :class:`~agentwal.local.blobs.BlobReader`, checked against the file's
            SHA-256 as it is read to the end.

        Raises:
            TreePathError: ``relpath`` is not a regular file of the tree.
            NotATreeError, RunNotFoundError, CheckpointNotFoundError,
            MissingKeyError, CorruptionError, InvalidKeyError, StoreClosedError.

        Example::

            with store.open_tree_file("agent", "workspace", "src/app.py", at=3) as f:
                old = f.read().decode()
        """
        self._engine.check_open()
        try:
            parts = split_relpath(relpath)
        except ValueError as exc:
            raise TreePathError(str(relpath), f"is not a path inside a tree ({exc})") from None
        return self._engine.blobrefs.open_tree_file(run, key, relpath, parts, at)

    def list_tree(self, run: str, key: str, *, at: int | None = None) -> list[TreeFile]:
        """Every file and link of the tree ``key`` holds (latest, or at checkpoint ``at``).

        Returns:
            :class:`~agentwal.TreeFile` s sorted by path (directories are implied).

        Raises:
            NotATreeError, RunNotFoundError, CheckpointNotFoundError,
            MissingKeyError, CorruptionError, InvalidKeyError, StoreClosedError.

        Example::

            for f in store.list_tree("agent", "workspace"):
                print(f.path, f.size)
        """
        self._engine.check_open()
        return self._engine.blobrefs.list_tree(run, key, at)

    def _tree_status(self, run: str, key: str, path: str | os.PathLike[str],
                     exclude: Any) -> TreeDiff:
        """What differs on disk at ``path`` from the run's latest tree at ``key`` (Workspace)."""
        return self._engine.blobrefs.tree_status(run, key, path, exclude)

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
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {list(STATUSES)}, not {status!r}")
        if run is not None:
            check_key(run, "run id")
        found = self._engine.effectlog.entries() if run is None and status is None else \
            self._engine.effectlog.query(run, status)
        return [e for e in sorted(found, key=lambda e: (e.created_at, e.order or (0, 0), e.key))
                if (run is None or e.run == run) and (status is None or e.status == status)]

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

        Raises:
            What ``txn.effect`` raises; ReadOnlyError, StoreClosedError.

        Example::

            receipt = store.effect("thread-7", "charge", charge, key=f"charge/{task_id}",
                                   mode="exactly_once", idempotent=True)
        """
        req = self._standalone(run, name, fn, key=key, mode=mode, args=args, probe=probe,
                               idempotent=idempotent, retries=retries, retry_on=retry_on,
                               backoff=backoff, allow_async=False)
        return self._engine.ledger.run(req)

    async def aeffect(self, run: str, name: str, fn: Callable[[EffectContext], Any], *,
                      key: str, mode: EffectMode | str, args: Any = None,
                      probe: Callable[[EffectContext], Any] | None = None,
                      idempotent: bool = False, retries: int = 0,
                      retry_on: tuple[type[BaseException], ...] = (ConnectionError,
                                                                   TimeoutError),
                      backoff: float = 0.1) -> Any:
        """:meth:`effect` for asyncio (``fn`` and ``probe`` may be coroutine functions;
        ledger reads and writes run off the event loop, as for ``txn.aeffect``)."""
        return await self._engine.ledger.arun(self._standalone(
            run, name, fn, key=key, mode=mode, args=args, probe=probe, idempotent=idempotent,
            retries=retries, retry_on=retry_on, backoff=backoff, allow_async=True))

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
        if not isinstance(key, str):
            raise TypeError("store.effect needs key=, a business key (str): with no "
                            "transaction there is no position to derive one from")
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

    # -- verify, backup, stats, closing ---------------------------------------------

    def verify(self, *, progress: Progress | None = None) -> VerifyReport:
        """Recompute every checksum and hash chain and cross-check state against history.

        Reads every entry of every LMDB database (each value's CRC, its
        shape), recomputes each run's checkpoint hashes from the stored
        deltas, compares manifests and the head state (``state()``'s fast
        path) with the replayed history, recounts the references of every
        stored object, decodes the effects ledger, and reads every WAL frame
        (CRC, continuity, decoding, the hash of each commit record). Each
        problem names its place: the database and key, or the file and
        offset. The store stays usable; nothing is repaired.

        The view is consistent: a writer holds its fold lock meanwhile (no
        fold runs, commits go on), so the snapshot and the log agree; a
        read-only store reads the log first and the snapshot after, as its
        own open does. Time is proportional to every byte ever committed
        (history included): it rehashes them all.

        Args:
            progress: ``progress(phase, done, total)``, called in this thread
                as the checks go: ``("snapshot: PART", parts checked, 10)``
                (each part named as it begins: ``meta`` ... ``effects``),
                ``("log", segments, segments)``, ``("blobs", bytes, bytes)``.
                A writer holds its fold lock meanwhile: keep it quick and do
                not call the store from it; what it raises propagates.

        Returns:
            A :class:`VerifyReport` (``ok``, ``problems``, ``checked``, ``notes``).

        Raises:
            StoreClosedError: the store is closed.

        Example::

            report = store.verify()
            for p in report.problems:
                print(p.where, p.what)
        """
        return self._engine.audit.verify(progress)

    def backup(self, dest: str | os.PathLike[str], *,
               progress: Progress | None = None) -> BackupReport:
        """Write a consistent copy of the store to the new directory ``dest``.

        Works while the store is open and commits go on. The backup holds
        every commit acknowledged before ``backup()`` was called (and may
        hold some made while it runs), with its whole history and effects
        ledger, and opens as a store with the same id, state and history;
        ``blobs/`` is copied when present. It is built in ``dest + ".tmp"``,
        every file and directory fsynced, then renamed to ``dest``: a crash
        or an error never leaves a half-made backup under ``dest``.

        A writer holds its fold lock throughout (no fold runs; commits go
        on) and its log's flush lock while the segments are copied (commits
        wait that long). A read-only store copies the log first and the
        snapshot after, so a writer in another process may fold meanwhile.

        Args:
            dest: a path that does not exist (its parent is created if missing).
                The store's files are read through its file system (``fs=``);
                the backup is written to the operating system's.
            progress: ``progress(phase, done, total)``, called in this thread
                as the copy goes: ``("log", segments copied, segments)``,
                ``("snapshot: LMDB copy", 0|1, 1)`` (one C call), ``("blobs", files
                copied, None)``. Locks may be held meanwhile: keep it quick and
                do not call the store from it; what it raises propagates (and
                nothing is published at ``dest``).

        Returns:
            A :class:`BackupReport`: ``path``, ``lsn`` (every commit up to it
            is in the backup), ``files``, ``bytes``, ``seconds``.

        Raises:
            PathExistsError: ``dest`` (or a half-made ``dest.tmp``) exists.
            ValueError: ``dest`` is inside the store.
            CorruptionError: a WAL segment of the store is damaged (nothing
                is published at ``dest``).
            DiskFullError, DurabilityError: writing the copy failed (nothing
                is published at ``dest``; remove ``dest.tmp``).
            StoreClosedError: the store is closed.

        Example::

            store.backup("/backups/state-2024-05-01.awal")
            agentwal.open("/backups/state-2024-05-01.awal", readonly=True).verify()
        """
        return self._engine.audit.backup(dest, progress)

    def stats(self) -> dict[str, Any]:
        """Sizes, LSNs, counters and what the last recovery did (a new dict)."""
        return self._engine.stats()

    def close(self) -> None:
        """Flush, fold the WAL into LMDB, and release the store (idempotent).

        After ``close()`` every method raises ``StoreClosedError``; open
        transactions are dead. If the writer is broken the fold is skipped and
        the WAL keeps everything for the next open.
        """
        self._engine.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._engine.closed else ("read-only" if self.readonly else "open")
        return f"<agentwal.Store {self.path!r} {state} {self.durability.value}>"

    # -- asyncio (agentwal/aio.py) --------------------------------------------------

    def abegin(self, run: str, *, retry_of: Transaction | None = None) -> Begin:
        """:meth:`begin` for asyncio code; use as ``async with store.abegin(run) as txn:``.

        Takes the arguments of :meth:`begin` (``retry_of=`` positions a retried
        step's effects where its first attempt's were). A clean exit commits
        with ``await txn.acommit()`` (validation, write and fsync off the
        event loop); an exception rolls back and propagates.
        ``txn = await store.abegin(run)`` gives the transaction, to finish by
        hand or with ``async with txn:``. Beginning takes no I/O (a snapshot
        of memory and an LMDB read transaction), nor do ``txn.get`` and the
        other reads, so they stay synchronous.

        Raises:
            What :meth:`begin` raises, at the call.

        Example::

            async with store.abegin("run-42") as txn:
                txn["step"] = txn.get("step", 0) + 1
        """
        return Begin(self.begin(run, retry_of=retry_of))
