"""The WAL reader and recovery planning, by byte surgery on real segment files.

After LevelDB's ``log_test.cc``: every case writes a log with the real
:class:`~agentwal.local.wal.Writer` on the OS file system, damages it in one
precise way (flip, truncate, zero-fill, garbage, stale or foreign segment,
missing segment) and checks what :func:`scan_segment` and
:func:`agentwal.local.recovery.plan` make of it, one named test per case.

Vocabulary: a *batch* is one ``Writer.append`` call; a frame carries the
synced LSN its writer knew when the batch was written, so a frame written
after a ``sync()`` proves that every earlier record was durable.
"""

from __future__ import annotations

import hashlib
import os
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentwal.codec import (
    CommitRecord,
    decode_meta,
    decode_value,
    encode_commit,
    encode_delta,
    encode_meta,
    encode_value,
)
from agentwal.errors import CorruptionError, Error
from agentwal.format import (
    APPENDS_VERSION,
    FLAG_APPENDS,
    FLAG_ZSTD,
    REC_COMMIT,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    TMP_SUFFIX,
    segment_name,
)
from agentwal.io import OsFileSystem
from agentwal.local import recovery
from agentwal.local.wal import (
    PendingRecord,
    Scan,
    SegmentHeader,
    Writer,
    list_segments,
    scan_segment,
)
from agentwal.local.wal.frame import Frame, encode_frame, encode_header, parse_header

FS = OsFileSystem()
STORE = uuid.UUID("6c1f0a9e-2b7d-4f3a-8e55-0d4c3b2a1f00")
OTHER_STORE = uuid.UUID("99999999-8888-4777-a666-555555555555")
SEG_BYTES = 4096
#: Pad that makes three records fit in one SEG_BYTES segment and four not.
BIG = 1000


# -- building logs --------------------------------------------------------------------------


def rec(lsn: int, pad: int = 0) -> PendingRecord:
    """A real commit record for LSN ``lsn``; ``pad`` adds that many incompressible bytes."""
    delta = {"step": encode_value("step", lsn)}
    if pad:
        delta["blob"] = encode_value("blob", random.Random(lsn).randbytes(pad))
    packed, flags, _digest = encode_delta(delta)
    record = CommitRecord(
        run="run-a", id=lsn, parent=lsn - 1 if lsn > 1 else None, created_at=1000.0 + lsn,
        meta=encode_meta({"step": lsn}), hash=hashlib.sha256(str(lsn).encode()).digest(),
        origin=None, delta=packed,
    )
    return PendingRecord(lsn, REC_COMMIT, flags, encode_commit(record))


def write_log(wal_dir: Path, batches: list[list[int]], *, sync: bool = True, pad: int = 0,
              store: uuid.UUID = STORE, first: int | None = None) -> Writer:
    """Write each batch with one append (and a sync after it when ``sync``); closed writer."""
    wal_dir.mkdir(exist_ok=True)
    w = Writer(FS, str(wal_dir), store, SEG_BYTES)
    w.start(first if first is not None else batches[0][0])
    for batch in batches:
        w.append([rec(lsn, pad) for lsn in batch])
        if sync:
            w.sync()
    w.close()
    return w


def only_segment(wal_dir: Path) -> Path:
    (name,) = os.listdir(wal_dir)
    return wal_dir / name


def seg_path(wal_dir: Path, first_lsn: int) -> Path:
    return wal_dir / segment_name(first_lsn)


def header_of(path: Path) -> SegmentHeader:
    h = parse_header(path.read_bytes())
    assert isinstance(h, SegmentHeader)
    return h


def frames_of(path: Path) -> list[Frame]:
    """The valid frames of an undamaged segment."""
    s = scan_segment(path.read_bytes(), header_of(path))
    assert s.state == "clean", s.reason
    return s.frames


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    b = path.read_bytes()[offset]
    patch(path, offset, bytes([b ^ mask]))


def scan(path: Path) -> Scan:
    return scan_segment(path.read_bytes(), header_of(path))


def plan(wal_dir: Path, applied: int = 0, store: uuid.UUID = STORE) -> recovery.Plan:
    return recovery.plan(list_segments(FS, str(wal_dir)), applied, store)


def lsns(p: recovery.Plan) -> list[int]:
    return [r.lsn for r in p.records]


