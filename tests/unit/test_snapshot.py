"""The LMDB snapshot: the pre-mapping file check, folds read back, sealed values, run
digests, the shared per-process environment, reader counting, map growth."""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from agentwal.codec import encode_meta
from agentwal.errors import CorruptionError, ReadOnlyError, StoreClosedError
from agentwal.snapshot import FoldRun, MapFull, RunInfo, Snapshot, check_lmdb_file
from agentwal.types import Checkpoint

SID = uuid.UUID(int=0xA6E47)
MAP = 1 << 24
U64 = struct.Struct(">Q")


def entry(run: str, cid: int, lsn: int, *, origin: tuple[str, int] | None = None,
          **meta: Any) -> tuple[Checkpoint, bytes, bytes]:
    meta = meta or {"step": cid}
    h = hashlib.sha256(f"{run}/{cid}".encode()).digest()
    c = Checkpoint(run, cid, cid - 1 or None, lsn, 1000.0 + lsn, meta, h.hex(), origin)
    return c, h, encode_meta(meta)


def seal(key: bytes, data: bytes) -> bytes:
    return struct.pack("<I", zlib.crc32(data, zlib.crc32(key))) + data


@pytest.fixture
def sdir(tmp_path: Path) -> str:
    return str(tmp_path / "snapshot")


@pytest.fixture
def snap(sdir: str) -> Iterator[Snapshot]:
    s = Snapshot(sdir, readonly=False, map_size=MAP)
    yield s
    s.close()


@contextlib.contextmanager
def reading(s: Snapshot) -> Iterator[Any]:
    txn = s.begin_read()
    try:
        yield txn
    finally:
        s.end_read(txn)


def fold_basic(s: Snapshot) -> dict[str, list[tuple[Checkpoint, bytes, bytes]]]:
    """Run ``a`` (3 checkpoints, 3 keys) and run ``b`` (1 checkpoint, 1 key), applied LSN 4."""
    ents = {"a": [entry("a", 1, 1), entry("a", 2, 2, origin=("b", 1)), entry("a", 3, 4)],
            "b": [entry("b", 1, 3)]}
    s.fold(4, SID, [FoldRun("a", {"msg/1": b"one", "msg/2": b"two", "note": b"n"}, ents["a"]),
                    FoldRun("b", {"k": b"bee"}, ents["b"])])
    return ents


def raw_put(s: Snapshot, db: bytes, key: bytes, value: bytes | None) -> None:
    """Write (or delete, with None) an entry behind the snapshot's back."""
    handle = s.env.open_db(db)  # before the write txn: open_db takes its own
    with s.env.begin(write=True) as t:
        if value is None:
            assert t.delete(key, db=handle)
        else:
            t.put(key, value, db=handle)


def raw_get(s: Snapshot, db: bytes, key: bytes) -> bytes:
    handle = s.env.open_db(db)
    with s.env.begin(db=handle) as t:
        v = t.get(key)
    assert v is not None
    return bytes(v)


def flip(s: Snapshot, db: bytes, key: bytes, at: int = -1) -> None:
    v = bytearray(raw_get(s, db, key))
    v[at] ^= 0x01
    raw_put(s, db, key, bytes(v))


# -- check_lmdb_file ------------------------------------------------------------------------


@pytest.fixture
def mdb(snap: Snapshot, sdir: str) -> bytes:
    """The bytes of a real data.mdb after a fold."""
    fold_basic(snap)
    return Path(sdir, "data.mdb").read_bytes()


def check(tmp_path: Path, data: bytes) -> CorruptionError | None:
    p = tmp_path / "copy.mdb"
    p.write_bytes(data)
    try:
        check_lmdb_file(str(p))
    except CorruptionError as exc:
        assert exc.path == str(p)
        return exc
    return None


def test_check_accepts_a_real_file(tmp_path: Path, mdb: bytes) -> None:
    assert check(tmp_path, mdb) is None


def test_check_accepts_a_missing_or_empty_file(tmp_path: Path) -> None:
    check_lmdb_file(str(tmp_path / "nope.mdb"))
    assert check(tmp_path, b"") is None


@pytest.mark.parametrize("size", [1, 100, 159])
def test_check_refuses_a_file_shorter_than_a_meta_page(tmp_path: Path, mdb: bytes,
                                                       size: int) -> None:
    e = check(tmp_path, mdb[:size])
    assert e is not None and e.offset == 0


