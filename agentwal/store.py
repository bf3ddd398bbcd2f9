"""The store: opening and recovery, views and reads, publishing, folds, closing.

Theory of operation: the store owns the memtables, the LMDB snapshot and the
open views; the commit pipeline (``commit.py``: validation, group commit,
failure rollback) hands it durable batches through :meth:`Store._publish`.

*Visibility after durability*: a commit becomes readable only after it is as
durable as the mode promises, so nobody acts on state a crash can take back.

*Isolation*: a view is ``(snapshot LSN, memtables, LMDB read txn)`` taken
under the store lock, so it never changes under a transaction or a read;
the pipeline validates commits against the oldest snapshot still open.

*Fold*: a background thread (or ``snapshot()``/``close()``) freezes the
active memtable, writes it to LMDB in one synced transaction with
``applied_lsn``, then drops the frozen table and removes WAL segments the
fold covers. Commits continue into the new memtable meanwhile.

*Deletion* (``delete_run``): a durable ``REC_DELETE_RUN`` record, published
as a memtable tombstone, hides the run from every view taken after it (a
view reads nothing of the run below the table holding the tombstone, and
``_info`` gives no LMDB record); the next fold removes the run from LMDB.
Crash windows: before the record is durable the run is intact after
recovery; after it, recovery replays the tombstone; a fold that removes the
run is one LMDB transaction, after which ``applied_lsn`` covers the record.

*Compaction* (``compact``, and ``retain=`` from the fold thread, at most
once per ``_retain_every`` seconds): fold the WAL, then under the fold lock
(commits continue) one LMDB write transaction planned by ``retention.py``:
before it commits nothing changed, after it the dropped checkpoints are
gone. A *vacuum* then writes LMDB's compacting copy, waits for the reads of
this process to end while new views wait (``_swapping``), and swaps the
file in under ``_lock`` (``snapshot.py`` has its crash windows).

Crash windows: see ``recovery.py`` (the log), ``wal/writer.py`` (segments),
``snapshot.py`` (LMDB) and ``blobs.py`` (blob files); the store itself keeps
no state on disk of its own beyond what those write.

*Trees* (``txn.put_tree``, ``restore_tree``, ``open_tree_file``) are blobs
too: :class:`~agentwal.treeio.TreeStore` snapshots and restores them, and
:meth:`Store._blob_refs` expands every tree reference into the objects and
files it names, so sweeps, verify and backups cover trees with no code of
their own.

*Blobs*: ``txn.put_blob`` writes through :class:`~agentwal.local.blobs.BlobStore`
(durable before the commit that names it); ``open_blob`` resolves a key's
reference in a view and opens the file; ``_sweep_blobs`` removes the files
no retained state or history references (:meth:`Store._blob_references`),
sparing those pinned by unfinished transactions.

Lock order: ``_fold_lock`` → the pipeline's ``flush_lock`` → ``_lock`` (shared
with the pipeline). ``_lock`` is never held across I/O except to begin an LMDB
read transaction, and for the file swap of a vacuum (a few milliseconds).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import gc
import inspect
import os
import random
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from . import aio, failpoints
from .codec import CodecError, DecodedValues, decode_blob_ref, decode_stored, is_blob_ref
from .effects import (
    STATUSES,
    EffectContext,
    EffectMode,
    EffectRecord,
    decode_entry,
    derive_key,
    effects_after,
    encode_entry,
    outstanding,
)
from .errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptionError,
    DiskFullError,
    DurabilityError,
    Error,
    MissingKeyError,
    NotABlobError,
    NotATreeError,
    ReadOnlyError,
    RunExistsError,
    RunNotFoundError,
    StoreBusyError,
    StoreClosedError,
    TreePathError,
)
from .format import (
    BLOB_REF_PREFIX,
    BLOBS_DIR,
    DEFAULT_SEGMENT_BYTES,
    MIN_SEGMENT_BYTES,
    SNAPSHOT_DIR,
    TREE_MEDIA_TYPE,
    WAL_DIR,
)
from .io import DISK_FULL_ERRNOS, FileSystem, OsFileSystem, WriterLock
from .ledger import DispatchReport, Ledger, Request
from .local.apply import apply_record, from_pending, replay
from .local.backup import BackupReport, Copier, check_destination
from .local.blobs import BlobMissing, BlobReader, BlobStore, blob_path
from .local.commit import CommitPipeline, Pending
from .local.control import create_control, read_control
from .local.memtable import Memtable
from .local.reads import LayeredReader, Pin, View, epoch_at, in_txn
from .local.recovery import Plan, recover
from .local.snapshot import FoldRun, MapFull, RunInfo, Snapshot, check_lmdb_file
from .local.verify import LMDB_FILE, Problem, VerifyReport, check_control, read_wal
from .local.verify import verify as verify_store
from .local.wal import Writer
from .retention import CompactReport, Policy, Tally, check_args, policy_args
from .tree import exclude_spec, split_relpath
from .treeio import RestoreReport, TreeStore
from .txn import Begin, Transaction, check_effect_args
from .types import (
    BlobRef,
    Checkpoint,
    Diff,
    Durability,
    TreeDiff,
    TreeFile,
    TreeRef,
    check_key,
)

__all__ = ["Store", "open"]

_MAX_MAP = 1 << 46 if sys.maxsize > 2**32 else 1 << 31
_NEWEST = 1 << 63  # a snapshot LSN past every record
#: Seconds a vacuum waits for this process's reads to end before giving up.
_VACUUM_WAIT = 10.0
#: Seconds between two passes of the automatic retention policy (``retain=``).
_RETAIN_EVERY = 60.0
_UNSET: Any = object()
T = TypeVar("T")


_Pin = Pin  # the old names, used throughout the engine's body below
_View = View


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
        segment_bytes: size of each preallocated WAL segment (default:
            a quarter of ``wal_max_bytes``, at most 16 MiB).
        map_size: initial LMDB map size (address space, not disk; default
            1 TiB on 64-bit). A full map is doubled when no read is open.
        effect_retention: how long settled effects-ledger entries (done,
            resolved, not applied) are kept after their last update, so their
            keys still dedup (default 30 days; None keeps them forever).
            Entries in doubt, failed or pending are never dropped.
        retain: an automatic retention policy, ``agentwal.KeepLast(n)``,
            ``agentwal.KeepFor(timedelta)`` or a tuple of both (a checkpoint
            either keeps is kept): the background fold thread runs
            ``compact(keep_last=..., older_than=...)`` after a fold, at most
            once a minute (never ``vacuum``). None (default): history is kept
            until ``compact()`` is called.

    Returns:
        An open :class:`Store` (also a context manager).

    Raises:
        StoreLockedError: another process has it open for writing.
        CorruptionError: a file of the store is damaged; nothing was changed.
        DiskFullError: no space to create the store or repair the log.
        DurabilityError: an I/O error (a failed write or fsync) while opening.
        CorruptionError: ``readonly`` and there is no store at ``path``.
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
    if segment_bytes is None:
        segment_bytes = max(MIN_SEGMENT_BYTES * 16, min(DEFAULT_SEGMENT_BYTES, wal_max_bytes // 4))
    if segment_bytes < MIN_SEGMENT_BYTES:
        raise ValueError(f"segment_bytes must be at least {MIN_SEGMENT_BYTES}")
    if effect_retention is not None and effect_retention.total_seconds() < 0:
        raise ValueError("effect_retention must not be negative")
    keep_last, older_than = policy_args(retain)
    if readonly and retain is not None:
        raise ValueError("retain= needs a writable store (readonly=False)")
    store = Store(os.fspath(path), mode, readonly, wal_max_bytes, fs or OsFileSystem(),
                  sync_interval, segment_bytes, map_size)
    if effect_retention is not None:
        store._effect_retention = effect_retention.total_seconds()
    if retain is not None:
        store._retain = (keep_last, older_than)
    try:
        store._open()
    except OSError as exc:
        store._release_all()
        raise _io_error(exc, store.path, "cannot open the store") from None
    except BaseException:
        store._release_all()
        raise
    return store


def _io_error(exc: OSError, path: str, what: str) -> Error:
    """The typed error for an I/O failure (not damage: the bytes read were fine)."""
    if exc.errno in DISK_FULL_ERRNOS:
        where = exc.filename or path
        return DiskFullError(where, f"{what}: no room to write {where!r} "
                             f"({exc.strerror or exc}). Free some space and open the store "
                             "again.")
    return DurabilityError(exc.filename or path, f"{what}: {exc.strerror or exc}")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (restoring its previous state after)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _background(ref: weakref.ref[Store], wake: threading.Condition, step: str,
                interval: float) -> None:
    """A store's background thread: wake (notified or every ``interval``), do ``step``."""
    while True:
        with wake:
            wake.wait(interval)
        store = ref()
        if store is None or not getattr(store, step)():
            return
        del store


def _release_handles(lock: WriterLock | None, snap: Snapshot | None,
                     writer: Writer | None) -> None:
    """Finalizer of a store dropped without close(): like a crash, nothing is written."""
    if writer is not None:
        writer.close()
    if snap is not None:
        snap.close()
    if lock is not None:
        lock.release()


