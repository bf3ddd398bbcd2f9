"""The embedded engine: opening and recovery, views and reads, publishing, folds, closing.

Theory of operation: :class:`Engine` is the local backend's state and the
work on it; ``agentwal.store.Store`` is the facade in front of it (argument
checks, docstrings, delegation) and reaches it only through the methods
below. The engine owns the memtables, the LMDB snapshot and the open views;
the commit pipeline (``local/commit.py``: validation, group commit, failure
rollback) hands it durable batches through :meth:`Engine._publish`.

*Visibility after durability*: a commit becomes readable only after it is as
durable as the mode promises, so nobody acts on state a crash can take back.

*Isolation*: a view is ``(snapshot LSN, memtables, LMDB read txn)`` taken
under the engine lock, so it never changes under a transaction or a read;
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
file in under ``_lock`` (``local/snapshot/`` has its crash windows).

Crash windows: see ``recovery.py`` (the log), ``wal/writer.py`` (segments),
``snapshot/`` (LMDB) and ``blobs.py`` (blob files); the engine itself keeps
no state on disk of its own beyond what those write.

*Trees* (``txn.put_tree``, ``restore_tree``, ``open_tree_file``) are blobs
too: :class:`~agentwal.treeio.TreeStore` snapshots and restores them, and
:meth:`Engine._blob_refs` expands every tree reference into the objects and
files it names, so sweeps, verify and backups cover trees with no code of
their own.

*Blobs*: ``txn.put_blob`` writes through :class:`~agentwal.local.blobs.BlobStore`
(durable before the commit that names it); ``open_blob`` resolves a key's
reference in a view and opens the file; ``_sweep_blobs`` removes the files
no retained state or history references (:meth:`Engine._blob_references`),
sparing those pinned by unfinished transactions.

Lock order: ``_fold_lock`` → the pipeline's ``flush_lock`` → ``_lock`` (shared
with the pipeline). ``_lock`` is never held across I/O except to begin an LMDB
read transaction, and for the file swap of a vacuum (a few milliseconds).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import gc
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .. import failpoints
from ..codec import CodecError, decode_blob_ref, decode_stored, is_blob_ref
from ..effects import (
    EffectMode,
    EffectRecord,
    decode_entry,
    derive_key,
    encode_entry,
    outstanding,
)
from ..errors import (
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
    StoreClosedError,
    TreePathError,
)
from ..format import (
    BLOB_REF_PREFIX,
    BLOBS_DIR,
    SNAPSHOT_DIR,
    TREE_MEDIA_TYPE,
    WAL_DIR,
)
from ..io import DISK_FULL_ERRNOS, FileSystem, OsFileSystem, WriterLock
from ..ledger import Ledger, Request
from ..tree import exclude_spec
from ..treeio import RestoreReport, TreeStore
from ..txn import Transaction
from ..types import (
    BlobRef,
    Checkpoint,
    Diff,
    Durability,
    TreeDiff,
    TreeFile,
    TreeRef,
    check_checkpoint_id,
    check_key,
)
from .apply import apply_record, from_pending, replay
from .backup import BackupReport, Copier, check_destination
from .blobs import BlobMissing, BlobReader, BlobStore, blob_path
from .commit import CommitPipeline, Pending
from .control import create_control, read_control
from .fold import Folder
from .maintenance import Maintenance
from .memtable import Memtable
from .reads import LayeredReader, Pin, View, epoch_at, in_txn
from .recovery import Plan, recover
from .snapshot import RunInfo, Snapshot, check_lmdb_file
from .verify import LMDB_FILE, Problem, VerifyReport, check_control, read_wal
from .verify import verify as verify_store
from .wal import Writer

__all__ = ["Engine", "open_engine"]

_NEWEST = 1 << 63  # a snapshot LSN past every record
#: Seconds between two passes of the automatic retention policy (``retain=``).
_RETAIN_EVERY = 60.0
#: How many checkpoints back a step looks for an uncommitted attempt of itself.
_ADOPT_WALK = 32
T = TypeVar("T")


_Pin = Pin  # the old names, used throughout the engine's body below
_View = View


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


def _background(ref: weakref.ref[Engine], wake: threading.Condition,
                step: Callable[[Engine], bool], interval: float) -> None:
    """An engine's background thread: wake (notified or every ``interval``), do ``step``."""
    while True:
        with wake:
            wake.wait(interval)
        engine = ref()
        if engine is None or not step(engine):
            return
        del engine


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



