"""A store written with the format-2 history layout (regular manifests, no versions index).

``tests/data/history-v2.tar.gz`` was written by the code before the versions
index (``tests/data/make_history_v2.py`` says how), with the SHA-256 of every
state it read. This version reads it as it is (also read-only), upgrades it
in place at its first fold, and reads the same states afterwards; verify
finds nothing wrong before or after, and the upgraded store goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

import agentwal
from agentwal.local.snapshot.layout import HISTORY_INDEX
from tests.data.make_history_v2 import digest
from tests.helpers import check_history_counts

FIXTURE = Path(__file__).parent.parent / "data" / "history-v2.tar.gz"


@pytest.fixture
def old(tmp_path: Path) -> tuple[str, dict[str, dict[str, str]]]:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    want = json.loads((tmp_path / "expected.json").read_text())
    return str(tmp_path / "store.awal"), want


def _verify(path: str) -> agentwal.VerifyReport:
    with agentwal.open(path, readonly=True) as s:
        return s.verify()


def _states(store: agentwal.Store) -> dict[str, dict[str, str]]:
    return {run: {str(c.id): digest(store.state(run, at=c.id)) for c in store.history(run)}
            for run in store.runs()}


def _indexed(store: agentwal.Store) -> bool:
    snap = store._engine._snap
    assert snap is not None
    txn = snap.begin_read()
    try:
        return snap.raw(txn).get("meta", HISTORY_INDEX) is not None
    finally:
        snap.end_read(txn)


def test_the_old_layout_reads_as_written_read_only_and_verifies(
        old: tuple[str, dict[str, dict[str, str]]], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    path, want = old
    assert _verify(path).ok
    with agentwal.open(path, readonly=True) as store:
        assert not _indexed(store)
        assert _states(store) == want
        assert store.get("chat", "big", at=45) == "40:" + "b" * 1100
    # a copy no open has touched (the opens above added an empty versions database)
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path / "fresh", filter="data")
    fresh = str(tmp_path / "fresh" / "store.awal")
    # a snapshot directory this process may not write (a read-only mount, another user's
    # files): the environment is opened read-only and the versions database stays absent
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if mode == os.W_OK
                        and p.endswith("snapshot") else real(p, mode, **kw))
    with agentwal.open(fresh, readonly=True) as store:
        snap = store._engine._snap
        assert snap is not None and snap._dbs.versions is None
        assert _states(store) == want
        assert store.verify().ok


def test_the_first_fold_upgrades_in_place_and_history_reads_the_same(
        old: tuple[str, dict[str, dict[str, str]]], tmp_path: Path) -> None:
    path, want = old
    with agentwal.open(path, durability="none") as store:
        assert _states(store) == want  # a writer reads the old layout before any fold
        for i in range(71, 101):  # past 96: a multiple of 32, which gets no manifest now
            with store.begin("chat") as txn:
                txn["step"] = i
        store.snapshot()
        assert _indexed(store)
        now = _states(store)
        assert {r: {c: d for c, d in s.items() if r != "chat" or int(c) <= 70}
                for r, s in now.items()} == want
        assert store.state("chat", at=100)["step"] == 100
        assert store.state("chat", at=96)["messages"] == store.state("chat", at=70)["messages"]
        check_history_counts(store)
    report = _verify(path)
    assert report.ok, report.problems
    assert report.checked["versions"] > 0
    copy = str(tmp_path / "copy.awal")
    shutil.copytree(path, copy)
    with agentwal.open(copy, durability="none") as store:  # compaction after the upgrade
        store.compact(keep_last=10, runs=["chat"], vacuum=True)
        for c in store.history("chat"):
            assert digest(store.state("chat", at=c.id)) == now["chat"][str(c.id)]
        check_history_counts(store)
    assert _verify(copy).ok


def test_a_compaction_upgrades_too(old: tuple[str, dict[str, dict[str, str]]]) -> None:
    path, want = old
    with agentwal.open(path, durability="none") as store:
        store.compact(keep_last=30, runs=["pruned"])
        assert _indexed(store)
        assert _states(store) == {r: {c: d for c, d in s.items()
                                      if r != "pruned" or int(c) > 50}
                                  for r, s in want.items()}
        check_history_counts(store)
    assert _verify(path).ok


def test_indexing_marks_a_block_start_whose_record_also_lists_appends(tmp_path: Path) -> None:
    """A checkpoint logged with append entries keeps a 10th field in its record; when
    compaction dropped its parent (9th field set), indexing an unindexed snapshot must
    still give it its block start entry (it used to look for 9-field records only)."""
    import lmdb

    path = str(tmp_path / "s.awal")
    with agentwal.open(path, durability="none") as store:
        with store.begin("r") as txn:
            txn["l"] = ["a" * 40]
        for i in range(6):
            with store.begin("r") as txn:
                txn.append("l", f"{i}" * 40)
        store.compact(keep_last=2, runs=["r"])
        kept = [c.id for c in store.history("r")]
    assert _verify(path).ok
    # take the index away, as a snapshot written before it would be
    env = lmdb.open(os.path.join(path, "snapshot"), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"versions", txn=txn), delete=False)
        txn.delete(HISTORY_INDEX, db=env.open_db(b"meta", txn=txn))
    env.close()
    with agentwal.open(path, durability="none") as store:
        with store.begin("r") as txn:
            txn["x"] = 1
        store.snapshot()  # the fold indexes the snapshot again
        assert _indexed(store)
        assert store.state("r", at=min(kept))["l"][-1] == "4" * 40
    report = _verify(path)
    assert report.ok, report.problems


def test_the_index_derivation_is_one_pure_function() -> None:
    """What the writer and salvage both derive: one entry per delta key, and a block start
    for a record with its dropped parent's hash, with or without the appends field."""
    from agentwal.local.snapshot.layout import implied_versions, version_key

    k = (3).to_bytes(8, "big") + (7).to_bytes(8, "big")
    base = [7, 6, 1, 0.0, b"", b"h" * 32, None, None]
    assert implied_versions(k, ["a", "b"]) == [version_key(3, b"a", 7), version_key(3, b"b", 7)]
    assert implied_versions(k, (), base) == []
    assert implied_versions(k, (), [*base, None, {"l": [1, 2]}]) == []  # appends, parent kept
    start = version_key(3, b"", 7)
    assert implied_versions(k, (), [*base, b"p" * 32]) == [start]
    assert implied_versions(k, (), [*base, b"p" * 32, {"l": [1, 2]}]) == [start]
    assert implied_versions(k[:15], ["a"], [*base, b"p" * 32]) == []  # not a checkpoint key