def test_check_refuses_bad_magic(tmp_path: Path, mdb: bytes) -> None:
    e = check(tmp_path, mdb[:16] + b"\0\0\0\0" + mdb[20:])
    assert e is not None and e.offset == 16 and "magic" in e.reason


def test_check_refuses_a_bad_data_version(tmp_path: Path, mdb: bytes) -> None:
    e = check(tmp_path, mdb[:20] + struct.pack("<I", 2) + mdb[24:])
    assert e is not None and e.offset == 20 and "version 2" in e.reason


@pytest.mark.parametrize("psize", [0, 256, 1000, 4097, 131072])
def test_check_refuses_an_implausible_page_size(tmp_path: Path, mdb: bytes, psize: int) -> None:
    e = check(tmp_path, mdb[:40] + struct.pack("<I", psize) + mdb[44:])
    assert e is not None and e.offset == 40 and str(psize) in e.reason


def test_check_refuses_a_file_shorter_than_two_meta_pages(tmp_path: Path, mdb: bytes) -> None:
    e = check(tmp_path, mdb[:4096 + 100])
    assert e is not None and e.offset == 4096 + 100


def test_check_refuses_a_damaged_second_meta_page(tmp_path: Path, mdb: bytes) -> None:
    base = 4096 + 16
    e = check(tmp_path, mdb[:base] + b"\xff\xff\xff\xff" + mdb[base + 4:])
    assert e is not None and e.offset == base and "meta page 1" in e.reason


def test_check_refuses_a_file_truncated_below_its_last_page(tmp_path: Path, mdb: bytes) -> None:
    size = 3 * 4096
    e = check(tmp_path, mdb[:size])
    assert e is not None and e.offset == size and "truncated" in e.reason


def test_check_of_a_directory_is_corruption_without_offset(tmp_path: Path) -> None:
    (tmp_path / "dir.mdb").mkdir()
    with pytest.raises(CorruptionError) as ei:
        check_lmdb_file(str(tmp_path / "dir.mdb"))
    assert ei.value.offset is None


def test_opening_a_truncated_snapshot_is_refused_before_mapping(tmp_path: Path, mdb: bytes,
                                                                sdir: str) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.mdb").write_bytes(mdb[: 3 * 4096])
    with pytest.raises(CorruptionError) as ei:
        Snapshot(str(other), readonly=False, map_size=MAP)  # would be SIGBUS if mapped
    assert ei.value.path == str(other / "data.mdb")


# -- folding and reading back ---------------------------------------------------------------


def test_an_empty_snapshot(snap: Snapshot) -> None:
    with reading(snap) as t:
        assert snap.reader(t).meta() == (0, None)
        assert snap.reader(t).runs() == []
        assert snap.reader(t).run_info("a") is None
        assert snap.reader(t).get(1, "k") is None
        assert snap.reader(t).checkpoint("a", 1, 1) is None
        assert list(snap.reader(t).checkpoints("a", 1)) == []


def test_fold_then_read_back(snap: Snapshot) -> None:
    ents = fold_basic(snap)
    with reading(snap) as t:
        assert snap.reader(t).meta() == (4, SID)
        assert snap.reader(t).runs() == ["a", "b"]
        a = snap.reader(t).run_info("a")
        b = snap.reader(t).run_info("b")
        assert isinstance(a, RunInfo) and isinstance(b, RunInfo)
        assert (a.number, a.head, a.head_hash, a.count, a.keys) == (1, 3, ents["a"][2][1], 3, 3)
        assert (b.number, b.head, b.count, b.keys) == (2, 1, 1, 1)
        assert snap.reader(t).get(1, "msg/1") == b"one"
        assert snap.reader(t).get(2, "k") == b"bee"
        assert snap.reader(t).get(1, "k") is None  # keys are per run
        assert snap.reader(t).get(2, "msg/1") is None
        assert snap.reader(t).items(a) == {"msg/1": b"one", "msg/2": b"two", "note": b"n"}
        assert snap.reader(t).items(b) == {"k": b"bee"}


def test_items_with_a_prefix(snap: Snapshot) -> None:
    fold_basic(snap)
    with reading(snap) as t:
        a = snap.reader(t).run_info("a")
        assert a is not None
        assert snap.reader(t).items(a, "msg/") == {"msg/1": b"one", "msg/2": b"two"}
        assert snap.reader(t).items(a, "msg/2") == {"msg/2": b"two"}
        assert snap.reader(t).items(a, "n") == {"note": b"n"}
        assert snap.reader(t).items(a, "zzz") == {}
        assert snap.reader(t).items(a, "k") == {}  # run b's key "k" sorts right after run a


