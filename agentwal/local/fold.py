"""The fold: memtables into LMDB, map growth, the fold thread's step.

Theory of operation: a fold freezes the active memtable (commits go on into
a new one), syncs the log through the frozen table's last LSN (LMDB must
never be durable past the log), writes the table into LMDB in one synced
transaction with ``applied_lsn`` (``Snapshot.fold``), then drops the frozen
table and removes the WAL segments the fold covers. A fold that fails
leaves the frozen table in place; the next fold writes it first.

Crash windows: before the LMDB transaction commits, LMDB is as it was and
recovery replays the log; after it, ``applied_lsn`` covers the table and
recovery skips what it folded (``recovery.py``). A full map is doubled
(:meth:`Folder.grow_map`, with no read of this process open) and the fold
written again; a failed LMDB write or sync stops the writer, since LMDB's
state is unknown until a reopen and an fsync is never retried.

The fold's policy lives here, not in the LMDB writer: a deleted run's
effect positions are not folded (its entries are), and settled ledger
entries past ``effect_retention`` are expired at most hourly. The state the
fold works on (the memtables, ``_fold_wanted``, ``_fold_mark``,
``_fold_error``, ``_next_expiry``) is the engine's, under its locks
(``engine.py``: ``_fold_lock`` -> the pipeline's ``flush_lock`` -> ``_lock``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING

from .. import failpoints
from ..errors import DiskFullError, DurabilityError, Error
from .background import BUSY, IDLE, STOP
from .memtable import Memtable
from .snapshot import FoldRun, MapFull

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Folder"]

_MAX_MAP = 1 << 46 if sys.maxsize > 2**32 else 1 << 31


class Folder:
    """Folds the engine's memtables into LMDB (one per engine: ``engine.folder``)."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    def step(self) -> str:
        """The fold thread's work when woken: BUSY, IDLE (nothing wanted) or STOP.

        A retention pass that is due (``_retain_wanted``) folds first too: it
        drops only folded history. A writer that began a segment first gets the
        next one's file ready (``Writer.prepare_spare``).
        """
        e = self._e
        with e._lock:
            if e._stop:
                return STOP
            spare = e._pipe is not None and e._pipe.writer.spare_wanted
            asked = (e._fold_wanted, e._retain_wanted)
            fold = any(asked)
            if not fold and not spare:
                return IDLE
            e._fold_wanted = e._retain_wanted = False
        if spare:  # zero-fill the next segment here, not on a commit's path
            assert e._pipe is not None
            try:
                e._pipe.writer.prepare_spare()  # best effort: OSError means no spare
            except BaseException as exc:  # a simulated power cut: stop, as after a fold
                with e._lock:  # a fold asked for is still owed, and says why it is not done
                    e._fold_wanted = e._fold_wanted or asked[0]
                    e._retain_wanted = e._retain_wanted or asked[1]
                    e._fold_error = exc
                return STOP
            if not fold:
                return BUSY
        try:
            self.fold()
            e._fold_error = None
        except Error as exc:
            e._fold_error = exc
            e._fold_retry_at = time.monotonic() + 1.0  # not on every batch
            return BUSY
        except BaseException as exc:
            e._fold_error = exc
            return STOP
        e.maintenance.retain_step()
        return BUSY

    def fold(self) -> None:
        """Fold everything published so far (a table left by a failed fold first).

        A writer's ``HEALTH`` file records a failure and clears it at the next success.
        """
        e = self._e
        try:
            while self.fold_one():
                pass
        except Error as exc:
            if e.health is not None:
                e.health.failed("fold", exc)
            raise
        if e.health is not None:
            e.health.succeeded("fold")

    def fold_one(self) -> bool:
        """Fold one memtable; True if it was one a failed fold had left frozen."""
        e = self._e
        assert e._snap is not None and e._pipe is not None
        pipe = e._pipe
        with e._fold_lock:
            with e._lock:
                leftover = e._frozen is not None
                if e._frozen is None:
                    if e._active.empty:
                        return False
                    e._frozen, e._active = e._active, Memtable()
                    e._frozen.frozen = True
                    e._fold_mark = pipe.writer.bytes_written
                frozen = e._frozen
            failpoints.hit("fold_after_freeze")
            # LMDB must never be durable past the log: after a power cut the WAL
            # has to reach applied_lsn (async and none modes sync here).
            pipe.sync_through(frozen.last_lsn)
            runs = [FoldRun(run, writes, ckpts, deltas, outboxes, reset,
                            frozen.appends_of(run) or None)
                    for run, reset, writes, ckpts, deltas, outboxes in frozen.fold_runs()]
            resets = any(fr.reset for fr in runs)
            effects = list(frozen.effects.values())
            if resets:  # a deleted run's effect positions are not folded (entries are)
                gone = {fr.run for fr in runs if fr.reset}
                effects = [(x, raw) if x.ordinal is None or x.run not in gone
                           or frozen.effect_pos.get((x.run, x.checkpoint, x.ordinal)) == x.key
                           else (dataclasses.replace(x, ordinal=None), raw)
                           for x, raw in effects]
            expire = None
            if e._effect_retention is not None and time.time() >= e._next_expiry:
                expire = time.time() - e._effect_retention
            failpoints.hit("fold_before_commit")
            if resets:
                failpoints.hit("delete_run_fold_before_commit")
            while True:
                try:
                    e._snap.fold(frozen.last_lsn, e.store_id, runs, frozen.log_pos,
                                    effects, expire)
                    break
                except MapFull as full:  # double until the fold fits
                    self.grow_map(full)
                except DurabilityError as exc:
                    # LMDB's write or sync failed: its state is unknown until a
                    # reopen, and an fsync is never retried. Stop the writer.
                    pipe.writer.broken = exc
                    raise
            failpoints.hit("fold_after_commit")
            if resets:
                failpoints.hit("delete_run_fold_after_commit")
            if expire is not None:
                e._next_expiry = time.time() + 3600.0  # expiry scans the ledger: hourly
            with e._lock:
                e._frozen = None
                e._applied = frozen.last_lsn
                e.counters["folds"] += 1
            with pipe.flush_lock:
                if pipe.writer.broken is None:
                    e.counters["segments_removed"] += pipe.writer.remove_through(
                        frozen.last_lsn)
        return leftover

    def grow_map(self, full: MapFull) -> None:
        """Double LMDB's map; needs every read transaction of this process closed."""
        e = self._e
        assert e._snap is not None
        # Wait (lock released between looks) until no read is open, then resize
        # while holding the lock, so no view can begin between the look and the resize.
        with e._lock:
            deadline = time.monotonic() + 5.0
            while e._snap.readers() and time.monotonic() < deadline:
                e._lock.release()
                time.sleep(0.005)
                e._lock.acquire()
            if e._snap.readers() or full.size >= _MAX_MAP:
                path = os.path.join(e._snap.directory, "data.mdb")
                why = ("it is at its largest size" if full.size >= _MAX_MAP else
                       "read transactions stay open in this process (a read-only store "
                       "holds one until refresh() or close())")
                raise DiskFullError(path, f"the LMDB map of {path!r} is full and cannot grow: "
                                    f"{why}. Nothing was lost: the WAL keeps everything; "
                                    "finish those reads and the next fold grows it.") from full
            e._snap.grow()
            e.counters["map_grows"] += 1
