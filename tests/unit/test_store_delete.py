"""store.delete_run: hidden at once, removed by the next fold, durable, fresh when recreated."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal import ConflictError, RunNotFoundError, errors, failpoints
from agentwal.testing import SimulatedDisk
from agentwal.testing import crash as crash_store
from tests.helpers import check_history_counts, commit

BIG = "x" * 3000  # a shared, content-addressed object


def _fill(store: agentwal.Store, run: str, n: int, **extra: Any) -> None:
    for i in range(1, n + 1):
        commit(store, run, step=i, log=[f"{run}-{j}-{'y' * 300}" for j in range(i)], **extra)


def _assert_gone(store: agentwal.Store, run: str) -> None:
    assert store.head(run) is None
    assert store.history(run) == []
    assert run not in store.runs()
    assert store.get(run, "step", "absent") == "absent"
    for call in (lambda: store.state(run), lambda: store.state(run, at=1),
                 lambda: store.get(run, "step", at=1), lambda: store.diff(run, 1, 2),
                 lambda: store.rollback_to(run, 1), lambda: store.fork(run, 1, run + "-f"),
                 lambda: store.history(run, before=2), lambda: store.delete_run(run)):
        with pytest.raises(RunNotFoundError):
            call()
    with store.begin(run) as txn:
        assert dict(txn.items()) == {} and txn.get("step") is None
        txn.rollback()


@pytest.mark.parametrize("folded", [False, True])
def test_delete_hides_the_run_at_once(store: agentwal.Store, folded: bool) -> None:
    _fill(store, "r", 40, big=BIG)
    _fill(store, "other", 3, big=BIG)
    if folded:
        store.snapshot()
    store.delete_run("r")
    _assert_gone(store, "r")
    assert store.runs() == ["other"]
    assert store.state("other")["step"] == 3 and store.state("other")["big"] == BIG
    store.snapshot()  # the fold removes it from LMDB
    _assert_gone(store, "r")
    assert store.state("other", at=2)["big"] == BIG  # the shared object stays


def test_the_fold_removes_the_run_and_frees_what_only_it_used(path: str) -> None:
    with agentwal.open(path, durability="none") as store:
        _fill(store, "keep", 3, big=BIG)
        store.snapshot()
        baseline = store.stats()
        counts = check_history_counts(store)
        _fill(store, "r", 70, big=BIG, own="z" * 5000)
        store.snapshot()
        assert store.stats()["versions"] > baseline["versions"] + 70
        store.delete_run("r")
        store.snapshot()
        after = store.stats()
        for key in ("folded_runs", "state_keys", "checkpoints", "deltas", "manifests",
                    "versions", "objects"):
            assert after[key] == baseline[key], key
        assert check_history_counts(store) == counts
        assert store.state("keep") == {"step": 3, "big": BIG,
                                       "log": [f"keep-{j}-{'y' * 300}" for j in range(3)]}


def test_recreated_run_starts_fresh(store: agentwal.Store) -> None:
    _fill(store, "r", 5)
    old = store.head("r")
    store.snapshot()
    store.delete_run("r")
    c1 = commit(store, "r", fresh=True)
    assert (c1.id, c1.parent, c1.origin) == (1, None, None)
    assert old is not None and c1.hash != old.hash
    assert store.state("r") == {"fresh": True} and store.history("r") == [c1]
    with pytest.raises(errors.CheckpointNotFoundError):
        store.state("r", at=2)
    for fold in (False, True):
        if fold:
            store.snapshot()
        assert store.history("r") == [c1]
        assert store.state("r", at=1) == {"fresh": True}
    c2 = commit(store, "r", more=1)
    assert (c2.id, c2.parent) == (2, 1)


def test_recreated_run_survives_reopen(path: str) -> None:
    with agentwal.open(path, durability="none") as store:
        _fill(store, "r", 3)
        store.delete_run("r")
        commit(store, "r", a=1)
        store.delete_run("r")
        commit(store, "r", b=2)
        commit(store, "r", b=3)
        hist = store.history("r")
    with agentwal.open(path) as store:
        assert store.history("r") == hist and [c.id for c in hist] == [2, 1]
        assert store.state("r") == {"b": 3} and store.state("r", at=1) == {"b": 2}
        check_history_counts(store)


def test_a_transaction_begun_before_the_delete_conflicts(store: agentwal.Store) -> None:
    commit(store, "r", a=1)
    early = store.begin("r")
    early["b"] = 2
    blind = store.begin("r")  # writes only: it read nothing, still refused
    blind["c"] = 3
    store.delete_run("r")
    with pytest.raises(ConflictError) as ei:
        early.commit()
    assert ei.value.deleted and ei.value.code == "conflict" and "delete_run" in str(ei.value)
    with pytest.raises(ConflictError):
        blind.commit()
    assert store.head("r") is None  # nothing applied
    with store.begin("r") as txn:  # begun after: a new run
        txn["d"] = 4
    assert txn.checkpoint is not None and txn.checkpoint.id == 1
    assert store.state("r") == {"d": 4}


def test_an_old_view_keeps_reading_the_deleted_run(store: agentwal.Store) -> None:
    commit(store, "r", a=1)
    commit(store, "r", a=2)
    reader = store.begin("r")  # its snapshot predates the deletion
    store.delete_run("r")
    commit(store, "r", z=9)  # the new incarnation, ids from 1 again
    assert reader.get("a") == 2 and dict(reader.items()) == {"a": 2}
    assert store.state("r") == {"z": 9} and store.state("r", at=1) == {"z": 9}
    reader.rollback()


def test_delete_is_durable_in_every_mode(tmp_path: Path) -> None:
    """The delete record is fsynced even with durability "none": a power cut keeps it."""
    disk = SimulatedDisk()
    path = str(tmp_path / "s")
    store = agentwal.open(path, fs=disk, durability="none", segment_bytes=65536)
    commit(store, "r", a=1)
    store.sync()
    commit(store, "other", b=1)  # not synced by itself; the delete's fsync covers it
    store.delete_run("r")
    images = [disk.crash_image(m, seed=s) for m in ("strict", "prefix", "reorder")
              for s in range(3)]
    crash_store(store)
    for image in images:
        s = agentwal.open(path, fs=image, durability="none", segment_bytes=65536)
        try:
            assert s.head("r") is None and s.runs() == ["other"]
        finally:
            crash_store(s)


def test_delete_replays_after_a_crash_and_the_next_fold_removes_it(path: str) -> None:
    store = agentwal.open(path, durability="sync")
    _fill(store, "r", 4)
    store.snapshot()
    # The deletion asks the fold thread for a fold at once: make it fail, so the crash
    # below finds LMDB still holding the run (as a crash before that fold would).
    failpoints.arm("delete_run_fold_before_commit", exc=errors.DiskFullError(path))
    store.delete_run("r")
    crash_store(store)  # a crash: LMDB still has the run
    failpoints.disarm()
    with agentwal.open(path) as store:
        _assert_gone(store, "r")
        assert store.stats()["folded_runs"] == 1
        store.snapshot()
        assert store.stats()["folded_runs"] == 0
        _assert_gone(store, "r")


def test_forks_of_a_deleted_run_keep_their_state_and_origin(store: agentwal.Store) -> None:
    _fill(store, "r", 6, big=BIG)
    f = store.fork("r", 4, "f")
    store.delete_run("r")
    store.snapshot()
    assert store.state("f")["step"] == 4 and store.state("f")["big"] == BIG
    assert store.history("f") == [f] and f.origin == ("r", 4)
    commit(store, "f", step=5)
    assert store.state("f", at=1)["step"] == 4


def test_effects_ledger_entries_survive_the_deletion(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        assert txn.effect("call", lambda ctx: "done", mode="at_least_once") == "done"
        txn["a"] = 1
    store.delete_run("r")
    store.snapshot()
    (e,) = store.effects(run="r")
    assert (e.name, e.status, e.result) == ("call", "done", "done")


def test_a_read_only_store_sees_the_deletion(path: str) -> None:
    with agentwal.open(path, durability="none") as writer:
        commit(writer, "r", a=1)
        commit(writer, "s", a=1)
        writer.snapshot()
        reader = agentwal.open(path, readonly=True)
        try:
            assert reader.runs() == ["r", "s"]
            writer.delete_run("r")
            assert reader.runs() == ["r", "s"]  # as of its open
            reader.refresh()
            assert reader.runs() == ["s"] and reader.head("r") is None
            writer.snapshot()
            reader.refresh()
            assert reader.runs() == ["s"]
        finally:
            reader.close()


def test_delete_errors(store: agentwal.Store) -> None:
    with pytest.raises(RunNotFoundError):
        store.delete_run("nope")
    with pytest.raises(errors.InvalidKeyError):
        store.delete_run("")
    commit(store, "r", a=1)
    store.delete_run("r")
    with pytest.raises(RunNotFoundError):
        store.delete_run("r")


def test_delete_on_a_read_only_or_closed_store(path: str) -> None:
    with agentwal.open(path) as s:
        commit(s, "r", a=1)
    with agentwal.open(path, readonly=True) as ro, pytest.raises(errors.ReadOnlyError):
        ro.delete_run("r")
    s = agentwal.open(path)
    s.close()
    with pytest.raises(errors.StoreClosedError):
        s.delete_run("r")


def test_a_failed_delete_record_leaves_the_run(store: agentwal.Store) -> None:
    commit(store, "r", a=1)
    failpoints.arm("before_wal_append", exc=agentwal.DiskFullError("wal", "injected"))
    with pytest.raises(agentwal.DiskFullError):
        store.delete_run("r")
    assert store.state("r") == {"a": 1}
    assert commit(store, "r", a=2).id == 2  # the head came back
    store.delete_run("r")
    assert store.head("r") is None


def test_delete_while_other_runs_commit(store: agentwal.Store) -> None:
    stop = threading.Event()
    errors_seen: list[BaseException] = []

    def work() -> None:
        # Paced: a writer that commits flat out outruns the folds (the engine has no
        # back-pressure), and snapshot() below would wait on an ever larger fold.
        n = 0
        while not stop.is_set() and n < 5000:
            try:
                commit(store, "busy", n=n)
            except BaseException as exc:
                errors_seen.append(exc)
                return
            n += 1
            time.sleep(0.0005)

    t = threading.Thread(target=work)
    t.start()
    try:
        for i in range(20):
            commit(store, "r", i=i)
            store.delete_run("r")
            if i % 5 == 0:
                store.snapshot()
    finally:
        stop.set()
        t.join()
    assert not errors_seen
    _assert_gone(store, "r")
    assert store.head("busy") is not None


def test_the_wal_dump_shows_deletions(path: str) -> None:
    from click.testing import CliRunner

    from agentwal.cli import main

    store = agentwal.open(path)
    commit(store, "r", a=1)
    store.delete_run("r")
    crash_store(store)
    out = CliRunner().invoke(main, ["wal", path, "--json"])
    assert out.exit_code == 0, out.output
    import json

    rows = json.loads(out.output)["records"]
    assert [r["type"] for r in rows] == ["commit", "delete_run"]
    assert (rows[1]["run"], rows[1]["id"]) == ("r", 1)


@pytest.mark.parametrize("where", ["memtable", "lmdb", "deleted-unfolded"])
def test_a_recreated_run_calls_its_effects_afresh(path: str, where: str) -> None:
    """Default effect keys carry the run id's epoch (the LSN of its last deletion), so a
    run created again under a deleted id derives new keys: its steps call again instead
    of meeting the old run's results, and the old entries stay in the ledger. Wherever
    the old run was (memtable, LMDB, LMDB with the deletion not folded yet), and after a
    crash (the deletion replayed) and a reopen (the epoch read from LMDB)."""
    calls: list[str] = []

    def fn(ctx: agentwal.EffectContext) -> str:
        calls.append(ctx.key)
        return f"call {len(calls)}"

    def again(want: str) -> None:  # the first step of the run, not committed
        with store.begin("r") as txn:
            assert txn.effect("step", fn, mode="at_least_once") == want
            txn.rollback()

    store = agentwal.open(path, durability="none")
    try:
        with store.begin("r") as txn:
            assert txn.effect("step", fn, mode="at_least_once") == "call 1"
            txn.defer("notify", mode="at_least_once")
            txn["done"] = True
        if where != "memtable":
            store.snapshot()
        store.delete_run("r")
        if where != "deleted-unfolded":
            store.snapshot()
        again("call 2")  # the same step of the new run: a new key, a new call
        assert calls[0] != calls[1]
        again("call 2")  # within the new run, keys still dedup
        crash_store(store)  # crash: the deletion (if unfolded) is replayed
        store = agentwal.open(path, durability="none")
        again("call 2")
        store.snapshot()
        store.close()
        store = agentwal.open(path, durability="none")
        again("call 2")  # the epoch read back from LMDB
        with store.begin("r") as txn:
            txn.defer("notify", mode="at_least_once")
            txn["done"] = True
        notify = [e.key for e in store.effects(run="r") if e.name == "notify"]
        assert len(notify) == 2 and notify[0] != notify[1]  # the old one stays, pending
        assert len(calls) == 2
        assert store.verify().ok
    finally:
        store.close()


def test_outbox_keys_of_a_recreated_run_are_new_live_and_on_replay(path: str) -> None:
    """Outbox entries derive their default keys at publish and again at replay: both use
    the epoch the run id had when the commit was made."""
    store = agentwal.open(path, durability="none")
    with store.begin("r") as txn:
        txn.defer("notify", mode="at_least_once")
        txn["a"] = 1
    store.delete_run("r")  # not folded: the epoch is the tombstone's LSN
    with store.begin("r") as txn:
        txn.defer("notify", mode="at_least_once")
        txn["a"] = 2
    live = sorted(e.key for e in store.effects(run="r"))
    assert len(live) == 2 and live[0] != live[1]
    crash_store(store)  # both commits and the deletion are replayed
    with agentwal.open(path, durability="none") as store:
        assert sorted(e.key for e in store.effects(run="r")) == live
        store.snapshot()
        assert sorted(e.key for e in store.effects(run="r")) == live
        assert store.verify().ok