def test_checkpoints_read_back_with_every_field(snap: Snapshot) -> None:
    ents = fold_basic(snap)
    with reading(snap) as t:
        for run, number in (("a", 1), ("b", 2)):
            for c, _h, _m in ents[run]:
                assert snap.reader(t).checkpoint(run, number, c.id) == c
        got = snap.reader(t).checkpoint("a", 1, 2)
        assert got is not None and got.origin == ("b", 1) and got.meta == {"step": 2}
        assert snap.reader(t).checkpoint("a", 1, 4) is None
        assert snap.reader(t).checkpoint("a", 9, 1) is None  # no such run number


def test_checkpoints_are_newest_first_and_per_run(snap: Snapshot) -> None:
    ents = fold_basic(snap)
    snap.fold(5, SID, [FoldRun("c", {"x": b"1"}, [entry("c", 1, 5)])])
    with reading(snap) as t:
        assert list(snap.reader(t).checkpoints("a", 1)) == [e[0] for e in reversed(ents["a"])]
        assert list(snap.reader(t).checkpoints("b", 2)) == [ents["b"][0][0]]  # a run in the middle
        assert [c.id for c in snap.reader(t).checkpoints("c", 3)] == [1]  # the last run
        assert list(snap.reader(t).checkpoints("x", 0)) == []  # before every run
        assert list(snap.reader(t).checkpoints("x", 9)) == []  # after every run


def test_a_second_fold_updates_deletes_and_continues_the_run(snap: Snapshot) -> None:
    fold_basic(snap)
    snap.fold(7, SID, [FoldRun("a", {"msg/1": b"ONE", "note": None, "never": None, "new": b"w"},
                               [entry("a", 4, 5), entry("a", 5, 7)]),
                       FoldRun("d", {"z": b"z"}, [entry("d", 1, 6)])])
    with reading(snap) as t:
        assert snap.reader(t).meta() == (7, SID)
        a = snap.reader(t).run_info("a")
        d = snap.reader(t).run_info("d")
        assert a is not None and d is not None
        assert (a.number, a.head, a.count, a.keys) == (1, 5, 5, 3)
        assert d.number == 3  # numbers are never reused
        assert snap.reader(t).items(a) == {"msg/1": b"ONE", "msg/2": b"two", "new": b"w"}
        assert [c.id for c in snap.reader(t).checkpoints("a", 1)] == [5, 4, 3, 2, 1]
        assert snap.reader(t).runs() == ["a", "b", "d"]


def test_a_run_whose_keys_are_all_deleted(snap: Snapshot) -> None:
    snap.fold(1, SID, [FoldRun("r", {"k": b"v"}, [entry("r", 1, 1)])])
    snap.fold(2, SID, [FoldRun("r", {"k": None}, [entry("r", 2, 2)])])
    with reading(snap) as t:
        info = snap.reader(t).run_info("r")
        assert info is not None and (info.keys, info.digest) == (0, 0)
        assert snap.reader(t).items(info) == {}


def test_a_read_keeps_its_view_across_a_fold(snap: Snapshot) -> None:
    fold_basic(snap)
    with reading(snap) as old:
        snap.fold(9, SID, [FoldRun("a", {"note": b"changed"}, [entry("a", 4, 9)])])
        assert snap.reader(old).meta()[0] == 4
        assert snap.reader(old).get(1, "note") == b"n"
        with reading(snap) as new:
            assert snap.reader(new).meta()[0] == 9
            assert snap.reader(new).get(1, "note") == b"changed"


def test_values_are_sealed_with_a_crc_of_key_and_bytes(snap: Snapshot) -> None:
    fold_basic(snap)
    k = U64.pack(1) + b"msg/1"
    # written once (layout 4): 0xff + CBOR [the value's CBOR, the checkpoint that wrote it]
    assert raw_get(snap, b"state", k) == seal(k, b"\xff" + cbor2.dumps([b"one", 3]))
    assert raw_get(snap, b"meta", b"applied_lsn") == seal(b"applied_lsn", U64.pack(4))
    snap.fold(9, SID, [FoldRun("a", {"msg/1": b"uno"}, [entry("a", 4, 9)])])
    assert raw_get(snap, b"state", k) == seal(k, b"uno")  # a second version: the value itself


def test_stats(snap: Snapshot) -> None:
    fold_basic(snap)
    st = snap.stats()
    assert (st["folded_runs"], st["state_keys"], st["checkpoints"]) == (2, 4, 4)
    assert st["lmdb_page_size"] == 4096 and st["lmdb_bytes"] > 0 and st["lmdb_last_page"] > 0


