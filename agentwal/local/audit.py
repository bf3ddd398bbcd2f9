"""The two whole-store reads of a live engine: ``verify`` and ``backup``.

Theory of operation: both need the snapshot and the log to agree while
commits go on. A writer holds its fold lock throughout (no fold moves
records from the log into LMDB meanwhile; commits continue), so what LMDB
holds and what the log holds after it are one consistent store. A
read-only engine cannot stop another process's folds, so it reads the log
first and the snapshot after, as its own open does: a record folded in
between is then in both, never in neither.

*Verify* (:meth:`Audit.verify`) runs the offline checks of ``verify/`` on
that view (the CONTROL file, every LMDB database, every WAL frame), then
the blob files every reference names (:meth:`Audit.verify_blobs`), each
damage reported once. The file check before mapping comes first: a
truncated map is reported, never mapped.

*Backup* (:meth:`Audit.backup`) copies CONTROL, the log (under the
pipeline's flush lock, so no batch is half-written into the copy), LMDB's
own consistent copy and the blob files into ``dest.tmp``, then publishes
it with one rename (``backup.py``: the ``Copier`` and its crash windows).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from ..errors import CorruptionError
from ..format import SNAPSHOT_DIR, WAL_DIR
from ..io import OsFileSystem, io_error
from ..types import Progress
from .backup import BackupReport, Copier, check_destination
from .blobs import BlobMissing, blob_path
from .snapshot import Snapshot, check_lmdb_file
from .verify import (
    LMDB_FILE,
    Problem,
    VerifyReport,
    check_control,
    check_mark,
    load_mark,
    read_wal,
)
from .verify import verify as verify_store

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Audit"]


class Audit:
    """``verify`` and ``backup`` of a live engine (one per engine: ``engine.audit``)."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    def verify(self, progress: Progress | None = None) -> VerifyReport:
        """Every offline check, in one consistent view (``Store.verify``)."""
        e = self._e
        e.check_open()
        assert e._snap is not None
        found = check_control(e._fs, e.path, e.store_id)
        snap: Snapshot | None = e._snap
        rel = os.path.join(SNAPSHOT_DIR, "data.mdb")
        folding = e._fold_lock if not e.readonly else contextlib.nullcontext()
        with folding:
            with e._lock:
                limit = e._visible  # every record up to it is whole in the log
            try:
                check_lmdb_file(os.path.join(e._snap.directory, "data.mdb"))
            except CorruptionError as exc:  # mapping it could kill the process: skip LMDB
                found.append(Problem(rel, exc.reason, rel, offset=exc.offset))
                snap = None
            if e.readonly and snap is not None:
                # Another process writes: what it folded was acknowledged, so damage
                # up to there is damage (after it, a torn tail may be a write in progress).
                ltxn = snap.begin_read()
                with contextlib.suppress(CorruptionError):
                    limit = max(limit, snap.reader(ltxn).meta()[0])
                snap.end_read(ltxn)
            # LOGMARK before the log (an older mark is still true of a newer log), and
            # LMDB's applied LSN after it (a fold may have removed what the mark names).
            mark, bad_mark = load_mark(e._fs, e.path, e.store_id)
            found.extend(bad_mark)
            try:
                wal = read_wal(e._fs, os.path.join(e.path, WAL_DIR))
            except OSError as exc:
                raise io_error(exc, e.path, "cannot read the WAL") from None
            applied = e._applied
            if e.readonly and snap is not None:
                ltxn = snap.begin_read()
                with contextlib.suppress(CorruptionError):
                    applied = max(applied, snap.reader(ltxn).meta()[0])
                snap.end_read(ltxn)
            lacks, acked = check_mark(mark, wal, applied)
            found.extend(lacks)
            limit = max(limit, acked)
            if snap is None:
                return verify_store(None, wal, store_id=e.store_id, limit=limit,
                                    problems=found, progress=progress)
            ltxn = snap.begin_read()
            try:
                report = verify_store(snap.raw(ltxn), wal, store_id=e.store_id,
                                      limit=limit, problems=found, progress=progress)
            finally:
                snap.end_read(ltxn)
        return self.verify_blobs(report, progress)

    def verify_blobs(self, report: VerifyReport,
                     progress: Progress | None = None) -> VerifyReport:
        """``report`` plus the blob files: each referenced one exists, with its size and SHA-256."""
        e = self._e
        problems = list(report.problems)
        notes = list(report.notes)
        checked = dict(report.checked)
        # A damaged record the scan meets is one the snapshot checks reported
        # at its entry: report each damage once, and check the blobs of the rest.
        in_snapshot = any(p.file == LMDB_FILE for p in problems)
        damaged: list[str] = []
        trees: list[tuple[str, str]] = []
        try:
            refs = sorted(e.blobrefs.refs(trees, damaged), key=lambda r: r.sha256)
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
            rel = os.path.relpath(path, e.path)
            problems.append(Problem(rel, reason, rel))
        total = sum(r.size for r in refs)
        for ref in refs:
            if progress is not None:
                progress("blobs", checked.get("blob_bytes", 0), total)
            rel = os.path.relpath(blob_path(e._blobs.root, ref.sha256), e.path)
            try:
                with e._blobs.open(ref, verify=False) as reader:
                    reader.verify()
            except BlobMissing:
                problems.append(Problem(rel, f"the blob file of {ref.sha256} is missing "
                                        f"({ref.size} bytes referenced)", rel))
            except CorruptionError as exc:
                problems.append(Problem(rel, exc.reason, rel, offset=exc.offset))
            checked["blobs"] = checked.get("blobs", 0) + 1
            checked["blob_bytes"] = checked.get("blob_bytes", 0) + ref.size
        if progress is not None and refs:
            progress("blobs", total, total)
        return VerifyReport(not problems, problems, checked, notes)

    def backup(self, dest: str | os.PathLike[str],
               progress: Progress | None = None) -> BackupReport:
        """A consistent copy of the store at ``dest`` (``Store.backup``)."""
        e = self._e
        e.check_open()
        snap = e._snap
        assert snap is not None
        target = os.fspath(dest)
        out = OsFileSystem()  # the backup is a directory of the OS, like LMDB's copy in it
        tmp = check_destination(out, e.path, target)
        copier = Copier(e._fs, out, e.path, tmp, progress)
        try:
            copier.copy_control()
            if e._pipe is None:  # another process may fold: the log first, then LMDB
                copier.copy_wal(quiet=False)
                copier.copy_snapshot(snap.copy_to)
            else:
                pipe = e._pipe
                with e._fold_lock:
                    with pipe.flush_lock:
                        pipe.drain()  # no record written but not yet acknowledged
                        if pipe.writer.broken is not None:
                            raise pipe.writer.stopped()
                        copier.copy_wal(quiet=True)
                        with e._lock:
                            copier.last_lsn = max(copier.last_lsn, e._visible)
                    copier.copy_snapshot(snap.copy_to)
            copier.copy_blobs()
            return copier.publish(target)
        except OSError as exc:
            raise io_error(exc, tmp, "cannot write the backup") from None
