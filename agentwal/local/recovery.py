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
4. A segment is named only after its zeros and header are synced, so a bad
   header is corruption; an unfinished ``*.wal.tmp`` is removed.
5. Inside a segment the reader's verdict holds (``wal/reader.py``): a clean
   end goes on to the next segment; a torn end of the *last* segment is the
   end of the log and its bytes are zeroed. A torn end of any other segment
   is corruption: the writer synced it whole before creating the next one.
6. If the log ends before ``applied_lsn`` (LMDB is durable past the last
   record on disk), the writer starts a new segment at ``applied_lsn + 1``
   instead of writing after the gap.
7. The log must hold what the log mark (``logmark.py``) says it held: every
   marked segment not covered by ``applied_lsn``, at its full size, and every
   record up to the mark's acknowledged LSN. Anything less is a deleted,
   truncated or older-copy log: ``CorruptionError``, never an empty store.

Record types: a commit (``REC_COMMIT``) becomes a :class:`Replayed`, an
effects-ledger entry a :class:`ReplayedEffect`, a run deletion
(``REC_DELETE_RUN``) a :class:`ReplayedDelete`; the store replays a deletion
as a memtable tombstone, so a run deleted after ``applied_lsn`` is hidden
again and the next fold removes it from LMDB. A deletion at or before
``applied_lsn`` was folded: LMDB no longer has the run.

Crash windows during recovery itself are safe: repairs only zero bytes that
are not part of the log and remove files the log does not need, each made
durable before the store is used, so recovering again reaches the same plan.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

from .. import failpoints
from ..codec import CodecError
from ..errors import CorruptionError
from ..format import (
    FLAG_APPENDS,
    SEGMENT_HEADER_SIZE,
    SEGMENT_SUFFIX,
    SPARE_NAME,
    TMP_SUFFIX,
)
from ..io import FileSystem, write_all
from .logmark import MARK_HINT, mark_problems, read_mark
from .records import Record, Replayed, ReplayedDelete, ReplayedEffect, decode_record
from .wal import SegmentFile, SegmentHeader, list_segments
from .wal.writer import Segment

__all__ = ["Lost", "Plan", "Replayed", "ReplayedDelete", "ReplayedEffect", "plan", "recover",
           "repair"]


@dataclass
class Lost:
    """What a ``recover="prefix"`` open could not read: the log from ``first_lsn`` on.

    Attributes:
        first_lsn: the first LSN missing or damaged (the prefix ends before it).
        last_lsn: the highest LSN known to have been written (a valid frame
            found after the damage, or the log mark's acknowledged LSN);
            None when nothing after the damage is known.
        where: the file (and offset) of the damage.
        reason: what is wrong there.
        checkpoints: ``{run: [checkpoint ids]}`` of the commits found intact
            after the damage (lost with it: nothing after a gap is replayed).
        effects: how many effects-ledger records were found after the damage.
    """

    first_lsn: int
    last_lsn: int | None
    where: str
    reason: str
    checkpoints: dict[str, list[int]] = field(default_factory=dict)
    effects: int = 0


@dataclass
class Plan:
    """What recovery found and what it will do."""

    records: list[Replayed | ReplayedEffect | ReplayedDelete] = field(default_factory=list)
    next_lsn: int = 1
    resume: tuple[Segment, SegmentHeader, int] | None = None  # segment, header, end offset
    earlier: list[Segment] = field(default_factory=list)
    next_number: int = 0  # segment number for a new segment
    zero: tuple[str, int, int] | None = None  # path, from, to
    remove: list[str] = field(default_factory=list)
    torn_bytes: int = 0
    replayed_bytes: int = 0  # frame bytes of the records to replay
    notes: list[str] = field(default_factory=list)
    lost: Lost | None = None  # ``prefix`` plans only: where the readable prefix ends
    appends: bool = False  # a record to replay is a form-2 commit (``FLAG_APPENDS``)

    def cut(self, i: int, where: str, reason: str) -> None:
        """End a ``prefix`` plan before ``records[i]``, which replay cannot apply.

        ``lost`` then starts at that record and covers what was lost after
        it already (a later damage the plan had stopped at).
        """
        rest = self.records[i:]
        del self.records[i:]
        lost = Lost(rest[0].lsn, None, where, reason)
        for r in rest:
            lost.last_lsn = max(lost.last_lsn or 0, r.lsn)
            if isinstance(r, Replayed):
                lost.checkpoints.setdefault(r.record.run, []).append(r.record.id)
            elif isinstance(r, ReplayedEffect):
                lost.effects += 1
        if self.lost is not None:
            if self.lost.last_lsn is not None:
                lost.last_lsn = max(lost.last_lsn or 0, self.lost.last_lsn)
            for run, ids in self.lost.checkpoints.items():
                lost.checkpoints.setdefault(run, []).extend(ids)
            lost.effects += self.lost.effects
        self.lost = lost
        self.next_lsn = rest[0].lsn
        self.resume, self.zero, self.remove = None, None, []