def open_engine(path: str, durability: Durability, *, readonly: bool, wal_max_bytes: int,
                fs: FileSystem, sync_interval: float, segment_bytes: int,
                map_size: int | None, effect_retention: float | None,
                retain: tuple[int | None, datetime.timedelta | None] | None) -> Engine:
    """Open (or create) the store at ``path`` and recover it (``agentwal.open``'s work).

    The arguments are checked by the caller. On any failure every handle taken
    is released again, and an ``OSError`` becomes the typed error it means.
    """
    engine = Engine(path, durability, readonly, wal_max_bytes, fs, sync_interval,
                    segment_bytes, map_size, effect_retention=effect_retention, retain=retain)
    try:
        engine._open()
    except OSError as exc:
        engine._release_all()
        raise _io_error(exc, engine.path, "cannot open the store") from None
    except BaseException:
        engine._release_all()
        raise
    return engine


class Engine:
    """The local backend's state and work; the facade ``agentwal.Store`` drives it."""

    # -- opening --------------------------------------------------------------------

    def __init__(self, path: str, durability: Durability, readonly: bool, wal_max_bytes: int,
                 fs: FileSystem, sync_interval: float, segment_bytes: int,
                 map_size: int | None = None, *, effect_retention: float | None = None,
                 retain: tuple[int | None, datetime.timedelta | None] | None = None) -> None:
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
        self._effect_retention = effect_retention  # seconds; None keeps settled entries
        self._next_expiry = 0.0
        #: ``(keep_last, older_than)`` of ``retain=``; applied by the fold thread
        self._retain = retain
        self._retain_every = _RETAIN_EVERY
        self._retain_next = 0.0  # monotonic time of the next retention pass
        self._retain_error: BaseException | None = None
        self._swapping = False  # the LMDB file is being swapped (vacuum, reopen): views wait
        self._blobs = BlobStore(fs, path, BLOBS_DIR)
        self._trees = TreeStore(self._blobs, path, readonly=readonly)
        self.folder = Folder(self)
        self.maintenance = Maintenance(self)

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

    def _new_snapshot(self) -> Snapshot:
        snap_dir = os.path.join(self.path, SNAPSHOT_DIR)
        return (Snapshot(snap_dir, readonly=self.readonly) if self._map_size is None else
                Snapshot(snap_dir, readonly=self.readonly, map_size=self._map_size))

    def _start_threads(self) -> None:
        # The threads hold the store weakly, so a store dropped without close()
        # is still collected, and its finalizer releases the writer lock.
        self._stop = False
        ref = weakref.ref(self)
        jobs: list[tuple[str, Callable[[Engine], bool], float]] = [
            ("agentwal-fold", lambda e: e.folder.step(), 1.0)]
        if self.durability is Durability.ASYNC:
            jobs.append(("agentwal-flush", lambda e: e._flush_step(), self._sync_interval))
        for name, step, interval in jobs:
            t = threading.Thread(target=_background, args=(ref, self._wake, step, interval),
                                 name=name, daemon=True)
            self._threads.append(t)
            t.start()

    def refresh(self) -> None:
        """Read-only engines: load what the writer has committed since (``Store.refresh``)."""
        self._check_open()
        if not self.readonly:
            return
        with self._refresh_lock:  # on failure the old view stays in place
            self._load(os.path.join(self.path, WAL_DIR))

    # -- views ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(self.path)

    def _writable(self) -> CommitPipeline:
        self._check_open()
        if self._pipe is None:
            raise ReadOnlyError(self.path)
        return self._pipe

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

    def _with_view(self, fn: Callable[[_View], T]) -> T:
        view = self._view()
        try:
            return fn(view)
        finally:
            self._release(view)

    # -- the transaction hooks (txn._Engine) ----------------------------------------

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

    def _txn_base(self, txn: Transaction) -> int:
        head = self._head(txn._view, txn.run)
        return head.id if head is not None else 0

    def _txn_epoch(self, txn: Transaction) -> int:
        """The run id's epoch as the transaction sees it (``effects.derive_key``)."""
        return self._view_epoch(txn._view, txn.run)

    def _view_epoch(self, v: _View, run: str) -> int:
        """The run id's epoch (LSN of its last deletion; 0: none) as ``v`` sees it."""
        return self._reads(v).epoch(run)

    def _txn_effect(self, txn: Transaction, req: Request) -> Any:
        self._check_open()
        return self._ledger.run(req)

    async def _txn_aeffect(self, txn: Transaction, req: Request) -> Any:
        self._check_open()
        return await self._ledger.arun(req)

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
        for c in self.history(run, base - found, None):
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

    # -- the pipeline callbacks -----------------------------------------------------

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

    # -- syncing and folding --------------------------------------------------------

    def sync(self) -> None:
        """Make every acknowledged commit durable now (``Store.sync``)."""
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

    def snapshot(self) -> None:
        """Fold the WAL into LMDB now (``Store.snapshot``)."""
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        self.folder.fold()

    # -- reads ----------------------------------------------------------------------

    def value(self, run: str, key: str, cid: int | None) -> bytes | None:
        """The stored bytes of ``key`` (latest, or at checkpoint ``cid``), in one view."""
        if cid is None:
            return self._latest_raw(run, key)

        def read_at(v: _View) -> bytes | None:
            self._check_at(v, run, cid)
            return self._raw_at(v, run, cid, key).get(key)

        return self._with_view(read_at)

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

    def state_raw(self, run: str, cid: int | None) -> dict[str, bytes | None]:
        """The run's stored state (latest, or at checkpoint ``cid``), in one view."""

        def read(v: _View) -> dict[str, bytes | None]:
            if cid is not None:
                head = self._check_at(v, run, cid)
                if cid != head.id:
                    return dict(self._raw_at(v, run, cid))
            elif self._head(v, run) is None:
                raise RunNotFoundError(run)
            return self._items(v, run, "")

        return self._with_view(read)

    def head(self, run: str) -> Checkpoint | None:
        """The run's latest checkpoint, or None."""
        return self._with_view(lambda v: self._head(v, run))

    def history(self, run: str, limit: int | None, upto: int | None) -> list[Checkpoint]:
        """The run's checkpoints, newest first (``Store.history``)."""

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

    def diff(self, run: str, ca: int, cb: int) -> Diff:
        """What changed in ``run`` from checkpoint ``ca`` to ``cb`` (``Store.diff``)."""

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

    # -- writes beside transactions -------------------------------------------------

    def rollback_to(self, run: str, cid: int) -> Checkpoint:
        """A new checkpoint with the state at ``cid`` (``Store.rollback_to``)."""
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
        return ckpt

    def fork(self, run: str, cid: int, new_run: str) -> Checkpoint:
        """Start ``new_run`` from ``run`` at ``cid`` (``Store.fork``)."""
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
        return ckpt

    def delete_run(self, run: str) -> None:
        """Delete ``run`` durably and wake the fold that removes it (``Store.delete_run``)."""
        pipe = self._writable()
        pipe.delete_run(run)
        failpoints.hit("delete_run_after_record")
        with self._lock:
            self._fold_wanted = True
            self._wake.notify_all()

    # -- compaction and vacuum ------------------------------------------------------

    # -- blobs and trees ------------------------------------------------------------

    def _txn_put_blob(self, txn: Transaction, source: Any, media_type: str | None) -> BlobRef:
        pipe = self._writable()
        if pipe.writer.broken is not None:  # the commit would fail: do not stream first
            raise pipe.writer.stopped()
        try:
            return self._blobs.put(source, media_type)
        except DurabilityError as exc:
            pipe.writer.broken = exc  # as for the WAL: after a failed write, no more commits
            raise

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

    def open_blob(self, run: str, key: str, at: int | None, verify: bool) -> BlobReader:
        """The blob ``key`` holds, opened; one retry after a sweep (``Store.open_blob``)."""
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
        cid = None if at is None else check_checkpoint_id(at)

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

    def _tree_ref(self, run: str, key: str, at: int | None) -> BlobRef:
        where = f"{run!r}/{key!r}" + ("" if at is None else f" at {at}")
        raw, ref = self._stored_ref(run, key, at, where)
        if ref is None or ref.media_type != TREE_MEDIA_TYPE:
            raise NotATreeError(run, key, type(decode_stored(raw, self.path, where)).__name__)
        return ref

    def restore_tree(self, run: str, key: str, dest: str | os.PathLike[str],
                     at: int | None) -> RestoreReport:
        """Make ``dest`` the tree ``key`` holds (``Store.restore_tree``)."""
        with self._blobs.gate.shared():  # no sweep between reading the ref and the files
            return self._trees.restore(self._tree_ref(run, key, at), dest)

    def open_tree_file(self, run: str, key: str, relpath: str, parts: list[str],
                       at: int | None) -> BlobReader:
        """One file of the tree ``key`` holds, opened (``Store.open_tree_file``)."""
        with self._blobs.gate.shared():  # no sweep between reading the ref and the file
            got = self._trees.open_file(self._tree_ref(run, key, at), parts, relpath)
        if isinstance(got, str):
            raise TreePathError(relpath, got)
        assert isinstance(got, BlobReader)
        return got

    def list_tree(self, run: str, key: str, at: int | None) -> list[TreeFile]:
        """Every file and link of the tree ``key`` holds (``Store.list_tree``)."""
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

    # -- the ledger hooks (ledger._Engine) ------------------------------------------

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

    # -- verify and backup ----------------------------------------------------------

    def verify(self) -> VerifyReport:
        """Every offline check, in one consistent view (``Store.verify``)."""
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
        """A consistent copy of the store at ``dest`` (``Store.backup``)."""
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

    # -- stats and closing ----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Sizes, LSNs, counters and the last recovery (``Store.stats``)."""
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
        """Flush, fold and release everything (``Store.close``; idempotent)."""
        if self._closed:
            return
        try:
            if self._pipe is not None and self._pipe.writer.broken is None:
                self.sync()
                self.folder.fold()
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