# -- damage ---------------------------------------------------------------------------------


def test_flipped_value_byte_is_corruption_on_get(snap: Snapshot) -> None:
    fold_basic(snap)
    flip(snap, b"state", U64.pack(1) + b"msg/1")
    with reading(snap) as t:
        with pytest.raises(CorruptionError) as ei:
            snap.reader(t).get(1, "msg/1")
        assert ei.value.path.endswith("data.mdb") and "msg/1" in ei.value.reason
        assert snap.reader(t).get(1, "msg/2") == b"two"  # the others still read


def test_flipped_value_byte_is_corruption_on_items(snap: Snapshot) -> None:
    fold_basic(snap)
    flip(snap, b"state", U64.pack(1) + b"msg/2", at=0)  # the CRC itself
    with reading(snap) as t:
        a = snap.reader(t).run_info("a")
        assert a is not None
        with pytest.raises(CorruptionError):
            snap.reader(t).items(a)
        with pytest.raises(CorruptionError):
            snap.reader(t).items(a, "msg/")
        assert snap.reader(t).items(a, "note") == {"note": b"n"}


def test_a_value_under_another_key_is_corruption(snap: Snapshot) -> None:
    fold_basic(snap)
    k1, k2 = U64.pack(1) + b"msg/1", U64.pack(1) + b"msg/2"
    raw_put(snap, b"state", k2, raw_get(snap, b"state", k1))  # a damaged key, valid bytes
    with reading(snap) as t, pytest.raises(CorruptionError):
        snap.reader(t).get(1, "msg/2")


def test_a_value_too_short_for_its_crc_is_corruption(snap: Snapshot) -> None:
    fold_basic(snap)
    raw_put(snap, b"state", U64.pack(1) + b"note", b"\x01\x02")
    with reading(snap) as t, pytest.raises(CorruptionError):
        snap.reader(t).get(1, "note")


def test_damaged_run_record(snap: Snapshot) -> None:
    fold_basic(snap)
    flip(snap, b"runs", b"a")
    with reading(snap) as t:
        with pytest.raises(CorruptionError):
            snap.reader(t).run_info("a")
        with pytest.raises(CorruptionError):
            snap.reader(t).runs()
        assert snap.reader(t).run_info("b") is not None


def test_malformed_run_record_with_a_valid_seal(snap: Snapshot) -> None:
    import cbor2

    fold_basic(snap)
    raw_put(snap, b"runs", b"a", seal(b"a", cbor2.dumps([1, 3, b"h", 3])))  # too short
    with reading(snap) as t, pytest.raises(CorruptionError, match="malformed"):
        snap.reader(t).run_info("a")


def test_damaged_checkpoint_record(snap: Snapshot) -> None:
    fold_basic(snap)
    flip(snap, b"ckpt", U64.pack(1) + U64.pack(2))
    with reading(snap) as t:
        with pytest.raises(CorruptionError):
            snap.reader(t).checkpoint("a", 1, 2)
        with pytest.raises(CorruptionError):
            list(snap.reader(t).checkpoints("a", 1))
        assert snap.reader(t).checkpoint("a", 1, 3) is not None


def test_damaged_applied_lsn(snap: Snapshot) -> None:
    fold_basic(snap)
    flip(snap, b"meta", b"applied_lsn")
    with reading(snap) as t, pytest.raises(CorruptionError):
        snap.reader(t).meta()


def test_a_missing_checkpoint_in_the_chain_is_corruption(snap: Snapshot) -> None:
    fold_basic(snap)
    raw_put(snap, b"ckpt", U64.pack(1) + U64.pack(2), None)
    with reading(snap) as t, pytest.raises(CorruptionError, match="missing"):
        list(snap.reader(t).checkpoints("a", 1))


def test_a_missing_first_checkpoint_is_corruption(snap: Snapshot) -> None:
    fold_basic(snap)
    raw_put(snap, b"ckpt", U64.pack(1) + U64.pack(1), None)
    with reading(snap) as t, pytest.raises(CorruptionError, match="not at 1"):
        list(snap.reader(t).checkpoints("a", 1))
    raw_put(snap, b"ckpt", U64.pack(2) + U64.pack(1), None)  # run b had only one
    with reading(snap) as t:
        assert list(snap.reader(t).checkpoints("b", 2)) == []