def _decode(seg: SegmentFile, offset: int, lsn: int, rtype: int, flags: int,
            payload: bytes) -> Record:
    try:
        return decode_record(lsn, rtype, flags, payload)
    except CodecError as exc:
        raise CorruptionError(seg.path, offset, f"record LSN {lsn}: {exc}") from None


def plan(segments: list[SegmentFile], applied_lsn: int, store_id: object,
         start: tuple[int, int] | None = None, *, prefix: bool = False) -> Plan:
    """Decide what to replay and repair; raises :class:`CorruptionError`.

    ``start=(segment first LSN, offset)`` is where the snapshot says the log
    continues after ``applied_lsn``; the folded frames before it are not read.
    With ``prefix`` a damage ends the plan instead of raising: the records
    before it are replayed and ``lost`` says where and what follows (for a
    read-only ``recover="prefix"`` open, which never repairs).
    """
    if not prefix:
        return _plan(segments, applied_lsn, store_id, start)
    p = Plan(next_lsn=applied_lsn + 1)
    try:
        return _plan(segments, applied_lsn, store_id, start, into=p)
    except CorruptionError as exc:
        p.resume, p.zero, p.remove = None, None, []
        p.lost = _lost_after(segments, p.next_lsn, exc)
        return p


def _lost_after(segments: list[SegmentFile], first: int, exc: CorruptionError) -> Lost:
    """What the log holds from LSN ``first`` on, as far as its intact frames tell."""
    where = exc.path if exc.offset is None else f"{exc.path} @ {exc.offset}"
    lost = Lost(first, None, where, exc.reason)
    for seg in segments:
        if seg.header is None:
            continue
        scan = seg.scan()
        for f in [*scan.frames, *scan.later]:
            if f.lsn < first:
                continue
            lost.last_lsn = max(lost.last_lsn or 0, f.lsn)
            try:
                rec = decode_record(f.lsn, f.type, f.flags, f.payload)
            except CodecError:
                continue
            if isinstance(rec, Replayed):
                lost.checkpoints.setdefault(rec.record.run, []).append(rec.record.id)
            elif isinstance(rec, ReplayedEffect):
                lost.effects += 1
    return lost


