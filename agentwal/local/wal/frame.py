"""Segment headers and record frames: pure functions from fields to bytes and back.

Theory of operation: this module never touches a file. The byte tables live
in :mod:`agentwal.format`; here they become ``encode_*`` and ``parse_*``
functions that the writer, the reader and the golden-file tests share.
Every record CRC is seeded with its segment's random salt, so a frame left
over from a recycled or foreign file never validates in this segment.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from ...format import (
    FLAG_APPENDS,
    KNOWN_FLAGS,
    MAX_RECORD_PAYLOAD,
    PLAIN_VERSION,
    READ_VERSIONS,
    REC_COMMIT,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_TYPES,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
)

__all__ = ["Frame", "SegmentHeader", "encode_frame", "encode_header", "parse_header", "try_frame"]


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """The fields of a segment header."""

    store_id: uuid.UUID
    number: int
    first_lsn: int
    salt: int
    #: 1, or 2 when the segment may hold form-2 commit records (``format.APPENDS_VERSION``)
    version: int = PLAIN_VERSION


class Frame(NamedTuple):
    """One decoded record frame and where it sits in its segment."""

    offset: int
    lsn: int
    synced_lsn: int
    type: int
    flags: int
    payload: bytes

    @property
    def end(self) -> int:
        return self.offset + RECORD_HEADER_SIZE + len(self.payload)


def encode_header(h: SegmentHeader) -> bytes:
    """The 64 header bytes of a segment."""
    body = SEGMENT_HEADER.pack(
        SEGMENT_MAGIC, h.version, 0, SEGMENT_HEADER_SIZE, h.store_id.bytes, h.number,
        h.first_lsn, h.salt, bytes(8),
    )
    return body + struct.pack("<I", zlib.crc32(body))


def parse_header(data: bytes) -> SegmentHeader | str:
    """Decode a segment header, or return why it is not one."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return "segment is shorter than its header"
    body = data[: SEGMENT_HEADER.size]
    (crc,) = struct.unpack_from("<I", data, SEGMENT_HEADER.size)
    magic, version, flags, size, sid, number, first, salt, res = SEGMENT_HEADER.unpack(body)
    if magic != SEGMENT_MAGIC:
        return "bad segment magic"
    if zlib.crc32(body) != crc:
        return "segment header checksum mismatch"
    if version not in READ_VERSIONS:
        return (f"segment format version {version}, this agentwal reads versions "
                f"{min(READ_VERSIONS)} to {max(READ_VERSIONS)}")
    if size != SEGMENT_HEADER_SIZE:
        return f"segment header size {size}, expected {SEGMENT_HEADER_SIZE}"
    if flags or any(res):
        return "segment header has unknown flags or nonzero reserved bytes"
    return SegmentHeader(uuid.UUID(bytes=sid), number, first, salt, version)


# RECORD_HEADER without its leading CRC, and the CRC alone: packed apart, no slicing
_REST = struct.Struct("<" + RECORD_HEADER.format.lstrip("<")[1:])
_CRC = struct.Struct("<I")


def encode_frame(salt: int, lsn: int, synced_lsn: int, rtype: int, flags: int,
                 payload: bytes) -> bytes:
    """One record frame: header and payload."""
    rest = _REST.pack(len(payload), lsn, synced_lsn, rtype, flags, 0)
    return _CRC.pack(zlib.crc32(payload, zlib.crc32(rest, salt))) + rest + payload


def try_frame(data: bytes | memoryview, offset: int, salt: int) -> Frame | None:
    """The valid frame at ``offset``, or None if the bytes there are not one."""
    if offset + RECORD_HEADER_SIZE > len(data):
        return None
    crc, length, lsn, synced, rtype, flags, res = RECORD_HEADER.unpack_from(data, offset)
    if (length == 0 or length > MAX_RECORD_PAYLOAD or rtype not in RECORD_TYPES
            or flags & ~KNOWN_FLAGS or res != 0 or synced >= lsn
            or (flags & FLAG_APPENDS and rtype != REC_COMMIT)):
        return None
    end = offset + RECORD_HEADER_SIZE + length
    if end > len(data):
        return None
    rest = data[offset + 4 : offset + RECORD_HEADER_SIZE]
    payload = data[offset + RECORD_HEADER_SIZE : end]
    if zlib.crc32(payload, zlib.crc32(rest, salt)) != crc:
        return None
    return Frame(offset, lsn, synced, rtype, flags, bytes(payload))
