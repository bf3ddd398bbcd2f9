"""The embedded engine: opening and recovery, views and reads, publishing, folds, closing.

Theory of operation: :class:`Engine` is the local backend's state and the
work on it; ``agentwal.store.Store`` is the facade in front of it (argument
checks, docstrings, delegation) and reaches it only through the methods
below. The engine owns the memtables, the LMDB snapshot and the open views;
the commit pipeline (``local/commit.py``: validation, group commit, failure
rollback) hands it durable batches through :meth:`Engine.publish`. Its
parts, one concern each, hold the engine and work on its state under its
locks: ``startup`` (opening and recovery: ``local/startup.py``), ``folder``,
``maintenance``, ``blobrefs``, ``effectlog``, ``audit`` and ``runs``.

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
:meth:`BlobRefs.refs` expands every tree reference into the objects and
files it names, so sweeps, verify and backups cover trees with no code of
their own.

*Blobs*: ``txn.put_blob`` writes through :class:`~agentwal.local.blobs.BlobStore`
(durable before the commit that names it); ``open_blob`` resolves a key's
reference in a view and opens the file; ``BlobRefs.sweep`` removes the files
no retained state or history references (:meth:`BlobRefs.references`),
sparing those pinned by unfinished transactions.

Lock order: ``_fold_lock`` → the pipeline's ``flush_lock`` → ``_lock`` (shared
with the pipeline). ``_lock`` is never held across I/O except to begin an LMDB
read transaction, and for the file swap of a vacuum (a few milliseconds).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from .. import failpoints, forks
from ..backend import Change
from ..codec import Value
from ..effects import (
    EffectMode,
    EffectRecord,
)
from ..errors import (
    Error,
    ReadOnlyError,
    StoreClosedError,
)
from ..format import (
    BLOBS_DIR,
    WAL_DIR,
)
from ..io import FileSystem, WriterLock, io_error
from ..ledger import Ledger, PositionOwners, Request
from ..treeio import TreeStore
from ..txn import Transaction
from ..types import (
    BlobRef,
    Checkpoint,
    Durability,
)
from .apply import apply_record, from_pending
from .audit import Audit
from .backend import LocalBackend
from .background import BUSY, IDLE, STOP, Worker
from .blobrefs import BlobRefs
from .blobs import BlobStore
from .commit import CommitPipeline, Pending
from .effectlog import EffectLog
from .fold import Folder
from .healthfile import HealthFile
from .maintenance import Maintenance
from .memtable import Memtable
from .reads import LayeredReader, Pin, View, epoch_at, in_txn
from .recovery import Lost
from .runs import Runs
from .snapshot import RunInfo, Snapshot, SnapshotReader
from .startup import Startup

__all__ = ["Engine", "open_engine"]

_NEWEST = 1 << 63  # a snapshot LSN past every record
#: Seconds between two passes of the automatic retention policy (``retain=``).
_RETAIN_EVERY = 60.0
#: ``retain=`` also runs after this many commits since its last pass.
_RETAIN_COMMITS = 1000
#: A fold also starts once the active memtable holds this many times ``wal_max_bytes``:
#: it holds whole values where the log holds only what ``txn.append`` added, so a
#: growing list would otherwise keep every version in memory until the log fills.
MEMTABLE_PER_LOG = 4
T = TypeVar("T")


def open_engine(path: str, durability: Durability, *, readonly: bool, wal_max_bytes: int,
                fs: FileSystem, sync_interval: float, segment_bytes: int,
                map_size: int | None, effect_retention: float | None,
                retain: tuple[int | None, datetime.timedelta | None] | None,
                first_segment_bytes: int | None = None, recover_prefix: bool = False
                ) -> Engine:
    """Open (or create) the store at ``path`` and recover it (``agentwal.open``'s work).

    The arguments are checked by the caller. On any failure every handle taken
    is released again, and an ``OSError`` becomes the typed error it means.
    """
    engine = Engine(path, durability, readonly, wal_max_bytes, fs, sync_interval,
                    segment_bytes, map_size, effect_retention=effect_retention, retain=retain)
    engine._first_segment_bytes = first_segment_bytes
    engine._recover_prefix = recover_prefix
    try:
        engine.startup.open()
    except OSError as exc:
        engine._release_all()
        raise io_error(exc, engine.path, "cannot open the store") from None
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
        self._first_segment_bytes: int | None = None  # None: every segment segment_bytes
        self._recover_prefix = False  # open(recover="prefix"): stop at damage, say what's lost
        #: with ``recover="prefix"``: what the log holds past the intact prefix (None: nothing)
        self.lost: Lost | None = None
        self._map_size = map_size
        self._split_commits_for_test = False  # harness self-test only: breaks atomicity
        self._lock = threading.Lock()
        self._fold_lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        #: True before the open finished and after close (``check_open`` refuses then)
        self.closed = True
        self._stop = False
        self._writer_lock: WriterLock | None = None
        self._snap: Snapshot | None = None
        self._pipe: CommitPipeline | None = None
        self._workers: list[Worker] = []
        #: why the engine is closed when it is not by close() (a forked child's)
        self.closed_why: str | None = None
        #: the ``Store`` in front of this engine (weakly): an open of the same directory
        #: in this process waits for a dropped one (``startup._settle_dropped``)
        self.facade: weakref.ref[Any] | None = None
        self._folder: Worker | None = None  # the fold thread (started when a fold is wanted)
        self._flusher: Worker | None = None  # async mode's flush thread (while writes are unsynced)
        self._active = Memtable()
        self._frozen: Memtable | None = None
        self._visible = 0
        #: the LSN of the newest state ``store.get`` can see (``_visible``), kept apart so a
        #: read can compare it without the lock: the latest state of every run is the same
        #: while it has not moved. Set by publish only (an open sets the state it starts
        #: from before any read); -1 on a read-only engine, whose refresh moves the state
        #: without a publish (its reads keep no stamped entries)
        self.stamp = -1 if readonly else 0
        self._applied = 0
        self._snaps: dict[int, int] = {}
        self._ro_pin: Pin | None = None
        self._ro_lock = threading.Lock()  # reads through a shared LMDB txn, one at a time
        self._refresh_lock = threading.Lock()
        self._dead: collections.deque[View] = collections.deque()  # from Transaction.__del__
        #: (run, checkpoint) -> the live transaction whose step uses the effect
        #: positions there (``EffectLog.claim``); under ``_lock``
        self._pos_owners = PositionOwners()
        self._fold_wanted = False
        self._fold_error: BaseException | None = None
        self._fold_retry_at = 0.0  # after a failed fold, the next try waits until then
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._fold_mark = 0
        #: what ``stats()`` reports of the engine's work (the facade counts ``retries``)
        self.counters = {"folds": 0, "segments_removed": 0, "map_grows": 0,
                         "retention_passes": 0, "retries": 0}
        self._recovery: dict[str, Any] = {}
        self.store_id: Any = None
        self.backend = LocalBackend(self)  # the seam's view of this engine
        self.ledger = Ledger(self.backend)  # the effects executor over this engine
        self._effect_retention = effect_retention  # seconds; None keeps settled entries
        self._next_expiry = 0.0
        #: ``(keep_last, older_than)`` of ``retain=``; applied by the fold thread
        self._retain = retain
        self._retain_every = _RETAIN_EVERY
        self._retain_next = time.monotonic() + _RETAIN_EVERY  # the next timed retention pass
        self._retain_commits = 0  # commits since the last retention pass
        self._retain_wanted = False  # a pass is due: the fold thread runs it
        self._retain_error: BaseException | None = None
        #: the writer's HEALTH file (``local/healthfile.py``); None when read-only
        self.health: HealthFile | None = None
        self._swapping = False  # the LMDB file is being swapped (vacuum, reopen): views wait
        self._blobs = BlobStore(fs, path, BLOBS_DIR)
        self._trees = TreeStore(self._blobs, path, readonly=readonly)
        self.folder = Folder(self)
        self.maintenance = Maintenance(self)
        self.blobrefs = BlobRefs(self)
        self.effectlog = EffectLog(self)
        self.audit = Audit(self)
        self.runs = Runs(self)
        self.startup = Startup(self)

    def refresh(self) -> None:
        """Read-only engines: load what the writer has committed since (``Store.refresh``)."""
        self.check_open()
        if not self.readonly:
            return
        with self._refresh_lock:  # on failure the old view stays in place
            self.startup.load(os.path.join(self.path, WAL_DIR))

    # -- views ----------------------------------------------------------------------

    def close_in_forked_child(self, opener: int) -> None:
        """In a child forked while this engine was open (``agentwal.forks``): closed, with
        the reason its errors give, and its handles left alone. LMDB's environment, the
        log's offsets and the writer lock are the parent's: a child's commits were
        overwritten by the parent's (acknowledged, then lost, and a torn record in its
        log), and closing the environment here would clear the parent's reader slots."""
        if self.closed:
            return
        self.closed_why = forks.why(opener, "Open it in this process (readonly=True while "
                                    "the other one writes), or start processes with the "
                                    "'spawn' method.")
        self.closed = True
        if self._pipe is not None:
            self._pipe.closed = True
        if self._finalizer is not None:
            self._finalizer.detach()

    def check_open(self) -> None:
        """Raise ``StoreClosedError`` if the engine is closed."""
        if self.closed:
            raise StoreClosedError(self.path, self.closed_why)

    def _writable(self) -> CommitPipeline:
        self.check_open()
        if self._pipe is None:
            raise ReadOnlyError(self.path)
        return self._pipe

    def _view(self) -> View:
        self.check_open()
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
                view = View(snap, layers, pin.txn, self._ro_lock, pin)
            else:
                view = View(snap, layers, self._snap.begin_read(), None)
            self._snaps[snap] = self._snaps.get(snap, 0) + 1
        return view

    def _release(self, view: View) -> None:
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

    def _lmdb(self, view: View, fn: Callable[[Any], T]) -> T:
        return in_txn(view, fn)

    def _reads(self, view: View) -> LayeredReader:
        assert self._snap is not None
        return LayeredReader(self._snap, view)

    def _info(self, view: View, run: str) -> RunInfo | None:
        return self._reads(view).info(run)

    def _layers(self, view: View, run: str) -> tuple[Memtable, ...]:
        return self._reads(view).layers(run)

    def _read(self, view: View, run: str, key: str) -> bytes | None:
        return self._reads(view).value(run, key)

    def _stored(self, view: View, run: str, key: str) -> Value | None:
        return self._reads(view).stored(run, key)

    def _items(self, view: View, run: str, prefix: str) -> dict[str, bytes | None]:
        return self._reads(view).items(run, prefix)

    def _head(self, view: View, run: str) -> Checkpoint | None:
        return self._reads(view).head(run)

    def _check_at(self, view: View, run: str, cid: int) -> Checkpoint:
        return self._reads(view).check_at(run, cid)

    def _raw_at(self, view: View, run: str, cid: int,
                key: str | None = None) -> dict[str, bytes]:
        return self._reads(view).state_at(run, cid, key)

    def _with_view(self, fn: Callable[[View], T]) -> T:
        view = self._view()
        try:
            return fn(view)
        finally:
            self._release(view)

    # -- commits (LocalBackend.commit) ---------------------------------------------

    def commit_change(self, view: View, change: Change) -> Checkpoint | None:
        """Commit ``change``, read at ``view``, through the pipeline (``RunStore.commit``).

        An empty change applies nothing and returns the run's head as the view sees it.
        """
        self.check_open()
        run, pipe = change.run, self._pipe
        if pipe is None:
            raise ReadOnlyError(self.path)
        failpoints.hit("commit_before_validate")
        if change.empty:
            return self._head(view, run)
        delta = dict(change.writes)
        if self._split_commits_for_test and len(delta) > 1:
            # A deliberately broken engine (harness self-test): one transaction
            # becomes two commits, so a crash between them shows half of it.
            keys = sorted(delta)
            half = len(keys) // 2
            pipe.commit(run, view.snap, change.reads, change.prefixes,
                        {k: delta[k] for k in keys[:half]}, {})
            return pipe.commit(run, 1 << 62, set(), set(), {k: delta[k] for k in keys[half:]},
                               dict(change.meta))
        return pipe.commit(run, view.snap, change.reads, change.prefixes, delta,
                           dict(change.meta), list(change.deferred), origin=change.origin,
                           effects=change.effects, appends=change.appends)

    def _view_epoch(self, v: View, run: str) -> int:
        """The run id's epoch (LSN of its last deletion; 0: none) as ``v`` sees it."""
        return self._reads(v).epoch(run)

    # -- the transaction's hooks (txn.StepHooks; its reads and commit: LocalBackend) --

    def txn_put_blob(self, source: Any, media_type: str | None) -> BlobRef:
        return self.blobrefs.put_blob(source, media_type)

    def txn_put_tree(self, path: Any, exclude: Any, base: bytes | None, rehash: bool = False,
                     subdir: str | None = None) -> tuple[BlobRef, list[str]]:
        return self.blobrefs.put_tree(path, exclude, base, rehash, subdir)

    def txn_unpin(self, pins: list[str]) -> None:
        self._blobs.unpin(pins)

    def txn_abandon_pins(self, pins: list[str]) -> None:
        self._blobs.abandon(pins)

    def txn_effect(self, view: Any, req: Request) -> Any:
        self.check_open()
        _fenced(view, req)
        return self.ledger.run(req)

    async def txn_aeffect(self, view: Any, req: Request) -> Any:
        self.check_open()
        _fenced(view, req)
        return await self.ledger.arun(req)

    def txn_adopt(self, run: str, base: int, name: str, digest: str, mode: EffectMode,
                  epoch: int, key: str | None = None) -> int | None:
        return self.effectlog.adopt(run, base, name, digest, mode, epoch, key)

    def txn_claim(self, txn: Transaction, base: int, *, chain: object,
                  inherited: bool) -> None:
        self.effectlog.claim(txn, base, chain, inherited)

    # -- commit.Tables: what the pipeline reaches through the engine ----------------

    def head_of(self, run: str) -> tuple[int, bytes] | None:
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
        info = self._lmdb_now(lambda r: r.run_info(run))
        return (info.head, info.head_hash) if info is not None else None

    def oldest_snapshot(self) -> int:
        """The oldest snapshot LSN an open view still reads at; under ``_lock``."""
        return min(self._snaps) if self._snaps else self._visible

    def known_effect(self, key: str) -> EffectRecord | None:
        """The published ledger entry for ``key``; under ``_lock``."""
        return self.effectlog.recorded(key)

    def publish(self, batch: list[Pending], pos: tuple[int, int] | None) -> None:
        """Make a durable batch visible, in LSN order; under ``_lock``."""
        oldest = self.oldest_snapshot()
        for p in batch:  # the same mapping replay uses (local/apply.py)
            apply_record(self._active, from_pending(p), store_id=self.store_id, oldest=oldest,
                         lookup=self.effectlog.recorded, epoch=self._epoch_at)
            self._visible = p.lsn
        self.stamp = self._visible
        self._active.log_pos = pos
        assert self._pipe is not None
        if ((self._pipe.writer.bytes_written - self._fold_mark >= self.wal_max_bytes
                or self._active.nbytes >= MEMTABLE_PER_LOG * self.wal_max_bytes)
                and time.monotonic() >= self._fold_retry_at):
            self._want_fold()
        if self._flusher is not None and self._pipe.writer.written_lsn > \
                self._pipe.writer.synced_lsn:
            self._flusher.kick()
        if self._pipe.writer.spare_wanted and self._folder is not None:
            self._folder.kick()  # the next segment, made ahead of need (Writer.prepare_spare)
        if self._retain is not None:
            self._retain_commits += len(batch)
            if not self._retain_wanted and self._retain_due() and self._folder is not None:
                self._retain_wanted = True
                self._folder.kick()

    def _retain_due(self) -> bool:
        """Due: ``_RETAIN_COMMITS`` commits, or ``_retain_every`` s, since the last pass."""
        return self._retain_commits >= _RETAIN_COMMITS or (
            self._retain_commits > 0 and time.monotonic() >= self._retain_next)

    def _want_fold(self) -> None:
        """Ask the fold thread for a fold (starting it if idle); under ``_lock``."""
        self._fold_wanted = True
        if self._folder is not None:
            self._folder.kick()

    def _epoch_at(self, run: str, lsn: int) -> int:
        """The run id's epoch for a commit at ``lsn`` being published; under ``_lock``."""
        return epoch_at((self._active, self._frozen), run, lsn, self._folded_epoch)

    def _folded_epoch(self, run: str) -> int:
        """LMDB's epoch of run id ``run`` (0: never deleted)."""
        return self._lmdb_now(lambda r: r.epoch(run))

    def _lmdb_now(self, fn: Callable[[SnapshotReader], T]) -> T:
        """``fn`` of a fresh LMDB read, outside any view (for the pipeline, under ``_lock``)."""
        assert self._snap is not None
        ltxn = self._snap.begin_read()
        try:
            return fn(self._snap.reader(ltxn))
        finally:
            self._snap.end_read(ltxn)

    # -- syncing and folding --------------------------------------------------------

    def sync(self) -> None:
        """Make every acknowledged commit durable now (``Store.sync``)."""
        self.check_open()
        if self._pipe is not None:
            self._pipe.sync()

    def _flush_step(self) -> str:
        """Async mode's background flush: BUSY, IDLE (nothing unsynced) or STOP."""
        pipe = self._pipe
        if pipe is None or self._stop:
            return STOP
        # A failed sync stops the writer; the commits that follow report it. No
        # flush_lock: the writer syncs while commits go on writing (Writer.lock).
        with contextlib.suppress(Error):
            if pipe.writer.broken is None and not pipe.writer.closed:
                if pipe.writer.written_lsn <= pipe.writer.synced_lsn:
                    return IDLE
                pipe.sync_written()
        return BUSY

    def snapshot(self) -> None:
        """Fold the WAL into LMDB now (``Store.snapshot``)."""
        self.check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)
        self.folder.fold()
        self.maintenance.retain_step(force=True)

    # -- stats and closing ----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Sizes, LSNs, counters and the last recovery (``Store.stats``)."""
        self.check_open()
        assert self._snap is not None
        with self._lock:
            out: dict[str, Any] = {
                "path": self.path, "store_id": str(self.store_id),
                "durability": None if self.readonly else self.durability.value,
                "readonly": self.readonly,
                "visible_lsn": self._visible, "applied_lsn": self._applied,
                "memtable_commits": len(self._active), "memtable_bytes": self._active.nbytes,
                **self.counters, "recovery": dict(self._recovery),
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
        if self.closed:
            return
        try:
            if self._pipe is not None and self._pipe.writer.broken is None:
                self.sync()
                self.folder.fold()
                self.maintenance.retain_step(force=True)
                self._pipe.writer.remove_spare()
                # At rest a store keeps a first segment, not a grown one's zeros (which
                # the next open would read). Best effort: when it fails, the grown
                # segment and all it holds are still there, and nothing is lost.
                with self._pipe.flush_lock, contextlib.suppress(Error):
                    self._pipe.writer.restart_small(self._applied)
        finally:
            self.closed = True
            self._release_all()

    def _release_all(self) -> None:
        """Stop threads and close every handle without writing anything."""
        with self._lock:
            self._stop = True
            self.closed = True
            if self._pipe is not None:
                self._pipe.closed = True  # a commit past check_open() stops here
            self._wake.notify_all()
        for w in self._workers:
            w.join(timeout=30)
        self._workers = []
        if self._pipe is not None:
            got = self._pipe.flush_lock.acquire(timeout=30)  # let a batch being written finish
            try:
                if got:  # ... and be synced and published by its committers
                    self._pipe.drain(timeout=30)
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


def _fenced(view: Any, req: Request) -> None:
    """Refuse an effect of a step whose lease was released; else pass its epoch to ``fn``."""
    lease = view.fence
    if lease is not None:
        lease.check()
        req.fencing_token = lease.epoch