def _tree_blob(value: Any) -> BlobRef | None:
    """The blob reference of a TreeRef value (None for anything else)."""
    return BlobRef(value.sha256, value.size, TREE_MEDIA_TYPE) if isinstance(value, TreeRef) \
        else None


#: How many checkpoints back a step looks for an uncommitted attempt of itself.
_ADOPT_WALK = 32


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
        self.store._counters["retries"] += 1
        failpoints.hit("step_before_retry")
        self.prev = txn
        return random.random() * min(0.001 * 2.0 ** (self.attempt - 1), 0.05)

    @staticmethod
    def abort(txn: Transaction) -> None:
        """Any other exception: roll the attempt back (the caller re-raises)."""
        if txn.state == "active":
            txn.rollback()


def _check_retry_of(store: Store, run: str, prev: object) -> None:
    """Refuse a ``retry_of`` that is not a finished, uncommitted attempt of ``run`` here."""
    if not isinstance(prev, Transaction):
        raise TypeError(f"retry_of must be the Transaction of an earlier attempt, "
                        f"not {type(prev).__name__}")
    if prev._engine is not store:
        raise ValueError("retry_of is a transaction of another store")
    if prev.run != run:
        raise ValueError(f"retry_of is a transaction of run {prev.run!r}, not {run!r}")
    if prev.state == "active":
        raise ValueError("retry_of is still active: roll it back (or let its ConflictError "
                         "end it) before retrying the step")
    if prev.state == "committed":
        raise ValueError("retry_of committed: its step is done, so the next step begins "
                         "with a plain store.begin(run)")


def _checkpoint_id(cid: object) -> int:
    """``cid`` if it can be a checkpoint id (an int, not a bool), else TypeError."""
    if isinstance(cid, bool) or not isinstance(cid, int):
        raise TypeError(f"a checkpoint id is an int, not {type(cid).__name__}")
    return cid