# -- layout 3 (every object indexed by content) to layout 4 ------------------------------------

V3 = Path(__file__).parent.parent / "data" / "history-v3.tar.gz"


def _objects_and_ids(store: agentwal.Store) -> tuple[dict[int, bytes], set[int], bool]:
    """Every object's record, the addresses ``oids`` names, and whether the layout marker
    is there."""
    from agentwal.local.snapshot.layout import LAYOUT
    from tests.helpers import _object_records, raw_snapshot

    with raw_snapshot(store) as raw:
        records = _object_records(raw)
        named = {int.from_bytes(bytes(v)[4:], "big") for _k, v in raw.entries("oids")}
        marked = any(bytes(k) == LAYOUT for k, _v in raw.entries("meta"))
    return records, named, marked


def test_a_layout_3_store_reads_goes_on_and_compacts_under_layout_4(tmp_path: Path) -> None:
    """Written by the code before layout 4 (``tests/data/make_history_v3.py``): its nodes
    and segment leaves are indexed by content. It reads as written; new folds add
    unindexed nodes that extend the old indexed ones and mid-size values as plain
    leaves; compaction frees old and new objects alike (the old ids go with them)."""
    from agentwal import history

    with tarfile.open(V3) as tar:
        tar.extractall(tmp_path, filter="data")
    want = json.loads((tmp_path / "expected.json").read_text())
    path = str(tmp_path / "store.awal")
    with agentwal.open(path, readonly=True) as store:
        records, named, marked = _objects_and_ids(store)
        assert not marked and named == set(records)  # layout 3: every object indexed
        assert any(history.is_node(r) for r in records.values())
        assert _states(store) == want
    assert _verify(path).ok
    with agentwal.open(path, durability="none") as store:
        for i in range(41, 61):
            with store.begin("notes") as txn:
                txn["card"] = {"i": i, "text": "note " * 70}
                txn.append("items", {"i": i, "body": f"item {i} " * 40})
        store.snapshot()
        records, named, marked = _objects_and_ids(store)
        assert marked
        new = {a: r for a, r in records.items() if a not in named}
        assert any(history.is_node(r) for r in new.values())
        assert any(r[:1] == b"\x02" for r in new.values())  # plain leaves: cards, segments
        assert all(not history.indexed(r) for r in new.values())
        assert {r: s for r, s in _states(store).items() if r != "notes"} == {
            r: s for r, s in want.items() if r != "notes"}
        notes = store.state("notes")
        assert len(notes["items"]) == 60 and notes["items"][-1]["i"] == 60
        assert store.state("notes", at=40) == {
            "card": {"i": 40, "text": "note " * 220},
            "items": [{"i": i, "body": f"item {i} " * 40} for i in range(1, 41)]}
        check_history_counts(store)
    assert _verify(path).ok
    with agentwal.open(path, durability="none") as store:
        store.compact(keep_last=5, runs=["notes", "chat"], vacuum=True)
        records, named, _ = _objects_and_ids(store)
        assert named <= set(records)
        assert len(store.state("notes", at=58)["items"]) == 58
        check_history_counts(store)
    report = _verify(path)
    assert report.ok, report.problems