def _plan(segments: list[SegmentFile], applied_lsn: int, store_id: object,
          start: tuple[int, int] | None = None, *, into: Plan | None = None) -> Plan:
    p = into if into is not None else Plan(next_lsn=applied_lsn + 1)
    for seg in segments:
        if seg.header is not None and seg.header.store_id != store_id:
            raise CorruptionError(seg.path, 16, f"segment belongs to store {seg.header.store_id}, "
                                  f"not this store ({store_id})")
    needed: list[SegmentFile] = []
    for i, seg in enumerate(segments):
        if any(t.first_lsn <= applied_lsn + 1 for t in segments[i + 1 :]):
            p.remove.append(seg.path)
            p.notes.append(f"removed stale segment {seg.name}")
        else:
            needed.append(seg)
    expected = applied_lsn + 1
    log_end = expected  # LSN the last frame on disk is followed by
    for i, seg in enumerate(needed):
        if seg.header is None:  # segments are named only once their header is synced
            raise CorruptionError(seg.path, 0, seg.problem)
        if seg.first_lsn > expected:
            raise CorruptionError(seg.path, 0, f"log records {expected}..{seg.first_lsn - 1} "
                                  "are missing (a segment was removed)")
        if i > 0 and seg.first_lsn != expected:
            raise CorruptionError(seg.path, 0, f"segment starts at LSN {seg.first_lsn}, the "
                                  f"previous one ended before LSN {expected}")
        hint = None
        if i == 0 and start is not None and start[0] == seg.first_lsn and (
                SEGMENT_HEADER_SIZE <= start[1] <= len(seg.data)):
            hint = (start[1], expected)
        scan = seg.scan(hint)
        last = i == len(needed) - 1
        if into is not None or scan.state == "clean" or (scan.state == "torn" and last):
            # A prefix plan keeps the intact frames before a damage (then raises below).
            for f in scan.frames:
                if f.lsn >= expected:
                    p.records.append(_decode(seg, f.offset, f.lsn, f.type, f.flags, f.payload))
                    p.appends = p.appends or bool(f.flags & FLAG_APPENDS)
                    p.replayed_bytes += f.end - f.offset
                    expected = p.next_lsn = f.lsn + 1
        if scan.state == "corrupt":
            raise CorruptionError(seg.path, scan.end, scan.reason)
        if scan.state == "torn" and not last:
            # The writer synced this segment whole before creating the next one.
            raise CorruptionError(seg.path, scan.end, f"{scan.reason}, in a segment that was "
                                  f"synced before {needed[i + 1].name} was created")
        log_end = scan.next_lsn
        if p.resume is not None:
            p.earlier.append(p.resume[0])
        p.resume = (Segment(seg.header.number, seg.first_lsn, seg.path, len(seg.data)),
                    seg.header, scan.end)
        p.next_number = seg.header.number + 1
        if scan.state == "torn":
            p.zero = (seg.path, scan.end, scan.dirty_end)
            p.torn_bytes = scan.dirty_end - scan.end
            p.notes.append(f"torn tail of {p.torn_bytes} bytes at {seg.name}:{scan.end} zeroed")
    if p.resume is not None and log_end != expected:
        # LMDB is ahead of the log (a fold outran the WAL's sync): continue in a
        # new segment at applied_lsn + 1, never after a gap in this one.
        p.earlier.append(p.resume[0])
        p.resume = None
        p.notes.append(f"log ends at LSN {log_end - 1}, the snapshot at {applied_lsn}: "
                       "new segment started")
    p.next_lsn = expected
    return p


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
            readonly: bool, start: tuple[int, int] | None = None,
            prefix: bool = False) -> Plan:
    """Read the log, plan, and (unless ``readonly``) repair. Returns the plan.

    ``prefix`` (read-only only): stop at the first damage instead of raising,
    and say in ``plan.lost`` what could not be read.
    """
    assert readonly or not prefix
    failpoints.hit("recovery_before_replay")
    store_dir = os.path.dirname(wal_dir)
    # Read before the segments: an older mark is still true of a newer log.
    mark = read_mark(fs, store_dir, store_id) if isinstance(store_id, uuid.UUID) else None
    segments = list_segments(fs, wal_dir) if fs.exists(wal_dir) else []
    if applied_lsn and not segments and not prefix:
        # A store always keeps its current segment, even right after a fold.
        raise CorruptionError(wal_dir, None, f"the log is missing: the snapshot covers LSN "
                              f"{applied_lsn} but no segment remains", MARK_HINT)
    p = plan(segments, applied_lsn, store_id, start, prefix=prefix)
    if mark is not None:
        lacks = mark_problems(mark, {s.first_lsn: len(s.data) for s in segments}, applied_lsn,
                              p.next_lsn - 1)
        if lacks and not prefix:
            raise CorruptionError(wal_dir, None, "the log lacks records it had acknowledged: "
                                  + "; ".join(lacks), MARK_HINT)
        if lacks and p.lost is None:
            p.lost = Lost(p.next_lsn, mark.acked if mark.acked >= p.next_lsn else None,
                          wal_dir, "; ".join(lacks))
        elif p.lost is not None and mark.acked > (p.lost.last_lsn or 0):
            p.lost.last_lsn = mark.acked
    if prefix and applied_lsn and not segments and p.lost is None:
        p.lost = Lost(applied_lsn + 1, None, wal_dir, "no log segment remains")
    if fs.exists(wal_dir):
        for name in fs.listdir(wal_dir):
            if name == SPARE_NAME:  # the next segment made ahead (writer.py): not damage,
                if not readonly:    # nothing to report; a writer makes a fresh one
                    p.remove.append(os.path.join(wal_dir, name))
            elif name.endswith(SEGMENT_SUFFIX + TMP_SUFFIX):
                p.remove.append(os.path.join(wal_dir, name))
                p.notes.append(f"removed unfinished segment {name}")
    failpoints.hit("recovery_after_replay")
    if readonly:
        p.notes = [f"{n} (read-only: not done)" for n in p.notes]
    else:
        repair(fs, wal_dir, p)
        failpoints.hit("recovery_after_repair")
    return p

