"""Segment headers and record frames: encode/parse round trips and every rejected field.

One named test per rejected field, after LevelDB's ``log_test.cc``. Frames
whose *only* defect is the field under test are built with
:func:`_raw_frame`, which computes a correct CRC, so each rejection is
proven to come from the field check and not from a checksum mismatch.
"""

from __future__ import annotations

import struct
import uuid
import zlib

import pytest

from agentwal.format import (
    APPENDS_VERSION,
    FLAG_APPENDS,
    FLAG_ZSTD,
    FORMAT_VERSION,
    MAX_RECORD_PAYLOAD,
    PLAIN_VERSION,
    REC_COMMIT,
    REC_DELETE_RUN,
    REC_EFFECT,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    parse_segment_name,
    segment_name,
)
from agentwal.local.wal import frame as frame_mod
from agentwal.local.wal.frame import (
    Frame,
    SegmentHeader,
    encode_frame,
    encode_header,
    parse_header,
    try_frame,
)

STORE = uuid.UUID("0b6f3a52-5d1c-4c8e-9a57-3c2f1e0d9b10")
SALT = 0x5A17C0DE
HEADER = SegmentHeader(STORE, 3, 41, SALT)


def _raw_header(*, magic: bytes = SEGMENT_MAGIC, version: int = PLAIN_VERSION, flags: int = 0,
                size: int = SEGMENT_HEADER_SIZE, reserved: bytes = bytes(8)) -> bytes:
    """A segment header with any field value and a correct CRC."""
    body = SEGMENT_HEADER.pack(magic, version, flags, size, STORE.bytes, 3, 41, SALT, reserved)
    return body + struct.pack("<I", zlib.crc32(body))


def _raw_frame(salt: int = SALT, *, length: int | None = None, lsn: int = 7, synced: int = 5,
               rtype: int = REC_COMMIT, flags: int = 0, reserved: int = 0,
               payload: bytes = b"payload") -> bytes:
    """A frame with any header field value and a CRC that matches it."""
    n = len(payload) if length is None else length
    rest = RECORD_HEADER.pack(0, n, lsn, synced, rtype, flags, reserved)[4:]
    crc = zlib.crc32(payload, zlib.crc32(rest, salt))
    return struct.pack("<I", crc) + rest + payload


# -- segment names ------------------------------------------------------------------------


def test_segment_name_round_trip() -> None:
    assert segment_name(1) == "00000000000000000001.wal"
    assert parse_segment_name(segment_name(1)) == 1
    assert parse_segment_name(segment_name(2**63)) == 2**63


@pytest.mark.parametrize("name", ["LOCK", "1.wal", "0000000000000000000x.wal",
                                  "00000000000000000001.wal.tmp", "00000000000000000001.log",
                                  "000000000000000000001.wal"])
def test_parse_segment_name_rejects(name: str) -> None:
    assert parse_segment_name(name) is None


# -- segment headers ----------------------------------------------------------------------


def test_header_round_trip() -> None:
    data = encode_header(HEADER)
    assert len(data) == SEGMENT_HEADER_SIZE
    assert parse_header(data) == HEADER


def test_header_layout_matches_byte_table() -> None:
    data = encode_header(HEADER)
    assert data[0:8] == b"AWALSEG\x00"
    assert struct.unpack_from("<H", data, 8)[0] == PLAIN_VERSION
    assert struct.unpack_from("<H", data, 10)[0] == 0
    assert struct.unpack_from("<I", data, 12)[0] == SEGMENT_HEADER_SIZE
    assert data[16:32] == STORE.bytes
    assert struct.unpack_from("<Q", data, 32)[0] == 3
    assert struct.unpack_from("<Q", data, 40)[0] == 41
    assert struct.unpack_from("<I", data, 48)[0] == SALT
    assert data[52:60] == bytes(8)
    assert struct.unpack_from("<I", data, 60)[0] == zlib.crc32(data[:60])


def test_header_raw_helper_matches_encoder() -> None:
    assert _raw_header() == encode_header(HEADER)


def test_header_parse_ignores_trailing_bytes() -> None:
    assert parse_header(encode_header(HEADER) + b"\xff" * 100) == HEADER


def test_header_short() -> None:
    assert isinstance(parse_header(encode_header(HEADER)[:-1]), str)
    assert isinstance(parse_header(b""), str)


