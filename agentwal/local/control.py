"""The control file: a store's identity and format version.

Theory of operation: ``<store>/CONTROL`` is written when the store is
created, as ``magic + CRC-32 + CBOR {"format", "store_id", "created_at"}``
through a temporary file, fsync, rename and directory fsync, so it is either
absent or whole. It is rewritten the same way when the store's log
takes its first form-2 record (:func:`raise_format`: format 1 to 2) and
before the first fold that writes snapshot layout 4 (to 3), so an agentwal
that reads only the older formats refuses the store. It is never lowered. Its store id is
stamped into every WAL segment header and into LMDB, which is how a foreign
segment or snapshot is recognised. It goes through the I/O seam like the WAL.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass

import cbor2

from ..codec import CodecError, loads
from ..errors import CorruptionError
from ..format import CONTROL_FILE, PLAIN_VERSION, READ_VERSIONS
from ..io import FileSystem, read_all, replace_file

__all__ = ["Control", "ControlFile", "create_control", "raise_format", "read_control"]

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
    fmt = obj.get("format")
    if type(fmt) is not int or fmt not in READ_VERSIONS:
        raise CorruptionError(path, 12, f"store format {fmt}, this agentwal reads formats "
                              f"{min(READ_VERSIONS)} to {max(READ_VERSIONS)}")
    try:
        sid = uuid.UUID(bytes=obj["store_id"])
    except ValueError:
        raise CorruptionError(path, 12, "store id is malformed") from None
    created = obj.get("created_at", 0.0)
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not (
            0 <= created < 1e12):
        raise CorruptionError(path, 12, "creation time is malformed")
    return Control(sid, fmt, float(created))


def create_control(fs: FileSystem, directory: str, store_id: uuid.UUID | None = None,
                   version: int = PLAIN_VERSION) -> Control:
    """Write a new control file atomically and durably; returns it.

    ``store_id``: the identity to write (salvage rebuilding a damaged file's);
    None makes a new one. ``version``: its format (a new store's is 1).
    """
    ctl = Control(store_id or uuid.uuid4(), version, time.time())
    _write(fs, directory, ctl)
    return ctl


def raise_format(fs: FileSystem, directory: str, ctl: Control, version: int) -> Control:
    """Rewrite ``ctl`` with format ``version`` (same identity), atomically and durably."""
    new = Control(ctl.store_id, version, ctl.created_at)
    _write(fs, directory, new)
    return new


class ControlFile:
    """The CONTROL of an open writer: what it said at open, raised in place later.

    Holds no engine (the WAL writer keeps :meth:`raise_to` as its ``upgrade``, the
    snapshot calls it before its first layout-4 fold: two threads).
    """

    def __init__(self, fs: FileSystem, directory: str, control: Control) -> None:
        self.fs = fs
        self.directory = directory
        self.control = control
        self._lock = threading.Lock()

    def raise_to(self, version: int) -> None:
        """CONTROL says at least ``version`` from now on (atomic and durable; raises OSError).

        A version at or below the current one changes nothing: the format is never lowered.
        """
        with self._lock:
            if version > self.control.format:
                self.control = raise_format(self.fs, self.directory, self.control, version)


def _write(fs: FileSystem, directory: str, ctl: Control) -> None:
    body = cbor2.dumps({"format": ctl.format, "store_id": ctl.store_id.bytes,
                        "created_at": ctl.created_at})
    replace_file(fs, directory, CONTROL_FILE, _MAGIC + struct.pack("<I", zlib.crc32(body)) + body)
