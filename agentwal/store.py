"""The store facade: the public API of a local store, checked and delegated.

Theory of operation: :class:`Store` is what ``agentwal.open`` returns. Each
public method checks its arguments (a bad one raises a typed error and
changes nothing), carries the contract in its docstring, and delegates the
work to the embedded engine (``agentwal.local.engine.Engine``: views, the
commit pipeline, folds, retention, blobs, the ledger's storage, verify,
backup). What is the same for every backend stays in the facade: decoding
stored values, a rollback's or fork's ``effects_after``, the effects
listing's filter and ``transact``'s retry loop (``store_steps.py``).

The class is split by concern over five modules: this one (``open``,
``begin``, durability, deletion and retention, verify, backup, stats,
closing) and the base classes it inherits, ``store_steps.py``
(``transact``, ``atransact``, ``abegin``: shared with ``PostgresStore``),
``store_history.py``
(reads at a checkpoint, history, ``diff``, ``rollback_to``, ``fork``),
``store_blobs.py`` (blobs and trees) and ``store_effects.py`` (the effects
ledger's API).

The engine is imported when a store is opened, not when this module is: the
facade depends on the backend seam, not on the engine's modules
(``tests/unit/test_layout.py`` holds it to that). A :class:`Transaction`
from ``begin`` reads and commits through the engine's ``backend.RunStore``
(``engine.backend``) and reaches the rest of it (effects, blobs) through
the hooks ``txn.StepHooks`` names.
"""

from __future__ import annotations

import datetime
import os
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from .codec import DecodedValues
from .errors import ReadOnlyError
from .format import DEFAULT_SEGMENT_BYTES, FIRST_SEGMENT_BYTES, MIN_SEGMENT_BYTES
from .io import FileSystem, OsFileSystem
from .leases import LocalLeases, default_worker_id
from .retention import CompactReport, Policy, check_args, policy_args, selected_runs
from .store_blobs import BlobsAPI
from .store_effects import EffectsAPI
from .store_history import HistoryAPI
from .store_steps import StepsAPI
from .txn import Transaction, check_retry_of
from .types import (
    Durability,
    Progress,
    check_key,
)

if TYPE_CHECKING:
    from .local.backup import BackupReport
    from .local.engine import Engine
    from .local.recovery import Lost
    from .local.verify import VerifyReport

__all__ = ["Store", "open"]

T = TypeVar("T")

#: The smallest ``map_size`` ``open`` takes (a smaller map cannot hold a new store's first
#: pages, and LMDB's "map full" there read as a full disk).
MIN_MAP_SIZE = 1 << 20


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
    worker_id: str | None = None,
) -> Store:
    """Open (or create) the store in directory ``path`` and recover it.

    Args:
        path: the store directory; created if missing (unless ``readonly``).
        durability: ``"sync"`` (default), ``"async"`` or ``"none"``.
        readonly: open without the writer lock; sees the committed state as of
            the open (or the last ``refresh()``); writes raise ``ReadOnlyError``.
        wal_max_bytes: fold the log into LMDB once it holds this many bytes (or
            the unfolded commits' values four times as many: appends log only
            their new items).
        fs: the file system for the WAL and control file (default: the OS).
        sync_interval: seconds between background syncs in ``async`` mode.
        segment_bytes: size of each preallocated WAL segment (default: the
            first 64 KiB, each next one twice the last, up to a quarter of
            ``wal_max_bytes``, at most 16 MiB).
        map_size: initial LMDB map size (address space, not disk; default
            twice the snapshot file, at least 64 MiB). A full map is doubled
            when no read is open. At least 1 MiB (``MIN_MAP_SIZE``).
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
        worker_id: this process's name as a lease holder (``store.worker_id``;
            default ``host/pid/random``). The writer process holds every run's
            lease (``store.lease``; docs/api.md "Leases").

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
    if map_size is not None and map_size < MIN_MAP_SIZE:  # LMDB's first pages need ~40 KiB
        raise ValueError(f"map_size must be at least {MIN_MAP_SIZE} (1 MiB): it is address "
                         "space, not disk, and grows when full; pass None for the default")
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
    wid = default_worker_id() if worker_id is None else check_key(worker_id, "worker id")
    return Store(engine, wid)


class Store(StepsAPI, HistoryAPI, BlobsAPI, EffectsAPI):
    """An open agentwal store. Get one from :func:`agentwal.open`; share it between threads."""

    def __init__(self, engine: Engine, worker_id: str | None = None) -> None:
        self._engine = engine
        engine.facade = weakref.ref(self)
        self.worker_id = default_worker_id() if worker_id is None else worker_id
        self._leases = LocalLeases(self.worker_id)
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

    def begin(self, run: str, *, retry_of: Transaction | None = None,
              prefetch: Iterable[str] = ()) -> Transaction:
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
            prefetch: keys the transaction will read, fetched with its snapshot
                (as ``txn.prefetch(keys=...)``; on PostgreSQL in the same round
                trip as the snapshot itself). A hint: the local engine ignores it.

        Raises:
            InvalidKeyError: ``run`` or a ``prefetch`` key is not a valid id.
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
        for key in prefetch:
            check_key(key)
        self._engine.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        backend = self._engine.backend
        if retry_of is not None:
            check_retry_of(retry_of, backend, run)
        view = backend.begin(run)
        view.fence = self._leases.ensure(run)
        return Transaction(backend, view, self._engine, retry_of=retry_of)

    def _count_retry(self) -> None:
        self._engine.counters["retries"] += 1

    # -- leases (agentwal/leases.py: this process is the one worker) ------------------

    def lease(self, run: str) -> int:
        """Take (or keep) this worker's lease on ``run``; returns its epoch (fencing token).

        The writer process holds every run of a local store, so this never
        finds another holder. The epoch stays the same while the lease is
        held and is larger after each ``release``; ``begin`` takes the lease
        too, and effects get it as ``ctx.fencing_token``.

        Raises:
            InvalidKeyError, ReadOnlyError, StoreClosedError.
        """
        check_key(run, "run id")
        self._engine.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        return self._leases.ensure(run).epoch

    def release(self, run: str) -> bool:
        """Give up the lease on ``run``; True if this worker held it.

        A transaction on ``run`` begun under it gets ``LeaseLostError`` at
        its commit or next effect, and nothing of it is applied.
        """
        check_key(run, "run id")
        self._engine.check_open()
        return self._leases.release(run)

    def claim_runs(self, limit: int = 10) -> list[str]:
        """Adopt runs whose holder's lease expired: always ``[]`` on a local store.

        No run of a local store is ever orphaned: the writer lock lets one
        process write at a time and that process holds every run; the runs
        of a writer that crashed belong to the next one to open the store.
        Kept so a fleet worker's loop runs unchanged against a local store.

        Raises:
            ValueError: a bad ``limit``. ReadOnlyError, StoreClosedError.
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError("limit must be an int >= 0")
        self._engine.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        return []

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
        selected = selected_runs(runs)
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
        the WAL keeps everything for the next open. Once everything is folded,
        the log goes on in a new first-size segment (64 KiB) and a grown one
        is removed, so a store at rest holds little log and opens fast.
        """
        self._leases.release_all("the store was closed")
        self._engine.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._engine.closed else ("read-only" if self.readonly else "open")
        return f"<agentwal.Store {self.path!r} {state} {self.durability.value}>"