def unsynced_tail(wal_dir: Path) -> None:
    """Let the damage a test makes to the last records stand for a write never synced.

    The writer's LOGMARK says those records were acknowledged (they were
    synced), and rightly refuses a log cut before them; a real torn tail is
    a write the mark never claimed. Without the mark, recovery reads the log
    as a store made before LOGMARK did.
    """
    (wal_dir.parent / "LOGMARK").unlink()


def recover(wal_dir: Path, applied: int = 0, *, readonly: bool = False) -> recovery.Plan:
    return recovery.recover(FS, str(wal_dir), applied, STORE, readonly=readonly)


def resume_writer(wal_dir: Path, p: recovery.Plan) -> Writer:
    w = Writer(FS, str(wal_dir), STORE, SEG_BYTES)
    if p.resume is None:
        w.start(p.next_lsn)
    else:
        seg, header, end = p.resume
        w.resume(seg, header.salt, end, p.next_lsn - 1, p.earlier)
    return w


@dataclass
class Layout:
    """Which LSNs each segment of a multi-segment log holds."""

    paths: list[Path]
    lsns: list[list[int]]


def layout(wal_dir: Path) -> Layout:
    paths = sorted(wal_dir.iterdir())
    return Layout(paths, [[f.lsn for f in frames_of(p)] for p in paths])


@pytest.fixture
def wal(tmp_path: Path) -> Path:
    return tmp_path / "wal"


# -- scan_segment: clean ends -------------------------------------------------------------


