"""The control file: create/read round trip, every kind of damage, the atomic write."""

from __future__ import annotations

import errno
import os
import stat
import struct
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import cbor2
import pytest

from agentwal.errors import CorruptionError
from agentwal.format import APPENDS_VERSION, CONTROL_FILE, FORMAT_VERSION, PLAIN_VERSION
from agentwal.io import OsFileSystem
from agentwal.local.control import Control, create_control, raise_format, read_control

MAGIC = b"AWALCTL\x00"


def image(body: bytes, *, magic: bytes = MAGIC, crc: int | None = None) -> bytes:
    return magic + struct.pack("<I", zlib.crc32(body) if crc is None else crc) + body


def record(**over: Any) -> bytes:
    obj: dict[str, Any] = {"format": FORMAT_VERSION, "store_id": uuid.uuid4().bytes,
                           "created_at": 1700000000.5}
    obj.update(over)
    return cbor2.dumps({k: v for k, v in obj.items() if v is not ...})


def put(d: Path, data: bytes) -> str:
    p = d / CONTROL_FILE
    p.write_bytes(data)
    return str(p)


def corruption(d: Path) -> CorruptionError:
    with pytest.raises(CorruptionError) as ei:
        read_control(OsFileSystem(), str(d))
    return ei.value


# -- round trip -----------------------------------------------------------------------------


def test_create_then_read(tmp_path: Path) -> None:
    fs = OsFileSystem()
    before = time.time()
    ctl = create_control(fs, str(tmp_path))
    assert isinstance(ctl, Control)
    assert ctl.format == PLAIN_VERSION  # a new store stays readable by a version-1 agentwal
    assert ctl.store_id.version == 4
    assert before <= ctl.created_at <= time.time()
    assert read_control(fs, str(tmp_path)) == ctl


def test_each_store_gets_its_own_id(tmp_path: Path) -> None:
    fs = OsFileSystem()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert create_control(fs, str(tmp_path / "a")).store_id != \
        create_control(fs, str(tmp_path / "b")).store_id


def test_the_bytes_are_magic_crc_and_cbor(tmp_path: Path) -> None:
    ctl = create_control(OsFileSystem(), str(tmp_path))
    data = (tmp_path / CONTROL_FILE).read_bytes()
    assert data[:8] == MAGIC
    (crc,) = struct.unpack_from("<I", data, 8)
    assert crc == zlib.crc32(data[12:])
    assert cbor2.loads(data[12:]) == {"format": PLAIN_VERSION, "store_id": ctl.store_id.bytes,
                                      "created_at": ctl.created_at}


def test_raise_format_keeps_the_identity(tmp_path: Path) -> None:
    fs = OsFileSystem()
    ctl = create_control(fs, str(tmp_path))
    new = raise_format(fs, str(tmp_path), ctl, APPENDS_VERSION)
    assert (new.store_id, new.format, new.created_at) == (ctl.store_id, APPENDS_VERSION,
                                                          ctl.created_at)
    assert read_control(fs, str(tmp_path)) == new
    assert not (tmp_path / (CONTROL_FILE + ".tmp")).exists()


def test_control_is_frozen() -> None:
    ctl = Control(uuid.uuid4(), FORMAT_VERSION, 0.0)
    with pytest.raises(AttributeError):
        ctl.format = 2  # type: ignore[misc]


def test_a_record_without_created_at_reads_as_zero(tmp_path: Path) -> None:
    sid = uuid.uuid4()
    put(tmp_path, image(record(store_id=sid.bytes, created_at=...)))
    ctl = read_control(OsFileSystem(), str(tmp_path))
    assert ctl == Control(sid, FORMAT_VERSION, 0.0)


def test_missing_file_is_none(tmp_path: Path) -> None:
    assert read_control(OsFileSystem(), str(tmp_path)) is None
    assert not (tmp_path / CONTROL_FILE).exists()


# -- damage ---------------------------------------------------------------------------------


def test_bad_magic(tmp_path: Path) -> None:
    p = put(tmp_path, image(record(), magic=b"AWALSEG\x00"))
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 0)
    assert "not an agentwal control file" in str(e)


def test_bad_crc(tmp_path: Path) -> None:
    body = record()
    p = put(tmp_path, image(body, crc=zlib.crc32(body) ^ 1))
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 8)
    assert "checksum" in e.reason


def test_flipped_body_byte_fails_the_crc(tmp_path: Path) -> None:
    ctl = create_control(OsFileSystem(), str(tmp_path))
    p = tmp_path / CONTROL_FILE
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x40
    p.write_bytes(bytes(data))
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (str(p), 8)
    assert ctl is not None


@pytest.mark.parametrize("size", [0, 1, 8, 11])
def test_truncated_inside_the_header(tmp_path: Path, size: int) -> None:
    p = put(tmp_path, image(record())[:size])
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 0)


@pytest.mark.parametrize("cut", [1, 10])
def test_truncated_body(tmp_path: Path, cut: int) -> None:
    full = image(record())
    p = put(tmp_path, full[: len(full) - cut])
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 8)  # the CRC catches it first


def test_header_only_with_the_crc_of_nothing(tmp_path: Path) -> None:
    p = put(tmp_path, image(b""))
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 12)


