"""History through the store: state/get at a checkpoint, history(before=), diff,
rollback_to and fork, across folds, reopens and crashes."""

from __future__ import annotations

import os
import random
import threading
from typing import Any

import lmdb
import pytest

import agentwal
from agentwal import errors, failpoints, history
from agentwal.testing import crash as crash_store
from tests.helpers import commit

SMALL = {"durability": "none", "wal_max_bytes": 64 << 10, "segment_bytes": 16 << 10}


def _step(store: agentwal.Store, model: dict[str, Any], i: int, rng: random.Random) -> None:
    """One commit of a conversation-like run, mirrored in ``model``."""
    with store.begin("r") as txn:
        msgs = model.setdefault("messages", [])
        msgs.append({"i": i, "text": rng.randbytes(rng.choice([20, 300, 1100])).hex()})
        txn["messages"] = msgs
        txn["step"] = model["step"] = i
        if i % 7 == 0:
            txn.delete("scratch")
            model.pop("scratch", None)
        else:
            txn["scratch"] = model["scratch"] = {"n": i}
        if i % 11 == 0:
            txn["blob"] = model["blob"] = rng.randbytes(2000)
        if i % 97 == 0:  # a list that is not an append: a new root
            msgs.reverse()
            txn["messages"] = msgs


def _snap(model: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list) else v) for k, v in model.items()}


def test_state_at_every_checkpoint_of_a_500_commit_run(path: str) -> None:
    rng = random.Random(500)
    model: dict[str, Any] = {}
    want: dict[int, dict[str, Any]] = {}
    # The messages list outgrows MEMTABLE_PER_LOG * wal_max_bytes, so every late commit
    # asks for a fold, and whether the fold thread has caught up when the loop ends is
    # timing. Hold one fold after its freeze so the last commit is unfolded for certain.
    held, release = threading.Event(), threading.Event()

    def hold(_name: str) -> None:
        held.set()
        release.wait(60)

    store = agentwal.open(path, **SMALL)
    try:
        for i in range(1, 501):
            if i == 499:  # commit 499 asks for a fold, which freezes it and waits
                failpoints.arm("fold_after_freeze", "call", fn=hold)
            if i == 500:
                assert held.wait(60), "no fold froze the memtable"
            _step(store, model, i, rng)
            want[i] = _snap(model)
            if i == 250:  # the second half starts after a crash (WAL replayed)
                crash_store(store)
                store = agentwal.open(path, **SMALL)
        stats = store.stats()
        assert stats["folds"] >= 3 and stats["memtable_commits"] > 0  # folded and unfolded
        for i in range(1, 501):  # LMDB, the held fold's frozen memtable, the active one
            assert store.state("r", at=i) == want[i], i
    finally:
        release.set()
        failpoints.disarm()
    store.close()
    with agentwal.open(path, **SMALL) as store:
        assert store.stats()["memtable_commits"] == 0
        for i in range(1, 501):
            assert store.state("r", at=i) == want[i], i
        for i in (1, 31, 32, 33, 64, 499, 500):
            for key in ("messages", "step", "scratch", "blob"):
                assert store.get("r", key, "absent", at=i) == want[i].get(key, "absent")
        assert store.state("r") == want[500]
        stats = store.stats()
        # no regular manifests (format 3): a version per key each checkpoint changed
        assert stats["manifests"] == 0
        assert stats["versions"] == _delta_entries(store)


def test_a_list_stored_by_ref_reads_back_at_the_head(path: str) -> None:
    msgs = [{"text": "x" * 600, "i": i} for i in range(10)]
    with agentwal.open(path, durability="none") as s:
        for n in range(1, 11):
            commit(s, "r", messages=msgs[:n])
        s.snapshot()
        assert s.get("r", "messages") == msgs
        assert s.state("r") == {"messages": msgs}
        with s.begin("r") as txn:
            assert txn["messages"] == msgs and dict(txn.items()) == {"messages": msgs}


def test_unfolded_checkpoints_are_viewable(store: agentwal.Store) -> None:
    c1 = commit(store, "r", a=1, b=[1, 2])
    c2 = commit(store, "r", a=2)
    with store.begin("r") as txn:
        txn.delete("b")
    c3 = txn.checkpoint
    assert c3 is not None
    assert store.stats()["memtable_commits"] == 3
    assert store.state("r", at=c1.id) == {"a": 1, "b": [1, 2]}
    assert store.state("r", at=c2.id) == {"a": 2, "b": [1, 2]}
    assert store.state("r", at=c3.id) == {"a": 2}
    assert store.get("r", "b", at=2) == [1, 2] and store.get("r", "b", "gone", at=3) == "gone"


