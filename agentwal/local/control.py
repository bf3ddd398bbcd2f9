"""The control file: a store's identity and format version.

Theory of operation: ``<store>/CONTROL`` is written once, when the store is
created, as ``magic + CRC-32 + CBOR {"format", "store_id", "created_at"}``
through a temporary file, fsync, rename and directory fsync, so it is either
absent or whole. Its store id is stamped into every WAL segment header and
into LMDB, which is how a foreign segment or snapshot is recognised. It goes
through the I/O seam like the WAL.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
import zlib
from dataclasses import dataclass

import cbor2

from ..codec import CodecError, loads
from ..errors import CorruptionError
from ..format import CONTROL_FILE, FORMAT_VERSION
from ..io import FileSystem, read_all, replace_file

__all__ = ["Control", "create_control", "read_control"]

_MAGIC = b"AWALCTL\x00"


@dataclass(frozen=True, slots=True)
class Control:
    """A store's identity."""

    store_id: uuid.UUID
    format: int
    created_at: float


def read_control(fs: FileSystem, directory: str) -> Control | None:
    """The store's control record, or None when the file does not exist.

    Raises:
        CorruptionError: the file exists but is damaged or of an unknown format.
    """
    path = os.path.join(directory, CONTROL_FILE)
    if not fs.exists(path):
        return None
    data = read_all(fs, path)
    if len(data) < 12 or data[:8] != _MAGIC:
        raise CorruptionError(path, 0, "not an agentwal control file")
    (crc,) = struct.unpack_from("<I", data, 8)
    body = data[12:]
    if zlib.crc32(body) != crc:
        raise CorruptionError(path, 8, "control file checksum mismatch")
    try:
        obj = loads(body)
    except CodecError as exc:
        raise CorruptionError(path, 12, str(exc)) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("store_id"), bytes):
        raise CorruptionError(path, 12, "control record is malformed")
    if obj.get("format") != FORMAT_VERSION:
        raise CorruptionError(path, 12, f"store format {obj.get('format')}, this agentwal "
                              f"reads format {FORMAT_VERSION}")
    try:
        sid = uuid.UUID(bytes=obj["store_id"])
    except ValueError:
        raise CorruptionError(path, 12, "store id is malformed") from None
    created = obj.get("created_at", 0.0)
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not (
            0 <= created < 1e12):
        raise CorruptionError(path, 12, "creation time is malformed")
    return Control(sid, FORMAT_VERSION, float(created))


def create_control(fs: FileSystem, directory: str,
                   store_id: uuid.UUID | None = None) -> Control:
    """Write a new control file atomically and durably; returns it.

    ``store_id``: the identity to write (salvage rebuilding a damaged file's);
    None makes a new one.
    """
    ctl = Control(store_id or uuid.uuid4(), FORMAT_VERSION, time.time())
    body = cbor2.dumps({"format": ctl.format, "store_id": ctl.store_id.bytes,
                        "created_at": ctl.created_at})
    replace_file(fs, directory, CONTROL_FILE, _MAGIC + struct.pack("<I", zlib.crc32(body)) + body)
    return ctl
