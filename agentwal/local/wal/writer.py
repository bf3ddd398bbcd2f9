"""Appending frames to preallocated segments; rotating and removing segments.

Theory of operation (after LevelDB's ``log_writer``): the writer turns
records into frames and puts them on disk; it never decides durability
policy. The commit pipeline calls :meth:`Writer.append` and, when its mode
asks for it, :meth:`Writer.sync`.

Segments are preallocated: a new segment is zero-filled to its full size
under a temporary name, given its header, fsynced, renamed to its segment
name and that name made durable with a directory fsync, all *before* the
first record goes in. So a segment name never holds a bad header, and every
segment but the last was synced whole before the next one was created.
Records then overwrite zeros, so the file size never changes and an
fdatasync flushes data only.

Crash windows:
- dying while a segment is created leaves at most a ``*.wal.tmp`` file,
  which recovery removes;
- dying inside :meth:`append` leaves a torn tail (see ``reader.py``);
- dying between a fold and :meth:`remove_through` leaves old segments whose
  records recovery skips because LMDB's ``applied_lsn`` covers them.

Format versions: a segment's header carries the store's version (1 until the
store logs its first form-2 record, ``format.APPENDS_VERSION`` after). A
form-2 record only ever goes into a version-2 segment: the first batch that
holds one while the current segment is version 1 first raises the store's
version (``upgrade``: CONTROL rewritten atomically) and then starts a new
segment for itself, so an agentwal that reads only version 1 refuses the
store rather than reading that frame as the end of its log.

Errors: ``ENOSPC`` (or ``EDQUOT``, ``EFBIG``: no room for the write) becomes
:class:`DiskFullError` after the bytes of the
failed write are zeroed again, so a later write cannot leave a stale valid
frame behind; any other failure, or a failure to undo, becomes
:class:`DurabilityError` and the writer refuses all further work.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ... import failpoints
from ...errors import DiskFullError, DurabilityError, StoreClosedError
from ...format import (
    APPENDS_VERSION,
    FLAG_APPENDS,
    PLAIN_VERSION,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    SPARE_NAME,
    TMP_SUFFIX,
    segment_name,
)
from ...io import DISK_FULL_ERRNOS, FileSystem, write_all
from ..logmark import LogMark, write_acked, write_mark
from .frame import SegmentHeader, encode_frame, encode_header

#: After this many unsynced slot writes of the log mark, the next one is fsynced.
MARK_SYNC_EVERY = 256
#: ... or after this many seconds since the mark was last durable.
MARK_SYNC_SECONDS = 1.0

__all__ = ["PendingRecord", "Segment", "Writer"]

_ZERO_CHUNK = 1 << 20


@dataclass(slots=True)
class PendingRecord:
    """A record waiting to be framed: its LSN, type, flags and payload (never changed;
    not frozen, which would cost a third of a microsecond per commit)."""

    lsn: int
    type: int
    flags: int
    payload: bytes


@dataclass
class Segment:
    """A segment the writer knows about."""

    number: int
    first_lsn: int
    path: str
    size: int


#: ``Writer._spare_at`` when no spare is to be asked for (past any segment's end)
_NEVER = 1 << 62

class Writer:
    """Owns the tail of the log: the current segment and where the next frame goes."""

    def __init__(self, fs: FileSystem, wal_dir: str, store_id: uuid.UUID,
                 segment_bytes: int, first_bytes: int | None = None, *,
                 version: int = PLAIN_VERSION,
                 upgrade: Callable[[int], None] | None = None,
                 prepare_ahead: bool = False) -> None:
        self.fs = fs
        self.wal_dir = wal_dir
        self.store_id = store_id
        self.segment_bytes = segment_bytes
        #: the first segment's size; each next one doubles, up to ``segment_bytes``
        self.first_bytes = min(segment_bytes, first_bytes or segment_bytes)
        self.segments: list[Segment] = []
        #: held while the current segment's descriptor, the synced LSN or the log mark
        #: may change: by :meth:`sync`, rotation, :meth:`remove_through` and
        #: :meth:`close`. :meth:`append` writes without it, so the next batch can be
        #: written while an fsync is in flight (the commit pipeline's group commit).
        self.lock = threading.RLock()
        self.broken: DurabilityError | None = None
        self.closed = False
        self.synced_lsn = 0  # highest LSN known durable
        self.written_lsn = 0  # highest LSN handed to the OS
        self.bytes_written = 0
        #: the store's format version: what new segment headers say
        self.version = version
        #: makes the store's version durable (CONTROL) before a segment says it
        self._upgrade = upgrade
        self._seg_version = version  # of the current segment
        #: (first LSN of the segment, offset) just past the last frame written
        self.position: tuple[int, int] | None = None
        #: ``(written_lsn, position)`` and ``(synced_lsn, its position)``, each
        #: assigned at once, so a reader in another thread never sees a mix
        self.end: tuple[int, tuple[int, int] | None] = (0, None)
        self.synced_end: tuple[int, tuple[int, int] | None] = (0, None)
        self._fd: int | None = None
        self._salt = 0
        self._offset = 0
        self._mark_crc: int | None = None  # seed of the log mark's slots; None: no mark file
        self._mark_slot = 0
        self._marked = 0  # the acknowledged LSN the mark holds
        #: slot writes since the mark was last made durable, and when that was
        self._mark_unsynced = 0
        self._mark_synced_at = time.monotonic()
        #: whether a background thread calls :meth:`prepare_spare` when ``spare_wanted``
        self.prepare_ahead = prepare_ahead
        #: the next segment's file should be prepared (set once the current one is
        #: half full, so a small store that never rotates never makes one)
        self.spare_wanted = False
        self._spare_at = _NEVER  # the current segment's offset that wants a spare
        self._spare: tuple[int, int] | None = None  # (descriptor, size) of a ready spare
        self._spare_lock = threading.Lock()  # held while a spare is made or taken

    # -- opening ---------------------------------------------------------------

    def resume(self, seg: Segment, salt: int, offset: int, last_lsn: int,
               earlier: list[Segment], version: int = PLAIN_VERSION) -> None:
        """Continue after recovery in ``seg`` at ``offset``; ``last_lsn`` is durable.

        ``version``: the one ``seg``'s header says.
        """
        self.segments = [*earlier, seg]
        self._seg_version = version
        self._fd = self.fs.open(seg.path, create=False)
        self._salt = salt
        self._offset = offset
        self.position = (seg.first_lsn, offset)
        self.synced_lsn = self.written_lsn = last_lsn
        self.end = self.synced_end = (last_lsn, self.position)
        self._spare_at = seg.size // 2
        self.write_mark()

    def start(self, first_lsn: int, number: int = 0, earlier: list[Segment] | None = None) -> None:
        """Start a new segment whose first record will have LSN ``first_lsn``.

        ``earlier`` are segments recovery kept (their records are all folded);
        the writer removes them with the next :meth:`remove_through`.
        """
        self.synced_lsn = self.written_lsn = first_lsn - 1
        self.end = self.synced_end = (first_lsn - 1, None)
        self.segments = list(earlier or [])
        self._rotate(first_lsn, number, 0)

    # -- appending -------------------------------------------------------------

    def append(self, records: list[PendingRecord]) -> None:
        """Frame ``records`` (consecutive LSNs) and write them in one write.

        A batch never spans segments: when it does not fit in the current
        one, the next segment is created first (sized to hold it), so a
        failure leaves nothing of the batch behind.
        """
        self._check()
        if self.closed:
            raise StoreClosedError(os.path.dirname(self.wal_dir))
        if not records:
            return
        if len(records) == 1:  # the common case, without generators
            r = records[0]
            total = RECORD_HEADER_SIZE + len(r.payload)
            appends = self._seg_version < APPENDS_VERSION and bool(r.flags & FLAG_APPENDS)
        else:
            total = sum(RECORD_HEADER_SIZE + len(r.payload) for r in records)
            appends = self._seg_version < APPENDS_VERSION and any(
                r.flags & FLAG_APPENDS for r in records)
        if appends and self.version < APPENDS_VERSION:
            self._raise_version()
        if appends or self._fd is None or self._offset + total > self.segments[-1].size:
            number = self.segments[-1].number + 1 if self.segments else 0
            self._rotate(records[0].lsn, number, SEGMENT_HEADER_SIZE + total)
        synced, salt = self.synced_lsn, self._salt
        if len(records) == 1:
            r = records[0]
            self._write(encode_frame(salt, r.lsn, synced, r.type, r.flags, r.payload))
        else:
            self._write(b"".join([encode_frame(salt, r.lsn, synced, r.type, r.flags, r.payload)
                                  for r in records]))
        self.written_lsn = records[-1].lsn
        self.position = (self.segments[-1].first_lsn, self._offset)
        self.end = (self.written_lsn, self.position)
        if self._offset >= self._spare_at:
            self._spare_at = _NEVER  # asked once per segment
            self.spare_wanted = self.prepare_ahead

    def _raise_version(self) -> None:
        """Make the store's version ``APPENDS_VERSION`` (durable) before any segment says so."""
        path = os.path.dirname(self.wal_dir)
        if self._upgrade is not None:
            try:
                self._upgrade(APPENDS_VERSION)
            except OSError as exc:
                if exc.errno in DISK_FULL_ERRNOS:
                    raise DiskFullError(path) from None
                raise self._poison(path, "cannot raise the store's format version: "
                                   f"{exc.strerror or exc}") from None
        self.version = APPENDS_VERSION

    def _write(self, blob: bytes) -> None:
        assert self._fd is not None
        start = self._offset
        failpoints.hit("before_wal_append")
        try:
            if "wal_append_partial" in failpoints._armed and len(blob) > 1:
                half = len(blob) // 2
                write_all(self.fs, self._fd, start, blob[:half])
                failpoints.hit("wal_append_partial")
                write_all(self.fs, self._fd, start + half, blob[half:])
            else:
                write_all(self.fs, self._fd, start, blob)
        except OSError as exc:
            self._undo_write(start, len(blob), exc)
        self._offset += len(blob)
        self.bytes_written += len(blob)
        failpoints.hit("after_wal_append")

    def _undo_write(self, start: int, length: int, exc: OSError) -> None:
        assert self._fd is not None
        path = self.segments[-1].path
        try:
            write_all(self.fs, self._fd, start, bytes(length))
            self.fs.fsync(self._fd)  # the undo must be durable before we say "not written"
        except OSError as undo:
            raise self._poison(path, f"write failed ({exc.strerror or exc}) and could not be "
                               f"undone ({undo.strerror or undo})") from None
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(path) from None
        raise self._poison(path, f"write failed: {exc.strerror or exc}") from None

    # -- syncing ---------------------------------------------------------------

    def sync(self) -> bool:
        """Make every frame written so far durable (fdatasync of the current segment).

        Safe while another thread appends: what was written when the fsync
        began is what becomes durable (``synced_lsn``). Returns whether an
        fsync was issued (False: everything written was durable already).
        """
        with self.lock:
            self._check()
            end = self.end
            target = end[0]
            synced = target > self.synced_lsn
            if synced and self.closed:
                raise StoreClosedError(os.path.dirname(self.wal_dir))
            failpoints.hit("before_fsync")
            if synced:
                self._fsync_current()
                self.synced_lsn, self.synced_end = target, end
            if target > self._marked and self._mark_crc is not None:
                self._note_acked(target)
            failpoints.hit("after_fsync")
            return synced

    def _fsync_current(self) -> None:
        assert self._fd is not None
        try:
            self.fs.fsync(self._fd)
        except OSError as exc:
            raise self._poison(self.segments[-1].path,
                               f"fsync failed: {exc.strerror or exc}") from None

    # -- rotation and removal ------------------------------------------------------

    def _rotate(self, first_lsn: int, number: int, need: int) -> None:
        """Create, preallocate and durably name the next segment, then switch to it."""
        with self.lock:  # no fsync of the old descriptor is in flight
            self._rotate_locked(first_lsn, number, need)

    def _rotate_locked(self, first_lsn: int, number: int, need: int,
                       size: int | None = None) -> None:
        if self._fd is not None:  # retire the full segment: durable, then closed
            if self.written_lsn > self.synced_lsn:
                self._fsync_current()
            self.synced_lsn, self.synced_end = self.written_lsn, self.end
            self._close_fd()
        size = size or self._next_size(need)
        if self.segments and self.segments[-1].first_lsn == first_lsn:
            # The current segment holds no record yet (a first record too big
            # for it): the new one takes its name, number and place.
            number = self.segments.pop().number
        path = os.path.join(self.wal_dir, segment_name(first_lsn))
        tmp = path + TMP_SUFFIX
        header = SegmentHeader(self.store_id, number, first_lsn, secrets.randbits(32),
                               self.version)
        failpoints.hit("before_segment_create")
        # The spare lock is held until the spare is renamed: prepare_spare, which
        # makes the next one under the same name, must not open this one meanwhile.
        with self._spare_lock:
            fd = self._take_spare(size)
            if fd is not None:
                tmp = os.path.join(self.wal_dir, SPARE_NAME)
            try:
                # Built under a temporary name and renamed only once its zeros and
                # header are durable, so a segment name never holds a bad header.
                # A spare (prepare_spare) has its zeros on disk already.
                if fd is None:
                    fd = self.fs.open(tmp, create=True)
                    self.fs.truncate(fd, 0)
                    self._zero_fill(fd, size)
                write_all(self.fs, fd, 0, encode_header(header))
                self.fs.fsync(fd)
                failpoints.hit("segment_preallocated")
                self.fs.rename(tmp, path)
                self.fs.fsync_dir(self.wal_dir)
            except OSError as exc:
                self._abandon(tmp, path, fd)
                if exc.errno in DISK_FULL_ERRNOS:
                    raise DiskFullError(path) from None
                raise self._poison(path, f"cannot create segment: {exc.strerror or exc}"
                                   ) from None
            # (still under the spare lock: a spare is sized after this segment)
            self.segments.append(Segment(number, first_lsn, path, size))
        failpoints.hit("after_segment_create")
        self._fd = fd
        self._salt = header.salt
        self._seg_version = header.version
        self._offset = SEGMENT_HEADER_SIZE
        self.write_mark()
        self._spare_at = size // 2

    def _next_size(self, need: int = 0) -> int:
        """The size of the segment after the current one."""
        prev = self.segments[-1].size if self.segments else 0
        # Small stores stay small: the first segment is small, each next one twice the last.
        return max(min(self.segment_bytes, max(self.first_bytes, 2 * prev)), need)

    def _zero_fill(self, fd: int, size: int) -> None:
        zeros = bytes(min(_ZERO_CHUNK, size))
        off = 0
        while off < size:
            chunk = zeros[: min(len(zeros), size - off)]
            write_all(self.fs, fd, off, chunk)
            off += len(chunk)

    # -- the spare: the next segment, prepared ahead of need -----------------------------

    def prepare_spare(self) -> bool:
        """Make the next segment's file ahead of need: zero-filled to its size, synced.

        Called off the commit path (the store's fold thread, when
        ``spare_wanted``), so a rotation only writes a header into it,
        syncs and renames it: the zeros, the bulk of a new segment's cost,
        never delay a commit. Best effort: a failure (no room, say) leaves no
        spare, and the rotation makes its segment itself as before (and
        reports no room there, before anything is acknowledged). Returns
        whether a spare is ready.
        """
        with self._spare_lock:
            wanted, self.spare_wanted = self.spare_wanted, False  # settled either way
            if self._spare is not None:
                return True
            if not wanted or self.closed or self.broken is not None or not self.segments:
                return False
            size = self._next_size()
            path = os.path.join(self.wal_dir, SPARE_NAME)
            fd: int | None = None
            try:
                fd = self.fs.open(path, create=True)
                self.fs.truncate(fd, 0)
                self._zero_fill(fd, size)
                self.fs.fsync(fd)
                failpoints.hit("spare_prepared")
            except OSError:
                self._drop_spare_file(fd)
                return False
            self._spare = (fd, size)
            return True

    def _take_spare(self, size: int) -> int | None:
        """The spare's descriptor if one of ``size`` bytes is ready, else None (a spare
        of another size, or one whose name is gone, is dropped). Call with
        ``_spare_lock`` held."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        # Made for another rotation (a record larger than it came), or removed from
        # under the writer (an operator's cleanup of *.tmp files): the rotation would
        # rename a name that is gone, so the segment is made in place instead.
        if spare[1] != size or not self.fs.exists(os.path.join(self.wal_dir, SPARE_NAME)):
            self._drop_spare_file(spare[0])
            return None
        return spare[0]

    def _drop_spare_file(self, fd: int | None) -> None:
        """Close and remove a spare (best effort: recovery removes a leftover one)."""
        with contextlib.suppress(OSError):
            if fd is not None:
                self.fs.close(fd)
        with contextlib.suppress(OSError):
            path = os.path.join(self.wal_dir, SPARE_NAME)
            if self.fs.exists(path):
                self.fs.unlink(path)

    def _abandon(self, tmp: str, path: str, fd: int | None) -> None:
        """Best-effort removal of a segment whose creation failed."""
        with contextlib.suppress(OSError):
            if fd is not None:
                self.fs.close(fd)
            for name in (tmp, path):
                if self.fs.exists(name):
                    self.fs.unlink(name)
            self.fs.fsync_dir(self.wal_dir)
        # whatever is left is a temporary file, which recovery removes

    def remove_through(self, lsn: int) -> int:
        """Remove segments whose records all have LSN <= ``lsn``; returns how many."""
        with self.lock:
            return self._remove_through(lsn)

    def _remove_through(self, lsn: int) -> int:
        self._check()
        doomed = [s for s, nxt in zip(self.segments, self.segments[1:], strict=False)
                  if nxt.first_lsn <= lsn + 1]
        # The mark first, so it never names a segment that is gone.
        if not self.write_mark(self.segments[len(doomed):]) or not doomed:
            return 0
        failpoints.hit("before_segment_remove")
        try:
            for seg in doomed:
                self.fs.unlink(seg.path)
            failpoints.hit("after_segment_remove")
            self.fs.fsync_dir(self.wal_dir)
        except OSError as exc:
            raise self._poison(self.wal_dir,
                               f"cannot remove old segments: {exc.strerror or exc}") from None
        self.segments = self.segments[len(doomed):]
        return len(doomed)

    def write_mark(self, segments: list[Segment] | None = None) -> bool:
        """Record the log's segments and synced LSN in the store's log mark.

        Best effort: a failed write leaves the previous mark, which is still
        true (it names fewer segments and an older LSN), so the failure is
        not the commit's. Returns False when it failed.
        """
        with self.lock:
            segs = self.segments if segments is None else segments
            mark = LogMark(self.synced_lsn, tuple((s.first_lsn, s.size) for s in segs))
            try:
                self._mark_crc = write_mark(self.fs, os.path.dirname(self.wal_dir),
                                            self.store_id, mark)
            except OSError:
                return False
            self._marked = self.synced_lsn
            return True

    def _note_acked(self, lsn: int) -> None:
        """Say in the mark's next slot that the log is durable through ``lsn`` (best effort).

        The slot is fsynced too once :data:`MARK_SYNC_EVERY` slot writes or
        :data:`MARK_SYNC_SECONDS` have passed since it last was, so after a
        power cut the mark lags the acknowledged log by at most that much.
        """
        assert self._mark_crc is not None
        self._mark_unsynced += 1
        durable = (self._mark_unsynced >= MARK_SYNC_EVERY
                   or time.monotonic() - self._mark_synced_at >= MARK_SYNC_SECONDS)
        try:
            write_acked(self.fs, os.path.dirname(self.wal_dir), self._mark_slot, lsn,
                        self._mark_crc, sync=durable)
        except OSError:
            return  # the mark keeps an older LSN, which is still true
        if durable:
            self._mark_unsynced = 0
            self._mark_synced_at = time.monotonic()
        self._mark_slot ^= 1
        self._marked = lsn

    def size_bytes(self) -> int:
        """Bytes of log on disk (preallocation and a spare included)."""
        spare = self._spare
        return sum(s.size for s in self.segments) + (spare[1] if spare is not None else 0)

    def close(self) -> None:
        """Close the current segment (no sync); the writer accepts no more records."""
        with self.lock:
            self.closed = True
            self._close_fd()
        with self._spare_lock:  # waits for a spare being made; the file stays (see below)
            spare, self._spare = self._spare, None
            if spare is not None:
                with contextlib.suppress(OSError):
                    self.fs.close(spare[0])

    def restart_small(self, folded_lsn: int) -> bool:
        """At a clean close, once every record is folded: go on in a new first-size segment.

        A busy store's segments grow to ``segment_bytes``, preallocated with
        zeros, and its current one stays that big at rest: disk held by a
        store nobody writes to, and bytes the next open reads to check where
        the log ends (the preallocation after the last record must be all
        zeros). When LMDB holds every record written (``folded_lsn``, its
        applied LSN, is the last LSN) and the current segment is larger than
        a first segment, this makes the next segment at the first size, with
        no record in it, and removes the old one: a rotation and a removal,
        as the log makes after any fold, so recovery knows every state a
        crash can leave between them. Returns whether it did; nothing is
        done when a record is not folded, the writer stopped or the segment
        is small already. Call under the pipeline's ``flush_lock``.

        Raises:
            DiskFullError, DurabilityError: as a rotation or removal can (the
            old segment and everything in it are then still there).
        """
        with self.lock:
            if (self.broken is not None or self.closed or self._fd is None
                    or not self.segments or self.written_lsn != folded_lsn
                    or self.segments[-1].size <= self.first_bytes):
                return False
            self._rotate_locked(folded_lsn + 1, self.segments[-1].number + 1, 0,
                                size=self.first_bytes)
            self._remove_through(folded_lsn)
        return True

    def remove_spare(self) -> None:
        """Remove an unused spare and make no more (a clean close; best effort).

        A writer that stops otherwise (a crash, a stopped writer) leaves its
        spare for recovery to remove, like any ``*.wal.tmp``.
        """
        self.prepare_ahead = self.spare_wanted = False
        with self._spare_lock:
            spare, self._spare = self._spare, None
            if spare is not None:
                self._drop_spare_file(spare[0])

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                self.fs.close(fd)

    # -- helpers ---------------------------------------------------------------

    def _check(self) -> None:
        if self.broken is not None:
            raise self.stopped()

    def stopped(self) -> DurabilityError:
        """A fresh error saying the writer stopped (one object is never raised in many threads)."""
        assert self.broken is not None
        err = DurabilityError(self.broken.path, self.broken.reason)
        err.__cause__ = self.broken
        return err

    def _poison(self, path: str, reason: str) -> DurabilityError:
        self.broken = DurabilityError(path, reason)
        return self.broken