def test_state_at_mixes_folded_and_unfolded(store: agentwal.Store) -> None:
    commit(store, "r", a=1)
    commit(store, "r", a=2, b=1)
    store.snapshot()
    commit(store, "r", a=3)
    assert [store.state("r", at=i) for i in (1, 2, 3)] == [
        {"a": 1}, {"a": 2, "b": 1}, {"a": 3, "b": 1}]


def test_reads_inside_a_fold_window_see_each_checkpoint_once(store: agentwal.Store) -> None:
    for i in range(1, 5):
        commit(store, "r", n=i, log=list(range(i * 200)))
    seen: list[Any] = []

    def look(_name: str) -> None:  # LMDB holds the fold, the frozen table still shows
        seen.append([store.state("r", at=i) for i in range(1, 5)])
        seen.append(store.diff("r", 1, 4))

    failpoints.arm("fold_after_commit", "call", fn=look)
    store.snapshot()
    assert seen[0] == [{"n": i, "log": list(range(i * 200))} for i in range(1, 5)]
    assert seen[1].changed["n"] == (1, 4)


def test_read_only_store_sees_history(path: str) -> None:
    with agentwal.open(path) as s:
        commit(s, "r", a=1)
        commit(s, "r", a=2)
    with agentwal.open(path, readonly=True) as ro:
        assert ro.state("r", at=1) == {"a": 1}
        assert ro.diff("r", 1, 2).changed == {"a": (1, 2)}
        with pytest.raises(errors.ReadOnlyError):
            ro.rollback_to("r", 1)
        with pytest.raises(errors.ReadOnlyError):
            ro.fork("r", 1, "f")


