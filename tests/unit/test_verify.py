"""store.verify(): a clean store is ok; each kind of damage is reported where it is.

The damage here keeps every seal valid (it is written with a correct CRC, as
a forger would), so only the cross-checks can find it: the hash chains, the
state against the history, object ids, reference counts, ownership. Flipped
bytes (which the seals catch) are swept in ``tests/crash/test_verify_damage.py``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

import cbor2
import pytest

import agentwal
from agentwal.codec import decode_commit, encode_commit
from agentwal.io import OsFileSystem
from agentwal.local.verify import LMDB_FILE, Problem, VerifyReport, read_wal
from agentwal.local.verify import verify as verify_store
from agentwal.local.wal.frame import encode_frame, parse_header
from agentwal.local.wal.reader import scan_segment
from agentwal.testing import crash as crash_store
from tests.stores import U64, Built, Raw, build


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(str(tmp_path_factory.mktemp("verify") / "base.awal"))


@pytest.fixture(scope="module")
def tailed(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(str(tmp_path_factory.mktemp("verify") / "tail.awal"), tail=5)


def copy_of(b: Built, tmp_path: Path, name: str = "copy") -> str:
    dest = str(tmp_path / name)
    shutil.copytree(b.path, dest)
    return dest


def verify(path: str, *, readonly: bool = True) -> VerifyReport:
    with agentwal.open(path, readonly=readonly) as s:
        return s.verify()


def damaged(b: Built, tmp_path: Path, edit: Callable[[Raw], None]) -> VerifyReport:
    path = copy_of(b, tmp_path)
    with Raw(path) as raw:
        edit(raw)
    return verify(path)


def found(report: VerifyReport, db: str, key: str, what: str = "") -> Problem:
    """The problem reported for ``db[key]`` (whose text holds ``what``); fails if none."""
    for p in report.problems:
        if p.db == db and p.key == key and what in p.what:
            return p
    raise AssertionError(f"no problem {db}[{key}] {what!r} in:\n" + "\n".join(
        f"  {p.where}: {p.what}" for p in report.problems))


# -- clean stores -------------------------------------------------------------------------


def test_a_clean_store_verifies_ok(base: Built) -> None:
    report = verify(base.path)
    assert report.ok and report.problems == [], report.problems
    c = report.checked
    assert c["runs"] == 3 and c["checkpoints"] == base.head + 2 + 4
    assert c["hashes"] == c["checkpoints"] and c["deltas"] == c["checkpoints"]
    assert c["manifests"] == 1 and c["versions"] > c["deltas"]
    assert c["objects"] > 10 and c["effect_entries"] >= 2
    assert c["lmdb_entries"] > c["checkpoints"] * 2 and c["wal_segments"] >= 1


def test_a_store_with_an_unfolded_tail_verifies_ok(tailed: Built, tmp_path: Path) -> None:
    report = verify(tailed.path)
    assert report.ok, report.problems
    assert report.checked["wal_hashes"] >= tailed.tail
    writer = copy_of(tailed, tmp_path)
    report = verify(writer, readonly=False)  # recovery replays the tail; nothing folded yet
    assert report.ok, report.problems


def test_report_is_frozen_and_slotted(base: Built) -> None:
    report = verify(base.path)
    with pytest.raises(AttributeError):
        report.ok = False  # type: ignore[misc]
    assert not hasattr(report, "__dict__")
    p = Problem("x", "y", "f")
    assert not hasattr(p, "__dict__") and p.db is None and p.offset is None


def test_verify_while_commits_and_folds_continue(path: str) -> None:
    """A writer verifies a consistent view: threads commit (and folds run) meanwhile."""
    s = agentwal.open(path, durability="none", segment_bytes=1 << 14, wal_max_bytes=1 << 15)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(run: str) -> None:
        i = 0
        try:
            while not stop.is_set():
                with s.begin(run) as txn:
                    txn["n"] = i
                    txn["log"] = [*txn.get("log", []), "x" * 200][-40:]
                i += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=writer, args=(f"r{k}",)) for k in range(3)]
    for t in pool:
        t.start()
    try:
        reports = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline or len(reports) < 5:
            reports.append(s.verify())
        folds = s.stats()["folds"]
    finally:
        stop.set()
        for t in pool:
            t.join()
    assert not errors, errors
    bad = [p for r in reports for p in r.problems]
    assert not bad, bad
    assert folds >= 1 and sum(r.checked.get("hashes", 0) for r in reports) > 0
    ro = agentwal.open(path, readonly=True)
    try:
        assert ro.verify().ok  # a read-only store beside a writer that still commits
    finally:
        ro.close()
        s.close()


# -- hash chains --------------------------------------------------------------------------


def test_a_changed_delta_value_breaks_the_chain(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        k = raw.key("chat", 5)
        delta = raw.load("delta", k)
        delta["step"] = cbor2.dumps(555)  # inline ref: the value's CBOR
        raw.dump("delta", k, delta)

    report = damaged(base, tmp_path, edit)
    p = found(report, "ckpt", "'chat'/5", "hash chain broken")
    assert p.file == LMDB_FILE and p.where == "snapshot/data.mdb ckpt['chat'/5]"
    assert not report.ok and len(report.problems) == 1, report.problems


def test_a_reordered_delta_breaks_the_chain(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        k = raw.key("chat", 6)
        delta = raw.load("delta", k)
        raw.dump("delta", k, dict(reversed(list(delta.items()))))

    found(damaged(base, tmp_path, edit), "ckpt", "'chat'/6", "hash chain broken")


@pytest.mark.parametrize("field", [1, 3, 4, 6])  # parent, created_at, meta, origin
def test_a_changed_checkpoint_field_breaks_the_chain(base: Built, tmp_path: Path,
                                                     field: int) -> None:
    run, cid = ("chat-b", 1) if field == 6 else ("chat", 12)

    def edit(raw: Raw) -> None:
        k = raw.key(run, cid)
        rec = raw.load("ckpt", k)
        rec[field] = {1: 10, 3: rec[3] + 1.0, 4: cbor2.dumps({"node": "forged"}),
                      6: ["chat", 9]}[field]
        raw.dump("ckpt", k, rec)

    found(damaged(base, tmp_path, edit), "ckpt", f"{run!r}/{cid}")


def test_a_changed_hash_is_found_at_it_and_at_its_child(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        k = raw.key("chat", 14)
        rec = raw.load("ckpt", k)
        rec[5] = bytes(32)
        raw.dump("ckpt", k, rec)

    report = damaged(base, tmp_path, edit)
    found(report, "ckpt", "'chat'/14", "hash chain broken")
    found(report, "ckpt", "'chat'/15", "hash chain broken")


def test_the_outbox_digest_is_covered(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        k = raw.key("chat", base.outbox)
        rec = raw.load("ckpt", k)
        assert isinstance(rec[7], bytes) and len(rec[7]) == 32
        rec[7] = None
        raw.dump("ckpt", k, rec)

    found(damaged(base, tmp_path, edit), "ckpt", f"'chat'/{base.outbox}", "hash chain broken")


def test_a_changed_head_hash_in_the_run_record(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        rec = raw.load("runs", b"chat")
        rec[2] = bytes(32)
        raw.dump("runs", b"chat", rec)

    found(damaged(base, tmp_path, edit), "runs", "'chat'", "head hash")


# -- state against history ----------------------------------------------------------------


def test_a_changed_state_value_differs_from_history(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        k = raw.state_key("chat", "step")
        old = raw.txn.get(k, db=raw.dbs["state"])
        raw.put("state", k, cbor2.dumps(777))
        raw.fix_run_digest("chat", bytes(old), raw.txn.get(k, db=raw.dbs["state"]))

    report = damaged(base, tmp_path, edit)
    assert [(p.db, p.key) for p in report.problems] == [("state", "'chat'/'step'")], \
        report.problems
    found(report, "state", "'chat'/'step'", "differs from the value the history gives")


def test_a_missing_state_key_is_found(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        k = raw.state_key("chat", "blob")
        old = bytes(raw.txn.get(k, db=raw.dbs["state"]))
        raw.delete("state", k)
        raw.fix_run_digest("chat", old, None)

    found(damaged(base, tmp_path, edit), "state", "'chat'/'blob'", "is missing")


def test_an_extra_state_key_is_found(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        k = raw.state_key("chat", "ghost")
        raw.put("state", k, cbor2.dumps(1))
        raw.fix_run_digest("chat", None, raw.txn.get(k, db=raw.dbs["state"]))

    found(damaged(base, tmp_path, edit), "state", "'chat'/'ghost'", "not in the run's history")


def test_a_state_entry_the_run_record_does_not_count(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        raw.put("state", raw.state_key("chat", "ghost"), cbor2.dumps(1))

    found(damaged(base, tmp_path, edit), "runs", "'chat'", "state holds")


def test_a_changed_manifest_is_found(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        # a regular manifest (format 2 wrote one every 32 ids; format 3 keeps those it
        # has) must agree with the deltas
        k = raw.key("chat", 32)
        m = {key: raw.load("delta", raw.key("chat", 1))[key] for key in ("step",)}
        raw.dump("manifest", k, m)

    found(damaged(base, tmp_path, edit), "manifest", "'chat'/32", "differs from the deltas")


@pytest.mark.parametrize("db,run,cid", [("delta", "chat", 3), ("manifest", "pruned", 9),
                                        ("ckpt", "chat", 8)])
def test_a_missing_history_record_is_found(base: Built, tmp_path: Path, db: str, run: str,
                                           cid: int) -> None:
    report = damaged(base, tmp_path, lambda raw: raw.delete(db, raw.key(run, cid)))
    found(report, db, f"'{run}'/{cid}", "is missing")


def _version(raw: Raw, run: str, key: str, cid: int) -> bytes:
    k = key.encode()
    return U64.pack(raw.run_no(run)) + len(k).to_bytes(2, "big") + k + U64.pack(cid)


def test_a_missing_or_stray_version_entry_is_found(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        raw.delete("versions", _version(raw, "chat", "step", 5))  # delta 5 changed it
        raw.delete("versions", _version(raw, "pruned", "", 9))  # the block start
        raw.put("versions", _version(raw, "chat", "never", 6), b"")
        raw.put("versions", _version(raw, "pruned", "", 10), b"")
        raw.put("versions", _version(raw, "chat", "step", 7), b"x")

    report = damaged(base, tmp_path, edit)
    found(report, "versions", "'chat'/'step'@5", "is missing")
    found(report, "versions", "'pruned'/block start@9", "is missing")
    found(report, "versions", "'chat'/'never'@6", "did not change this key")
    found(report, "versions", "'pruned'/block start@10", "does not start a kept block")
    found(report, "versions", "'chat'/'step'@7", "not none")


def test_records_that_belong_to_nothing(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        raw.dump("delta", raw.key("chat", base.head + 5), {})
        raw.dump("manifest", raw.key("chat", 33), {})
        raw.put("state", U64.pack(99) + b"k", cbor2.dumps(1))
        raw.dump("ckpt", U64.pack(99) + U64.pack(1), [1])

    report = damaged(base, tmp_path, edit)
    found(report, "delta", f"'chat'/{base.head + 5}", "belongs to no checkpoint")
    found(report, "manifest", "'chat'/33", "belongs to no checkpoint")
    found(report, "state", "run #99/'k'", "belongs to no run")
    found(report, "ckpt", "run #99/1", "belongs to no run")


# -- objects, references, ids ------------------------------------------------------------------


def _leaf(raw: Raw) -> tuple[bytes, bytes]:
    """Key and record of a leaf object (a large value)."""
    return next((k, v[4:]) for k, v in raw.entries("objects") if v[4] == 0)


def _node(raw: Raw) -> tuple[bytes, bytes]:
    return next((k, v[4:]) for k, v in raw.entries("objects") if v[4] == 1)


def test_a_changed_object_no_longer_matches_its_id(base: Built, tmp_path: Path) -> None:
    addr: list[int] = []

    def edit(raw: Raw) -> None:
        k, record = _leaf(raw)
        addr.append(U64.unpack(k)[0])
        raw.put("objects", k, record[:-1] + bytes([record[-1] ^ 1]))

    report = damaged(base, tmp_path, edit)
    found(report, "objects", f"@{addr[0]}", "SHA-256 has no entry in oids")
    assert any(p.db == "ckpt" and "hash chain broken" in p.what for p in report.problems)


def test_a_changed_list_node_is_found(base: Built, tmp_path: Path) -> None:
    addr: list[int] = []

    def edit(raw: Raw) -> None:
        k, record = _node(raw)
        node = cbor2.loads(record[1:])
        node[1] += 1  # nbytes
        new = b"\x01" + cbor2.dumps(node)
        raw.put("objects", k, new)
        addr.append(U64.unpack(k)[0])
        assert raw.txn.get(hashlib.sha256(record).digest(), db=raw.dbs["oids"]) is None
        raw.put("oids", hashlib.sha256(new).digest(), k)  # a forger even indexes it

    report = damaged(base, tmp_path, edit)
    found(report, "objects", f"@{addr[0]}", "rebuilds to")


def test_a_wrong_reference_count_is_found(base: Built, tmp_path: Path) -> None:
    addr: list[int] = []

    def edit(raw: Raw) -> None:
        k, _ = _leaf(raw)
        n = U64.unpack(raw.get("refs", k))[0]
        raw.put("refs", k, U64.pack(n + 1))
        addr.append(U64.unpack(k)[0])

    found(damaged(base, tmp_path, edit), "refs", f"@{addr[0]}", "references; ")


def test_a_missing_object_is_found(base: Built, tmp_path: Path) -> None:
    addr: list[int] = []

    def edit(raw: Raw) -> None:
        k, _ = _leaf(raw)
        raw.delete("objects", k)
        addr.append(U64.unpack(k)[0])

    report = damaged(base, tmp_path, edit)
    assert any(p.db == "objects" and f"@{addr[0]}" in p.what and "missing" in p.what
               for p in report.problems), report.problems
    found(report, "refs", f"@{addr[0]}", "does not exist")


def test_a_dangling_object_id_is_found(base: Built, tmp_path: Path) -> None:
    report = damaged(base, tmp_path, lambda raw: raw.put("oids", bytes(32), U64.pack(10**6)))
    found(report, "oids", "0" * 16, "does not exist")


def test_a_lost_object_id_is_found(base: Built, tmp_path: Path) -> None:
    addr: list[int] = []

    def edit(raw: Raw) -> None:
        k, record = _leaf(raw)
        raw.delete("oids", hashlib.sha256(record).digest())
        addr.append(U64.unpack(k)[0])

    found(damaged(base, tmp_path, edit), "objects", f"@{addr[0]}", "no entry in oids")


# -- meta, runs, effects -------------------------------------------------------------------------


def test_a_foreign_store_id_is_found(base: Built) -> None:
    """Verified as another store's, the snapshot's id and every segment header disagree."""
    other = uuid.UUID(int=1)
    with agentwal.open(base.path, readonly=True) as s:
        assert s._engine._snap is not None
        txn = s._engine._snap.begin_read()
        try:
            wal = read_wal(OsFileSystem(), os.path.join(base.path, "wal"))
            report = verify_store(s._engine._snap.raw(txn), wal, store_id=other, limit=0)
        finally:
            s._engine._snap.end_read(txn)
    found(report, "meta", "'store_id'", f"not {other}")
    assert any(p.file.startswith("wal/") and p.offset == 16 for p in report.problems)


def test_a_wrong_checkpoint_count_is_found(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        rec = raw.load("runs", b"chat-b")
        rec[3] += 1
        raw.dump("runs", b"chat-b", rec)

    found(damaged(base, tmp_path, edit), "runs", "'chat-b'", "counts 3 checkpoints")


def test_a_malformed_ledger_entry_is_found(base: Built, tmp_path: Path) -> None:
    key: list[str] = []

    def edit(raw: Raw) -> None:
        k = next(k for k, _ in raw.entries("effects") if k[:1] == b"k")
        raw.dump("effects", k, {"v": 1, "status": "done"})
        key.append(k[1:].decode())

    found(damaged(base, tmp_path, edit), "effects", f"k {key[0]!r}", "missing or of the wrong")


def test_ledger_index_rows(base: Built, tmp_path: Path) -> None:
    def edit(raw: Raw) -> None:
        # A position row may outlive its entry (expiry): not a problem. An outbox row
        # must name an entry; a position row must be [run, checkpoint, ordinal].
        raw.put("effects", b"p" + cbor2.dumps(["chat", 99, 0]), b"expired-key")
        raw.put("effects", b"p" + cbor2.dumps(["chat", 99]), b"k")
        raw.put("effects", b"q" + U64.pack(5) + struct.pack(">I", 0), b"no-such-key")

    report = damaged(base, tmp_path, edit)
    assert sorted((p.key, p.what) for p in report.problems) == [
        (b"p".hex() + cbor2.dumps(["chat", 99]).hex(),
         "position row is not [run, checkpoint, ordinal]"),
        ("q 5/0", "names ledger entry b'no-such-key', which is missing")], report.problems


def test_damaged_control_file_is_reported(base: Built, tmp_path: Path) -> None:
    path = copy_of(base, tmp_path)
    with agentwal.open(path, readonly=True) as s:
        control = os.path.join(path, "CONTROL")
        data = bytearray(Path(control).read_bytes())
        data[-1] ^= 0x40
        Path(control).write_bytes(bytes(data))
        report = s.verify()
    assert [p.where for p in report.problems] == ["CONTROL"], report.problems
    assert "checksum" in report.problems[0].what


# -- the WAL ------------------------------------------------------------------------------------


def _segment(path: str) -> tuple[str, bytes]:
    wal = os.path.join(path, "wal")
    name = sorted(os.listdir(wal))[-1]
    return os.path.join(wal, name), Path(wal, name).read_bytes()


def test_a_flipped_byte_in_a_folded_record_is_found(base: Built, tmp_path: Path) -> None:
    path = copy_of(base, tmp_path)
    seg, data = _segment(path)
    header = parse_header(data)
    assert not isinstance(header, str)
    frames = scan_segment(data, header).frames
    f = frames[len(frames) // 2]
    with open(seg, "r+b") as fh:
        fh.seek(f.offset + 40)
        fh.write(bytes([data[f.offset + 40] ^ 0x04]))
    report = verify(path)  # recovery starts after the folded records: it opens fine
    p = next(p for p in report.problems if p.file.startswith("wal/"))
    assert p.offset == f.offset and p.where == f"wal/{os.path.basename(seg)} @ {f.offset}"


def test_damage_the_writer_already_acknowledged_is_found(path: str) -> None:
    """In an open writer, even the last record is acknowledged: damage there is a problem."""
    with agentwal.open(path, durability="sync") as s:
        for i in range(6):
            with s.begin("r") as txn:
                txn["i"] = i
        seg, data = _segment(path)
        header = parse_header(data)
        assert not isinstance(header, str)
        last = scan_segment(data, header).frames[-1]
        with open(seg, "r+b") as fh:
            fh.seek(last.offset + 30)
            fh.write(bytes([data[last.offset + 30] ^ 0x80]))
        report = s.verify()
        # The damaged frame, and LOGMARK's word that the log reached it (a synced record).
        assert [(p.file, p.offset) for p in report.problems] == \
            [("wal/", None), (f"wal/{os.path.basename(seg)}", last.offset)], report.problems
        with open(seg, "r+b") as fh:  # put it back, so close() can fold
            fh.seek(last.offset + 30)
            fh.write(bytes([data[last.offset + 30]]))


def test_a_torn_tail_after_the_last_acknowledged_record_is_a_note(tailed: Built,
                                                                   tmp_path: Path) -> None:
    path = copy_of(tailed, tmp_path)
    os.unlink(os.path.join(path, "LOGMARK"))  # the cut stands for a write never synced
    seg, data = _segment(path)
    header = parse_header(data)
    assert not isinstance(header, str)
    last = scan_segment(data, header).frames[-1]
    with open(seg, "r+b") as fh:
        fh.truncate(last.offset + 20)  # a write cut short
        fh.truncate(len(data))
    report = verify(path)
    assert report.ok, report.problems
    assert any("torn tail" in n for n in report.notes), report.notes


def test_a_forged_wal_record_breaks_its_chain(tailed: Built, tmp_path: Path) -> None:
    """A record rewritten with a valid frame CRC: only its hash can tell."""
    path = copy_of(tailed, tmp_path)
    seg, data = _segment(path)
    header = parse_header(data)
    assert not isinstance(header, str)
    f = next(f for f in scan_segment(data, header).frames if f.type == 1 and f.flags == 0
             and decode_commit(f.payload).id > tailed.head - tailed.tail)
    rec = decode_commit(f.payload)
    delta = cbor2.loads(rec.delta)
    assert isinstance(delta["step"], bytes)
    step = cbor2.loads(delta["step"])
    delta["step"] = cbor2.dumps(step ^ 1)  # same length
    forged = encode_commit(type(rec)(rec.run, rec.id, rec.parent, rec.created_at, rec.meta,
                                     rec.hash, rec.origin, cbor2.dumps(delta), rec.deferred))
    assert len(forged) == len(f.payload)
    frame = encode_frame(header.salt, f.lsn, f.synced_lsn, f.type, f.flags, forged)
    with open(seg, "r+b") as fh:
        fh.seek(f.offset)
        fh.write(frame)
    report = verify(path)
    p = next(p for p in report.problems if "hash chain broken" in p.what)
    assert p.offset == f.offset and p.file.startswith("wal/"), report.problems


def test_a_missing_segment_is_found(path: str) -> None:
    s = agentwal.open(path, durability="none", segment_bytes=4096, wal_max_bytes=1 << 20)
    for i in range(60):
        with s.begin("r") as txn:
            txn["v"] = hashlib.sha256(str(i).encode()).hexdigest() * 10
    crash_store(s)
    wal = os.path.join(path, "wal")
    names = sorted(os.listdir(wal))
    assert len(names) >= 3
    with agentwal.open(path, readonly=True) as ro:
        os.unlink(os.path.join(wal, names[1]))
        report = ro.verify()
    assert any(p.file == f"wal/{names[2]}" and "missing" in p.what for p in report.problems), \
        report.problems


def test_verify_sees_the_writer_lsn_cross_check(tailed: Built, tmp_path: Path) -> None:
    """A folded record whose twin in LMDB has another hash is reported (both sealed fine)."""
    path = copy_of(tailed, tmp_path)
    with agentwal.open(path) as s:  # fold the tail, keep its segment
        s.snapshot()
    with Raw(path) as raw:
        k = raw.key("chat", tailed.head)
        rec = raw.load("ckpt", k)
        rec[5] = bytes(32)
        raw.dump("ckpt", k, rec)
        run = raw.load("runs", b"chat")
        run[2] = bytes(32)
        raw.dump("runs", b"chat", run)
    report = verify(path)
    found(report, "ckpt", f"'chat'/{tailed.head}", "hash chain broken")
    assert any(p.file.startswith("wal/") and "differs from the checkpoint" in p.what
               for p in report.problems), report.problems


def _crc_ok(raw: bytes, key: bytes) -> bool:
    return struct.unpack_from("<I", raw)[0] == zlib.crc32(raw[4:], zlib.crc32(key))


def test_every_entry_of_a_clean_store_is_sealed(base: Built) -> None:
    """The premise of the byte sweep: every value of every database carries a valid seal."""
    with Raw(base.path) as raw:
        bad = [(db, k) for db in raw.dbs for k, v in raw.entries(db) if not _crc_ok(v, k)]
        raw.txn.abort()
        raw.txn = raw.env.begin()  # nothing to commit
    assert not bad


def test_the_object_cache_changes_nothing(base: Built, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With no room to keep objects, every read goes to LMDB: the same report."""
    from agentwal.local.verify import snapshot_checks

    full = verify(base.path)
    monkeypatch.setattr(snapshot_checks, "CACHE_BYTES", 1)
    assert verify(base.path) == full

    def edit(raw: Raw) -> None:
        k, _ = _leaf(raw)
        sealed = bytes(raw.txn.get(k, db=raw.dbs["objects"]))
        raw.put_raw("objects", k, sealed[:-1] + bytes([sealed[-1] ^ 1]))  # seal now fails

    report = damaged(base, tmp_path, edit)
    assert [p.db for p in report.problems] == ["objects"], report.problems