def test_a_missing_key_fails_the_whole_run_scan(snap: Snapshot) -> None:
    fold_basic(snap)
    raw_put(snap, b"state", U64.pack(1) + b"msg/2", None)
    with reading(snap) as t:
        a = snap.reader(t).run_info("a")
        assert a is not None
        with pytest.raises(CorruptionError, match="2 readable keys"):
            snap.reader(t).items(a)
        assert snap.reader(t).items(a, "msg/") == {"msg/1": b"one"}  # a prefix scan cannot tell


def test_an_extra_key_fails_the_whole_run_scan(snap: Snapshot) -> None:
    fold_basic(snap)
    k = U64.pack(1) + b"extra"
    raw_put(snap, b"state", k, seal(k, b"x"))
    with reading(snap) as t:
        a = snap.reader(t).run_info("a")
        assert a is not None
        with pytest.raises(CorruptionError):
            snap.reader(t).items(a)


def test_a_stale_value_fails_the_whole_run_scan_by_its_digest(snap: Snapshot) -> None:
    fold_basic(snap)
    k = U64.pack(1) + b"note"
    stale = raw_get(snap, b"state", k)
    snap.fold(5, SID, [FoldRun("a", {"note": b"fresh"}, [entry("a", 4, 5)])])
    raw_put(snap, b"state", k, stale)  # a validly sealed old version: same count
    with reading(snap) as t:
        a = snap.reader(t).run_info("a")
        assert a is not None
        assert snap.reader(t).get(1, "note") == b"n"  # one key alone cannot tell
        with pytest.raises(CorruptionError, match="digest"):
            snap.reader(t).items(a)


def test_a_fold_never_overwrites_a_damaged_value(snap: Snapshot) -> None:
    fold_basic(snap)
    flip(snap, b"state", U64.pack(1) + b"note")
    with pytest.raises(CorruptionError):
        snap.fold(5, SID, [FoldRun("a", {"note": b"new"}, [entry("a", 4, 5)])])
    with reading(snap) as t:
        assert snap.reader(t).meta()[0] == 4  # the whole fold was rolled back
        a = snap.reader(t).run_info("a")
        assert a is not None and a.head == 3


def test_a_damaged_next_run_number_stops_the_fold(snap: Snapshot) -> None:
    fold_basic(snap)
    raw_put(snap, b"meta", b"next_run", seal(b"next_run", b"\x03"))  # sealed, but not a u64
    with pytest.raises(CorruptionError):  # never restart numbering over run 1
        snap.fold(5, SID, [FoldRun("new", {"k": b"v"}, [entry("new", 1, 5)])])
    with reading(snap) as t:
        assert snap.reader(t).run_info("new") is None and snap.reader(t).meta()[0] == 4


# -- the shared environment -----------------------------------------------------------------


def test_two_snapshots_on_one_directory_share_one_env(sdir: str, tmp_path: Path) -> None:
    s1 = Snapshot(sdir, readonly=False, map_size=MAP)
    s2 = Snapshot(sdir, readonly=True, map_size=MAP)
    link = tmp_path / "link"
    os.symlink(sdir, link)
    s3 = Snapshot(str(link), readonly=True, map_size=MAP)  # the same directory
    try:
        assert s1.env is s2.env is s3.env
        fold_basic(s1)
        with reading(s2) as t:
            assert s2.reader(t).meta() == (4, SID)
    finally:
        s3.close()
        s2.close()
    with reading(s1) as t:  # still open for the last user
        assert s1.reader(t).get(1, "note") == b"n"
    env = s1.env
    s1.close()
    with pytest.raises(Exception) as ei:  # lmdb.Error: the env is closed
        env.begin()
    assert type(ei.value).__module__ == "lmdb"


def test_a_writer_can_share_the_env_a_reader_opened_first(sdir: str) -> None:
    Snapshot(sdir, readonly=False, map_size=MAP).close()  # the snapshot exists
    r = Snapshot(sdir, readonly=True, map_size=MAP)
    w = Snapshot(sdir, readonly=False, map_size=MAP)
    try:
        assert w.env is r.env
        fold_basic(w)
        with reading(r) as t:
            assert r.reader(t).meta() == (4, SID)
    finally:
        w.close()
        r.close()


def test_close_is_idempotent_and_does_not_close_the_env_under_others(sdir: str) -> None:
    s1 = Snapshot(sdir, readonly=False, map_size=MAP)
    s2 = Snapshot(sdir, readonly=False, map_size=MAP)
    fold_basic(s1)
    s1.close()
    s1.close()
    s1.close()
    with reading(s2) as t:
        assert s2.reader(t).meta() == (4, SID)
    s2.close()