# -- errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("fold", [False, True])
def test_unknown_runs_and_checkpoints(store: agentwal.Store, fold: bool) -> None:
    commit(store, "r", a=1)
    commit(store, "r", a=2)
    if fold:
        store.snapshot()
    for call in (lambda: store.state("nope", at=1), lambda: store.get("nope", "a", at=1),
                 lambda: store.diff("nope", 1, 1), lambda: store.rollback_to("nope", 1),
                 lambda: store.fork("nope", 1, "x"), lambda: store.history("nope", before=1)):
        with pytest.raises(errors.RunNotFoundError):
            call()
    for bad in (0, -1, 3, 10**6):
        for call in (lambda b=bad: store.state("r", at=b),
                     lambda b=bad: store.get("r", "a", at=b),
                     lambda b=bad: store.diff("r", 1, b), lambda b=bad: store.diff("r", b, 1),
                     lambda b=bad: store.rollback_to("r", b),
                     lambda b=bad: store.fork("r", b, "x"),
                     lambda b=bad: store.history("r", before=b)):
            with pytest.raises(errors.CheckpointNotFoundError) as info:
                call()
            assert info.value.checkpoint == bad and info.value.code == "checkpoint_not_found"
    with pytest.raises(TypeError):
        store.state("r", at=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.state("r", at="1")  # type: ignore[arg-type]
    assert store.history("nope") == []  # no `before`: an unknown run has no history
    assert store.runs() == ["r"]  # nothing was created by the failures


# -- history(before=) -----------------------------------------------------------------

def test_history_before_pages_back(path: str) -> None:
    with agentwal.open(path, **SMALL) as s:
        for i in range(1, 41):
            commit(s, "r", i=i, pad=os.urandom(3000))
            if i == 25:
                s.snapshot()
        ids: list[int] = []
        page = s.history("r", limit=7)
        while page:
            ids.extend(c.id for c in page)
            page = s.history("r", limit=7, before=page[-1].id)
        assert ids == list(range(40, 0, -1))
        assert [c.id for c in s.history("r", before=30)] == list(range(29, 0, -1))
        assert [c.id for c in s.history("r", before=27, limit=3)] == [26, 25, 24]
        assert s.history("r", before=1) == []
        assert s.history("r", before=40) == s.history("r")[1:]


# -- diff -----------------------------------------------------------------------------

def test_diff_reports_added_removed_changed(store: agentwal.Store) -> None:
    commit(store, "r", a=1, b="keep", c=[1])
    with store.begin("r") as txn:
        txn["a"] = 2
        txn.delete("c")
        txn["d"] = {"new": True}
        txn["b"] = "keep"  # put again, unchanged: not a change
    d = store.diff("r", 1, 2)
    assert d == agentwal.Diff(added={"d": {"new": True}}, removed={"c": [1]},
                              changed={"a": (1, 2)})
    back = store.diff("r", 2, 1)
    assert back.added == {"c": [1]} and back.removed == {"d": {"new": True}}
    assert back.changed == {"a": (2, 1)}
    assert not store.diff("r", 2, 2) and bool(d)


def test_diff_of_equal_values_encoded_differently_is_empty(store: agentwal.Store) -> None:
    commit(store, "r", m={"x": 1, "y": 2})
    commit(store, "r", m={"y": 2, "x": 1})  # same dict, other key order: other bytes
    assert store.diff("r", 1, 2).changed == {}


def test_diff_is_frozen_and_slotted() -> None:
    d = agentwal.Diff({}, {}, {})
    with pytest.raises(AttributeError):
        d.added = {}  # type: ignore[misc]
    assert not hasattr(d, "__dict__")


# -- rollback_to ----------------------------------------------------------------------

def test_rollback_to_makes_a_new_checkpoint_with_the_old_state(path: str) -> None:
    with agentwal.open(path, **SMALL) as s:
        commit(s, "r", a=1, msgs=[{"t": "x" * 500}])
        commit(s, "r", a=2, b=2, msgs=[{"t": "x" * 500}, {"t": "y" * 700}])
        s.snapshot()
        commit(s, "r", a=3)
        c = s.rollback_to("r", 1)
        assert (c.id, c.parent, c.meta, c.origin) == (4, 3, {"rollback_to": 1}, None)
        assert s.state("r") == s.state("r", at=1) == {"a": 1, "msgs": [{"t": "x" * 500}]}
        assert s.history("r")[0] == c == s.head("r")
        assert s.state("r", at=3) == {"a": 3, "b": 2,
                                      "msgs": [{"t": "x" * 500}, {"t": "y" * 700}]}
        c5 = s.rollback_to("r", 3)  # forward again, to an unfolded checkpoint
        assert s.state("r") == s.state("r", at=3) and c5.meta == {"rollback_to": 3}
        c6 = s.rollback_to("r", 5)  # to the head: no change, still a checkpoint
        assert c6.id == 6 and s.diff("r", 5, 6) == agentwal.Diff({}, {}, {})
        want = {i: s.state("r", at=i) for i in range(1, 7)}
    s = agentwal.open(path, **SMALL)
    crash_store(s)  # a crash right after the reopen: nothing new
    with agentwal.open(path, **SMALL) as s:
        assert {i: s.state("r", at=i) for i in range(1, 7)} == want
        assert s.head("r").meta == {"rollback_to": 5}  # type: ignore[union-attr]


def test_rollback_to_survives_a_crash_before_any_fold(path: str) -> None:
    s = agentwal.open(path, durability="sync")
    commit(s, "r", a=1)
    commit(s, "r", a=2, b=1)
    c = s.rollback_to("r", 1)
    crash_store(s)  # crash: the rollback is only in the WAL
    with agentwal.open(path) as s:
        assert s.head("r") == c
        assert s.state("r") == {"a": 1}


def test_rollback_to_conflicts_with_a_racing_commit(store: agentwal.Store) -> None:
    commit(store, "r", a=1)
    commit(store, "r", a=2)
    racer = store.begin("r")
    racer["z"] = 1

    def race(_name: str) -> None:
        racer.commit()

    failpoints.arm("commit_after_encode", "call", fn=race)
    with pytest.raises(errors.ConflictError):
        store.rollback_to("r", 1)
    assert store.state("r") == {"a": 2, "z": 1}
    assert store.rollback_to("r", 1).id == 4  # retried: fine


# -- fork -----------------------------------------------------------------------------

def test_fork_starts_an_independent_run(path: str) -> None:
    with agentwal.open(path, **SMALL) as s:
        for i in range(1, 6):
            commit(s, "r", i=i, msgs=[{"n": n, "t": "z" * 400} for n in range(i)])
        s.snapshot()
        commit(s, "r", i=6)
        f = s.fork("r", 3, "f")
        assert (f.run, f.id, f.parent, f.origin) == ("f", 1, None, ("r", 3))
        assert s.state("f") == s.state("r", at=3)
        g = s.fork("r", 6, "g")  # from an unfolded checkpoint
        assert g.origin == ("r", 6) and s.state("g") == s.state("r")
        commit(s, "f", i=100)
        assert s.state("r", at=3)["i"] == 3 and s.state("f")["i"] == 100
        assert s.get("r", "i") == 6
        with pytest.raises(errors.RunExistsError):
            s.fork("r", 1, "f")
        with pytest.raises(errors.RunExistsError):
            s.fork("r", 1, "r")
        want = {run: [s.state(run, at=i) for i in range(1, s.head(run).id + 1)]  # type: ignore[union-attr]
                for run in ("r", "f", "g")}
        heads = {run: s.head(run) for run in ("r", "f", "g")}
    for crashing in (True, False):
        s = agentwal.open(path, **SMALL)
        assert {run: s.history(run)[-1].origin for run in ("r", "f", "g")} == {
            "r": None, "f": ("r", 3), "g": ("r", 6)}
        assert {run: s.head(run) for run in ("r", "f", "g")} == heads
        assert {run: [s.state(run, at=i) for i in range(1, s.head(run).id + 1)]  # type: ignore[union-attr]
                for run in ("r", "f", "g")} == want
        if crashing:
            crash_store(s)
        else:
            s.close()


def test_a_fork_survives_a_crash_before_any_fold(path: str) -> None:
    s = agentwal.open(path)
    commit(s, "r", a=1)
    f = s.fork("r", 1, "f")
    crash_store(s)
    with agentwal.open(path) as s:
        assert s.head("f") == f and f.origin == ("r", 1)
        assert s.state("f") == {"a": 1}


def test_fork_origin_is_covered_by_the_hash(store: agentwal.Store) -> None:
    from agentwal.codec import checkpoint_hash, encode_delta, encode_meta

    commit(store, "r", a=1)
    f = store.fork("r", 1, "f")
    _blob, _flags, digest = encode_delta({"a": agentwal.codec.encode_value("a", 1)})
    want = checkpoint_hash(bytes(32), "f", 1, None, f.created_at, encode_meta({}), ("r", 1),
                           digest)
    assert f.hash == want.hex()
    other = checkpoint_hash(bytes(32), "f", 1, None, f.created_at, encode_meta({}), None,
                            digest)
    assert f.hash != other.hex()


# -- storage --------------------------------------------------------------------------

def test_appended_lists_are_stored_once(path: str) -> None:
    """100 appends of ~1 KiB: LMDB holds about the list once, not 100 times."""
    msgs: list[str] = []
    with agentwal.open(path, durability="none") as s:
        for i in range(100):
            msgs.append(random.Random(i).randbytes(500).hex())
            commit(s, "r", messages=msgs)
            if i % 25 == 24:
                s.snapshot()
        size = os.path.getsize(os.path.join(path, "snapshot", "data.mdb"))
    whole = len(agentwal.codec.encode_value("m", msgs))
    assert size < 4 * whole  # storing each version whole would be ~50x


def test_damaged_history_is_corruption(path: str) -> None:
    with agentwal.open(path) as s:
        for i in range(1, 5):
            commit(s, "r", i=i, log=[f"entry {i}"] * 200)
    env = lmdb.open(os.path.join(path, "snapshot"), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"delta", txn=txn)
        key = (1).to_bytes(8, "big") + (2).to_bytes(8, "big")
        raw = bytearray(txn.get(key, db=db))
        raw[-1] ^= 0xFF
        txn.put(key, bytes(raw), db=db)
        objects = env.open_db(b"objects", txn=txn)
        first = txn.cursor(db=objects)
        assert first.first()
        txn.delete(first.key(), db=objects)
    env.close()
    with agentwal.open(path) as s:
        with pytest.raises(errors.CorruptionError, match="checksum"):
            s.state("r", at=2)  # at 3 every key has a newer version
        with pytest.raises(errors.CorruptionError, match="missing"):
            s.state("r", at=1)
        assert s.state("r", at=4)["i"] == 4  # the head's fast path is intact


def _delta_entries(store: agentwal.Store) -> int:
    """Entries of every folded delta (each has its ``versions`` entry)."""
    snap = store._engine._snap
    assert snap is not None
    txn = snap.begin_read()
    try:
        return sum(len(history.decode_refs(v[4:], manifest=False))
                   for _k, v in snap.raw(txn).entries("delta"))
    finally:
        snap.end_read(txn)