def test_a_read_only_store_verifies_while_another_process_writes_and_folds(
        tmp_path: Path) -> None:
    """The writer commits, rotates, folds and removes segments meanwhile: no false problem."""
    import subprocess
    import sys

    from tests.unit.test_backup import ROOT, WRITER

    path, acked = str(tmp_path / "s"), str(tmp_path / "acked")
    child = subprocess.Popen([sys.executable, "-c", WRITER, path, acked],
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    reports = []
    try:
        while not os.path.exists(acked):
            time.sleep(0.01)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline or len(reports) < 10:
            with agentwal.open(path, readonly=True) as ro:
                reports.append(ro.verify())
    finally:
        Path(acked + ".stop").write_text("")
        assert child.wait(timeout=60) == 0
    bad = [p for r in reports for p in r.problems]
    assert not bad, bad
    assert min(os.listdir(os.path.join(path, "wal"))) > f"{1:020d}", "no fold removed a segment"
    assert verify(path).ok


def test_folded_blob_references_verify_clean(store: agentwal.Store) -> None:
    # A blob reference folded into LMDB's state is a value (it once read as undecodable CBOR).
    import io

    for i in range(3):
        with store.begin("r") as txn:
            txn.put_blob("b", io.BytesIO(b"x%d" % i))
    store.snapshot()
    assert store.verify().ok
    store.compact(keep_last=1)
    assert store.verify().ok


def test_unindexed_objects_need_the_layout_4_marker(base: Built, tmp_path: Path) -> None:
    """Without ``meta`` ``layout`` (a snapshot only layout-3 folds wrote), every object
    must be indexed: a plain leaf or a list node without its id is reported."""
    from agentwal.local.snapshot.layout import LAYOUT

    assert verify(base.path).ok
    report = damaged(base, tmp_path, lambda raw: raw.delete("meta", LAYOUT))
    assert any(p.db == "objects" and "plain leaf (layout 4)" in p.what
               for p in report.problems), report.problems
    assert any(p.db == "objects" and "no entry in oids" in p.what for p in report.problems)
