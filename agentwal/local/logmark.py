"""The log mark: what the log held when the writer last said so.

Theory of operation: LMDB's ``applied_lsn`` says what was folded, but a
store that was never folded (or whose last records came after the last fold)
had only the log itself as evidence of what it acknowledged, so a deleted,
truncated or older copy of a segment looked like an empty or shorter store.
``<store>/LOGMARK`` is the writer's statement about the log, in two parts:

- the *segment list*: the first LSN and size of every segment, rewritten
  whole (temporary file, fsync, rename, directory fsync, like ``CONTROL``)
  when a segment is created or removed and when a writer opens;
- the *acknowledged LSN*: after every sync of the log the writer overwrites
  one of two fixed 16-byte slots in place (alternating, each with its own
  CRC): the log itself was just synced, so any value a slot holds is
  durable in the log. A process kill keeps the latest value (the page cache
  has it). The slot write is fsynced only every ``MARK_SYNC_EVERY`` (256)
  writes or ``MARK_SYNC_SECONDS`` (1 s), whichever comes first (the writer,
  ``wal/writer.py``), so a power cut keeps a value at most that far behind:
  an older one, or a torn slot, which fails its CRC so the other one counts.

Every statement is true when it is made: the list names only segments
already durably named, a slot only an LSN already synced. The mark is
therefore a lower bound, and the checks (:func:`mark_problems`) are:

- a marked segment whose records may be needed (no later segment, marked or
  on disk, starts at or before ``applied_lsn + 1``) must exist and be at
  least as long as marked (segments are preallocated and never shrink);
- the log must reach the acknowledged LSN (or LMDB must).

Segments the list does not name (created after it) are the log's business.
Stores made before the mark existed have none; the first writer open writes
one. A damaged list is :class:`CorruptionError`; a damaged slot is what a
power cut during its write leaves, and reads as the other slot.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from dataclasses import dataclass

import cbor2

from ..codec import CodecError, loads
from ..errors import CorruptionError
from ..format import segment_name
from ..io import FileSystem, read_all, replace_file, write_all

__all__ = ["LOGMARK_FILE", "MARK_FORMAT", "LogMark", "mark_problems", "read_mark", "write_acked",
           "write_mark"]

#: The mark's file name in the store directory.
LOGMARK_FILE = "LOGMARK"
#: The version of the mark's body.
MARK_FORMAT = 1
_MAGIC = b"AWALMRK\x00"


@dataclass(frozen=True, slots=True)
class LogMark:
    """The writer's last statement about the log.

    Attributes:
        acked: every record up to this LSN was durable in the log.
        segments: ``(first LSN, size in bytes)`` of each segment, oldest first.
    """

    acked: int
    segments: tuple[tuple[int, int], ...]


_SLOT = struct.Struct("<QI4x")  # acknowledged LSN, CRC-32 of the LSN seeded with the body's
SLOT_OFFSETS = (8, 24)
_BODY_CRC = 40
_BODY = 44


def _slot(lsn: int, body_crc: int) -> bytes:
    return _SLOT.pack(lsn, zlib.crc32(lsn.to_bytes(8, "little"), body_crc))


def encode_mark(store_id: uuid.UUID, mark: LogMark) -> bytes:
    """The file image of ``mark`` (both slots hold its acknowledged LSN)."""
    body = cbor2.dumps({"format": MARK_FORMAT, "store_id": store_id.bytes,
                        "segments": [list(s) for s in mark.segments]})
    crc = zlib.crc32(body)
    slot = _slot(mark.acked, crc)
    return _MAGIC + slot + slot + struct.pack("<I", crc) + body


def read_mark(fs: FileSystem, directory: str, store_id: uuid.UUID) -> LogMark | None:
    """The store's log mark, or None when it has none (made before marks, or brand new).

    Raises:
        CorruptionError: the segment list is damaged, of an unknown format, or
            of another store.
    """
    path = os.path.join(directory, LOGMARK_FILE)
    if not fs.exists(path):
        return None
    data = read_all(fs, path)
    if len(data) < _BODY or data[:8] != _MAGIC:
        raise CorruptionError(path, 0, "not an agentwal log mark")
    (crc,) = struct.unpack_from("<I", data, _BODY_CRC)
    body = data[_BODY:]
    if zlib.crc32(body) != crc:
        raise CorruptionError(path, _BODY_CRC, "log mark checksum mismatch")
    try:
        obj = loads(body)
    except CodecError as exc:
        raise CorruptionError(path, _BODY, str(exc)) from None
    if not isinstance(obj, dict):
        raise CorruptionError(path, _BODY, "log mark is malformed")
    if obj.get("format") != MARK_FORMAT:
        raise CorruptionError(path, _BODY, f"log mark format {obj.get('format')}, this "
                              f"agentwal reads format {MARK_FORMAT}")
    if obj.get("store_id") != store_id.bytes:
        raise CorruptionError(path, _BODY, "log mark belongs to another store")
    segs = obj.get("segments")
    if not isinstance(segs, list) or not all(
            isinstance(s, list) and len(s) == 2 and _uint(s[0]) and _uint(s[1]) for s in segs):
        raise CorruptionError(path, _BODY, "log mark is malformed")
    acked = 0
    for off in SLOT_OFFSETS:
        lsn, _ = _SLOT.unpack_from(data, off)
        if data[off:off + _SLOT.size] == _slot(lsn, crc):
            acked = max(acked, lsn)
    return LogMark(acked, tuple((s[0], s[1]) for s in segs))


def _uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def write_mark(fs: FileSystem, directory: str, store_id: uuid.UUID, mark: LogMark) -> int:
    """Replace the mark atomically and durably; returns the CRC its slots are seeded with.

    Raises ``OSError`` like any write.
    """
    image = encode_mark(store_id, mark)
    replace_file(fs, directory, LOGMARK_FILE, image)
    return int(struct.unpack_from("<I", image, _BODY_CRC)[0])


def write_acked(fs: FileSystem, directory: str, slot: int, lsn: int, body_crc: int, *,
                sync: bool = False) -> None:
    """Overwrite slot ``slot`` (0 or 1) with ``lsn``, in place (see above); fsync it if ``sync``."""
    fd = fs.open(os.path.join(directory, LOGMARK_FILE), create=False)
    try:
        write_all(fs, fd, SLOT_OFFSETS[slot], _slot(lsn, body_crc))
        if sync:
            fs.fsync(fd)
    finally:
        fs.close(fd)


def mark_problems(mark: LogMark, found: dict[int, int], applied: int, log_last: int) -> list[str]:
    """What the log on disk lacks against ``mark``; empty when it holds all it should.

    ``found`` maps each segment file's first LSN to its size, ``applied`` is
    LMDB's applied LSN and ``log_last`` the last LSN the log holds (0 if none).
    """
    out = []
    segs = mark.segments
    # Where a later segment starts at or before ``applied + 1``, every record of the
    # ones before it was folded and a fold or recovery may remove them. The later
    # segment may be one the mark does not name yet: a process that died between
    # naming a new segment and rewriting the mark, whose recovery then removed the
    # stale segment the mark still named last and died before the writer's mark.
    starts = sorted({s[0] for s in segs} | set(found))
    for first, size in segs:
        if any(first < s <= applied + 1 for s in starts):
            continue  # every record in it was folded
        name = segment_name(first)
        have = found.get(first)
        if have is None:
            out.append(f"segment {name} is missing: it held the records from LSN {first}")
        elif have < size:
            out.append(f"segment {name} is truncated: {have} bytes of the {size} it was "
                       "created with")
    if mark.acked > max(applied, log_last):
        out.append(f"the log ends at LSN {log_last} but every record up to LSN {mark.acked} "
                   f"was acknowledged: records {max(applied, log_last) + 1}..{mark.acked} are "
                   "missing (the log was replaced with an older copy, or cut)")
    return out


#: What to do about a log that lacks what its mark says it held.
MARK_HINT = ("Nothing was changed. Put the missing or complete segment files back into wal/ "
             "(from a backup), or restore the store from a backup; "
             "`agentwal verify` lists what is missing.")
