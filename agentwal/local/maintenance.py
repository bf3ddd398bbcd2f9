"""Compaction, the automatic retention pass and vacuum: orchestration over the engine.

Theory of operation: ``retention.py`` plans (which checkpoints each run
keeps) and ``snapshot/compact.py`` executes the plan in one LMDB write
transaction; this module runs them in order against a live engine:

1. fold the WAL (:meth:`Maintenance.compact`), so everything committed is in LMDB;
2. under the fold lock (commits continue: they are newer than anything
   dropped) collect the fork origins the memtables still hold, then compact;
   a full map is grown and the compaction written again;
3. sweep the blob files no kept state or history names any more;
4. with ``vacuum=True``, write LMDB's compacting copy, wait for this
   process's reads to end while new views wait (``_swapping``), and swap
   the file in under the engine lock (:meth:`Maintenance.vacuum`).

``retain=`` runs steps 2 and 3 (:meth:`Maintenance.retain_step`) at
``close()`` and ``snapshot()`` after their fold, and on the fold thread after
a fold once ``_retain_every`` seconds or ``_RETAIN_COMMITS`` commits have
passed since the last pass (the engine's ``_publish`` asks the fold thread
for one then, folding first); its error is kept for ``stats()`` and the next
pass tries again.

Crash windows: before the compaction's LMDB transaction commits nothing is
dropped; after it, the dropped checkpoints are gone (``snapshot/compact.py``).
A vacuum's copy is a temp file until the swap (``snapshot/env.py``): a crash
before it leaves the old file. A failed LMDB write or sync stops the writer.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import TYPE_CHECKING

from .. import failpoints
from ..errors import DurabilityError, Error, RunNotFoundError, StoreBusyError
from ..retention import CompactReport, Tally
from ..types import Progress
from .snapshot import MapFull

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Maintenance"]

#: Seconds a vacuum waits for this process's reads to end before giving up.
_VACUUM_WAIT = 10.0


class Maintenance:
    """Compaction, ``retain=`` and vacuum (one per engine: ``engine.maintenance``)."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    def compact(self, selected: list[str] | None, keep_last: int | None,
                older_than: datetime.timedelta | None, vacuum: bool,
                keep_fork_origins: bool, progress: Progress | None = None) -> CompactReport:
        """Fold, drop what retention does not keep, sweep, vacuum (``Store.compact``)."""
        e = self._e
        if selected is not None:
            missing = e._with_view(lambda v: [r for r in selected or ()
                                                 if e._head(v, r) is None])
            if missing:
                raise RunNotFoundError(missing[0])
        tick = progress or (lambda phase, done, total: None)
        tick("fold", 0, 1)
        e.folder.fold()
        tick("fold", 1, 1)
        failpoints.hit("compact_after_fold")
        cutoff = None if older_than is None else time.time() - older_than.total_seconds()
        with e._fold_lock:
            before = self.file_bytes()
            tally = self.compact_locked(selected, keep_last, cutoff, keep_fork_origins,
                                        progress)
            failpoints.hit("compact_after_commit")
            e.blobrefs.sweep()  # the blob files no kept checkpoint names any more
            if vacuum:
                # one LMDB copy (a C call) and a file swap: no steps inside to count
                tick("vacuum: LMDB copy and swap", 0, 1)
                self.vacuum()
                tick("vacuum: LMDB copy and swap", 1, 1)
            after = self.file_bytes()
        return CompactReport(tally.dropped, tally.bytes_freed, dict(tally.runs),
                             tally.objects_freed, tally.manifests_written, tally.bytes_written,
                             before, after, vacuum)

    def file_bytes(self) -> int:
        e = self._e
        assert e._snap is not None
        path = os.path.join(e._snap.directory, "data.mdb")
        return os.path.getsize(path) if os.path.exists(path) else 0

    def compact_locked(self, runs: list[str] | None, keep_last: int | None,
                       cutoff: float | None, keep_origins: bool,
                       progress: Progress | None = None) -> Tally:
        """The LMDB part of a compaction; under ``_fold_lock``."""
        e = self._e
        assert e._snap is not None and e._pipe is not None
        origins: set[tuple[str, int]] = set()
        if keep_origins:  # forks not folded yet (committed since the fold) count too
            with e._lock:
                for layer in (e._active, e._frozen):
                    for rm in layer.runs.values() if layer is not None else ():
                        origins.update(c.origin for c, _h, _m in rm.checkpoints
                                       if c.origin is not None)
        while True:
            try:
                return e._snap.compact(runs, keep_last=keep_last, cutoff=cutoff,
                                       keep_origins=keep_origins, origins=origins,
                                       progress=progress)
            except MapFull as full:
                e.folder.grow_map(full)
            except DurabilityError as exc:  # LMDB's state is unknown until a reopen
                e._pipe.writer.broken = exc
                raise

    def vacuum(self) -> None:
        """Rewrite the LMDB file compactly and swap it in; under ``_fold_lock``."""
        e = self._e
        assert e._snap is not None and e._pipe is not None
        snap = e._snap
        busy = ("other stores of this process have this directory open (read-only ones "
                "share its LMDB environment); close them and call compact(vacuum=True) "
                "again. The compaction itself is done.")
        if snap.users() > 1:
            raise StoreBusyError(e.path, busy)
        try:
            tmp = snap.vacuum_copy()
        except DurabilityError as exc:
            e._pipe.writer.broken = exc
            raise
        failpoints.hit("vacuum_after_copy")
        while e._dead:  # views of transactions the garbage collector dropped
            e._release(e._dead.popleft())
        with e._lock:
            e._swapping = True
            try:
                deadline = time.monotonic() + _VACUUM_WAIT
                while snap.readers() and time.monotonic() < deadline:
                    e._wake.wait(0.005)
                if snap.readers() or snap.users() > 1:
                    snap.discard(tmp)
                    raise StoreBusyError(e.path, busy if snap.users() > 1 else
                                         f"reads stayed open for {_VACUUM_WAIT:.0f} s "
                                         "(transactions not finished, or a thread that "
                                         "holds one called compact). Finish them and call "
                                         "compact(vacuum=True) again. The compaction "
                                         "itself is done.")
                try:
                    swapped = snap.swap_in(tmp)
                except DurabilityError as exc:
                    e._pipe.writer.broken = exc
                    raise
                if not swapped:
                    raise StoreBusyError(e.path, "another process has the store open "
                                         "(a read-only store): the snapshot file cannot be "
                                         "replaced under it. Close it and call "
                                         "compact(vacuum=True) again. The compaction itself "
                                         "is done.")
            finally:
                e._swapping = False
                e._wake.notify_all()
        failpoints.hit("vacuum_after_swap")

    def retain_step(self, *, force: bool = False) -> None:
        """Apply ``retain=``: when ``force`` (``snapshot()``, ``close()``) or when due."""
        e = self._e
        if e._retain is None or not (force or e._retain_due()
                                     or time.monotonic() >= e._retain_next):
            return
        e._retain_next = time.monotonic() + e._retain_every
        e._retain_commits = 0
        keep_last, older_than = e._retain
        cutoff = None if older_than is None else time.time() - older_than.total_seconds()
        try:
            with e._fold_lock:
                self.compact_locked(None, keep_last, cutoff, True)
                e.blobrefs.sweep()
            e.counters["retention_passes"] += 1
            e._retain_error = None
            if e.health is not None:
                e.health.succeeded("retention")
        except Error as exc:
            e._retain_error = exc
            if e.health is not None:
                e.health.failed("retention", exc)