def test_clean_end_in_zero_preallocation(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    data = path.read_bytes()
    assert len(data) == SEG_BYTES
    s = scan_segment(data, header_of(path))
    assert s.state == "clean" and s.reason == ""
    assert [f.lsn for f in s.frames] == [1, 2, 3]
    assert [f.synced_lsn for f in s.frames] == [0, 1, 2]
    assert s.frames[0].offset == SEGMENT_HEADER_SIZE
    assert s.end == s.frames[-1].end == s.dirty_end
    assert data[s.end:] == bytes(SEG_BYTES - s.end)
    assert s.next_lsn == 4 and s.later == []


def test_empty_segment_is_clean(wal: Path) -> None:
    wal.mkdir()
    w = Writer(FS, str(wal), STORE, SEG_BYTES)
    w.start(1)
    w.close()
    s = scan(only_segment(wal))
    assert s.state == "clean" and s.frames == [] and s.end == SEGMENT_HEADER_SIZE
    assert s.next_lsn == 1  # nothing in it: the next record is its first


def test_batch_frames_share_synced_lsn(wal: Path) -> None:
    write_log(wal, [[1], [2, 3, 4], [5]])
    assert [f.synced_lsn for f in frames_of(only_segment(wal))] == [0, 1, 1, 1, 4]


def test_truncated_at_frame_boundary_is_clean(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    os.truncate(path, frames_of(path)[1].end)
    s = scan(path)
    assert s.state == "clean" and [f.lsn for f in s.frames] == [1, 2]


def test_zero_filled_tail_is_clean_end(wal: Path) -> None:
    # The last frame never reached the disk: its bytes are the preallocation's zeros.
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    last = frames_of(path)[-1]
    patch(path, last.offset, bytes(last.end - last.offset))
    s = scan(path)
    assert s.state == "clean" and [f.lsn for f in s.frames] == [1, 2]
    assert s.end == last.offset


@pytest.mark.parametrize("where", ["first", "block_end", "block_start", "last"])
def test_one_stray_byte_anywhere_in_a_long_zero_tail_is_not_a_clean_end(
        wal: Path, where: str) -> None:
    # A 16 MiB preallocation is checked a block of zeros at a time: a byte in any block,
    # on either side of a block's edge or the very last one, is seen.
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    data = bytearray(path.read_bytes() + bytes((5 << 20) // 2))  # the tail spans 3 blocks
    end = scan_segment(bytes(data), header_of(path)).end
    block = 1 << 20
    at = {"first": end, "block_end": end + block - 1, "block_start": end + block,
          "last": len(data) - 1}[where]
    data[at] = 0x5A
    s = scan_segment(bytes(data), header_of(path))
    assert s.state == "torn" and s.end == end and s.dirty_end == at + 1


# -- scan_segment: torn tails --------------------------------------------------------------


@pytest.mark.parametrize("keep", [5, RECORD_HEADER_SIZE - 1, RECORD_HEADER_SIZE, 40])
def test_truncated_tail_is_torn(wal: Path, keep: int) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    last = frames_of(path)[-1]
    os.truncate(path, last.offset + keep)
    s = scan(path)
    assert s.state == "torn"
    assert [f.lsn for f in s.frames] == [1, 2]
    assert s.end == last.offset
    kept = path.read_bytes()[last.offset:]
    assert len(kept) == keep
    assert s.dirty_end == last.offset + len(kept.rstrip(b"\x00"))  # past the last non-zero byte
    assert "LSN 3" in s.reason


def test_truncated_tail_plan_zeroes_to_end_of_file(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    last = frames_of(path)[-1]
    os.truncate(path, last.offset + 40)
    p = plan(wal)
    assert lsns(p) == [1, 2] and p.next_lsn == 3
    assert p.zero == (str(path), last.offset, last.offset + 40)
    assert p.torn_bytes == 40
    assert p.resume is not None
    seg, _header, end = p.resume
    assert (seg.size, end) == (last.offset + 40, last.offset)


def test_torn_last_frame_garbage_in_payload(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    last = frames_of(path)[-1]
    patch(path, last.offset + RECORD_HEADER_SIZE, b"\xff" * 8)
    s = scan(path)
    assert s.state == "torn"
    assert [f.lsn for f in s.frames] == [1, 2]
    assert (s.end, s.dirty_end) == (last.offset, last.end)
    assert s.later == []


def test_torn_last_frame_is_zeroed_by_recovery(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    unsynced_tail(wal)
    path = only_segment(wal)
    last = frames_of(path)[-1]
    patch(path, last.offset + RECORD_HEADER_SIZE, b"\xff" * 8)
    p = recover(wal)
    assert lsns(p) == [1, 2] and p.next_lsn == 3
    assert p.zero == (str(path), last.offset, last.end)
    assert p.torn_bytes == last.end - last.offset
    assert any("torn tail" in n for n in p.notes)
    data = path.read_bytes()
    assert len(data) == SEG_BYTES
    assert data[last.offset:] == bytes(SEG_BYTES - last.offset)
    s = scan(path)
    assert s.state == "clean" and [f.lsn for f in s.frames] == [1, 2]


def test_torn_header_of_last_frame(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    last = frames_of(path)[-1]
    flip(path, last.offset + 4)  # the length field
    s = scan(path)
    assert s.state == "torn" and s.end == last.offset


def test_flipped_byte_in_unsynced_batch_is_torn(wal: Path) -> None:
    # Records 2..4 went out in one batch after the sync of 1: none of them
    # proves the others durable, so damage in 2 is a torn tail, not corruption.
    write_log(wal, [[1], [2, 3, 4]], sync=False)
    path = only_segment(wal)
    frames = frames_of(path)
    flip(path, frames[1].offset + RECORD_HEADER_SIZE + 3)
    s = scan(path)
    assert s.state == "torn"
    assert [f.lsn for f in s.frames] == [1]
    assert [f.lsn for f in s.later] == [3, 4]
    assert s.dirty_end == frames[-1].end
    p = plan(wal)
    assert lsns(p) == [1] and p.next_lsn == 2
    assert p.zero == (str(path), frames[1].offset, frames[-1].end)


def test_flipped_byte_in_synced_batch_followed_by_same_batch_is_torn(wal: Path) -> None:
    # Even when the batch was synced, its own frames carry the synced LSN of
    # before the batch, so the reader cannot tell: the clean end is at the damage.
    write_log(wal, [[1], [2, 3, 4]], sync=True)
    path = only_segment(wal)
    frames = frames_of(path)
    flip(path, frames[1].offset + RECORD_HEADER_SIZE)
    assert scan(path).state == "torn"
    assert lsns(plan(wal)) == [1]


def test_torn_tail_with_zero_gap_before_later_frame_is_torn(wal: Path) -> None:
    # Pages of one unsynced batch landed out of order: 2 is lost (zeros), 3 arrived.
    write_log(wal, [[1], [2, 3]], sync=False)
    path = only_segment(wal)
    frames = frames_of(path)
    patch(path, frames[1].offset, bytes(frames[1].end - frames[1].offset))
    s = scan(path)
    assert s.state == "torn"
    assert [f.lsn for f in s.later] == [3]
    assert s.dirty_end == frames[2].end


# -- scan_segment: corruption --------------------------------------------------------------


def test_flipped_byte_in_middle_record_after_sync_is_corrupt(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    frames = frames_of(path)
    flip(path, frames[1].offset + RECORD_HEADER_SIZE + 5)
    s = scan(path)
    assert s.state == "corrupt"
    assert [f.lsn for f in s.frames] == [1]
    assert s.end == frames[1].offset
    assert [f.lsn for f in s.later] == [3]
    assert "LSN 2" in s.reason and "LSN 3" in s.reason
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert ei.value.path == str(path)
    assert ei.value.offset == frames[1].offset
    assert str(path) in str(ei.value) and str(frames[1].offset) in str(ei.value)


FIELDS = {"crc": 0, "length": 4, "lsn": 8, "synced_lsn": 16, "type": 24, "flags": 25,
          "reserved": 26, "payload_first": RECORD_HEADER_SIZE}


@pytest.mark.parametrize("field", FIELDS)
def test_flip_in_each_field_of_synced_middle_record_is_corrupt(wal: Path, field: str) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    frames = frames_of(path)
    flip(path, frames[1].offset + FIELDS[field], 0x10)
    assert scan(path).state == "corrupt"
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert (ei.value.path, ei.value.offset) == (str(path), frames[1].offset)


@pytest.mark.parametrize("flags", [FLAG_APPENDS, FLAG_ZSTD | FLAG_APPENDS])
def test_a_form2_frame_after_a_damaged_record_proves_it_durable(wal: Path, flags: int) -> None:
    # The frame that proves the damaged record was synced may be a form-2 commit:
    # the search for later frames must find it, or the damage would pass for a
    # torn tail and recovery would zero two acknowledged records.
    wal.mkdir()
    w = Writer(FS, str(wal), STORE, SEG_BYTES, version=APPENDS_VERSION)
    w.start(1)
    for lsn in (1, 2, 3):
        r = rec(lsn)
        w.append([PendingRecord(lsn, r.type, flags if lsn == 3 else r.flags, r.payload)])
        w.sync()
    w.close()
    path = only_segment(wal)
    flip(path, frames_of(path)[1].offset + RECORD_HEADER_SIZE + 5)
    s = scan(path)
    assert s.state == "corrupt" and [f.lsn for f in s.later] == [3]
    with pytest.raises(CorruptionError):
        plan(wal)


def test_flipped_last_payload_byte_of_middle_record_is_corrupt(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    frames = frames_of(path)
    flip(path, frames[1].end - 1, 0x80)
    assert scan(path).state == "corrupt"


def test_zeroed_middle_record_after_sync_is_corrupt(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    frames = frames_of(path)
    patch(path, frames[1].offset, bytes(frames[1].end - frames[1].offset))
    assert scan(path).state == "corrupt"


def test_flipped_first_record_is_corrupt_when_later_proves_it(wal: Path) -> None:
    write_log(wal, [[1], [2]])
    path = only_segment(wal)
    flip(path, SEGMENT_HEADER_SIZE + RECORD_HEADER_SIZE)
    s = scan(path)
    assert s.state == "corrupt" and s.frames == [] and s.end == SEGMENT_HEADER_SIZE


def test_wrong_lsn_sequence_is_corrupt(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    path = only_segment(wal)
    frames = frames_of(path)
    salt = header_of(path).salt
    # A frame with a valid CRC in this segment, but LSN 9 where LSN 2 belongs.
    patch(path, frames[1].offset, encode_frame(salt, 9, 1, REC_COMMIT, 0, rec(9).payload))
    s = scan(path)
    assert s.state == "corrupt"
    assert [f.lsn for f in s.frames] == [1] and s.end == frames[1].offset
    assert "LSN 9" in s.reason and "LSN 2" in s.reason
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert (ei.value.path, ei.value.offset) == (str(path), frames[1].offset)


def test_repeated_lsn_is_corrupt(wal: Path) -> None:
    write_log(wal, [[1], [2]])
    path = only_segment(wal)
    frames = frames_of(path)
    salt = header_of(path).salt
    patch(path, frames[1].end, encode_frame(salt, 2, 1, REC_COMMIT, 0, rec(2).payload))
    s = scan(path)
    assert s.state == "corrupt" and s.end == frames[1].end


def test_wrong_lsn_at_tail_is_corrupt_not_torn(wal: Path) -> None:
    write_log(wal, [[1], [2]])
    path = only_segment(wal)
    frames = frames_of(path)
    salt = header_of(path).salt
    patch(path, frames[1].end, encode_frame(salt, 5, 0, REC_COMMIT, 0, rec(5).payload))
    assert scan(path).state == "corrupt"


def test_frame_from_another_salt_is_not_a_frame(wal: Path) -> None:
    # A stale frame left by a file with another salt never validates here.
    write_log(wal, [[1], [2]])
    path = only_segment(wal)
    frames = frames_of(path)
    salt = header_of(path).salt
    patch(path, frames[1].end, encode_frame(salt ^ 0xFFFF, 3, 2, REC_COMMIT, 0, rec(3).payload))
    s = scan(path)
    assert s.state == "torn" and [f.lsn for f in s.frames] == [1, 2] and s.later == []


def test_valid_frame_with_undecodable_payload_is_corruption(wal: Path) -> None:
    wal.mkdir()
    w = Writer(FS, str(wal), STORE, SEG_BYTES)
    w.start(1)
    w.append([rec(1), PendingRecord(2, REC_COMMIT, 0, b"\xff\xfe not cbor")])
    w.sync()
    w.close()
    path = only_segment(wal)
    frames = frames_of(path)
    assert scan(path).state == "clean"  # the frame is sound; its content is not
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert (ei.value.path, ei.value.offset) == (str(path), frames[1].offset)
    assert "LSN 2" in ei.value.reason


def test_zstd_flag_on_plain_delta_is_corruption(wal: Path) -> None:
    wal.mkdir()
    w = Writer(FS, str(wal), STORE, SEG_BYTES)
    w.start(1)
    plain = rec(1)
    assert plain.flags == 0
    w.append([PendingRecord(1, REC_COMMIT, FLAG_ZSTD, plain.payload)])
    w.sync()
    w.close()
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert ei.value.offset == SEGMENT_HEADER_SIZE


def test_corruption_error_carries_path_and_offset() -> None:
    err = CorruptionError("/x/wal/00000000000000000001.wal", 1234, "record LSN 2 is damaged")
    assert isinstance(err, Error)
    assert err.code == "corruption"
    assert err.path == "/x/wal/00000000000000000001.wal"
    assert err.offset == 1234
    assert err.reason == "record LSN 2 is damaged"
    assert "/x/wal/00000000000000000001.wal" in str(err) and "1234" in str(err)
    assert "record LSN 2 is damaged" in str(err)
    assert CorruptionError("/x", None, "why").offset is None


# -- list_segments ------------------------------------------------------------------------


def test_list_segments_ignores_other_names_and_sorts(wal: Path) -> None:
    write_log(wal, [[1], [2], [3], [4]], pad=BIG)
    (wal / "README").write_bytes(b"not a segment")
    (wal / (segment_name(9) + ".tmp")).write_bytes(b"")
    segs = list_segments(FS, str(wal))
    assert [s.first_lsn for s in segs] == [1, 4]
    assert all(s.header is not None and s.problem == "" for s in segs)
    assert [s.header.number for s in segs if s.header] == [0, 1]
    assert (wal / "README").exists()


def test_header_first_lsn_disagreeing_with_name_is_a_problem(wal: Path) -> None:
    write_log(wal, [[1]])
    os.rename(only_segment(wal), seg_path(wal, 5))
    (seg,) = list_segments(FS, str(wal))
    assert seg.header is None and "first LSN 1" in seg.problem


# -- plan: whole logs -----------------------------------------------------------------------


def test_plan_replays_a_clean_log(wal: Path) -> None:
    write_log(wal, [[1], [2, 3]])
    p = plan(wal)
    assert lsns(p) == [1, 2, 3] and p.next_lsn == 4
    r = p.records[1]
    assert (r.record.run, r.record.id, r.record.parent, decode_meta(r.record.meta)) == (
        "run-a", 2, 1, {"step": 2})
    assert decode_value(r.delta["step"]) == 2
    assert p.zero is None and p.remove == [] and p.torn_bytes == 0
    assert p.resume is not None
    seg, header, end = p.resume
    assert (seg.first_lsn, seg.number, seg.size, header.store_id) == (1, 0, SEG_BYTES, STORE)
    assert end == frames_of(only_segment(wal))[-1].end


def test_plan_of_no_segments(wal: Path) -> None:
    wal.mkdir()
    p = plan(wal, applied=7)
    assert p.records == [] and p.next_lsn == 8 and p.resume is None


def test_plan_across_segments(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 8)], pad=BIG)
    lay = layout(wal)
    assert lay.lsns == [[1, 2, 3], [4, 5, 6], [7]]
    p = plan(wal)
    assert lsns(p) == list(range(1, 8)) and p.next_lsn == 8
    assert [s.first_lsn for s in p.earlier] == [1, 4]
    assert p.resume is not None and p.resume[0].first_lsn == 7


def test_plan_skips_records_covered_by_applied_lsn(wal: Path) -> None:
    write_log(wal, [[1], [2], [3], [4]])
    p = plan(wal, applied=2)
    assert lsns(p) == [3, 4] and p.next_lsn == 5 and p.remove == []


def test_segment_of_another_store_is_corruption(wal: Path) -> None:
    write_log(wal, [[1], [2]], store=OTHER_STORE)
    path = only_segment(wal)
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert ei.value.path == str(path) and ei.value.offset == 16
    assert str(OTHER_STORE) in ei.value.reason


def test_foreign_segment_after_own_segments_is_corruption(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]], pad=BIG)
    own = only_segment(wal)
    stranger = Writer(FS, str(wal), OTHER_STORE, SEG_BYTES)
    stranger.start(4)
    stranger.append([rec(4)])
    stranger.sync()
    stranger.close()
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert ei.value.path == str(seg_path(wal, 4)) != str(own)


def test_stale_segments_covered_by_applied_lsn_are_removed(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 8)], pad=BIG)
    lay = layout(wal)
    assert lay.lsns == [[1, 2, 3], [4, 5, 6], [7]]
    p = plan(wal, applied=6)
    assert p.remove == [str(lay.paths[0]), str(lay.paths[1])]
    assert sum("stale" in n for n in p.notes) == 2
    assert lsns(p) == [7] and p.next_lsn == 8 and p.earlier == []
    recovery.repair(FS, str(wal), p)
    assert sorted(wal.iterdir()) == [lay.paths[2]]


def test_stale_segment_is_removed_even_if_damaged(wal: Path) -> None:
    # Its records are all in LMDB: damage there no longer matters.
    write_log(wal, [[i] for i in range(1, 5)], pad=BIG)
    lay = layout(wal)
    flip(lay.paths[0], SEGMENT_HEADER_SIZE + RECORD_HEADER_SIZE + 1)
    p = plan(wal, applied=3)
    assert p.remove == [str(lay.paths[0])] and lsns(p) == [4]


def test_segment_partly_covered_by_applied_lsn_is_kept(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 6)], pad=BIG)
    assert layout(wal).lsns == [[1, 2, 3], [4, 5]]
    p = plan(wal, applied=2)
    assert p.remove == [] and lsns(p) == [3, 4, 5]


@pytest.mark.parametrize("damage", ["zero_header", "garbage_header", "short_file", "empty_file"])
def test_bad_header_of_last_segment_is_corruption(wal: Path, damage: str) -> None:
    # Segments are renamed into place only once their header is synced, so a
    # bad header under a segment name is damage, never a half-made segment.
    write_log(wal, [[1], [2]])
    half = seg_path(wal, 3)
    if damage == "zero_header":
        half.write_bytes(bytes(SEG_BYTES))
    elif damage == "garbage_header":
        good = encode_header(SegmentHeader(STORE, 1, 3, 1234))
        half.write_bytes(good[:30] + b"\xee" * 34 + bytes(SEG_BYTES - SEGMENT_HEADER_SIZE))
    elif damage == "short_file":
        half.write_bytes(encode_header(SegmentHeader(STORE, 1, 3, 1234))[:40])
    else:
        half.write_bytes(b"")
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert (ei.value.path, ei.value.offset) == (str(half), 0)


def test_unfinished_temporary_segment_is_removed(wal: Path) -> None:
    write_log(wal, [[1], [2]])
    first = only_segment(wal)
    tmp = Path(str(seg_path(wal, 3)) + TMP_SUFFIX)
    tmp.write_bytes(b"\xee" * 100)
    p = recover(wal)
    assert p.remove == [str(tmp)]
    assert any("unfinished" in n for n in p.notes)
    assert lsns(p) == [1, 2] and p.next_lsn == 3
    assert sorted(wal.iterdir()) == [first]


def test_bad_header_in_middle_segment_is_corruption(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 8)], pad=BIG)
    lay = layout(wal)
    flip(lay.paths[1], 20)  # store id byte: header CRC mismatch
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert (ei.value.path, ei.value.offset) == (str(lay.paths[1]), 0)
    assert "checksum" in ei.value.reason


def test_missing_middle_segment_is_corruption(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 8)], pad=BIG)
    lay = layout(wal)
    lay.paths[1].unlink()
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert (ei.value.path, ei.value.offset) == (str(lay.paths[2]), 0)
    assert "4..6" in ei.value.reason


