"""Golden files: the committed bytes in ``tests/data/`` pin the on-disk format.

(a) The current reader decodes the committed files, every field checked.
(b) ``tests/data/make_golden.py`` regenerates them in memory and the bytes
    must be equal, so any change to the format (the byte tables, the framing,
    the CRC seeding, the CBOR layout of a commit or of the control file)
    fails here until the files are regenerated *and* ``FORMAT_VERSION`` is
    bumped (the files are named after the version they are written in: 1 for
    a store whose log holds no form-2 record, 2 after).

zstd output is not guaranteed to be identical across zstandard versions, so
the compressed frame (LSN 2) is compared by decoded content, and the rest of
the image is compared byte for byte with the committed compressed payload
put back in its place.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import cbor2
import pytest

from agentwal.codec import (
    checkpoint_hash,
    decode_commit,
    decode_delta,
    decode_meta,
    decode_value,
)
from agentwal.format import (
    APPENDS_VERSION,
    COMPRESS_THRESHOLD,
    CONTROL_FILE,
    FLAG_ZSTD,
    PLAIN_VERSION,
    REC_COMMIT,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    segment_name,
)
from agentwal.io import OsFileSystem
from agentwal.local import recovery
from agentwal.local.control import read_control
from agentwal.local.wal import PendingRecord, Writer, list_segments, scan_segment
from agentwal.local.wal.frame import Frame, SegmentHeader, encode_frame, parse_header

DATA = Path(__file__).resolve().parent.parent / "data"


def _load_maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden", DATA / "make_golden.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_golden", mod)
    spec.loader.exec_module(mod)
    return mod


mg = _load_maker()
SEGMENT = DATA / f"segment-v{PLAIN_VERSION}.bin"
CONTROL = DATA / f"control-v{PLAIN_VERSION}.bin"


@pytest.fixture(scope="module")
def seg_bytes() -> bytes:
    return SEGMENT.read_bytes()


@pytest.fixture(scope="module")
def frames(seg_bytes: bytes) -> list[Frame]:
    h = parse_header(seg_bytes)
    assert isinstance(h, SegmentHeader)
    s = scan_segment(seg_bytes, h)
    assert s.state == "clean", s.reason
    return s.frames


def test_golden_files_exist_for_this_format_version() -> None:
    # Bumping a version without regenerating the golden files fails here.
    for path in (SEGMENT, CONTROL, EFFECTS, APPENDS, CONTROL2, LEGACY_APPENDS):
        assert path.is_file(), f"run tests/data/make_golden.py to write {path.name}"


# -- (a) the committed segment decodes -------------------------------------------------------


def test_golden_segment_header(seg_bytes: bytes) -> None:
    assert len(seg_bytes) == mg.SEGMENT_SIZE == 4096
    h = parse_header(seg_bytes)
    assert h == SegmentHeader(mg.STORE_ID, 0, 1, mg.SALT, PLAIN_VERSION)
    assert isinstance(h, SegmentHeader)
    assert str(h.store_id) == "a9e1c0de-0000-4000-8000-00000000a11e"
    assert h.salt == 0x5EED5A17


def test_golden_segment_frames(seg_bytes: bytes, frames: list[Frame]) -> None:
    assert [f.lsn for f in frames] == [1, 2, 3]
    assert [f.synced_lsn for f in frames] == [0, 1, 1]
    assert [f.type for f in frames] == [REC_COMMIT] * 3
    assert [f.flags for f in frames] == [0, FLAG_ZSTD, 0]
    assert frames[0].offset == SEGMENT_HEADER_SIZE
    assert frames[1].offset == frames[0].end and frames[2].offset == frames[1].end
    assert seg_bytes[frames[-1].end:] == bytes(len(seg_bytes) - frames[-1].end)
    for f in frames:
        assert f.end - f.offset == RECORD_HEADER_SIZE + len(f.payload)


def test_golden_segment_commits(frames: list[Frame]) -> None:
    recs = [decode_commit(f.payload) for f in frames]
    deltas = [decode_delta(r.delta, f.flags) for r, f in zip(recs, frames, strict=True)]

    r1, r2, r3 = recs
    assert (r1.run, r1.id, r1.parent, r1.origin) == ("run-1", 1, None, None)
    assert (r2.run, r2.id, r2.parent, r2.origin) == ("run-1", 2, 1, None)
    assert (r3.run, r3.id, r3.parent, r3.origin) == ("run-1-b", 1, None, ("run-1", 2))
    assert [r.created_at for r in recs] == [1767225601.0, 1767225602.0, 1767225603.0]
    assert decode_meta(r1.meta) == {"node": "planner", "step": 1}
    assert decode_meta(r2.meta) == {"node": "tool", "step": 2}
    assert decode_meta(r3.meta) == {"forked": True}

    d1, d2, d3 = ({k: None if v is None else decode_value(v) for k, v in d.items()}
                  for d in deltas)
    assert d1 == {"plan": {"steps": ["search", "answer"]}, "step": 1}
    assert d2 == {"messages/0": {"role": "user", "content": mg.LONG_TEXT}, "step": 2}
    assert d3 == {"step": 3, "scratch": None}
    # Record 2's delta crossed the threshold and is stored compressed.
    raw2 = cbor2.dumps(deltas[1])
    assert len(raw2) >= COMPRESS_THRESHOLD and len(r2.delta) < len(raw2)

    # The hash chain: each checkpoint hash covers its fields, its metadata bytes
    # as stored, and its raw delta.
    parent_hash = {("run-1", None): bytes(32), ("run-1-b", None): bytes(32),
                   ("run-1", 1): r1.hash}
    for r, d in zip(recs, deltas, strict=True):
        digest = hashlib.sha256(cbor2.dumps(d)).digest()
        expect = checkpoint_hash(parent_hash[(r.run, r.parent)], r.run, r.id, r.parent,
                                 r.created_at, r.meta, r.origin, digest)
        assert r.hash == expect


def test_golden_segment_recovers(tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    wal.mkdir()
    shutil.copy(SEGMENT, wal / segment_name(1))
    fs = OsFileSystem()
    p = recovery.plan(list_segments(fs, str(wal)), 0, mg.STORE_ID)
    assert [r.lsn for r in p.records] == [1, 2, 3] and p.next_lsn == 4
    assert p.zero is None and p.remove == []
    assert decode_value(p.records[1].delta["messages/0"])["content"] == mg.LONG_TEXT
    assert p.records[2].record.origin == ("run-1", 2)


# -- (a) the committed control file decodes ------------------------------------------------


def test_golden_control(tmp_path: Path) -> None:
    data = CONTROL.read_bytes()
    assert data[:8] == b"AWALCTL\x00"
    shutil.copy(CONTROL, tmp_path / CONTROL_FILE)
    ctl = read_control(OsFileSystem(), str(tmp_path))
    assert ctl is not None
    assert ctl.store_id == mg.STORE_ID
    assert ctl.format == PLAIN_VERSION
    assert ctl.created_at == mg.CREATED_AT


# -- (b) regenerating gives the same bytes ----------------------------------------------------


def test_regenerated_header_is_identical(seg_bytes: bytes) -> None:
    assert mg.segment_image()[:SEGMENT_HEADER_SIZE] == seg_bytes[:SEGMENT_HEADER_SIZE]


def test_regenerated_plain_frames_are_identical(frames: list[Frame]) -> None:
    regen = {r.lsn: r for r in mg.records()}
    for f in frames:
        r = regen[f.lsn]
        assert (r.synced_lsn, r.flags) == (f.synced_lsn, f.flags)
        if not f.flags & FLAG_ZSTD:
            assert r.payload == f.payload, f"payload of LSN {f.lsn} changed"


def test_regenerated_compressed_frame_has_same_content(frames: list[Frame]) -> None:
    # zstd's output may vary between zstandard versions: compare what it decodes to.
    (golden,) = [f for f in frames if f.flags & FLAG_ZSTD]
    (regen,) = [r for r in mg.records() if r.flags & FLAG_ZSTD]
    old, new = decode_commit(golden.payload), decode_commit(regen.payload)
    assert (old.run, old.id, old.parent, old.created_at, old.meta, old.hash, old.origin) == (
        new.run, new.id, new.parent, new.created_at, new.meta, new.hash, new.origin)
    assert decode_delta(old.delta, golden.flags) == decode_delta(new.delta, regen.flags)


def test_regenerated_segment_is_identical(seg_bytes: bytes, frames: list[Frame]) -> None:
    # Byte for byte, with the committed zstd payload in place of a fresh one.
    compressed = {f.lsn: f.payload for f in frames if f.flags & FLAG_ZSTD}
    assert mg.segment_image(compressed) == seg_bytes


def test_golden_frames_reencode_identically(seg_bytes: bytes, frames: list[Frame]) -> None:
    for f in frames:
        assert encode_frame(mg.SALT, f.lsn, f.synced_lsn, f.type, f.flags, f.payload) == \
            seg_bytes[f.offset:f.end]


def test_writer_reproduces_golden_segment(tmp_path: Path, frames: list[Frame],
                                          seg_bytes: bytes, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    # The real Writer, given the golden payloads and the golden salt, writes the
    # same file: preallocation, header, framing and synced-LSN stamping.
    monkeypatch.setattr("agentwal.local.wal.writer.secrets.randbits", lambda _bits: mg.SALT)
    fs = OsFileSystem()
    w = Writer(fs, str(tmp_path), mg.STORE_ID, mg.SEGMENT_SIZE)
    w.start(1)
    pending = [PendingRecord(f.lsn, f.type, f.flags, f.payload) for f in frames]
    w.append(pending[:1])
    w.sync()
    w.append(pending[1:])
    w.sync()
    w.close()
    assert (tmp_path / segment_name(1)).read_bytes() == seg_bytes


def test_regenerated_control_is_identical() -> None:
    assert mg.control_image() == CONTROL.read_bytes()


def _scan_clean(path: Path) -> Any:
    """The frames of a golden segment file, which must end clean."""
    data = path.read_bytes()
    h = parse_header(data)
    assert isinstance(h, SegmentHeader)
    scan = scan_segment(data, h)
    assert scan.state == "clean"
    return scan


# -- the effects segment: REC_EFFECT records and a commit with an outbox ------------------------

EFFECTS = DATA / f"effects-v{PLAIN_VERSION}.bin"


def test_golden_effects_segment_decodes() -> None:
    from agentwal.effects import decode_entry, decode_outbox
    from agentwal.format import REC_EFFECT

    scan = _scan_clean(EFFECTS)
    assert [f.lsn for f in scan.frames] == [1, 2, 3]
    assert [f.type for f in scan.frames] == [REC_EFFECT, REC_EFFECT, REC_COMMIT]
    intent, outcome = (decode_entry(f.payload) for f in scan.frames[:2])
    assert (intent.name, intent.status, intent.attempts) == ("charge-card", "in_doubt", 1)
    assert (outcome.status, outcome.result) == ("done", {"charge": "ch_1"})
    assert intent.key == outcome.key and intent.key.startswith("awe-") and len(intent.key) == 60
    rec = decode_commit(scan.frames[2].payload)
    assert rec.deferred is not None
    (entry,) = decode_outbox(rec.deferred)
    assert entry[0] == "send-email" and decode_value(entry[2]) == {"to": "ada@example.com"}
    digest = hashlib.sha256(cbor2.dumps(decode_delta(rec.delta, 0))).digest()
    assert rec.hash == checkpoint_hash(bytes(32), rec.run, rec.id, rec.parent, rec.created_at,
                                       rec.meta, rec.origin, digest, rec.deferred)
    # the outbox is covered: without it the hash differs
    assert rec.hash != checkpoint_hash(bytes(32), rec.run, rec.id, rec.parent, rec.created_at,
                                       rec.meta, rec.origin, digest)


def test_golden_effects_segment_recovers(tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    wal.mkdir()
    shutil.copy(EFFECTS, wal / segment_name(1))
    p = recovery.plan(list_segments(OsFileSystem(), str(wal)), 0, mg.STORE_ID)
    assert [type(r).__name__ for r in p.records] == ["ReplayedEffect", "ReplayedEffect",
                                                     "Replayed"]
    assert p.next_lsn == 4


def test_regenerated_effects_segment_is_identical() -> None:
    assert mg.effects_image() == EFFECTS.read_bytes()


# -- the appends segment: form-2 commit records (FLAG_APPENDS) ---------------------------------

APPENDS = DATA / f"appends-v{APPENDS_VERSION}.bin"
CONTROL2 = DATA / f"control-v{APPENDS_VERSION}.bin"
#: What session 5's agentwal wrote: form-2 records in a version-1 segment (still read).
LEGACY_APPENDS = DATA / f"appends-v{PLAIN_VERSION}.bin"


@pytest.mark.parametrize("path", [APPENDS, LEGACY_APPENDS], ids=["v2", "session5-v1"])
def test_golden_appends_segment_decodes(path: Path) -> None:
    from agentwal.codec import decode_delta_entries
    from agentwal.format import FLAG_APPENDS

    version = parse_header(path.read_bytes())
    assert isinstance(version, SegmentHeader)
    assert version.version == (APPENDS_VERSION if path == APPENDS else PLAIN_VERSION)
    scan = _scan_clean(path)
    assert [f.flags for f in scan.frames] == [0, FLAG_APPENDS, FLAG_APPENDS]
    parent_hash, count, length = bytes(32), 0, 0
    for f, items in zip(scan.frames, mg.APPEND_STATES, strict=True):
        rec = decode_commit(f.payload)
        delta = decode_delta_entries(rec.delta, f.flags)
        entry = delta["messages"]
        if f.lsn == 1:
            assert isinstance(entry, bytes) and decode_value(entry) == items
            count, length = len(items), len(entry)
        else:
            # [base count, base length, tail]: the list before, and only what was appended
            assert isinstance(entry, tuple) and entry[:2] == (count, length)
            assert decode_value(entry[2]) == items
            assert decode_value(delta["step"]) == rec.id  # type: ignore[arg-type]
            count += len(items)
            length += len(entry[2]) - 1  # one-byte array headers throughout
        # the hash covers the record's delta as logged: entries, not joined lists
        digest = hashlib.sha256(rec.delta).digest()
        assert rec.hash == checkpoint_hash(parent_hash, rec.run, rec.id, rec.parent,
                                           rec.created_at, rec.meta, rec.origin, digest)
        parent_hash = rec.hash
    with pytest.raises(Exception, match="delta entry is not"):
        decode_delta(decode_commit(scan.frames[1].payload).delta, 0)  # form 1 refuses them


def test_golden_control_v2(tmp_path: Path) -> None:
    shutil.copy(CONTROL2, tmp_path / CONTROL_FILE)
    ctl = read_control(OsFileSystem(), str(tmp_path))
    assert ctl is not None and (ctl.store_id, ctl.format, ctl.created_at) == (
        mg.STORE_ID, APPENDS_VERSION, mg.CREATED_AT)
    assert mg.control_image(APPENDS_VERSION) == CONTROL2.read_bytes()


def test_golden_appends_segment_opens_as_a_store(tmp_path: Path) -> None:
    import agentwal

    (tmp_path / "wal").mkdir()
    shutil.copy(CONTROL2, tmp_path / CONTROL_FILE)
    shutil.copy(APPENDS, tmp_path / "wal" / segment_name(1))
    with agentwal.open(str(tmp_path), durability="none") as store:
        everything = [m for items in mg.APPEND_STATES for m in items]
        assert store.get("chat", "messages") == everything
        assert store.state("chat", at=2)["messages"] == everything[:3]
        assert store.verify().ok
        store.snapshot()
        report = store.verify()
        assert report.ok and report.checked["hashes"] == 3


def test_regenerated_appends_segment_is_identical() -> None:
    assert mg.appends_image() == APPENDS.read_bytes()
    assert mg.appends_image(PLAIN_VERSION) == LEGACY_APPENDS.read_bytes()


def test_writer_reproduces_golden_appends_segment(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A store already at version 2 writes form-2 records into the segment it has.
    monkeypatch.setattr("agentwal.local.wal.writer.secrets.randbits", lambda _bits: mg.SALT)
    w = Writer(OsFileSystem(), str(tmp_path), mg.STORE_ID, mg.SEGMENT_SIZE,
               version=APPENDS_VERSION)
    w.start(1)
    for lsn, (flags, payload, _h) in enumerate(mg.append_commits(), start=1):
        w.append([PendingRecord(lsn, REC_COMMIT, flags, payload)])
        w.sync()
    w.close()
    assert (tmp_path / segment_name(1)).read_bytes() == APPENDS.read_bytes()


def test_session5_appends_log_is_read_and_raised_to_version_2(tmp_path: Path) -> None:
    # A store session 5 wrote (CONTROL 1, form-2 records in a version-1 segment) opens;
    # a writer raises its CONTROL to 2 so a reader of version 1 refuses it from then on.
    import agentwal

    (tmp_path / "wal").mkdir()
    shutil.copy(CONTROL, tmp_path / CONTROL_FILE)
    shutil.copy(LEGACY_APPENDS, tmp_path / "wal" / segment_name(1))
    everything = [m for items in mg.APPEND_STATES for m in items]
    with agentwal.open(str(tmp_path), durability="none") as store:
        assert store.get("chat", "messages") == everything
        ctl = read_control(OsFileSystem(), str(tmp_path))
        assert ctl is not None and ctl.format == APPENDS_VERSION
        assert store.verify().ok
