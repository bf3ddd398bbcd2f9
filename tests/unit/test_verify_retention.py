"""store.verify() on compacted and deleted runs: clean stores verify ok, damage is still found.

Compaction leaves gaps in a run's checkpoint ids; the first checkpoint after
a gap carries its dropped parent's hash and has a manifest. A deletion
leaves the deleted run's records in the WAL (until their segment goes) and
a new run under the same id in the snapshot. None of that is damage.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import cbor2

import agentwal
from tests.helpers import commit

U64 = struct.Struct(">Q")


def _fill(store: agentwal.Store, run: str, n: int, start: int = 1) -> None:
    for i in range(start, n + 1):
        commit(store, run, step=i, log=[f"{run}{j}-{'m' * 150}" for j in range(i)],
               big=f"{i % 3}" * 2000)


def _problems(store: agentwal.Store) -> list[str]:
    report = store.verify()
    return [f"{p.where}: {p.what}" for p in report.problems]


def _rewrite(store: agentwal.Store, db: str, run: str, cid: int, fn: Any) -> None:
    """Change one LMDB record of ``run`` behind the store's back, with a valid seal."""
    snap = store._engine._snap
    assert snap is not None
    with snap.env.begin(write=True) as txn:
        info = snap.reader(txn).run_info(run)
        assert info is not None
        k = U64.pack(info.number) + U64.pack(cid)
        handle = getattr(snap._dbs, db)
        if fn is None:
            assert txn.delete(k, db=handle)
            return
        obj = cbor2.loads(bytes(txn.get(k, db=handle))[4:])
        data = cbor2.dumps(fn(obj))
        txn.put(k, struct.pack("<I", zlib.crc32(data, zlib.crc32(k))) + data, db=handle)


def test_a_compacted_store_verifies_ok(store: agentwal.Store) -> None:
    _fill(store, "r", 80)
    store.fork("r", 5, "f")
    store.compact(keep_last=10)  # keeps 5 (the fork's origin) and 71..80
    assert [c.id for c in store.history("r")][-2:] == [71, 5]
    assert _problems(store) == []
    report = store.verify()
    assert report.checked["checkpoints_dropped"] == 69
    _fill(store, "r", 90, start=81)  # the chain goes on after the kept head
    store.snapshot()
    assert _problems(store) == []
    store.compact(keep_last=3, vacuum=True)
    assert _problems(store) == []


def test_a_deleted_run_verifies_ok_before_and_after_its_fold(store: agentwal.Store) -> None:
    _fill(store, "r", 20)
    _fill(store, "keep", 5)
    store.snapshot()
    _fill(store, "r", 24, start=21)  # unfolded: in the WAL only
    store.delete_run("r")
    assert _problems(store) == []  # LMDB still has it; the WAL has the deletion
    _fill(store, "r", 3)  # a new run under the id, ids from 1 again
    assert _problems(store) == []
    store.snapshot()  # the old run's records stay in the current WAL segment
    assert _problems(store) == []
    store.delete_run("r")
    _fill(store, "r", 2)
    store.snapshot()
    assert _problems(store) == []


def test_a_compacted_run_still_reports_a_missing_kept_checkpoint(store: agentwal.Store) -> None:
    _fill(store, "r", 40)
    store.compact(keep_last=10)  # keeps 31..40
    _rewrite(store, "ckpt", "r", 35, None)
    found = _problems(store)
    assert any("is missing" in p for p in found), found


def test_a_compacted_run_reports_a_missing_manifest_after_a_gap(store: agentwal.Store) -> None:
    _fill(store, "r", 40)
    store.compact(keep_last=10)  # 31 starts the kept block: it has a manifest
    _rewrite(store, "manifest", "r", 31, None)
    found = _problems(store)
    assert any("first kept after checkpoints compaction dropped" in p for p in found), found


def test_the_chain_is_checked_across_a_gap(store: agentwal.Store) -> None:
    _fill(store, "r", 40)
    store.compact(keep_last=10)

    def forge(rec: list[Any]) -> list[Any]:
        rec[8] = bytes(32)  # another parent hash
        return rec

    _rewrite(store, "ckpt", "r", 31, forge)
    found = _problems(store)
    assert any("hash chain broken" in p for p in found), found


def test_a_gap_without_a_parent_hash_is_missing_checkpoints(store: agentwal.Store) -> None:
    _fill(store, "r", 40)
    store.compact(keep_last=10)

    def unmark(rec: list[Any]) -> list[Any]:
        return rec[:8]  # as if nothing had been dropped below it

    _rewrite(store, "ckpt", "r", 31, unmark)
    found = _problems(store)
    assert any("is missing" in p for p in found), found


def test_a_delta_left_of_a_dropped_checkpoint_belongs_to_nothing(store: agentwal.Store) -> None:
    _fill(store, "r", 40)
    store.snapshot()
    snap = store._engine._snap
    assert snap is not None
    txn = snap.begin_read()
    try:
        info = snap.reader(txn).run_info("r")
        assert info is not None
        k = U64.pack(info.number) + U64.pack(12)
        kept_delta = snap.raw(txn).get("delta", k)
    finally:
        snap.end_read(txn)
    store.compact(keep_last=10)
    with snap.env.begin(write=True) as wtxn:
        wtxn.put(k, kept_delta, db=snap._dbs.delta)  # sealed for its key: only ownership fails
    found = _problems(store)
    assert any("belongs to no checkpoint" in p for p in found), found


def test_a_backup_of_a_compacted_store_opens_and_verifies(store: agentwal.Store,
                                                          tmp_path: Any) -> None:
    _fill(store, "r", 50)
    _fill(store, "gone", 5)
    store.fork("r", 7, "f")
    store.compact(keep_last=5, vacuum=True)
    store.delete_run("gone")
    rep = store.backup(str(tmp_path / "copy.awal"))
    with agentwal.open(rep.path, readonly=True) as copy:
        assert [c.id for c in copy.history("r")] == [50, 49, 48, 47, 46, 7]
        assert copy.state("r", at=7) == store.state("r", at=7)
        assert copy.runs() == ["f", "r"] and copy.verify().ok