def test_missing_first_segment_is_corruption(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 5)], pad=BIG)
    lay = layout(wal)
    lay.paths[0].unlink()
    with pytest.raises(CorruptionError) as ei:
        plan(wal, applied=1)
    assert ei.value.path == str(lay.paths[1]) and "2..3" in ei.value.reason
    assert lsns(plan(wal, applied=3)) == [4]


def test_torn_tail_proven_durable_by_later_segment_is_corruption(wal: Path) -> None:
    # Rotation syncs the full segment first, so the next segment's frames
    # carry a synced LSN that covers every record of the previous one.
    write_log(wal, [[1], [2], [3], [4]], pad=BIG, sync=False)
    lay = layout(wal)
    assert lay.lsns == [[1, 2, 3], [4]]
    last_of_first = frames_of(lay.paths[0])[-1]
    assert frames_of(lay.paths[1])[0].synced_lsn == 3
    patch(lay.paths[0], last_of_first.offset + RECORD_HEADER_SIZE, b"\xff" * 8)
    assert scan(lay.paths[0]).state == "torn"
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert (ei.value.path, ei.value.offset) == (str(lay.paths[0]), last_of_first.offset)
    assert lay.paths[1].name in ei.value.reason


def test_torn_tail_followed_by_later_segment_is_corruption(wal: Path) -> None:
    # The writer syncs a segment whole before it creates the next one, so a
    # damaged end of any segment but the last was durable: corruption, even
    # when nothing in the later segment proves it by its synced LSN.
    write_log(wal, [[1], [2], [3]])
    first = only_segment(wal)
    last = frames_of(first)[-1]
    patch(first, last.offset + RECORD_HEADER_SIZE, b"\xff" * 8)
    salt = 0x1234
    later = seg_path(wal, 4)
    body = encode_header(SegmentHeader(STORE, 1, 4, salt))
    body += encode_frame(salt, 4, 2, REC_COMMIT, 0, rec(4).payload)
    later.write_bytes(body + bytes(SEG_BYTES - len(body)))
    with pytest.raises(CorruptionError) as ei:
        plan(wal)
    assert (ei.value.path, ei.value.offset) == (str(first), last.offset)
    assert later.name in ei.value.reason


