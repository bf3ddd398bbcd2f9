"""Opening an engine: the writer lock, CONTROL, the LMDB base, WAL replay, the writer.

Theory of operation: :class:`Startup` is the part of an
:class:`~agentwal.local.engine.Engine` that brings it up (``open_engine``
calls :meth:`Startup.open`) and, for a read-only engine, catches it up
again (``Store.refresh`` calls :meth:`Startup.load`). Opening takes the
writer lock (a writer), reads or creates CONTROL, opens the LMDB snapshot,
then :meth:`load`: pin an LMDB read transaction and its ``applied_lsn``,
plan recovery of the log after it (``recovery.py``), replay the plan into a
memtable (``apply.py``), and start the WAL writer and the commit pipeline
where the log ends. Nothing is visible before the replay is complete, and
a failure leaves the engine unopened (``open_engine`` releases every
handle). A read-only engine races the writer's folds, so
:meth:`read_base` retries with a fresh LMDB view a few times before it
believes damage. It writes nothing of its own: recovery repairs the log's
tail (a writer only) and the writer creates its segments.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import forks
from ..errors import CorruptionError, DurabilityError, StoreLockedError
from ..format import APPENDS_VERSION, LAYOUT4_VERSION, SNAPSHOT_DIR, WAL_DIR
from ..io import WriterLock, io_error
from ..types import Durability
from .apply import replay
from .background import Worker
from .commit import CommitPipeline
from .control import ControlFile, create_control, read_control
from .healthfile import HealthFile
from .opening import missing_snapshot, no_control, prepare
from .reads import Pin
from .recovery import Plan, recover
from .snapshot import Snapshot
from .wal import Writer

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Startup"]


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


def _release_handles(lock: WriterLock | None, snap: Snapshot | None,
                     writer: Writer | None) -> None:
    """Finalizer of a store dropped without close(): like a crash, nothing is written."""
    if writer is not None:
        writer.close()
    if snap is not None:
        snap.close()
    if lock is not None:
        lock.release()



#: The writer engine of each store directory open in this process (by real path), so that
#: an open that finds the writer lock held by this process can tell a dropped one.
_WRITERS: weakref.WeakValueDictionary[str, Engine] = weakref.WeakValueDictionary()

#: Seconds an open waits for a dropped store's background step (a fold) to end.
SETTLE_SECONDS = 60.0


def _settle_dropped(path: str) -> bool:
    """Let a writer store of this process whose ``Store`` was dropped without ``close()``
    let go of the writer lock; False if that store's ``Store`` is still in use.

    A dropped store lives on while its background threads run a step (a step holds it)
    and then until the cyclic garbage collector frees it (its parts refer to each
    other); its finalizer releases the lock. So: ask its threads to end after the step
    in progress, wait for that step, and collect.
    """
    engine = _WRITERS.get(os.path.realpath(path))
    if engine is not None:
        facade = engine.facade() if engine.facade is not None else None
        if facade is not None:
            return False  # open, and the program holds it: the lock error is right
        workers = list(engine._workers)
        del engine  # only the registry's weak reference is left here: the engine may go
        for w in workers:
            w.halt()
        for w in workers:
            w.wait_step(SETTLE_SECONDS)
    gc.collect()
    return True


def _folded_value(reader: Any, run: str, key: str) -> bytes | None:
    """The value bytes LMDB holds for ``key`` of ``run`` (replay's base of an append)."""
    info = reader.run_info(run)
    return None if info is None else reader.get(info.number, key)

class Startup:
    """Opening and recovery of one engine (``engine.startup``)."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine
        self._control: ControlFile | None = None

    def open(self) -> None:
        """Bring the engine up: lock, CONTROL, snapshot, :meth:`load`, finalizer, threads."""
        e = self._e
        fs, path = e._fs, e.path
        wal_dir = os.path.join(path, WAL_DIR)
        prepare(fs, path, readonly=e.readonly)
        if not e.readonly:
            e._writer_lock = WriterLock(path)
            try:
                e._writer_lock.acquire()
            except StoreLockedError as exc:
                if exc.pid != os.getpid() or not _settle_dropped(path):
                    raise
                e._writer_lock.acquire()  # still held: something still holds that store
            _WRITERS[os.path.realpath(path)] = e
        ctl = read_control(fs, path)
        if ctl is None:
            if e.readonly:
                missing = no_control(path, fs.listdir(wal_dir) if fs.exists(wal_dir) else [])
                if missing is not None:
                    raise missing
            if fs.exists(wal_dir) and fs.listdir(wal_dir):
                raise CorruptionError(path, None, "the WAL exists but the CONTROL file is missing")
            ctl = create_control(fs, path)
        else:
            lost = missing_snapshot(fs, path)
            if lost is not None:
                raise lost
        self._control = ControlFile(fs, path, ctl)
        e.store_id = ctl.store_id
        if not e.readonly:
            fs.mkdir(wal_dir)
            fs.fsync_dir(path)
            e.health = HealthFile(path, e.store_id)
            e.health.opened({"wal_max_bytes": e.wal_max_bytes,
                             "durability": e.durability.value})
        e._snap = self.new_snapshot()
        self.load(wal_dir)
        e.closed = False
        e._finalizer = weakref.finalize(
            e, _release_handles, e._writer_lock, e._snap,
            e._pipe.writer if e._pipe is not None else None)
        # Not at interpreter exit: the fold thread may be folding then (a store left open
        # when the program ends), and closing LMDB under it hung the exit. The process's
        # end releases the lock and the files as a crash would, and recovery is for that.
        e._finalizer.atexit = False
        forks.register(e, type(e).close_in_forked_child)
        if not e.readonly:
            self.start_threads()

    def load(self, wal_dir: str) -> None:
        """Pin the LMDB base, replay the WAL after it, and set up the writer."""
        e = self._e
        assert e._snap is not None
        started = time.perf_counter()
        with _gc_paused():  # replay makes many objects that all live on: skip the scans
            ltxn, applied, plan = self.read_base(wal_dir)
            snap = e._snap
            mem, heads = replay(plan, e.store_id, lambda run: snap.reader(ltxn).epoch(run),
                                 lambda key: snap.reader(ltxn).effect(key),
                                 lambda run, key: _folded_value(snap.reader(ltxn), run, key),
                                 path=e.path, prefix=e._recover_prefix)
        ended = None
        with e._lock:
            if e.readonly:
                old, e._ro_pin = e._ro_pin, Pin(ltxn)
                if old is not None:
                    old.retired = True
                    ended = old.txn if old.users == 0 else None
            e._active = mem
            e._applied = applied
            e.lost = plan.lost
            e._visible = plan.next_lsn - 1
            e._recovery.update(applied_lsn=applied, replayed=len(plan.records),
                               torn_bytes=plan.torn_bytes, actions=plan.notes,
                               seconds=round(time.perf_counter() - started, 6))
        if ended is not None:
            e._snap.end_read(ended)
        if e.readonly:
            return
        e._snap.end_read(ltxn)
        ctl = self._control
        assert ctl is not None
        if ctl.control.format < APPENDS_VERSION and plan.appends:
            # An agentwal of session 5 logged form-2 records in version-1 segments:
            # say so in CONTROL, so a reader of version 1 refuses the store from now on.
            try:
                ctl.raise_to(APPENDS_VERSION)
            except OSError as exc:
                raise io_error(exc, e.path, "cannot raise the store's format version") from None
        w = Writer(e._fs, wal_dir, e.store_id, e._segment_bytes, e._first_segment_bytes,
                   version=ctl.control.format, upgrade=ctl.raise_to, prepare_ahead=True)
        if plan.resume is not None:
            seg, header, end = plan.resume
            w.resume(seg, header.salt, end, plan.next_lsn - 1, plan.earlier, header.version)
        else:
            w.start(plan.next_lsn, plan.next_number, plan.earlier)
        e._pipe = CommitPipeline(e.path, w, e.durability, e._lock, plan.next_lsn, heads, e)
        # The replayed log counts toward the next fold, so a process that keeps
        # crashing early still folds and open time stays bounded.
        e._fold_mark = w.bytes_written - plan.replayed_bytes
        e._fold_wanted = plan.replayed_bytes >= e.wal_max_bytes

    def read_base(self, wal_dir: str) -> tuple[Any, int, Plan]:
        """An LMDB read transaction, its applied LSN, and the recovery plan after it.

        A read-only store races the writer's folds (a segment it needs may be
        removed between reading LMDB and reading the log), so it retries with
        a fresh LMDB view a few times before believing the damage.
        """
        e = self._e
        assert e._snap is not None
        attempts = 20 if e.readonly else 1
        for attempt in range(attempts):
            ltxn = e._snap.begin_read()
            try:
                applied, sid = e._snap.reader(ltxn).meta()
                if sid is not None and sid != e.store_id:
                    raise CorruptionError(e._snap.directory, None,
                                          f"snapshot belongs to store {sid}, not {e.store_id}")
                try:
                    plan = recover(e._fs, wal_dir, applied, e.store_id,
                                   readonly=e.readonly, start=e._snap.reader(ltxn).log_pos(),
                                   prefix=e._recover_prefix)
                except OSError as exc:
                    raise io_error(exc, wal_dir, "I/O error while recovering the WAL") from None
                return ltxn, applied, plan
            except (CorruptionError, DurabilityError):
                e._snap.end_read(ltxn)
                if attempt + 1 >= attempts:
                    raise
                time.sleep(0.01 * (attempt + 1))
            except BaseException:
                e._snap.end_read(ltxn)
                raise
        raise AssertionError("unreachable")

    def new_snapshot(self) -> Snapshot:
        """The engine's LMDB snapshot, opened (with its map size, if one was given)."""
        e = self._e
        snap_dir = os.path.join(e.path, SNAPSHOT_DIR)
        snap = (Snapshot(snap_dir, readonly=e.readonly) if e._map_size is None else
                Snapshot(snap_dir, readonly=e.readonly, map_size=e._map_size))
        ctl = self._control
        if not e.readonly and ctl is not None:
            snap.before_layout4 = lambda: ctl.raise_to(LAYOUT4_VERSION)
        return snap

    def start_threads(self) -> None:
        """Set up the fold thread (and async mode's flusher); each starts when kicked."""
        e = self._e
        # Started only when there is work (local/background.py): an idle store has none.
        # The threads hold the engine weakly, so a store dropped without close() is
        # still collected, and its finalizer releases the writer lock.
        e._stop = False
        e._folder = Worker(e, e._wake, lambda eng: eng.folder.step(), 1.0, "agentwal-fold")
        e._workers = [e._folder]
        if e.durability is Durability.ASYNC:
            e._flusher = Worker(e, e._wake, lambda eng: eng._flush_step(),
                                e._sync_interval, "agentwal-flush")
            e._workers.append(e._flusher)
        with e._lock:
            if e._fold_wanted or (e._pipe is not None and e._pipe.writer.spare_wanted):
                e._folder.kick()

