"""Recovery: from LMDB's ``applied_lsn`` and the segments on disk to a replay plan.

Theory of operation: LMDB is always at a fold boundary, so recovery only has
to find the records after ``applied_lsn`` and decide where the log ends.
:func:`plan` is pure: it takes the segments as read and returns the records
to replay, the repairs to make and where the writer continues, or raises
:class:`CorruptionError`. :func:`repair` carries the repairs out through the
I/O seam (a read-only open never repairs).

Rules, in order:

1. A segment every record of which is covered by ``applied_lsn`` (a later
   segment starts at or before ``applied_lsn + 1``) is *stale*: a fold was
   durable but the removal was not. It is skipped and removed.
2. A segment of another store is never replayed: ``CorruptionError``.
3. The first needed segment must start at or before ``applied_lsn + 1``, and
   each next one exactly where the previous ended; a gap is corruption.
4. A bad header is a half-created segment when it is the last one (rotation
   syncs the segment before naming it): it is removed. Elsewhere, corruption.
5. Inside a segment the reader's verdict holds (``wal/reader.py``): a clean
   end goes on to the next segment; a torn end is the end of the log, its
   bytes are zeroed and every later segment is removed, unless a later
   record's synced LSN proves the lost record had been durable (corruption).

Crash windows during recovery itself are safe: repairs only zero bytes that
are not part of the log and remove files the log does not need, each made
durable before the store is used, so recovering again reaches the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import failpoints
from .codec import CodecError, CommitRecord, decode_commit, decode_delta
from .errors import CorruptionError
from .format import REC_COMMIT
from .io import FileSystem, write_all
from .wal import SegmentFile, SegmentHeader, list_segments
from .wal.writer import Segment

__all__ = ["Plan", "Replayed", "plan", "recover", "repair"]


@dataclass(frozen=True, slots=True)
class Replayed:
    """One commit read back from the log."""

    lsn: int
    record: CommitRecord
    delta: dict[str, bytes | None]


@dataclass
class Plan:
    """What recovery found and what it will do."""

    records: list[Replayed] = field(default_factory=list)
    next_lsn: int = 1
    resume: tuple[Segment, SegmentHeader, int] | None = None  # segment, header, end offset
    earlier: list[Segment] = field(default_factory=list)
    zero: tuple[str, int, int] | None = None  # path, from, to
    remove: list[str] = field(default_factory=list)
    torn_bytes: int = 0
    notes: list[str] = field(default_factory=list)


def _decode(seg: SegmentFile, offset: int, lsn: int, rtype: int, flags: int,
            payload: bytes) -> Replayed:
    if rtype != REC_COMMIT:
        raise CorruptionError(seg.path, offset, f"record LSN {lsn} has unknown type {rtype}")
    try:
        rec = decode_commit(payload)
        delta = decode_delta(rec.delta, flags)
    except CodecError as exc:
        raise CorruptionError(seg.path, offset, f"record LSN {lsn}: {exc}") from None
    return Replayed(lsn, rec, delta)


def plan(segments: list[SegmentFile], applied_lsn: int, store_id: object) -> Plan:
    """Decide what to replay and repair; raises :class:`CorruptionError`."""
    p = Plan(next_lsn=applied_lsn + 1)
    needed: list[SegmentFile] = []
    for i, seg in enumerate(segments):
        later_start = any(t.first_lsn <= applied_lsn + 1 for t in segments[i + 1 :])
        if later_start:
            p.remove.append(seg.path)
            p.notes.append(f"removed stale segment {seg.name}")
        else:
            needed.append(seg)
    for seg in needed:
        if seg.header is not None and seg.header.store_id != store_id:
            raise CorruptionError(seg.path, 16, f"segment belongs to store {seg.header.store_id}, "
                                  f"not this store ({store_id})")
    expected = applied_lsn + 1
    for i, seg in enumerate(needed):
        last = i == len(needed) - 1
        if seg.header is None:
            if last:
                p.remove.append(seg.path)
                p.notes.append(f"removed half-created segment {seg.name} ({seg.problem})")
                break
            raise CorruptionError(seg.path, 0, seg.problem)
        if seg.first_lsn > expected:
            raise CorruptionError(seg.path, 0, f"log records {expected}..{seg.first_lsn - 1} "
                                  "are missing (a segment was removed)")
        if i > 0 and seg.first_lsn != expected:
            raise CorruptionError(seg.path, 0, f"segment starts at LSN {seg.first_lsn}, the "
                                  f"previous one ended before LSN {expected}")
        scan = seg.scan()
        if scan.state == "corrupt":
            raise CorruptionError(seg.path, scan.end, scan.reason)
        for f in scan.frames:
            if f.lsn >= expected:
                p.records.append(_decode(seg, f.offset, f.lsn, f.type, f.flags, f.payload))
                expected = f.lsn + 1
        size = len(seg.data)
        info = Segment(seg.header.number, seg.first_lsn, seg.path, size)
        if scan.state == "torn":
            for later in needed[i + 1 :]:
                proof = _durable_after(later, expected)
                if proof is not None:
                    raise CorruptionError(seg.path, scan.end,
                                          f"record LSN {expected} is damaged, but {later.name} "
                                          f"at offset {proof} shows it was durable")
                p.remove.append(later.path)
                p.notes.append(f"removed segment {later.name} written after the torn tail")
            p.zero = (seg.path, scan.end, scan.dirty_end)
            p.torn_bytes = scan.dirty_end - scan.end
            p.notes.append(f"torn tail of {p.torn_bytes} bytes at {seg.name}:{scan.end} zeroed")
            p.resume = (info, seg.header, scan.end)
            break
        if p.resume is not None:
            p.earlier.append(p.resume[0])
        p.resume = (info, seg.header, scan.end)
    p.next_lsn = expected
    return p


def _durable_after(seg: SegmentFile, lsn: int) -> int | None:
    """Offset of a frame in ``seg`` whose synced LSN reaches ``lsn``, if any."""
    if seg.header is None:
        return None
    scan = seg.scan()
    for f in [*scan.frames, *scan.later]:
        if f.synced_lsn >= lsn:
            return f.offset
    return None


def repair(fs: FileSystem, wal_dir: str, p: Plan) -> None:
    """Zero the torn tail, remove unneeded segments, and make both durable."""
    if p.zero is not None:
        path, start, end = p.zero
        fd = fs.open(path, create=False)
        try:
            write_all(fs, fd, start, bytes(end - start))
            fs.fsync(fd)
        finally:
            fs.close(fd)
    elif p.resume is not None:
        # Records replayed from the OS cache after a process crash may not be
        # on disk yet; make them durable before new records claim they are.
        fd = fs.open(p.resume[0].path, create=False)
        try:
            fs.fsync(fd)
        finally:
            fs.close(fd)
    if p.remove:
        for path in p.remove:
            if fs.exists(path):
                fs.unlink(path)
        fs.fsync_dir(wal_dir)


def recover(fs: FileSystem, wal_dir: str, applied_lsn: int, store_id: object, *,
            readonly: bool) -> Plan:
    """Read the log, plan, and (unless ``readonly``) repair. Returns the plan."""
    failpoints.hit("recovery_before_replay")
    segments = list_segments(fs, wal_dir) if fs.exists(wal_dir) else []
    p = plan(segments, applied_lsn, store_id)
    failpoints.hit("recovery_after_replay")
    if not readonly:
        repair(fs, wal_dir, p)
        failpoints.hit("recovery_after_repair")
    return p