def _version_entries(store: agentwal.Store, key: str) -> list[int]:
    """The ids of ``key``'s ``versions`` entries (any run)."""
    from agentwal.local.snapshot.layout import version_parts
    from tests.helpers import raw_snapshot

    with raw_snapshot(store) as raw:
        return [p[2] for k, _v in raw.entries("versions")
                if (p := version_parts(bytes(k))) is not None and p[1] == key.encode()]


def test_write_once_keys_have_no_version_entry_until_they_change(tmp_path: Path) -> None:
    """A key written once (a LangGraph checkpoint record, a pending write) is named by its
    head entry instead of a ``versions`` entry; reads at every checkpoint are the same, and
    the entry comes back when the key changes or is deleted, or after salvage."""
    path = str(tmp_path / "s.awal")
    model: dict[int, dict[str, object]] = {}
    with agentwal.open(path, durability="none") as store:
        state: dict[str, object] = {}
        for i in range(1, 31):
            with store.begin("r") as txn:
                txn[f"ck/{i:03d}"] = state[f"ck/{i:03d}"] = {"i": i, "pad": "p" * (i * 13)}
                txn["head"] = state["head"] = i
                if i == 20:
                    txn["ck/005"] = state["ck/005"] = "changed"
                if i == 25:
                    del txn["ck/007"]
                    del state["ck/007"]
            model[i] = dict(state)
            if i % 10 == 0:
                store.snapshot()
        assert _version_entries(store, "ck/003") == []
        assert _version_entries(store, "ck/005") == [5, 20]
        assert _version_entries(store, "ck/007") == [7, 25]
        assert _version_entries(store, "head") == list(range(1, 31))
        for i in range(1, 31):
            assert store.state("r", at=i) == model[i], i
            assert store.get("r", "ck/003", at=i) == model[i].get("ck/003")
            assert store.get("r", "ck/005", at=i) == model[i].get("ck/005")
        check_history_counts(store)
        store.compact(keep_last=8, runs=["r"])  # drops the only version of ck/001 .. ck/022
        for i in range(23, 31):
            assert store.state("r", at=i) == model[i], i
        assert store.get("r", "ck/003", at=24) == model[24]["ck/003"]
        check_history_counts(store)
    report = _verify(path)
    assert report.ok, report.problems


def test_verify_checks_what_a_head_entry_says_of_its_only_version(tmp_path: Path) -> None:
    from agentwal.local.snapshot.layout import version_key
    from tests.stores import Raw

    path = str(tmp_path / "s.awal")
    with agentwal.open(path, durability="none") as store:
        for i in range(1, 6):
            with store.begin("r") as txn:
                txn[f"ck/{i}"] = {"i": i}
                txn["n"] = i
    assert _verify(path).ok
    with Raw(path) as raw:  # an entry at a checkpoint that did not write the key
        raw.put("versions", version_key(raw.run_no("r"), b"ck/2", 4), b"")
        raw.put("versions", version_key(raw.run_no("r"), b"ck/3", 3), b"")  # salvage's: fine
    problems = _verify(path).problems
    assert [(p.db, "only version" in p.what) for p in problems] == [("versions", True)], problems


def test_a_write_once_key_whose_version_was_compacted_away_changes_again(
        tmp_path: Path) -> None:
    """Its one version dropped, a key that changes again gets no entry for that version
    (verify found one naming a checkpoint that no longer exists)."""
    path = str(tmp_path / "s.awal")
    with agentwal.open(path, durability="none") as store:
        with store.begin("r") as txn:
            txn["once"] = {"v": 1}
        for i in range(5):
            with store.begin("r") as txn:
                txn["n"] = i
        store.compact(keep_last=2, runs=["r"])
        with store.begin("r") as txn:
            txn["once"] = {"v": 2}
        store.snapshot()
        assert _version_entries(store, "once") == [7]
        assert store.get("r", "once", at=5) == {"v": 1}
        assert store.get("r", "once", at=7) == {"v": 2}
        check_history_counts(store)
    report = _verify(path)
    assert report.ok, report.problems