def test_garbage_segment_after_torn_tail_is_corruption(wal: Path) -> None:
    write_log(wal, [[1], [2]])
    first = only_segment(wal)
    last = frames_of(first)[-1]
    flip(first, last.offset + RECORD_HEADER_SIZE)
    later = seg_path(wal, 3)
    body = encode_header(SegmentHeader(STORE, 1, 3, 77)) + b"\xab" * 100
    later.write_bytes(body + bytes(SEG_BYTES - len(body)))
    with pytest.raises(CorruptionError):
        plan(wal)


def test_torn_tail_in_last_segment_keeps_earlier_segments_clean(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 6)], pad=BIG)
    lay = layout(wal)
    assert lay.lsns == [[1, 2, 3], [4, 5]]
    last = frames_of(lay.paths[1])[-1]
    patch(lay.paths[1], last.offset + RECORD_HEADER_SIZE, b"\xff" * 4)
    p = plan(wal)
    assert lsns(p) == [1, 2, 3, 4] and p.next_lsn == 5
    assert p.remove == []
    assert p.resume is not None and p.resume[0].path == str(lay.paths[1])


def test_torn_tail_in_last_segment_lists_earlier_segments(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 6)], pad=BIG)
    lay = layout(wal)
    last = frames_of(lay.paths[1])[-1]
    patch(lay.paths[1], last.offset + RECORD_HEADER_SIZE, b"\xff" * 4)
    p = plan(wal)
    assert [s.path for s in p.earlier] == [str(lay.paths[0])]


