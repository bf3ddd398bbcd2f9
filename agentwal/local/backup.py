"""Backups: copying a store's files into a new directory that opens as the same store.

Theory of operation: a store is its ``CONTROL`` file, the LMDB snapshot at a
fold boundary (``applied_lsn``), the WAL segments holding every record after
it, and (when present) the ``blobs/`` directory. A copy of those opens as a
store with the same state and history provided the snapshot copy is not older
than the log copy's first segment needs: the copied log must reach back to
the copied snapshot's ``applied_lsn + 1``. Folds move ``applied_lsn`` forward
and then remove the segments they cover, so either of two orders works:

- the writer (``Store.backup`` of the process that writes) holds the fold
  lock, so no fold runs and no segment goes, and copies the segments while it
  holds the log's flush lock, so no record is half-written in the copy;
- any other process (a read-only store, the CLI) cannot hold those locks: it
  copies the segments *first* and the snapshot *after*. A fold in between
  only makes the snapshot newer, and a segment removed before it was read is
  one the fold covered. The last segment may be copied while a record is
  being written into it: the copy then has a torn tail, which is exactly what
  a crash leaves and what recovery repairs when the backup is opened. A torn
  read can also look like damage (a later batch read whole after an earlier
  one read half); the last segment is then copied again.

Every record written before the copy of the log began is in the backup, so
every commit acknowledged before ``backup()`` was called is; commits made
while it runs may or may not be. Blobs are copied last, so every blob a copied
commit names is there (blob files are written before the commits that name
them).

The copy is made under ``dest + ".tmp"``; every file and directory is
fsynced, then it is renamed to ``dest`` and ``dest``'s parent fsynced. A
half-made backup (a crash, an error) is never found under ``dest``; its
``.tmp`` directory is left for the user to remove (the next backup to the
same ``dest`` refuses to start while it exists).

All file I/O goes through the I/O seam; the LMDB copy is ``snapshot.py``'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import CorruptionError, PathExistsError
from ..format import CONTROL_FILE, SNAPSHOT_DIR, TMP_SUFFIX, WAL_DIR, parse_segment_name
from ..io import FileSystem, write_all
from ..types import Progress
from .wal import scan_segment
from .wal.frame import parse_header

__all__ = ["BLOBS_DIR", "BackupReport", "Copier", "check_destination"]

#: The directory of content-addressed blob files, copied when present.
BLOBS_DIR = "blobs"
_CHUNK = 1 << 20
_RETRIES = 5


@dataclass(frozen=True, slots=True)
class BackupReport:
    """What ``store.backup(dest)`` wrote.

    Attributes:
        path: the backup directory (``dest``).
        lsn: every commit with an LSN up to this one is in the backup (so is
            every commit acknowledged before ``backup()`` was called); later
            ones may be too.
        files: files copied.
        bytes: bytes copied.
        seconds: how long it took.
    """

    path: str
    lsn: int
    files: int
    bytes: int
    seconds: float


def check_destination(fs: FileSystem, store: str, dest: str) -> str:
    """Refuse a destination that exists, is being made, or lies inside the store.

    Returns:
        The temporary directory the backup is built in (``dest + ".tmp"``).

    Raises:
        PathExistsError: ``dest`` or ``dest.tmp`` exists.
        ValueError: ``dest`` is inside the store directory.
    """
    real, home = os.path.realpath(dest), os.path.realpath(store)
    if real == home or real.startswith(home + os.sep):
        raise ValueError(f"the backup destination {dest!r} is inside the store {store!r}")
    if fs.exists(dest):
        raise PathExistsError(dest)
    tmp = dest + TMP_SUFFIX
    if fs.exists(tmp):
        raise PathExistsError(tmp, "holds a half-made backup (an interrupted backup() made "
                              "it); nothing was written. Remove it, then back up again.")
    return tmp


class Copier:
    """Builds one backup under its temporary directory, then publishes it.

    Args:
        src: the file system of the store (its WAL and CONTROL).
        dst: the file system of the backup.
        store: the store directory.
        tmp: the temporary directory (:func:`check_destination`).
        progress: called with ``("log", segments copied, segments)``,
            ``("snapshot: LMDB copy", 0 then 1, 1)`` and ``("blobs", files copied, None)``.
    """

    def __init__(self, src: FileSystem, dst: FileSystem, store: str, tmp: str,
                 progress: Progress | None = None) -> None:
        self.progress = progress
        self.src = src
        self.dst = dst
        self.store = store
        self.tmp = tmp
        self.files = 0
        self.bytes = 0
        self.last_lsn = 0
        self._dirs: list[str] = []
        self._blob_files = 0
        self.started = time.monotonic()

    def mkdir(self, rel: str) -> str:
        """Create ``tmp/rel`` (and ``tmp``); returns its path."""
        path = os.path.join(self.tmp, rel) if rel else self.tmp
        self.dst.mkdir(path)
        self._dirs.append(path)
        return path

    def copy_file(self, src: str, dst: str) -> int:
        """Copy one file in chunks and fsync the copy; returns its size.

        Raises:
            FileNotFoundError: ``src`` vanished (the caller decides).
            OSError: reading or writing failed.
        """
        fd = self.src.open(src, create=False)
        try:
            out = self.dst.open(dst, create=True)
            try:
                self.dst.truncate(out, 0)
                offset = 0
                while True:
                    chunk = self.src.read(fd, offset, _CHUNK)
                    if not chunk:
                        break
                    write_all(self.dst, out, offset, chunk)
                    offset += len(chunk)
                self.dst.fsync(out)
            finally:
                self.dst.close(out)
        finally:
            self.src.close(fd)
        self.files += 1
        self.bytes += offset
        return offset

    def copy_control(self) -> None:
        """Copy ``CONTROL`` (written once when the store was made)."""
        self.mkdir("")
        self.copy_file(os.path.join(self.store, CONTROL_FILE),
                       os.path.join(self.tmp, CONTROL_FILE))

    def copy_wal(self, *, quiet: bool) -> None:
        """Copy every segment, oldest first, and check what was copied.

        ``quiet``: no record is being written meanwhile (the writer's flush
        lock is held). Otherwise the last segment may be caught mid-write: a
        copy that looks damaged there is made again, up to a few times.

        Raises:
            CorruptionError: a segment of the store is damaged.
        """
        wal, out = os.path.join(self.store, WAL_DIR), self.mkdir(WAL_DIR)
        names = [n for n in self.src.listdir(wal) if parse_segment_name(n) is not None]
        names.sort(key=lambda n: parse_segment_name(n) or 0)
        copied: dict[str, int] = {}
        for i, name in enumerate(names):
            self._tick("log", i, len(names))
            try:
                copied[name] = self.copy_file(os.path.join(wal, name), os.path.join(out, name))
            except FileNotFoundError:
                # Removed by a fold (of another process) since the listing: the
                # snapshot, copied after the log, covers its records. A segment
                # copied before it is then stale, and recovery drops it.
                continue
        self._tick("log", len(names), len(names))
        order = list(copied)
        for i, name in enumerate(order):
            last = i == len(order) - 1
            for attempt in range(_RETRIES):
                problem = self._check_segment(os.path.join(out, name), last, quiet)
                if problem is None:
                    break
                if quiet or not last or attempt == _RETRIES - 1:
                    raise CorruptionError(os.path.join(wal, name), problem[0], problem[1],
                                          "Nothing was published at the destination; its "
                                          ".tmp directory holds the partial copy. Run "
                                          "`agentwal verify` on the store.")
                time.sleep(0.01 * (attempt + 1))  # caught mid-write: copy it again
                self.files -= 1
                self.bytes -= copied[name]
                copied[name] = self.copy_file(os.path.join(wal, name), os.path.join(out, name))

    def _check_segment(self, path: str, last: bool, quiet: bool) -> tuple[int, str] | None:
        """``(offset, reason)`` if the copied segment would not recover, else None."""
        fd = self.dst.open(path, create=False)
        try:
            data = self.dst.read(fd, 0, None)
        finally:
            self.dst.close(fd)
        header = parse_header(data)
        if isinstance(header, str):
            return 0, header
        scan = scan_segment(data, header)
        if scan.frames:
            self.last_lsn = max(self.last_lsn, scan.frames[-1].lsn)
        if scan.state == "corrupt" or (scan.state == "torn" and (quiet or not last)):
            return scan.end, scan.reason  # a writer's own log has no torn tail: damage
        return None

    def copy_snapshot(self, copy: Callable[[str], None]) -> None:
        """Copy LMDB with ``copy(directory)`` (``Snapshot.copy_to``) and fsync it."""
        out = self.mkdir(SNAPSHOT_DIR)
        # One LMDB copy (mdb_env_copy, one C call that releases the GIL): no steps inside
        # it to count, so the phase says what runs while a bar's clock keeps going.
        self._tick("snapshot: LMDB copy", 0, 1)
        copy(out)
        self._tick("snapshot: LMDB copy", 1, 1)
        path = os.path.join(out, "data.mdb")
        fd = self.dst.open(path, create=False)
        try:
            self.dst.fsync(fd)
            self.bytes += self.dst.size(fd)
        finally:
            self.dst.close(fd)
        self.files += 1

    def copy_blobs(self) -> None:
        """Copy ``blobs/`` if the store has one (every file; not ``*.tmp`` ones in progress)."""
        root = os.path.join(self.store, BLOBS_DIR)
        if self.src.exists(root):
            self._copy_tree(root, BLOBS_DIR)

    def _copy_tree(self, src: str, rel: str) -> None:
        out = self.mkdir(rel)
        for name in self.src.listdir(src):
            path = os.path.join(src, name)
            try:
                self.src.listdir(path)
            except NotADirectoryError:
                if name.endswith(TMP_SUFFIX):
                    continue
                try:
                    self.copy_file(path, os.path.join(out, name))
                except FileNotFoundError:  # freed meanwhile: no copied commit names it
                    continue
                self._blob_files += 1
                self._tick("blobs", self._blob_files, None)
            except FileNotFoundError:
                continue
            else:
                self._copy_tree(path, os.path.join(rel, name))

    def _tick(self, phase: str, done: int, total: int | None) -> None:
        if self.progress is not None:
            self.progress(phase, done, total)

    def publish(self, dest: str) -> BackupReport:
        """Make every directory durable, rename ``tmp`` to ``dest``, make that durable."""
        for d in reversed(self._dirs):
            self.dst.fsync_dir(d)
        self.dst.rename(self.tmp, dest)
        self.dst.fsync_dir(os.path.dirname(os.path.abspath(dest)))
        return BackupReport(dest, self.last_lsn, self.files, self.bytes,
                            round(time.monotonic() - self.started, 6))