class Store:
    """An open agentwal store. Get one from :func:`agentwal.open`; share it between threads."""

    def __init__(self, path: str, durability: Durability, readonly: bool, wal_max_bytes: int,
                 fs: FileSystem, sync_interval: float, segment_bytes: int,
                 map_size: int | None = None) -> None:
        self.path = path
        self.durability = durability
        self.readonly = readonly
        self.wal_max_bytes = wal_max_bytes
        self._fs = fs
        self._sync_interval = sync_interval
        self._segment_bytes = segment_bytes
        self._map_size = map_size
        self._split_commits_for_test = False  # harness self-test only: breaks atomicity
        self._lock = threading.Lock()
        self._fold_lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closed = True
        self._stop = False
        self._writer_lock: WriterLock | None = None
        self._snap: Snapshot | None = None
        self._pipe: CommitPipeline | None = None
        self._threads: list[threading.Thread] = []
        self._active = Memtable()
        self._frozen: Memtable | None = None
        self._visible = 0
        self._applied = 0
        self._snaps: dict[int, int] = {}
        self._ro_pin: _Pin | None = None
        self._ro_lock = threading.Lock()  # reads through a shared LMDB txn, one at a time
        self._refresh_lock = threading.Lock()
        self._dead: collections.deque[_View] = collections.deque()  # from Transaction.__del__
        #: (run, checkpoint) -> the live transaction whose step uses the effect
        #: positions there (``_effect_claim``); under ``_lock``
        self._pos_owners: dict[tuple[str, int], weakref.ref[Transaction]] = {}
        self._fold_wanted = False
        self._fold_error: BaseException | None = None
        self._fold_retry_at = 0.0  # after a failed fold, the next try waits until then
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._fold_mark = 0
        self._counters = {"folds": 0, "segments_removed": 0, "map_grows": 0,
                          "retention_passes": 0, "retries": 0}
        self._recovery: dict[str, Any] = {}
        self.store_id: Any = None
        self._ledger = Ledger(self)
        self._effect_retention: float | None = None  # seconds; set by open()
        self._next_expiry = 0.0
        #: ``(keep_last, older_than)`` of ``retain=``; applied by the fold thread
        self._retain: tuple[int | None, datetime.timedelta | None] | None = None
        self._retain_every = _RETAIN_EVERY
        self._retain_next = 0.0  # monotonic time of the next retention pass
        self._retain_error: BaseException | None = None
        self._swapping = False  # the LMDB file is being swapped (vacuum, reopen): views wait
        #: small values lately read, decoded (``get``, ``txn.get``): a repeated read skips CBOR
        self._decoded = DecodedValues()
        self._blobs = BlobStore(fs, path, BLOBS_DIR)
        self._trees = TreeStore(self._blobs, path, readonly=readonly)

    # -- opening --------------------------------------------------------------------

    def _open(self) -> None:
        fs, path = self._fs, self.path
        wal_dir = os.path.join(path, WAL_DIR)
        if self.readonly:
            if not os.path.isdir(path):
                raise CorruptionError(path, None, "no store here",
                                      "Check the path; a read-only open never creates a store.")
        else:
            fs.mkdir(path)
            fs.fsync_dir(os.path.dirname(os.path.abspath(path)))
            self._writer_lock = WriterLock(path)
            self._writer_lock.acquire()
        ctl = read_control(fs, path)
        if ctl is None:
            if self.readonly:
                raise CorruptionError(path, None, "not an agentwal store (no CONTROL file)",
                                      "Check the path; a read-only open never creates a store.")
            if fs.exists(wal_dir) and fs.listdir(wal_dir):
                raise CorruptionError(path, None, "the WAL exists but the CONTROL file is missing")
            ctl = create_control(fs, path)
        self.store_id = ctl.store_id
        if not self.readonly:
            fs.mkdir(wal_dir)
            fs.fsync_dir(path)
        self._snap = self._new_snapshot()
        self._load(wal_dir)
        self._closed = False
        self._finalizer = weakref.finalize(
            self, _release_handles, self._writer_lock, self._snap,
            self._pipe.writer if self._pipe is not None else None)
        if not self.readonly:
            self._start_threads()

    def _load(self, wal_dir: str) -> None:
        """Pin the LMDB base, replay the WAL after it, and set up the writer."""
        assert self._snap is not None
        started = time.perf_counter()
        with _gc_paused():  # replay makes many objects that all live on: skip the scans
            ltxn, applied, plan = self._read_base(wal_dir)
            snap = self._snap
            mem, heads = replay(plan, self.store_id, lambda run: snap.reader(ltxn).epoch(run),
                                 lambda key: snap.reader(ltxn).effect(key))
        ended = None
        with self._lock:
            if self.readonly:
                old, self._ro_pin = self._ro_pin, _Pin(ltxn)
                if old is not None:
                    old.retired = True
                    ended = old.txn if old.users == 0 else None
            self._active = mem
            self._applied = applied
            self._visible = plan.next_lsn - 1
            self._recovery.update(applied_lsn=applied, replayed=len(plan.records),
                                  torn_bytes=plan.torn_bytes, actions=plan.notes,
                                  seconds=round(time.perf_counter() - started, 6))
        if ended is not None:
            self._snap.end_read(ended)
        if self.readonly:
            return
        self._snap.end_read(ltxn)
        w = Writer(self._fs, wal_dir, self.store_id, self._segment_bytes)
        if plan.resume is not None:
            seg, header, end = plan.resume
            w.resume(seg, header.salt, end, plan.next_lsn - 1, plan.earlier)
        else:
            w.start(plan.next_lsn, plan.next_number, plan.earlier)
        self._pipe = CommitPipeline(self.path, w, self.durability, self._lock, plan.next_lsn,
                                    heads, self._folded_head, self._publish,
                                    self._oldest_snapshot, self._effect_recorded)
        # The replayed log counts toward the next fold, so a process that keeps
        # crashing early still folds and open time stays bounded.
        self._fold_mark = w.bytes_written - plan.replayed_bytes
        self._fold_wanted = plan.replayed_bytes >= self.wal_max_bytes

    def _read_base(self, wal_dir: str) -> tuple[Any, int, Plan]:
        """An LMDB read transaction, its applied LSN, and the recovery plan after it.

        A read-only store races the writer's folds (a segment it needs may be
        removed between reading LMDB and reading the log), so it retries with
        a fresh LMDB view a few times before believing the damage.
        """
        assert self._snap is not None
        attempts = 20 if self.readonly else 1
        for attempt in range(attempts):
            ltxn = self._snap.begin_read()
            try:
                applied, sid = self._snap.reader(ltxn).meta()
                if sid is not None and sid != self.store_id:
                    raise CorruptionError(self._snap.directory, None,
                                          f"snapshot belongs to store {sid}, not {self.store_id}")
                try:
                    plan = recover(self._fs, wal_dir, applied, self.store_id,
                                   readonly=self.readonly, start=self._snap.reader(ltxn).log_pos())
                except OSError as exc:
                    raise _io_error(exc, wal_dir, "I/O error while recovering the WAL") from None
                return ltxn, applied, plan
            except (CorruptionError, DurabilityError):
                self._snap.end_read(ltxn)
                if attempt + 1 >= attempts:
                    raise
                time.sleep(0.01 * (attempt + 1))
            except BaseException:
                self._snap.end_read(ltxn)
                raise
        raise AssertionError("unreachable")

    def _start_threads(self) -> None:
        # The threads hold the store weakly, so a store dropped without close()
        # is still collected, and its finalizer releases the writer lock.
        self._stop = False
        ref = weakref.ref(self)
        jobs = [("agentwal-fold", "_fold_step", 1.0)]
        if self.durability is Durability.ASYNC:
            jobs.append(("agentwal-flush", "_flush_step", self._sync_interval))
        for name, step, interval in jobs:
            t = threading.Thread(target=_background, args=(ref, self._wake, step, interval),
                                 name=name, daemon=True)
            self._threads.append(t)
            t.start()

    # -- views ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(self.path)

    def _view(self) -> _View:
        self._check_open()
        assert self._snap is not None
        while self._dead:  # views of transactions the garbage collector dropped
            self._release(self._dead.popleft())
        with self._lock:
            while self._swapping:
                self._wake.wait()
            snap = self._visible
            layers = (self._active,) if self._frozen is None else (self._active, self._frozen)
            if self.readonly:
                pin = self._ro_pin
                assert pin is not None
                pin.users += 1
                view = _View(snap, layers, pin.txn, self._ro_lock, pin)
            else:
                view = _View(snap, layers, self._snap.begin_read(), None)
            self._snaps[snap] = self._snaps.get(snap, 0) + 1
        return view

    def _release(self, view: _View) -> None:
        if not view.live:
            return
        view.live = False
        ltxn, view.ltxn = view.ltxn, None  # the LMDB reader slot is freed now, not at GC
        ended = None
        with self._lock:
            n = self._snaps.get(view.snap, 0) - 1
            if n <= 0:
                self._snaps.pop(view.snap, None)
            else:
                self._snaps[view.snap] = n
            if view.pin is None:
                ended = ltxn
            else:
                view.pin.users -= 1
                if view.pin.retired and view.pin.users == 0:
                    ended = view.pin.txn
        if ended is not None and self._snap is not None:
            self._snap.end_read(ended)

    def _lmdb(self, view: _View, fn: Callable[[Any], T]) -> T:
        return in_txn(view, fn)

    def _reads(self, view: _View) -> LayeredReader:
        assert self._snap is not None
        return LayeredReader(self._snap, view)

    def _info(self, view: _View, run: str) -> RunInfo | None:
        return self._reads(view).info(run)

    def _layers(self, view: _View, run: str) -> tuple[Memtable, ...]:
        return self._reads(view).layers(run)

    def _read(self, view: _View, run: str, key: str) -> bytes | None:
        return self._reads(view).value(run, key)

    def _items(self, view: _View, run: str, prefix: str) -> dict[str, bytes | None]:
        return self._reads(view).items(run, prefix)

    def _head(self, view: _View, run: str) -> Checkpoint | None:
        return self._reads(view).head(run)

    def _check_at(self, view: _View, run: str, cid: int) -> Checkpoint:
        return self._reads(view).check_at(run, cid)

    def _raw_at(self, view: _View, run: str, cid: int,
                key: str | None = None) -> dict[str, bytes]:
        return self._reads(view).state_at(run, cid, key)

    def _latest_raw(self, run: str, key: str) -> bytes | None:
        """The newest stored bytes of ``key`` (None: absent): a view's read without the view.

        Everything happens under ``_lock``, so no publish, prune or fold can
        move between the memtable lookup and LMDB's read: the layers newest
        first, then (if none decides the key) one short LMDB read that
        :meth:`Snapshot.latest` begins and ends itself. A read-only store
        (one shared, pinned LMDB transaction) and a vacuum's swap take the
        view path.
        """
        self._check_open()
        snap = self._snap
        assert snap is not None
        if not self.readonly:
            with self._lock:
                if not self._swapping:
                    lsn = self._visible
                    found, value = self._active.lookup(run, key, lsn)
                    if found:
                        return value
                    if self._frozen is not None:
                        found, value = self._frozen.lookup(run, key, lsn)
                        if found:
                            return value
                    return snap.latest(run, key)
        return self._with_view(lambda v: self._read(v, run, key))

    def _with_view(self, fn: Callable[[_View], T]) -> T:
        view = self._view()
        try:
            return fn(view)
        finally:
            self._release(view)

    # -- transactions -----------------------------------------------------------------

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
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        if retry_of is not None:
            _check_retry_of(self, run, retry_of)
        return Transaction(self, run, self._view(), retry_of=retry_of)

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

    def _effect_adopt(self, txn: Transaction, base: int, name: str, digest: str,
                      mode: EffectMode, epoch: int) -> int | None:
        """The checkpoint of an uncommitted attempt of this step, whose effects to meet.

        A step that conflicted, or whose process died, after it called an
        effect leaves entries that no commit marked; if the run moved on
        meanwhile (other transactions committed without effects: a message
        arriving through a web handler), a plain retry begins from a later
        head and would derive new keys. So before the first positional effect
        of a step, walk back from its base checkpoint through the run's
        checkpoints (at most ``_ADOPT_WALK``): the first checkpoint whose
        position 0 holds an entry decides. A committed entry there means the
        positions since were used and the step is new (None). An uncommitted
        one is the same step's earlier attempt if it asked for the same effect
        (name, args, mode) first: its checkpoint is returned, and the
        transaction's effects are positioned there. The walk never crosses a
        ``rollback_to`` checkpoint or a fork's first checkpoint (steps re-run
        from those are new positions by design) and ignores retired entries.
        """
        run = txn.run
        pipe = self._pipe
        if base == 0 or pipe is None:
            return None  # a run's first step has no earlier positions
        with self._lock:
            head = pipe.heads.get(run) or self._folded_head(run)
        if head is None or head[0] != base:
            return None  # a stale step, which _effect_claim refuses

        def find(v: _View) -> int | None:
            # Checkpoint ids are consecutive (a commit's id is its parent's + 1), so the
            # steps before this one began at base - 1, base - 2, ...
            for cid in range(base, max(base - _ADOPT_WALK, 0) - 1, -1):
                key0 = self._effect_key_in(v, run, cid, 0)
                e0 = self._effect_get_in(v, key0) if key0 is not None else None
                if e0 is None or e0.status == "retired":
                    continue
                if cid == base or e0.committed_in is not None:
                    return None  # this step's own positions, or a step that committed
                same = (e0.name == name and e0.args_digest == digest and e0.mode == mode
                        and not e0.keyed
                        and e0.key == derive_key(self.store_id, run, cid, name, 0, epoch=epoch))
                return cid if same else None
            return None

        found = self._with_view(find)
        if found is None:
            return None
        # The stretch walked over must not cross a rollback_to (steps re-run from one
        # are new by design) nor, back to a run's start, a fork's first checkpoint.
        for c in self.history(run, limit=base - found):
            if c.id > found and ("rollback_to" in c.meta or c.origin is not None):
                return None
        return found

    def _effect_claim(self, txn: Transaction, base: int) -> None:
        """Check that effect positions at ``base`` are ``txn``'s step's to use; claim them.

        Called by the ledger under the position's lock before an effect runs.
        Positions at a checkpoint belong to one step: a second live
        transaction from the same checkpoint, or one begun before the run
        moved on that is not a retry anchored there, would otherwise meet
        (and silently reuse) another step's recorded results. Such a
        transaction gets ``ConflictError`` before anything is called or
        recorded, and its retry (``store.transact``) runs from the new head.

        Raises:
            ConflictError: as above.
        """
        run = txn.run
        with self._lock:
            ref = self._pos_owners.get((run, base))
            other = ref() if ref is not None else None
            if (other is not None and other is not txn and other.state == "active"
                    and other._chain is not txn._chain):
                raise ConflictError(run, reason=(
                    f"another transaction on this run, begun from checkpoint {base}, is "
                    "calling effects there; nothing was called or recorded. Two steps cannot "
                    "run from one checkpoint: retry once it commits (store.transact does)."))
            if not txn._inherited and other is not txn:
                pipe = self._pipe
                assert pipe is not None
                head = pipe.heads.get(run) or self._folded_head(run)
                if (head[0] if head is not None else 0) != base:
                    raise ConflictError(run, reason=(
                        f"the run moved on from checkpoint {base} (where this transaction "
                        f"began) to {head[0] if head is not None else 'nothing'}; its effect "
                        "positions there belong to the step that committed. Nothing was "
                        "called or recorded; retry the step from the new head "
                        "(store.transact does)."))
            if other is not txn:
                if len(self._pos_owners) > 4096:
                    self._pos_owners = {k: r for k, r in self._pos_owners.items()
                                        if (t := r()) is not None and t.state == "active"}
                self._pos_owners[(run, base)] = weakref.ref(txn)

    def _txn_read(self, txn: Transaction, key: str) -> bytes | None:
        self._check_open()
        return self._read(txn._view, txn.run, key)

    def _txn_items(self, txn: Transaction, prefix: str) -> dict[str, bytes | None]:
        self._check_open()
        return self._items(txn._view, txn.run, prefix)

    def _txn_release(self, txn: Transaction) -> None:
        self._release(txn._view)
        if txn._blob_pins and not txn._blobs_in_doubt:
            self._blobs.unpin(txn._blob_pins)

    def _txn_abandon(self, txn: Transaction) -> None:
        """A transaction was garbage-collected unfinished; takes no lock (GC runs anywhere)."""
        self._dead.append(txn._view)
        if txn._blob_pins:
            self._blobs.abandon(txn._blob_pins)

    def _txn_commit(self, txn: Transaction) -> Checkpoint | None:
        self._check_open()
        run, view, pipe = txn.run, txn._view, self._pipe
        if pipe is None:
            raise ReadOnlyError(self.path)
        failpoints.hit("commit_before_validate")
        if not txn._writes and not txn._meta and not txn._deferred and not txn._effect_keys:
            return self._head(view, run)
        delta = dict(txn._writes)
        if self._split_commits_for_test and len(delta) > 1:
            # A deliberately broken engine (harness self-test): one transaction
            # becomes two commits, so a crash between them shows half of it.
            keys = sorted(delta)
            half = len(keys) // 2
            pipe.commit(run, view.snap, txn._reads, txn._prefixes,
                        {k: delta[k] for k in keys[:half]}, {})
            return pipe.commit(run, 1 << 62, set(), set(), {k: delta[k] for k in keys[half:]},
                               dict(txn._meta))
        return pipe.commit(run, view.snap, txn._reads, txn._prefixes, delta, dict(txn._meta),
                           list(txn._deferred), effects=tuple(txn._effect_keys))

    def _folded_head(self, run: str) -> tuple[int, bytes] | None:
        """Latest published head of ``run`` (memtables, then LMDB); under ``_lock``."""
        for layer in (self._active, self._frozen):
            rm = layer.runs.get(run) if layer is not None else None
            if rm is None:
                continue
            entry = rm.latest(_NEWEST)
            if entry is not None:
                return entry[0].id, entry[1]
            if rm.deleted:  # deleted, and nothing committed since
                return None
        assert self._snap is not None
        ltxn = self._snap.begin_read()
        try:
            info = self._snap.reader(ltxn).run_info(run)
        finally:
            self._snap.end_read(ltxn)
        return (info.head, info.head_hash) if info is not None else None

    def _oldest_snapshot(self) -> int:
        """The oldest snapshot LSN an open view still reads at; under ``_lock``."""
        return min(self._snaps) if self._snaps else self._visible

    def _publish(self, batch: list[Pending], pos: tuple[int, int] | None) -> None:
        """Make a durable batch visible, in LSN order; under ``_lock``."""
        oldest = self._oldest_snapshot()
        for p in batch:  # the same mapping replay uses (local/apply.py)
            apply_record(self._active, from_pending(p), store_id=self.store_id, oldest=oldest,
                         lookup=self._effect_recorded, epoch=self._epoch_at)
            self._visible = p.lsn
        self._active.log_pos = pos
        assert self._pipe is not None
        if (self._pipe.writer.bytes_written - self._fold_mark >= self.wal_max_bytes
                and time.monotonic() >= self._fold_retry_at):
            self._fold_wanted = True
            self._wake.notify_all()

    def sync(self) -> None:
        """Make every acknowledged commit durable now (a no-op in ``sync`` mode).

        Raises:
            DurabilityError: the fsync failed; the store accepts no more commits.
        """
        self._check_open()
        if self._pipe is not None:
            self._pipe.sync()

    def _flush_step(self) -> bool:
        """Async mode's background flush; False once the thread should stop."""
        pipe = self._pipe
        if pipe is None or self._stop:
            return False
        # A failed sync stops the writer; the commits that follow report it.
        with contextlib.suppress(Error), pipe.flush_lock:
            if pipe.writer.broken is None and not pipe.writer.closed:
                pipe.sync_written()
        return True

    # -- folding ------------------------------------------------------------------------

    def _fold_step(self) -> bool:
        """The fold thread's work when woken; False once the thread should stop."""
        with self._lock:
            if self._stop:
                return False
            if not self._fold_wanted:
                return True
            self._fold_wanted = False
        try:
            self._fold()
            self._fold_error = None
        except Error as exc:
            self._fold_error = exc
            self._fold_retry_at = time.monotonic() + 1.0  # not on every batch
            return True
        except BaseException as exc:
            self._fold_error = exc
            return False
        self._retain_step()
        return True

    def snapshot(self) -> None:
        """Fold the WAL into LMDB now and remove the segments it covers.

        Raises:
            ReadOnlyError: the store is read-only.
            DiskFullError: LMDB had no room; the WAL still holds everything and
                the store keeps working (the next fold tries again).
            DurabilityError: LMDB's write or sync failed; the WAL still holds
                everything, but the store accepts no more commits until reopened.
        """
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        self._fold()

    def _fold(self) -> None:
        """Fold everything published so far (a table left by a failed fold first)."""
        while self._fold_one():
            pass

    def _fold_one(self) -> bool:
        """Fold one memtable; True if it was one a failed fold had left frozen."""
        assert self._snap is not None and self._pipe is not None
        pipe = self._pipe
        with self._fold_lock:
            with self._lock:
                leftover = self._frozen is not None
                if self._frozen is None:
                    if self._active.empty:
                        return False
                    self._frozen, self._active = self._active, Memtable()
                    self._frozen.frozen = True
                    self._fold_mark = pipe.writer.bytes_written
                frozen = self._frozen
            failpoints.hit("fold_after_freeze")
            # LMDB must never be durable past the log: after a power cut the WAL
            # has to reach applied_lsn (async and none modes sync here).
            pipe.sync_through(frozen.last_lsn)
            runs = [FoldRun(run, writes, ckpts, deltas, outboxes, reset)
                    for run, reset, writes, ckpts, deltas, outboxes in frozen.fold_runs()]
            resets = any(fr.reset for fr in runs)
            effects = list(frozen.effects.values())
            if resets:  # a deleted run's effect positions are not folded (entries are)
                gone = {fr.run for fr in runs if fr.reset}
                effects = [(e, raw) if e.ordinal is None or e.run not in gone
                           or frozen.effect_pos.get((e.run, e.checkpoint, e.ordinal)) == e.key
                           else (dataclasses.replace(e, ordinal=None), raw)
                           for e, raw in effects]
            expire = None
            if self._effect_retention is not None and time.time() >= self._next_expiry:
                expire = time.time() - self._effect_retention
            failpoints.hit("fold_before_commit")
            if resets:
                failpoints.hit("delete_run_fold_before_commit")
            while True:
                try:
                    self._snap.fold(frozen.last_lsn, self.store_id, runs, frozen.log_pos,
                                    effects, expire)
                    break
                except MapFull as full:  # double until the fold fits
                    self._grow_map(full)
                except DurabilityError as exc:
                    # LMDB's write or sync failed: its state is unknown until a
                    # reopen, and an fsync is never retried. Stop the writer.
                    pipe.writer.broken = exc
                    raise
            failpoints.hit("fold_after_commit")
            if resets:
                failpoints.hit("delete_run_fold_after_commit")
            if expire is not None:
                self._next_expiry = time.time() + 3600.0  # expiry scans the ledger: hourly
            with self._lock:
                self._frozen = None
                self._applied = frozen.last_lsn
                self._counters["folds"] += 1
            with pipe.flush_lock:
                if pipe.writer.broken is None:
                    self._counters["segments_removed"] += pipe.writer.remove_through(
                        frozen.last_lsn)
        return leftover

    def _grow_map(self, full: MapFull) -> None:
        """Double LMDB's map; needs every read transaction of this process closed."""
        assert self._snap is not None
        # Wait (lock released between looks) until no read is open, then resize
        # while holding the lock, so no view can begin between the look and the resize.
        with self._lock:
            deadline = time.monotonic() + 5.0
            while self._snap.readers() and time.monotonic() < deadline:
                self._lock.release()
                time.sleep(0.005)
                self._lock.acquire()
            if self._snap.readers() or full.size >= _MAX_MAP:
                path = os.path.join(self._snap.directory, "data.mdb")
                why = ("it is at its largest size" if full.size >= _MAX_MAP else
                       "read transactions stay open in this process (a read-only store "
                       "holds one until refresh() or close())")
                raise DiskFullError(path, f"the LMDB map of {path!r} is full and cannot grow: "
                                    f"{why}. Nothing was lost: the WAL keeps everything; "
                                    "finish those reads and the next fold grows it.") from full
            self._snap.grow()
            self._counters["map_grows"] += 1

    # -- reads --------------------------------------------------------------------------

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
        if at is None:
            raw = self._latest_raw(run, key)
        else:
            cid = _checkpoint_id(at)

            def read_at(v: _View) -> bytes | None:
                self._check_at(v, run, cid)
                return self._raw_at(v, run, cid, key).get(key)

            raw = self._with_view(read_at)
            return default if raw is None else decode_stored(raw, self.path, f"{run!r}/{key!r}")
        if raw is None:
            return default
        return self._decoded.decode(run, key, raw, self.path)

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
        cid = None if at is None else _checkpoint_id(at)

        def read(v: _View) -> dict[str, bytes | None]:
            if cid is not None:
                head = self._check_at(v, run, cid)
                if cid != head.id:
                    return dict(self._raw_at(v, run, cid))
            elif self._head(v, run) is None:
                raise RunNotFoundError(run)
            return self._items(v, run, "")

        raw = self._with_view(read)
        return {k: decode_stored(b, self.path, f"{run!r}/{k!r}")
                for k, b in sorted(raw.items()) if b is not None}

    def head(self, run: str) -> Checkpoint | None:
        """The run's latest checkpoint, or None if it has none."""
        check_key(run, "run id")
        return self._with_view(lambda v: self._head(v, run))

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

        def read(v: _View) -> list[Checkpoint]:
            if upto is not None:  # a bound: one compaction dropped may still page on
                head = self._head(v, run)
                if head is None:
                    raise RunNotFoundError(run)
                if not 1 <= upto <= head.id:
                    raise CheckpointNotFoundError(run, upto)
            out: list[Checkpoint] = []
            for layer in self._layers(v, run):
                rm = layer.runs.get(run)
                if rm is not None:
                    floor = rm.floor(v.snap) if rm.deleted else 0
                    out.extend(c for c, _h, _m in reversed(rm.checkpoints)
                               if floor < c.lsn <= v.snap and (upto is None or c.id < upto))
            info = self._info(v, run)
            if info is not None:
                assert self._snap is not None
                snap = self._snap
                want = None if limit is None else max(0, limit - len(out))

                # While a fold commits, LMDB may already hold what the frozen
                # memtable still shows: take from LMDB only what is older.
                below = min((c.id for c in out), default=None)

                def folded(t: Any) -> list[Checkpoint]:
                    got: list[Checkpoint] = []
                    for c in snap.reader(t).checkpoints(run, info.number, upto):
                        if below is not None and c.id >= below:
                            continue
                        if want is not None and len(got) >= want:
                            break
                        got.append(c)
                    return got

                out.extend(self._lmdb(v, folded))
            return out if limit is None else out[:limit]

        return self._with_view(read)

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
        ca, cb = _checkpoint_id(a), _checkpoint_id(b)

        def read(v: _View) -> tuple[dict[str, bytes], dict[str, bytes]]:
            self._check_at(v, run, ca)
            self._check_at(v, run, cb)
            return self._raw_at(v, run, ca), self._raw_at(v, run, cb)

        with self._blobs.gate.shared():  # no sweep between the values and their trees
            return self._diff(run, ca, cb, *self._with_view(read))

    def _diff(self, run: str, ca: int, cb: int, ra: dict[str, bytes], rb: dict[str, bytes]
              ) -> Diff:
        def dec(raw: bytes, k: str, cid: int) -> Any:
            return decode_stored(raw, self.path, f"{run!r}/{k!r} at {cid}")

        added = {k: dec(rb[k], k, cb) for k in sorted(rb.keys() - ra.keys())}
        removed = {k: dec(ra[k], k, ca) for k in sorted(ra.keys() - rb.keys())}
        changed: dict[str, tuple[Any, Any]] = {}
        for k in sorted(ra.keys() & rb.keys()):
            if ra[k] != rb[k]:
                old, new = dec(ra[k], k, ca), dec(rb[k], k, cb)
                if old != new:  # equal values may encode differently (dict order)
                    changed[k] = (old, new)
        return Diff(added, removed, changed, self._tree_diffs(added, removed, changed))

    def _tree_diffs(self, added: dict[str, Any], removed: dict[str, Any],
                    changed: dict[str, tuple[Any, Any]]) -> dict[str, TreeDiff]:
        """The file-level diff of each key whose old or new value is a tree."""
        pairs = {**{k: (None, v) for k, v in added.items()},
                 **{k: (v, None) for k, v in removed.items()}, **changed}
        out: dict[str, TreeDiff] = {}
        for k, (old, new) in sorted(pairs.items()):
            if isinstance(old, TreeRef) or isinstance(new, TreeRef):
                out[k] = self._trees.diff(_tree_blob(old), _tree_blob(new))
        return out

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
        with self._blobs.gate.shared():  # no blob sweep between reading refs and committing
            pipe, view = self._writable(), self._view()
            try:
                self._check_at(view, run, cid)
                target = self._raw_at(view, run, cid)
                current = {k: v for k, v in self._items(view, run, "").items() if v is not None}
                delta: dict[str, bytes | None] = {k: v for k, v in target.items()
                                                  if current.get(k) != v}
                delta.update((k, None) for k in current.keys() - target.keys())
                # The whole run was read: any commit on it since the view conflicts.
                ckpt = pipe.commit(run, view.snap, set(), {""}, delta, {"rollback_to": cid})
            finally:
                self._release(view)
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
        # The fold lock keeps a compaction out from checking the origin to committing
        # the fork (it would not yet see the fork's origin, and could drop it); the
        # blob gate keeps a sweep out from reading the refs to committing them.
        with self._fold_lock, self._blobs.gate.shared():
            pipe, view = self._writable(), self._view()
            try:
                self._check_at(view, run, cid)
                if self._head(view, new_run) is not None:
                    raise RunExistsError(new_run)
                target: dict[str, bytes | None] = dict(self._raw_at(view, run, cid))
                ckpt = pipe.commit(new_run, view.snap, set(), {""}, target, {},
                                   origin=(run, cid))
            finally:
                self._release(view)
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
        pipe = self._writable()
        pipe.delete_run(run)
        failpoints.hit("delete_run_after_record")
        with self._lock:
            self._fold_wanted = True
            self._wake.notify_all()

    def compact(self, *, keep_last: int | None = None,
                older_than: datetime.timedelta | None = None,
                runs: list[str] | tuple[str, ...] | set[str] | None = None,
                vacuum: bool = False, keep_fork_origins: bool = True) -> CompactReport:
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
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        check_args(keep_last, older_than)
        selected: list[str] | None = None
        if runs is not None:
            if isinstance(runs, str):
                raise TypeError("runs is a list of run ids, not one str")
            selected = sorted({check_key(r, "run id") for r in runs})
            missing = self._with_view(lambda v: [r for r in selected or ()
                                                 if self._head(v, r) is None])
            if missing:
                raise RunNotFoundError(missing[0])
        self._fold()
        failpoints.hit("compact_after_fold")
        cutoff = None if older_than is None else time.time() - older_than.total_seconds()
        with self._fold_lock:
            before = self._file_bytes()
            tally = self._compact_locked(selected, keep_last, cutoff, keep_fork_origins)
            failpoints.hit("compact_after_commit")
            self._sweep_blobs()  # the blob files no kept checkpoint names any more
            if vacuum:
                self._vacuum()
            after = self._file_bytes()
        return CompactReport(tally.dropped, tally.bytes_freed, dict(tally.runs),
                             tally.objects_freed, tally.manifests_written, tally.bytes_written,
                             before, after, vacuum)

    def _file_bytes(self) -> int:
        assert self._snap is not None
        path = os.path.join(self._snap.directory, "data.mdb")
        return os.path.getsize(path) if os.path.exists(path) else 0

    def _compact_locked(self, runs: list[str] | None, keep_last: int | None,
                        cutoff: float | None, keep_origins: bool) -> Tally:
        """The LMDB part of a compaction; under ``_fold_lock``."""
        assert self._snap is not None and self._pipe is not None
        origins: set[tuple[str, int]] = set()
        if keep_origins:  # forks not folded yet (committed since the fold) count too
            with self._lock:
                for layer in (self._active, self._frozen):
                    for rm in layer.runs.values() if layer is not None else ():
                        origins.update(c.origin for c, _h, _m in rm.checkpoints
                                       if c.origin is not None)
        while True:
            try:
                return self._snap.compact(runs, keep_last=keep_last, cutoff=cutoff,
                                          keep_origins=keep_origins, origins=origins)
            except MapFull as full:
                self._grow_map(full)
            except DurabilityError as exc:  # LMDB's state is unknown until a reopen
                self._pipe.writer.broken = exc
                raise

    def _vacuum(self) -> None:
        """Rewrite the LMDB file compactly and swap it in; under ``_fold_lock``."""
        assert self._snap is not None and self._pipe is not None
        snap = self._snap
        busy = ("other stores of this process have this directory open (read-only ones "
                "share its LMDB environment); close them and call compact(vacuum=True) "
                "again. The compaction itself is done.")
        if snap.users() > 1:
            raise StoreBusyError(self.path, busy)
        try:
            tmp = snap.vacuum_copy()
        except DurabilityError as exc:
            self._pipe.writer.broken = exc
            raise
        failpoints.hit("vacuum_after_copy")
        while self._dead:  # views of transactions the garbage collector dropped
            self._release(self._dead.popleft())
        with self._lock:
            self._swapping = True
            try:
                deadline = time.monotonic() + _VACUUM_WAIT
                while snap.readers() and time.monotonic() < deadline:
                    self._wake.wait(0.005)
                if snap.readers() or snap.users() > 1:
                    snap.discard(tmp)
                    raise StoreBusyError(self.path, busy if snap.users() > 1 else
                                         f"reads stayed open for {_VACUUM_WAIT:.0f} s "
                                         "(transactions not finished, or a thread that "
                                         "holds one called compact). Finish them and call "
                                         "compact(vacuum=True) again. The compaction "
                                         "itself is done.")
                try:
                    swapped = snap.swap_in(tmp)
                except DurabilityError as exc:
                    self._pipe.writer.broken = exc
                    raise
                if not swapped:
                    raise StoreBusyError(self.path, "another process has the store open "
                                         "(a read-only store): the snapshot file cannot be "
                                         "replaced under it. Close it and call "
                                         "compact(vacuum=True) again. The compaction itself "
                                         "is done.")
            finally:
                self._swapping = False
                self._wake.notify_all()
        failpoints.hit("vacuum_after_swap")

    def _retain_step(self) -> None:
        """Apply ``retain=`` after a background fold, at most once per ``_retain_every`` s."""
        if self._retain is None or time.monotonic() < self._retain_next:
            return
        self._retain_next = time.monotonic() + self._retain_every
        keep_last, older_than = self._retain
        cutoff = None if older_than is None else time.time() - older_than.total_seconds()
        try:
            with self._fold_lock:
                self._compact_locked(None, keep_last, cutoff, True)
                self._sweep_blobs()
            self._counters["retention_passes"] += 1
            self._retain_error = None
        except Error as exc:
            self._retain_error = exc

    def _writable(self) -> CommitPipeline:
        self._check_open()
        if self._pipe is None:
            raise ReadOnlyError(self.path)
        return self._pipe

    def runs(self) -> list[str]:
        """Every run id with at least one checkpoint, sorted."""

        def read(v: _View) -> list[str]:
            assert self._snap is not None
            snap = self._snap
            names = set(self._lmdb(v, lambda t: snap.reader(t).runs()))
            for layer in v.layers:
                names.update(r for r, rm in layer.runs.items()
                             if any(c.lsn <= v.snap for c, _h, _m in rm.checkpoints))
            deleted = {r for layer in v.layers for r, rm in layer.runs.items() if rm.deleted}
            names.difference_update(r for r in deleted if self._head(v, r) is None)
            return sorted(names)

        return self._with_view(read)

    def refresh(self) -> None:
        """Read-only stores: catch up with what the writer has committed since."""
        self._check_open()
        if not self.readonly:
            return
        with self._refresh_lock:  # on failure the old view stays in place
            self._load(os.path.join(self.path, WAL_DIR))

    def _new_snapshot(self) -> Snapshot:
        snap_dir = os.path.join(self.path, SNAPSHOT_DIR)
        return (Snapshot(snap_dir, readonly=self.readonly) if self._map_size is None else
                Snapshot(snap_dir, readonly=self.readonly, map_size=self._map_size))

    # -- blobs ----------------------------------------------------------------------

    def _txn_put_blob(self, txn: Transaction, source: Any, media_type: str | None) -> BlobRef:
        pipe = self._writable()
        if pipe.writer.broken is not None:  # the commit would fail: do not stream first
            raise pipe.writer.stopped()
        try:
            return self._blobs.put(source, media_type)
        except DurabilityError as exc:
            pipe.writer.broken = exc  # as for the WAL: after a failed write, no more commits
            raise

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
        where = f"{run!r}/{key!r}" + ("" if at is None else f" at {at}")
        missing: BlobMissing | None = None
        for _attempt in range(2):
            raw, ref = self._stored_ref(run, key, at, where)
            if ref is None or ref.media_type == TREE_MEDIA_TYPE:
                kind = type(decode_stored(raw, self.path, where)).__name__
                raise NotABlobError(run, key, kind)
            try:
                return self._blobs.open(ref, verify=verify)
            except BlobMissing as exc:
                # A sweep may have removed it since the view was taken (its key was
                # overwritten, or its checkpoint dropped): look once more.
                missing = exc
        assert missing is not None
        hint = ("Its file was removed: if the writer compacted the store since this read-only "
                "store's last refresh(), refresh() and read again; otherwise restore the file "
                "from a backup (its name is its SHA-256)." if self.readonly else
                "Restore the file from a backup (its name is its SHA-256), or put the "
                "artifact again.")
        raise CorruptionError(missing.path, None, f"the blob file of {where} is missing", hint)

    def _stored_raw(self, run: str, key: str, at: int | None) -> bytes:
        """The stored bytes of ``key`` (latest, or at checkpoint ``at``), in one view.

        Raises:
            RunNotFoundError, CheckpointNotFoundError, MissingKeyError, InvalidKeyError.
        """
        check_key(run, "run id")
        check_key(key)
        cid = None if at is None else _checkpoint_id(at)

        def read(v: _View) -> bytes | None:
            if cid is None:
                if self._head(v, run) is None:
                    raise RunNotFoundError(run)
                return self._read(v, run, key)
            self._check_at(v, run, cid)
            return self._raw_at(v, run, cid, key).get(key)

        raw = self._with_view(read)
        if raw is None:
            raise MissingKeyError(run, key)
        return raw

    def _stored_ref(self, run: str, key: str, at: int | None, where: str
                    ) -> tuple[bytes, BlobRef | None]:
        """The stored bytes of ``key`` and the blob reference they are (trees too), if one."""
        raw = self._stored_raw(run, key, at)
        if not is_blob_ref(raw):
            return raw, None
        try:
            return raw, decode_blob_ref(raw)
        except CodecError as exc:
            raise CorruptionError(self.path, None, f"blob reference of {where}: {exc}"
                                  ) from None

    # -- trees ----------------------------------------------------------------------

    def _txn_put_tree(self, txn: Transaction, path: Any, exclude: Any, base: bytes | None
                      ) -> tuple[BlobRef, list[str]]:
        patterns, gitignore = exclude_spec(exclude)
        pipe = self._writable()
        if pipe.writer.broken is not None:
            raise pipe.writer.stopped()
        old = None
        if is_blob_ref(base):
            with contextlib.suppress(CodecError):
                old = decode_blob_ref(base)
        try:
            got = self._trees.snapshot(path, patterns, gitignore, base=old)
        except DurabilityError as exc:
            pipe.writer.broken = exc
            raise
        return got.ref, got.pins

    def _tree_ref(self, run: str, key: str, at: int | None) -> BlobRef:
        where = f"{run!r}/{key!r}" + ("" if at is None else f" at {at}")
        raw, ref = self._stored_ref(run, key, at, where)
        if ref is None or ref.media_type != TREE_MEDIA_TYPE:
            raise NotATreeError(run, key, type(decode_stored(raw, self.path, where)).__name__)
        return ref

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
        self._check_open()
        with self._blobs.gate.shared():  # no sweep between reading the ref and the files
            return self._trees.restore(self._tree_ref(run, key, at), dest)

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
        self._check_open()
        try:
            parts = split_relpath(relpath)
        except ValueError as exc:
            raise TreePathError(str(relpath), f"is not a path inside a tree ({exc})") from None
        with self._blobs.gate.shared():  # no sweep between reading the ref and the file
            got = self._trees.open_file(self._tree_ref(run, key, at), parts, relpath)
        if isinstance(got, str):
            raise TreePathError(relpath, got)
        assert isinstance(got, BlobReader)
        return got

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
        self._check_open()
        with self._blobs.gate.shared():  # no sweep between reading the ref and the objects
            return self._trees.files(self._tree_ref(run, key, at))

    def _tree_status(self, run: str, key: str, path: str | os.PathLike[str],
                     exclude: Any) -> TreeDiff:
        """What differs on disk at ``path`` from the run's latest tree at ``key`` (Workspace)."""
        try:
            ref: BlobRef | None = self._tree_ref(run, key, None)
        except (MissingKeyError, RunNotFoundError):
            ref = None
        return self._trees.status(ref, path, *exclude_spec(exclude))

    def _blob_references(self) -> set[str]:
        """The SHA-256 of every blob any retained state or checkpoint references.

        A superset is harmless (a blob stays until the next sweep); missing
        one is not, so any damage raises instead. See :meth:`_blob_refs`.

        Raises:
            CorruptionError: a record or a blob reference is damaged.
        """
        return {ref.sha256 for ref in self._blob_refs()}

    def _blob_refs(self, problems: list[tuple[str, str]] | None = None,
                   damaged: list[str] | None = None) -> set[BlobRef]:
        """Every blob reference any retained state or checkpoint holds (for verify and backup).

        One view: the memtables' unfolded versions and deltas, and LMDB's
        ``state``, ``delta`` and ``manifest`` databases (whatever retention
        keeps there), each tree expanded into its objects and files. The
        same hash may come with several media types.

        Args:
            problems: None raises at a damaged tree object; a list collects
                ``(path, reason)`` of each one and goes on (verify).
            damaged: if given, a damaged LMDB record is described there and
                skipped (see ``SnapshotReader.inline_values``; verify).

        Raises:
            CorruptionError: a record, a blob reference or a tree object is damaged.
        """
        snap = self._snap
        assert snap is not None

        def read(v: _View) -> set[bytes]:
            found = self._lmdb(v, lambda t: snap.reader(t).inline_values(BLOB_REF_PREFIX,
                                                                          damaged=damaged))
            with self._lock:  # the active table changes under publish
                for layer in v.layers:
                    for rm in layer.runs.values():
                        for delta in rm.deltas:
                            found.update(b for b in delta.values() if is_blob_ref(b))
                        for chain in rm.versions.values():
                            found.update(b for _lsn, b in chain if is_blob_ref(b))
            return found

        out: set[BlobRef] = set()
        for raw in self._with_view(read):
            try:
                out.add(decode_blob_ref(raw))
            except CodecError as exc:
                raise CorruptionError(self.path, None, f"a blob reference: {exc}") from None
        return self._trees.expand(out, problems)

    def _sweep_blobs(self, keep: set[str] | frozenset[str] = frozenset()) -> tuple[int, int]:
        """Remove every blob file no retained state or history references.

        The hook ``compact()`` calls after dropping history. Safe while
        transactions run: under the blob gate it reads the pins of
        unfinished transactions, then computes :meth:`_blob_references`, and
        removes only files in neither (nor in ``keep``), plus temp files of
        writes no longer in progress (left by a crash or a failed put).

        Args:
            keep: more hashes to keep.

        Returns:
            ``(files removed, bytes freed)``.

        Raises:
            ReadOnlyError, StoreClosedError.
            DurabilityError: the writer is stopped, or a removal failed (it
                stops the writer).
            CorruptionError: state or history is damaged; nothing was removed.
        """
        pipe = self._writable()
        if pipe.writer.broken is not None:
            raise pipe.writer.stopped()
        try:
            return self._blobs.sweep(self._blob_references, keep)
        except DurabilityError as exc:
            pipe.writer.broken = exc
            raise

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
        found = self._effect_all() if run is None and status is None else \
            self._effect_query(run, status)
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
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        if run is not None:
            check_key(run, "run id")
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        return self._ledger.dispatch(dict(handlers), probes=probes, run=run, limit=limit)

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
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        if (result is _UNSET) == (not not_applied):
            raise ValueError("give exactly one of result=... or not_applied=True")
        return self._ledger.resolve(effect_id, result=None if result is _UNSET else result,
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
        return self._ledger.run(self._standalone(run, name, fn, key=key, mode=mode, args=args,
                                                 probe=probe, idempotent=idempotent,
                                                 retries=retries, retry_on=retry_on,
                                                 backoff=backoff, allow_async=False))

    async def aeffect(self, run: str, name: str, fn: Callable[[EffectContext], Any], *,
                      key: str, mode: EffectMode | str, args: Any = None,
                      probe: Callable[[EffectContext], Any] | None = None,
                      idempotent: bool = False, retries: int = 0,
                      retry_on: tuple[type[BaseException], ...] = (ConnectionError,
                                                                   TimeoutError),
                      backoff: float = 0.1) -> Any:
        """:meth:`effect` for asyncio (``fn`` and ``probe`` may be coroutine functions;
        ledger reads and writes run off the event loop, as for ``txn.aeffect``)."""
        return await self._ledger.arun(self._standalone(
            run, name, fn, key=key, mode=mode, args=args, probe=probe, idempotent=idempotent,
            retries=retries, retry_on=retry_on, backoff=backoff, allow_async=True))

    def _standalone(self, run: str, name: str, fn: Callable[[EffectContext], Any], *,
                    key: str, mode: EffectMode | str, args: Any,
                    probe: Callable[[EffectContext], Any] | None, idempotent: bool,
                    retries: int, retry_on: tuple[type[BaseException], ...], backoff: float,
                    allow_async: bool) -> Request:
        """The ledger request of a ``store.effect``: checked, keyed, with no position."""
        check_key(run, "run id")
        self._check_open()
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
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        return self._ledger.retire(effect_id, by=by)

    def _effects_after(self, run: str, cid: int) -> tuple[EffectRecord, ...]:
        """``run``'s ledger entries made after checkpoint ``cid`` that the world may hold."""
        return effects_after(self.effects(run=run), cid)

    def _txn_base(self, txn: Transaction) -> int:
        head = self._head(txn._view, txn.run)
        return head.id if head is not None else 0

    def _txn_epoch(self, txn: Transaction) -> int:
        """The run id's epoch as the transaction sees it (``effects.derive_key``)."""
        return self._view_epoch(txn._view, txn.run)

    def _view_epoch(self, v: _View, run: str) -> int:
        """The run id's epoch (LSN of its last deletion; 0: none) as ``v`` sees it."""
        return self._reads(v).epoch(run)

    def _epoch_at(self, run: str, lsn: int) -> int:
        """The run id's epoch for a commit at ``lsn`` being published; under ``_lock``."""
        return epoch_at((self._active, self._frozen), run, lsn, self._folded_epoch)

    def _folded_epoch(self, run: str) -> int:
        """LMDB's epoch of run id ``run`` (0: never deleted)."""
        assert self._snap is not None
        ltxn = self._snap.begin_read()
        try:
            return self._snap.reader(ltxn).epoch(run)
        finally:
            self._snap.end_read(ltxn)

    def _txn_effect(self, txn: Transaction, req: Request) -> Any:
        self._check_open()
        return self._ledger.run(req)

    def _effect_recorded(self, key: str) -> EffectRecord | None:
        """The published ledger entry for ``key`` (memtables, then LMDB); under ``_lock``."""
        for layer in (self._active, self._frozen):
            if layer is not None and key in layer.effects:
                return layer.effects[key][0]
        assert self._snap is not None
        ltxn = self._snap.begin_read()
        try:
            return self._snap.reader(ltxn).effect(key)
        finally:
            self._snap.end_read(ltxn)

    def _effect_get(self, key: str) -> EffectRecord | None:
        return self._with_view(lambda v: self._effect_get_in(v, key))

    def _effect_key_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        return self._with_view(lambda v: self._effect_key_in(v, run, checkpoint, ordinal))

    def _effect_key_in(self, v: _View, run: str, checkpoint: int, ordinal: int) -> str | None:
        """The key recorded at a position, as ``v`` sees the ledger."""
        return self._reads(v).effect_key_at(run, checkpoint, ordinal)

    def _effect_write(self, entry: EffectRecord) -> EffectRecord:
        """Log ``entry`` durably; returns it as recorded (decoded from its encoding,
        so it shares no object with the caller's)."""
        self._check_open()
        if self._pipe is None:
            raise ReadOnlyError(self.path)
        raw = encode_entry(entry)
        recorded = decode_entry(raw)
        self._pipe.record_effect(recorded, raw)
        return decode_entry(raw)

    def _effect_layers(self, v: _View) -> list[dict[str, tuple[EffectRecord, bytes]]]:
        """Copies of the view's memtable ledgers, newest first (other threads add to them)."""
        with self._lock:
            return [dict(layer.effects) for layer in v.layers]

    def _effect_all(self) -> list[EffectRecord]:
        """Every ledger entry (fresh objects: callers may keep and change them)."""
        def read(v: _View) -> list[EffectRecord]:
            snap = self._snap
            assert snap is not None
            out = {e.key: e for e in self._lmdb(v, lambda t: list(snap.reader(t).effects()))}
            for layer in reversed(self._effect_layers(v)):
                out.update((k, decode_entry(raw)) for k, (_e, raw) in layer.items())
            return list(out.values())

        return self._with_view(read)

    def _effect_query(self, run: str | None, status: str | None) -> list[EffectRecord]:
        """The ledger entries of ``run`` and/or ``status``: LMDB's through its indexes
        (a store without them yet scans), then the memtables' (fresh objects)."""
        def match(e: EffectRecord) -> bool:
            return (run is None or e.run == run) and (status is None or e.status == status)

        def read(v: _View) -> list[EffectRecord]:
            snap = self._snap
            assert snap is not None
            folded = self._lmdb(v, lambda t: snap.reader(t).effects_of(run, status))
            if folded is None:
                folded = [e for e in self._lmdb(v, lambda t: list(snap.reader(t).effects()))
                          if match(e)]
            out = {e.key: e for e in folded}
            for layer in reversed(self._effect_layers(v)):  # oldest first
                for k, (e, raw) in layer.items():
                    if match(e):
                        out[k] = decode_entry(raw)
                    else:  # a newer version that no longer matches hides LMDB's
                        out.pop(k, None)
            return list(out.values())

        return self._with_view(read)

    def _effect_outbox(self) -> list[EffectRecord]:
        """Unsettled outbox entries in commit order."""
        def read(v: _View) -> list[EffectRecord]:
            snap = self._snap
            assert snap is not None
            keys = set(self._lmdb(v, lambda t: snap.reader(t).outbox()))
            for layer in self._effect_layers(v):
                keys.update(k for k, (e, _raw) in layer.items() if e.deferred)
            return [e for e in (self._effect_get_in(v, k) for k in keys)
                    if e is not None and e.deferred and outstanding(e)]

        return sorted(self._with_view(read), key=lambda e: e.order or (0, 0))

    def _effect_get_in(self, v: _View, key: str) -> EffectRecord | None:
        with self._lock:
            found = next((layer.effects[key] for layer in v.layers if key in layer.effects),
                         None)
        if found is not None:
            return decode_entry(found[1])  # a fresh copy
        snap = self._snap
        assert snap is not None
        return self._lmdb(v, lambda t: snap.reader(t).effect(key))

    # -- verify and backup -------------------------------------------------------------------

    def verify(self) -> VerifyReport:
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

        Returns:
            A :class:`VerifyReport` (``ok``, ``problems``, ``checked``, ``notes``).

        Raises:
            StoreClosedError: the store is closed.

        Example::

            report = store.verify()
            for p in report.problems:
                print(p.where, p.what)
        """
        self._check_open()
        assert self._snap is not None
        found = check_control(self._fs, self.path, self.store_id)
        snap: Snapshot | None = self._snap
        rel = os.path.join(SNAPSHOT_DIR, "data.mdb")
        folding = self._fold_lock if not self.readonly else contextlib.nullcontext()
        with folding:
            with self._lock:
                limit = self._visible  # every record up to it is whole in the log
            try:
                check_lmdb_file(os.path.join(self._snap.directory, "data.mdb"))
            except CorruptionError as exc:  # mapping it could kill the process: skip LMDB
                found.append(Problem(rel, exc.reason, rel, offset=exc.offset))
                snap = None
            if self.readonly and snap is not None:
                # Another process writes: what it folded was acknowledged, so damage
                # up to there is damage (after it, a torn tail may be a write in progress).
                ltxn = snap.begin_read()
                with contextlib.suppress(CorruptionError):
                    limit = max(limit, snap.reader(ltxn).meta()[0])
                snap.end_read(ltxn)
            try:
                wal = read_wal(self._fs, os.path.join(self.path, WAL_DIR))
            except OSError as exc:
                raise _io_error(exc, self.path, "cannot read the WAL") from None
            if snap is None:
                return verify_store(None, wal, store_id=self.store_id, limit=limit,
                                    problems=found)
            ltxn = snap.begin_read()
            try:
                report = verify_store(snap.raw(ltxn), wal, store_id=self.store_id,
                                      limit=limit, problems=found)
            finally:
                snap.end_read(ltxn)
        return self._verify_blobs(report)

    def _verify_blobs(self, report: VerifyReport) -> VerifyReport:
        """``report`` plus the blob files: each referenced one exists, with its size and SHA-256."""
        problems = list(report.problems)
        notes = list(report.notes)
        checked = dict(report.checked)
        # A damaged record the scan meets is one the snapshot checks reported
        # at its entry: report each damage once, and check the blobs of the rest.
        in_snapshot = any(p.file == LMDB_FILE for p in problems)
        damaged: list[str] = []
        trees: list[tuple[str, str]] = []
        try:
            refs = sorted(self._blob_refs(trees, damaged), key=lambda r: r.sha256)
        except CorruptionError as exc:
            if not in_snapshot:
                problems.append(Problem("blob references", exc.reason, exc.path))
            else:
                notes.append(f"blob files not checked: {exc.reason} (reported above)")
            refs = []
        if damaged and not in_snapshot:
            problems.extend(Problem("blob references", what, LMDB_FILE) for what in damaged)
        elif damaged:
            notes.append(f"{len(damaged)} damaged record(s) reported above were not "
                         "scanned for blob references")
        for path, reason in trees:
            rel = os.path.relpath(path, self.path)
            problems.append(Problem(rel, reason, rel))
        for ref in refs:
            rel = os.path.relpath(blob_path(self._blobs.root, ref.sha256), self.path)
            try:
                with self._blobs.open(ref, verify=False) as reader:
                    reader.verify()
            except BlobMissing:
                problems.append(Problem(rel, f"the blob file of {ref.sha256} is missing "
                                        f"({ref.size} bytes referenced)", rel))
            except CorruptionError as exc:
                problems.append(Problem(rel, exc.reason, rel, offset=exc.offset))
            checked["blobs"] = checked.get("blobs", 0) + 1
            checked["blob_bytes"] = checked.get("blob_bytes", 0) + ref.size
        return VerifyReport(not problems, problems, checked, notes)

    def backup(self, dest: str | os.PathLike[str]) -> BackupReport:
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
        self._check_open()
        snap = self._snap
        assert snap is not None
        target = os.fspath(dest)
        out = OsFileSystem()  # the backup is a directory of the OS, like LMDB's copy in it
        tmp = check_destination(out, self.path, target)
        copier = Copier(self._fs, out, self.path, tmp)
        try:
            copier.copy_control()
            if self._pipe is None:  # another process may fold: the log first, then LMDB
                copier.copy_wal(quiet=False)
                copier.copy_snapshot(snap.copy_to)
            else:
                pipe = self._pipe
                with self._fold_lock:
                    with pipe.flush_lock:
                        if pipe.writer.broken is not None:
                            raise pipe.writer.stopped()
                        copier.copy_wal(quiet=True)
                        with self._lock:
                            copier.last_lsn = max(copier.last_lsn, self._visible)
                    copier.copy_snapshot(snap.copy_to)
            copier.copy_blobs()
            return copier.publish(target)
        except OSError as exc:
            raise _io_error(exc, tmp, "cannot write the backup") from None

    # -- stats and closing -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Sizes, LSNs, counters and what the last recovery did (a new dict)."""
        self._check_open()
        assert self._snap is not None
        with self._lock:
            out: dict[str, Any] = {
                "path": self.path, "store_id": str(self.store_id),
                "durability": None if self.readonly else self.durability.value,
                "readonly": self.readonly,
                "visible_lsn": self._visible, "applied_lsn": self._applied,
                "memtable_commits": len(self._active), "memtable_bytes": self._active.nbytes,
                **self._counters, "recovery": dict(self._recovery),
            }
            if self._pipe is not None:
                w = self._pipe.writer
                out.update(self._pipe.counters)
                out.update(next_lsn=self._pipe.next_lsn, synced_lsn=w.synced_lsn,
                           written_lsn=w.written_lsn,
                           wal_segments=len(w.segments), wal_bytes=w.size_bytes(),
                           wal_bytes_since_fold=w.bytes_written - self._fold_mark,
                           writer_broken=str(w.broken) if w.broken else None)
            if self._fold_error is not None:
                out["fold_error"] = str(self._fold_error)
            if self._retain_error is not None:
                out["retention_error"] = str(self._retain_error)
            # Its read is no view: wait out a vacuum's file swap as a view does, and
            # keep the vacuum's check for open reads true until it swaps.
            while self._swapping:
                self._wake.wait()
            out.update(self._snap.stats())
        return out

    def close(self) -> None:
        """Flush, fold the WAL into LMDB, and release the store (idempotent).

        After ``close()`` every method raises ``StoreClosedError``; open
        transactions are dead. If the writer is broken the fold is skipped and
        the WAL keeps everything for the next open.
        """
        if self._closed:
            return
        try:
            if self._pipe is not None and self._pipe.writer.broken is None:
                self.sync()
                self._fold()
        finally:
            self._closed = True
            self._release_all()

    def _release_all(self) -> None:
        """Stop threads and close every handle without writing anything."""
        with self._lock:
            self._stop = True
            self._closed = True
            if self._pipe is not None:
                self._pipe.closed = True  # a commit past _check_open() stops here
            self._wake.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=30)
        self._threads = []
        if self._pipe is not None:
            got = self._pipe.flush_lock.acquire(timeout=30)  # let a batch being written finish
            try:
                self._pipe.writer.close()
            finally:
                if got:
                    self._pipe.flush_lock.release()
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._snap is not None:
            if self._ro_pin is not None:
                self._snap.end_read(self._ro_pin.txn)
                self._ro_pin = None
            # Views of abandoned transactions die with this store.
            self._snap.forget_readers(0 if self.readonly else sum(self._snaps.values()))
            self._snap.close()
        if self._writer_lock is not None:
            self._writer_lock.release()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self.readonly else "open")
        return f"<agentwal.Store {self.path!r} {state} {self.durability.value}>"

    # -- asyncio (agentwal/aio.py) -----------------------------------------------------

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

    async def _txn_aeffect(self, txn: Transaction, req: Request) -> Any:
        self._check_open()
        return await self._ledger.arun(req)