def test_header_all_zero() -> None:
    assert parse_header(bytes(SEGMENT_HEADER_SIZE)) == "bad segment magic"


def test_header_bad_magic() -> None:
    assert parse_header(_raw_header(magic=b"AWALSEG\x01")) == "bad segment magic"


def test_header_bad_crc() -> None:
    data = bytearray(encode_header(HEADER))
    data[60] ^= 0x01
    assert parse_header(bytes(data)) == "segment header checksum mismatch"


@pytest.mark.parametrize("offset", [8, 16, 32, 40, 48, 52, 59])
def test_header_flipped_byte_fails_crc(offset: int) -> None:
    data = bytearray(encode_header(HEADER))
    data[offset] ^= 0x40
    assert parse_header(bytes(data)) == "segment header checksum mismatch"


@pytest.mark.parametrize("version", [0, FORMAT_VERSION + 1, 0xFFFF])
def test_header_wrong_version(version: int) -> None:
    why = parse_header(_raw_header(version=version))
    assert isinstance(why, str)
    assert f"format version {version}, this agentwal reads versions 1 to 3" in why


@pytest.mark.parametrize("version", [PLAIN_VERSION, APPENDS_VERSION])
def test_header_of_each_readable_version(version: int) -> None:
    h = SegmentHeader(STORE, 3, 41, SALT, version)
    assert parse_header(encode_header(h)) == h
    assert encode_header(h) == _raw_header(version=version)


def test_header_wrong_header_size() -> None:
    why = parse_header(_raw_header(size=128))
    assert isinstance(why, str)
    assert "header size 128" in why


def test_header_of_other_version_via_dataclass() -> None:
    data = encode_header(SegmentHeader(STORE, 0, 1, SALT, version=FORMAT_VERSION + 1))
    assert isinstance(parse_header(data), str)


# -- frames -------------------------------------------------------------------------------


def test_frame_round_trip() -> None:
    data = encode_frame(SALT, 7, 5, REC_COMMIT, FLAG_ZSTD, b"hello")
    assert len(data) == RECORD_HEADER_SIZE + 5
    f = try_frame(data, 0, SALT)
    assert f == Frame(0, 7, 5, REC_COMMIT, FLAG_ZSTD, b"hello")
    assert f.end == len(data)


def test_frame_layout_matches_byte_table() -> None:
    data = encode_frame(SALT, 7, 5, REC_COMMIT, FLAG_ZSTD, b"hello")
    crc, length, lsn, synced, rtype, flags, res = RECORD_HEADER.unpack_from(data, 0)
    assert (length, lsn, synced, rtype, flags, res) == (5, 7, 5, REC_COMMIT, FLAG_ZSTD, 0)
    assert crc == zlib.crc32(data[4:], SALT)
    assert data[RECORD_HEADER_SIZE:] == b"hello"


def test_frame_raw_helper_matches_encoder() -> None:
    assert _raw_frame() == encode_frame(SALT, 7, 5, REC_COMMIT, 0, b"payload")


def test_frame_at_offset_in_larger_buffer() -> None:
    one = encode_frame(SALT, 1, 0, REC_COMMIT, 0, b"a")
    two = encode_frame(SALT, 2, 1, REC_COMMIT, 0, b"bb")
    data = b"\x00" * 10 + one + two + b"\x00" * 50
    f1 = try_frame(data, 10, SALT)
    assert f1 is not None and (f1.lsn, f1.payload) == (1, b"a")
    f2 = try_frame(data, f1.end, SALT)
    assert f2 is not None and (f2.offset, f2.lsn, f2.synced_lsn, f2.payload) == (
        f1.end, 2, 1, b"bb")


def test_frame_from_memoryview() -> None:
    data = encode_frame(SALT, 7, 5, REC_COMMIT, 0, b"view")
    f = try_frame(memoryview(data), 0, SALT)
    assert f is not None and f.payload == b"view" and type(f.payload) is bytes


def test_frame_largest_allowed_length(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frame_mod, "MAX_RECORD_PAYLOAD", 16)
    assert try_frame(_raw_frame(payload=b"x" * 16), 0, SALT) is not None


def test_frame_zero_length() -> None:
    data = _raw_frame(payload=b"") + bytes(64)
    assert try_frame(data, 0, SALT) is None