def test_after_the_last_close_a_new_snapshot_opens_a_new_env(sdir: str) -> None:
    s1 = Snapshot(sdir, readonly=False, map_size=MAP)
    fold_basic(s1)
    old = s1.env
    s1.close()
    s2 = Snapshot(sdir, readonly=True, map_size=MAP)
    try:
        assert s2.env is not old
        with reading(s2) as t:
            assert s2.reader(t).meta() == (4, SID)
    finally:
        s2.close()


def test_a_closed_snapshot_refuses_reads(snap: Snapshot) -> None:
    snap.close()
    with pytest.raises(StoreClosedError):
        snap.begin_read()
    with pytest.raises(StoreClosedError):
        snap.readers()
    with pytest.raises(StoreClosedError):
        snap.grow()
    snap.forget_readers(3)  # a no-op, not an error


def test_readonly_snapshot_of_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(CorruptionError, match="missing"):
        Snapshot(str(tmp_path / "nope"), readonly=True)
    assert not (tmp_path / "nope").exists()


def test_readonly_snapshot_refuses_to_fold(sdir: str) -> None:
    w = Snapshot(sdir, readonly=False, map_size=MAP)
    r = Snapshot(sdir, readonly=True, map_size=MAP)
    try:
        with pytest.raises(ReadOnlyError):
            r.fold(1, SID, [FoldRun("a", {"k": b"v"}, [entry("a", 1, 1)])])
    finally:
        r.close()
        w.close()


# -- readers and map growth -----------------------------------------------------------------


def test_readers_are_counted_across_snapshots_on_one_env(sdir: str) -> None:
    s1 = Snapshot(sdir, readonly=False, map_size=MAP)
    s2 = Snapshot(sdir, readonly=True, map_size=MAP)
    try:
        assert s1.readers() == s2.readers() == 0
        t1 = s1.begin_read()
        t2 = s2.begin_read()
        t3 = s2.begin_read()
        assert s1.readers() == s2.readers() == 3
        s2.end_read(t2)
        assert s1.readers() == 2
        s1.end_read(t1)
        s2.end_read(t3)
        assert s1.readers() == 0
    finally:
        s2.close()
        s1.close()


def test_forget_readers_drops_and_never_goes_negative(snap: Snapshot) -> None:
    ts = [snap.begin_read() for _ in range(3)]
    snap.forget_readers(2)
    assert snap.readers() == 1
    snap.forget_readers(10)
    assert snap.readers() == 0
    snap.forget_readers(0)
    assert snap.readers() == 0
    for t in ts:
        t.abort()


def test_grow_doubles_the_map(snap: Snapshot) -> None:
    assert snap.env.info()["map_size"] == MAP
    assert snap.grow() == 2 * MAP
    assert snap.env.info()["map_size"] == 2 * MAP
    assert snap.grow() == 4 * MAP


def test_grow_refuses_while_a_read_is_open(sdir: str) -> None:
    s1 = Snapshot(sdir, readonly=False, map_size=MAP)
    s2 = Snapshot(sdir, readonly=True, map_size=MAP)
    try:
        t = s2.begin_read()  # another user's read counts too
        with pytest.raises(RuntimeError, match="reads are open"):
            s1.grow()
        assert s1.env.info()["map_size"] == MAP
        s2.end_read(t)
        assert s1.grow() == 2 * MAP
    finally:
        s2.close()
        s1.close()


def test_a_fold_too_big_for_the_map_is_map_full_and_changes_nothing(sdir: str) -> None:
    small = 256 << 10
    s = Snapshot(sdir, readonly=False, map_size=small)
    try:
        s.fold(1, SID, [FoldRun("r", {"a": b"small"}, [entry("r", 1, 1)])])
        big = FoldRun("r", {"b": os.urandom(1 << 20)}, [entry("r", 2, 2)])
        with pytest.raises(MapFull) as ei:
            s.fold(2, SID, [big])
        assert ei.value.size == small and str(small) in str(ei.value)
        with reading(s) as t:
            assert s.reader(t).meta()[0] == 1
            assert s.reader(t).get(1, "b") is None
        while True:  # what the store does: grow with no read open, retry
            s.grow()
            try:
                s.fold(2, SID, [big])
                break
            except MapFull:
                continue
        with reading(s) as t:
            info = s.reader(t).run_info("r")
            assert info is not None and info.keys == 2
            assert len(s.reader(t).items(info)["b"]) == 1 << 20
    finally:
        s.close()
