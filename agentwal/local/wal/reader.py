"""Reading segments back: where the valid records end, and whether that end is clean.

Theory of operation (after LevelDB's ``log_reader``): a segment is its header
and then frames with consecutive LSNs. Scanning stops at the first offset
that does not hold the next valid frame, and the bytes from there on decide
what that stop means:

- all zero: the clean end (the rest of the zero-filled preallocation);
- not zero, and no later valid frame proves the lost record was durable:
  a **torn tail**, the unacknowledged end of the last write before a crash;
  recovery zeroes it;
- a later valid frame whose *synced LSN* (the highest LSN its writer knew to
  be on disk) reaches the lost record: **corruption**, since that record was
  once durable and is now damaged;
- a frame with a valid CRC but the wrong LSN: **corruption** too.

Torn writes may reach the disk in any order (pages of one unsynced batch),
so a valid frame after a damaged one is not by itself proof of corruption;
the synced LSN is. This module only reads bytes: :func:`scan_segment` is a
pure function; :func:`list_segments` reads files through the I/O seam.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ...format import (
    KNOWN_FLAGS,
    RECORD_TYPES,
    SEGMENT_HEADER_SIZE,
    parse_segment_name,
)
from ...io import FileSystem, read_all
from .frame import Frame, SegmentHeader, parse_header, try_frame

__all__ = ["Scan", "SegmentFile", "list_segments", "scan_segment"]

# Bytes 24..27 of a plausible frame header: type, any known flags, two zero bytes.
_CANDIDATE = re.compile(
    b"(?=["
    + b"".join(re.escape(bytes([t])) for t in sorted(RECORD_TYPES))
    + b"]["
    + b"".join(re.escape(bytes([f])) for f in range(KNOWN_FLAGS + 1))
    + b"]\x00\x00)"
)


@dataclass
class Scan:
    """What one segment holds.

    Attributes:
        frames: the valid frames in order.
        end: offset just past the last valid frame.
        state: ``"clean"``, ``"torn"`` or ``"corrupt"``.
        reason: why the scan stopped, when not clean.
        dirty_end: offset past the last non-zero byte (what to zero when torn).
        later: valid frames found past a torn or corrupt stop.
        start_lsn: the LSN the scan expected first.
    """

    frames: list[Frame]
    end: int
    state: str = "clean"
    reason: str = ""
    dirty_end: int = 0
    later: list[Frame] = field(default_factory=list)
    start_lsn: int = 0  # the LSN the scan expected first

    @property
    def next_lsn(self) -> int:
        """The LSN the next record after this segment's valid ones would have."""
        return self.frames[-1].lsn + 1 if self.frames else self.start_lsn


def _later_frames(data: bytes, start: int, salt: int, min_lsn: int) -> list[Frame]:
    found = []
    for m in _CANDIDATE.finditer(data, start + 24):
        pos = m.start() - 24
        if pos < start:
            continue
        f = try_frame(data, pos, salt)
        if f is not None and f.lsn >= min_lsn:
            found.append(f)
    return found


def scan_segment(data: bytes, header: SegmentHeader, start: tuple[int, int] | None = None) -> Scan:
    """Scan a segment image (header included).

    ``start=(offset, lsn)`` begins at a known frame boundary instead of the
    header: the frames before it are covered by the snapshot and not read.
    """
    frames: list[Frame] = []
    off, expected = start if start is not None else (SEGMENT_HEADER_SIZE, header.first_lsn)
    first = expected
    while True:
        f = try_frame(data, off, header.salt)
        if f is None:
            break
        if f.lsn != expected:
            return Scan(frames, off, "corrupt",
                        f"record with LSN {f.lsn} where LSN {expected} belongs", len(data),
                        start_lsn=first)
        frames.append(f)
        off = f.end
        expected += 1
    if _zero_from(data, off):  # the zero preallocation
        return Scan(frames, off, "clean", "", off, start_lsn=first)
    dirty_end = len(data.rstrip(b"\x00"))
    later = _later_frames(data, off + 1, header.salt, expected)
    proof = next((f for f in later if f.synced_lsn >= expected), None)
    if proof is not None:
        return Scan(frames, off, "corrupt",
                    f"record LSN {expected} is damaged, but record LSN {proof.lsn} at offset "
                    f"{proof.offset} shows it was durable", dirty_end, later, first)
    return Scan(frames, off, "torn", f"torn or damaged record where LSN {expected} belongs",
                dirty_end, later, first)


_ZEROS = bytes(1 << 20)
_ZERO_VIEW = memoryview(_ZEROS)  # a shorter block of zeros without a copy


def _zero_from(data: bytes, off: int) -> bool:
    """True if every byte of ``data`` from ``off`` on is zero.

    ``startswith`` against a block of zeros is a ``memcmp`` with no copy: about
    ten times the speed of ``data.count(0, off)`` over a 16 MiB preallocation.
    """
    end = len(data)
    while off < end:
        n = min(end - off, len(_ZEROS))
        if not data.startswith(_ZERO_VIEW[:n], off):
            return False
        off += n
    return True


@dataclass
class SegmentFile:
    """A segment file as found on disk."""

    name: str
    path: str
    first_lsn: int
    header: SegmentHeader | None
    problem: str
    data: bytes

    def scan(self, start: tuple[int, int] | None = None) -> Scan:
        assert self.header is not None
        return scan_segment(self.data, self.header, start)


def list_segments(fs: FileSystem, wal_dir: str) -> list[SegmentFile]:
    """Every segment in ``wal_dir`` in LSN order, read and header-checked.

    Files that are not named like segments are ignored (never removed).
    """
    out = []
    for name in fs.listdir(wal_dir):
        first = parse_segment_name(name)
        if first is None:
            continue
        path = os.path.join(wal_dir, name)
        data = read_all(fs, path)
        parsed = parse_header(data)
        if isinstance(parsed, str):
            out.append(SegmentFile(name, path, first, None, parsed, data))
        elif parsed.first_lsn != first:
            out.append(SegmentFile(name, path, first, None,
                                   f"header says first LSN {parsed.first_lsn}", data))
        else:
            out.append(SegmentFile(name, path, first, parsed, "", data))
    out.sort(key=lambda s: s.first_lsn)
    return out