@pytest.mark.parametrize("fmt", [PLAIN_VERSION, APPENDS_VERSION])
def test_every_format_version_reads(tmp_path: Path, fmt: int) -> None:
    put(tmp_path, image(record(format=fmt)))
    ctl = read_control(OsFileSystem(), str(tmp_path))
    assert ctl is not None and ctl.format == fmt


@pytest.mark.parametrize("fmt", [0, FORMAT_VERSION + 1, 99, "1", None, True, 1.0])
def test_wrong_format_version(tmp_path: Path, fmt: Any) -> None:
    p = put(tmp_path, image(record(format=fmt)))
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 12)
    assert f"reads formats 1 to {FORMAT_VERSION}" in e.reason


def test_format_missing(tmp_path: Path) -> None:
    put(tmp_path, image(record(format=...)))
    assert corruption(tmp_path).offset == 12


@pytest.mark.parametrize("body", [b"\xff", b"\x9f\x01", b"\xa1\x61", b"\x1c"],
                         ids=["break", "open-array", "truncated-map", "reserved"])
def test_malformed_cbor(tmp_path: Path, body: bytes) -> None:
    p = put(tmp_path, image(body))
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 12)


@pytest.mark.parametrize("obj", [[1, 2], "x", 7, {"format": 1}, {"format": 1, "store_id": "s"}],
                         ids=["list", "str", "int", "no-id", "id-not-bytes"])
def test_malformed_record(tmp_path: Path, obj: Any) -> None:
    p = put(tmp_path, image(cbor2.dumps(obj)))
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 12)
    assert "malformed" in e.reason


def test_store_id_of_the_wrong_length(tmp_path: Path) -> None:
    p = put(tmp_path, image(record(store_id=b"\x01" * 15)))
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 12)
    assert "store id" in e.reason


# Regression (was an xfail: the bug is fixed).
@pytest.mark.parametrize("created_at", ["soon", None, [1], 10**400],
                         ids=["str", "null", "list", "huge-int"])
def test_created_at_of_the_wrong_type(tmp_path: Path, created_at: Any) -> None:
    p = put(tmp_path, image(record(created_at=created_at)))
    e = corruption(tmp_path)
    assert (e.path, e.offset) == (p, 12)


def test_message_says_what_to_do(tmp_path: Path) -> None:
    put(tmp_path, b"garbage!" * 4)
    assert "restore" in str(corruption(tmp_path))


# -- the atomic write -----------------------------------------------------------------------


class RecordingFs(OsFileSystem):
    """The OS file system, logging every call and failing ``fail_on`` once reached."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.log: list[tuple[str, ...]] = []
        self.fail_on = fail_on

    def _note(self, *call: str) -> None:
        self.log.append(call)
        if call[0] == self.fail_on:
            raise OSError(errno.EIO, f"injected {call[0]} failure")

    def open(self, path: str, create: bool = True) -> int:
        self._note("open", os.path.basename(path))
        return super().open(path, create)

    def truncate(self, fd: int, size: int) -> None:
        self._note("truncate")
        super().truncate(fd, size)

    def pwrite(self, fd: int, offset: int, data: bytes) -> int:
        self._note("pwrite")
        return super().pwrite(fd, offset, data)

    def fsync(self, fd: int) -> None:
        self._note("fsync")
        super().fsync(fd)

    def close(self, fd: int) -> None:
        self._note("close")
        super().close(fd)

    def rename(self, src: str, dst: str) -> None:
        self._note("rename", os.path.basename(src), os.path.basename(dst))
        super().rename(src, dst)

    def fsync_dir(self, path: str) -> None:
        self._note("fsync_dir")
        super().fsync_dir(path)


def test_written_through_a_synced_temporary_file_then_renamed(tmp_path: Path) -> None:
    fs = RecordingFs()
    create_control(fs, str(tmp_path))
    tmp = CONTROL_FILE + ".tmp"
    assert fs.log == [("open", tmp), ("truncate",), ("pwrite",), ("fsync",), ("close",),
                      ("rename", tmp, CONTROL_FILE), ("fsync_dir",)]
    assert os.listdir(tmp_path) == [CONTROL_FILE]
    assert stat.S_IMODE(os.stat(tmp_path / CONTROL_FILE).st_mode) & 0o077 == 0


def test_a_stale_longer_temporary_file_is_overwritten_whole(tmp_path: Path) -> None:
    (tmp_path / (CONTROL_FILE + ".tmp")).write_bytes(b"\xee" * 4096)
    ctl = create_control(OsFileSystem(), str(tmp_path))
    assert read_control(OsFileSystem(), str(tmp_path)) == ctl
    assert os.listdir(tmp_path) == [CONTROL_FILE]


@pytest.mark.parametrize("step", ["pwrite", "fsync", "rename"])
def test_a_failed_create_leaves_no_control_file(tmp_path: Path, step: str) -> None:
    fs = RecordingFs(fail_on=step)
    with pytest.raises(OSError):
        create_control(fs, str(tmp_path))
    assert not (tmp_path / CONTROL_FILE).exists()
    assert read_control(OsFileSystem(), str(tmp_path)) is None  # absent, never half-written
    if step != "rename":
        assert ("close",) in fs.log  # the temporary file's descriptor is not leaked


def test_read_goes_through_the_seam(tmp_path: Path) -> None:
    create_control(OsFileSystem(), str(tmp_path))
    fs = RecordingFs()
    assert read_control(fs, str(tmp_path)) is not None
    assert fs.log == [("open", CONTROL_FILE), ("close",)]