def test_damaged_header_of_last_segment_with_records_is_corruption(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 6)], pad=BIG)
    lay = layout(wal)
    assert lay.lsns == [[1, 2, 3], [4, 5]]
    flip(lay.paths[1], 48)  # a salt byte: the header CRC no longer matches
    # Records 4 and 5 were synced (and the segment was created only after 1..3
    # were durable): a half-created segment never has bytes past its header.
    with pytest.raises(CorruptionError):
        plan(wal)


def test_log_ending_before_applied_lsn_resumes_consistently(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    p = recover(wal, applied=5)
    assert p.records == [] and p.next_lsn == 6
    w = resume_writer(wal, p)
    w.append([rec(6)])
    w.sync()
    w.close()
    again = recover(wal, applied=5)
    assert lsns(again) == [6]


# -- recover and repair end to end ------------------------------------------------------------


def test_recover_repair_resume_and_recover_again(wal: Path) -> None:
    write_log(wal, [[1], [2], [3, 4]])
    unsynced_tail(wal)
    path = only_segment(wal)
    last = frames_of(path)[-1]
    patch(path, last.offset + RECORD_HEADER_SIZE + 2, b"\x00\xff\x00\xff")
    p = recover(wal)
    assert lsns(p) == [1, 2, 3] and p.next_lsn == 4 and p.torn_bytes > 0
    assert path.read_bytes()[last.offset:] == bytes(SEG_BYTES - last.offset)

    w = resume_writer(wal, p)
    assert w.synced_lsn == 3
    w.append([rec(4), rec(5)])
    w.sync()
    w.append([rec(6)])
    w.sync()
    w.close()

    again = recover(wal)
    assert lsns(again) == [1, 2, 3, 4, 5, 6] and again.next_lsn == 7
    assert again.torn_bytes == 0 and again.zero is None and again.remove == []
    frames = frames_of(path)
    assert [f.synced_lsn for f in frames] == [0, 1, 2, 3, 3, 5]
    assert frames[3].offset == last.offset
    data = path.read_bytes()
    assert data[frames[-1].end:] == bytes(SEG_BYTES - frames[-1].end)


def test_recover_resume_rotates_out_of_truncated_segment(wal: Path) -> None:
    write_log(wal, [[1], [2], [3]])
    unsynced_tail(wal)
    path = only_segment(wal)
    last = frames_of(path)[-1]
    os.truncate(path, last.offset + 10)
    p = recover(wal)
    assert path.stat().st_size == last.offset + 10
    w = resume_writer(wal, p)
    w.append([rec(3, pad=BIG)])  # does not fit in what is left: a new segment
    w.sync()
    w.close()
    assert sorted(wal.iterdir()) == [path, seg_path(wal, 3)]
    again = recover(wal)
    assert lsns(again) == [1, 2, 3] and again.zero is None


def test_recover_across_segments_then_resume(wal: Path) -> None:
    write_log(wal, [[i] for i in range(1, 6)], pad=BIG)
    p = recover(wal, applied=3)
    assert lsns(p) == [4, 5] and p.remove == [str(seg_path(wal, 1))]
    assert not seg_path(wal, 1).exists()
    w = resume_writer(wal, p)
    w.append([rec(6, pad=BIG)])
    w.append([rec(7, pad=BIG)])  # rotates
    w.sync()
    w.close()
    again = recover(wal, applied=3)
    assert lsns(again) == [4, 5, 6, 7]
    assert [s.first_lsn for s in again.earlier] == [4]


def test_recover_readonly_changes_nothing(wal: Path) -> None:
    write_log(wal, [[1], [2]])
    unsynced_tail(wal)
    path = only_segment(wal)
    last = frames_of(path)[-1]
    patch(path, last.offset + RECORD_HEADER_SIZE, b"\xff" * 8)
    half = Path(str(seg_path(wal, 3)) + TMP_SUFFIX)
    half.write_bytes(bytes(100))
    before = path.read_bytes()
    p = recover(wal, readonly=True)
    assert lsns(p) == [1] and p.zero is not None and p.remove == [str(half)]
    assert path.read_bytes() == before and half.exists()


def test_recover_twice_reaches_the_same_plan(wal: Path) -> None:
    write_log(wal, [[1], [2, 3]], sync=False)
    path = only_segment(wal)
    frames = frames_of(path)
    flip(path, frames[1].offset + RECORD_HEADER_SIZE)
    first = recover(wal)
    second = recover(wal)
    assert lsns(first) == lsns(second) == [1]
    assert second.zero is None and second.torn_bytes == 0
    assert first.resume is not None and second.resume is not None
    assert first.resume[2] == second.resume[2]


def test_recover_without_wal_dir(wal: Path) -> None:
    p = recover(wal, applied=0)  # a new store
    assert p.records == [] and p.next_lsn == 1 and p.resume is None


def test_missing_log_after_a_fold_is_corruption(wal: Path) -> None:
    # Regression: with applied_lsn > 0 and no segment at all, the records after
    # the fold were silently gone (a store always keeps its current segment).
    with pytest.raises(CorruptionError) as ei:
        recover(wal, applied=4)
    assert "log is missing" in ei.value.reason