def test_frame_over_max_length(monkeypatch: pytest.MonkeyPatch) -> None:
    # With a lowered limit the rejection is provably the length check: the
    # bytes are all there and the CRC matches.
    monkeypatch.setattr(frame_mod, "MAX_RECORD_PAYLOAD", 16)
    assert try_frame(_raw_frame(payload=b"x" * 17), 0, SALT) is None


def test_frame_length_field_over_real_max() -> None:
    data = _raw_frame(length=MAX_RECORD_PAYLOAD + 1) + bytes(64)
    assert try_frame(data, 0, SALT) is None
    data = _raw_frame(length=0xFFFFFFFF) + bytes(64)
    assert try_frame(data, 0, SALT) is None


@pytest.mark.parametrize("rtype", [0, 4, 0x7F, 0xFF])  # 1-3 are the record types
def test_frame_unknown_type(rtype: int) -> None:
    assert try_frame(_raw_frame(rtype=rtype), 0, SALT) is None


@pytest.mark.parametrize("flags", [0x04, 0x80, 0xFF, FLAG_ZSTD | 0x04])
def test_frame_unknown_flag(flags: int) -> None:
    assert try_frame(_raw_frame(flags=flags), 0, SALT) is None


@pytest.mark.parametrize("flags", [FLAG_APPENDS, FLAG_APPENDS | FLAG_ZSTD])
def test_frame_appends_flag_is_a_commit_flag(flags: int) -> None:
    # A form-2 commit (append entries) is a frame; the flag on another record type is not.
    assert try_frame(_raw_frame(flags=flags), 0, SALT) is not None
    assert try_frame(_raw_frame(flags=flags, rtype=REC_EFFECT), 0, SALT) is None
    assert try_frame(_raw_frame(flags=flags, rtype=REC_DELETE_RUN), 0, SALT) is None


def test_frame_known_flags() -> None:
    assert try_frame(_raw_frame(flags=0), 0, SALT) is not None
    assert try_frame(_raw_frame(flags=FLAG_ZSTD), 0, SALT) is not None


@pytest.mark.parametrize("reserved", [1, 0x100, 0xFFFF])
def test_frame_nonzero_reserved(reserved: int) -> None:
    assert try_frame(_raw_frame(reserved=reserved), 0, SALT) is None


def test_frame_wrong_salt() -> None:
    data = encode_frame(SALT, 7, 5, REC_COMMIT, 0, b"payload")
    assert try_frame(data, 0, SALT ^ 1) is None
    assert try_frame(data, 0, 0) is None


def test_frame_synced_lsn_equal_to_lsn() -> None:
    assert try_frame(_raw_frame(lsn=7, synced=7), 0, SALT) is None


def test_frame_synced_lsn_above_lsn() -> None:
    assert try_frame(_raw_frame(lsn=7, synced=8), 0, SALT) is None


def test_frame_synced_lsn_just_below_lsn() -> None:
    f = try_frame(_raw_frame(lsn=7, synced=6), 0, SALT)
    assert f is not None and f.synced_lsn == 6


def test_frame_bad_crc() -> None:
    data = bytearray(encode_frame(SALT, 7, 5, REC_COMMIT, 0, b"payload"))
    data[0] ^= 0x01
    assert try_frame(bytes(data), 0, SALT) is None


@pytest.mark.parametrize("offset", range(RECORD_HEADER_SIZE + 7))
def test_frame_any_flipped_bit_is_rejected(offset: int) -> None:
    data = bytearray(encode_frame(SALT, 7, 5, REC_COMMIT, 0, b"payload"))
    data[offset] ^= 0x01
    assert try_frame(bytes(data) + bytes(64), 0, SALT) is None


def test_frame_truncated_payload() -> None:
    data = encode_frame(SALT, 7, 5, REC_COMMIT, 0, b"payload")
    for cut in range(len(data)):
        assert try_frame(data[:cut], 0, SALT) is None


def test_frame_offset_past_end() -> None:
    data = encode_frame(SALT, 7, 5, REC_COMMIT, 0, b"payload")
    assert try_frame(data, len(data), SALT) is None
    assert try_frame(data, len(data) + 100, SALT) is None


def test_frame_all_zero_bytes() -> None:
    assert try_frame(bytes(256), 0, SALT) is None
