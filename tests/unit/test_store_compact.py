"""store.compact (keep_last, older_than, runs, fork origins, vacuum) and open(retain=)."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import struct
import threading
import time
from typing import Any

import cbor2
import pytest

import agentwal
from agentwal import (
    CheckpointNotFoundError,
    KeepFor,
    KeepLast,
    RunNotFoundError,
    StoreBusyError,
    failpoints,
)
from tests.helpers import check_history_counts, commit, lmdb_values

U64 = struct.Struct(">Q")


def _step(i: int, run: str = "r") -> dict[str, Any]:
    """The writes of checkpoint ``i``: a growing list (list nodes), a big value, small keys."""
    out: dict[str, Any] = {"step": i, "log": [f"{run}{j}-{'m' * 200}" for j in range(i)]}
    if i % 5 == 0:
        out["big"] = f"{i}" * 2000
    if i % 7 == 0:
        out["gone"] = None
    else:
        out["gone"] = i
    return out


def build(store: agentwal.Store, run: str, n: int, model: dict[int, dict[str, Any]],
          start: int = 1) -> None:
    """Commit checkpoints ``start..n`` of ``run``; ``model[i]`` is the state at ``i``."""
    state = dict(model.get(start - 1, {}))
    for i in range(start, n + 1):
        writes = _step(i, run)
        with store.begin(run) as txn:
            for k, v in writes.items():
                if v is None:
                    txn.delete(k)
                    state.pop(k, None)
                else:
                    txn[k] = v
                    state[k] = v
        model[i] = dict(state)


def check(store: agentwal.Store, run: str, model: dict[int, dict[str, Any]],
          kept: set[int]) -> None:
    """Kept checkpoints read as the model says; the others raise CheckpointNotFoundError."""
    head = max(model)
    assert [c.id for c in store.history(run)] == sorted(kept, reverse=True)
    for i in model:
        if i in kept:
            assert store.state(run, at=i) == model[i], i
            assert store.get(run, "step", at=i) == i
        else:
            with pytest.raises(CheckpointNotFoundError):
                store.state(run, at=i)
            with pytest.raises(CheckpointNotFoundError):
                store.get(run, "step", at=i)
            with pytest.raises(CheckpointNotFoundError):
                store.diff(run, i, head)
    assert store.state(run) == model[head]


def test_keep_last_drops_the_rest_and_kept_ones_read_as_before(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 100, model)
    other: dict[int, dict[str, Any]] = {}
    build(store, "o", 10, other)
    store.snapshot()
    build(store, "r", 103, model, start=101)  # unfolded ones too: compact folds first
    report = store.compact(keep_last=10)
    kept = set(range(94, 104))
    assert report.checkpoints_dropped == 93 + 0 and report.runs == {"r": 93}
    assert report.bytes_freed > 0 and report.objects_freed > 0
    assert report.manifests_written == 1  # 94 starts the kept block, 96 has one
    check(store, "r", model, kept)
    check(store, "o", other, set(range(1, 11)))  # keep_last=10: nothing to drop
    d = store.diff("r", 94, 103)
    assert d.changed["step"] == (94, 103)
    check_history_counts(store)
    assert store.stats()["checkpoints"] == 10 + 10


def test_the_head_is_always_kept(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 40, model)
    report = store.compact(keep_last=1)
    assert report.checkpoints_dropped == 39
    check(store, "r", model, {40})
    report = store.compact(older_than=dt.timedelta(0))  # everything is older than now
    assert report.checkpoints_dropped == 0
    check(store, "r", model, {40})


def test_older_than(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 20, model)
    time.sleep(0.3)
    t_mid = time.time()
    build(store, "r", 30, model, start=21)
    assert store.compact(older_than=dt.timedelta(days=1)).checkpoints_dropped == 0
    age = dt.timedelta(seconds=time.time() - t_mid + 0.15)  # the cut falls in the pause
    report = store.compact(older_than=age)
    assert report.checkpoints_dropped == 20
    check(store, "r", model, set(range(21, 31)))


def test_keep_last_or_older_than_keeps_what_either_keeps(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 20, model)
    time.sleep(1.0)  # checkpoint 20 is >= 1 s older than 21: the age cuts in that gap
    t_mid = time.time()
    build(store, "r", 25, model, start=21)

    def age() -> dt.timedelta:  # measured at each call, with 0.5 s of slack either way
        return dt.timedelta(seconds=time.time() - t_mid + 0.5)

    store.compact(keep_last=10, older_than=age())  # the last 10 win over the age
    check(store, "r", model, set(range(16, 26)))
    store.compact(keep_last=2, older_than=age())  # the age wins over the last 2
    check(store, "r", model, set(range(21, 26)))


def test_no_criterion_drops_nothing(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 10, model)
    report = store.compact()
    assert (report.checkpoints_dropped, report.bytes_freed, report.runs) == (0, 0, {})
    assert not report.vacuumed
    check(store, "r", model, set(range(1, 11)))


def test_only_the_runs_named(store: agentwal.Store) -> None:
    a: dict[int, dict[str, Any]] = {}
    b: dict[int, dict[str, Any]] = {}
    build(store, "a", 10, a)
    build(store, "b", 10, b)
    assert store.compact(keep_last=3, runs=["a"]).runs == {"a": 7}
    check(store, "a", a, {8, 9, 10})
    check(store, "b", b, set(range(1, 11)))
    with pytest.raises(RunNotFoundError):
        store.compact(keep_last=3, runs=["a", "nope"])
    with pytest.raises(TypeError):
        store.compact(keep_last=3, runs="a")  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"keep_last": 0}, ValueError), ({"keep_last": -1}, ValueError),
    ({"keep_last": True}, TypeError), ({"keep_last": 1.5}, TypeError),
    ({"older_than": 5}, TypeError), ({"older_than": dt.timedelta(seconds=-1)}, ValueError),
])
def test_bad_arguments(store: agentwal.Store, kwargs: dict[str, Any],
                       exc: type[Exception]) -> None:
    commit(store, "r", a=1)
    with pytest.raises(exc):
        store.compact(**kwargs)


def test_compact_on_read_only_and_closed_stores(path: str) -> None:
    with agentwal.open(path) as s:
        commit(s, "r", a=1)
    with agentwal.open(path, readonly=True) as ro, pytest.raises(agentwal.ReadOnlyError):
        ro.compact(keep_last=1)
    s = agentwal.open(path)
    s.close()
    with pytest.raises(agentwal.StoreClosedError):
        s.compact(keep_last=1)


def test_fork_origins_are_kept(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 50, model)
    store.fork("r", 7, "f")
    store.snapshot()
    store.fork("r", 12, "g")  # not folded yet: protected all the same
    report = store.compact(keep_last=5)
    check(store, "r", model, {7, 12, 46, 47, 48, 49, 50})
    assert report.manifests_written == 3  # 7, 12 and 46 each start a block
    assert store.state("f") == model[7] and store.state("g") == model[12]
    # The fork's first checkpoint goes; its origin still protects r/7.
    for i in range(2, 6):
        commit(store, "f", n=i)
    store.compact(keep_last=2)
    assert [c.id for c in store.history("f")] == [5, 4]
    check(store, "r", model, {7, 12, 49, 50})
    store.compact(keep_last=2, keep_fork_origins=False)
    check(store, "r", model, {49, 50})
    check_history_counts(store)


def test_a_gap_in_history_and_paging_across_it(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 40, model)
    store.fork("r", 3, "f")
    store.compact(keep_last=4)
    assert [c.id for c in store.history("r")] == [40, 39, 38, 37, 3]
    assert [c.id for c in store.history("r", before=37)] == [3]
    assert [c.id for c in store.history("r", before=20)] == [3]  # a dropped bound pages on
    assert [c.id for c in store.history("r", limit=2, before=39)] == [38, 37]
    with pytest.raises(CheckpointNotFoundError):
        store.history("r", before=41)
    assert store.rollback_to("r", 3).id == 41
    assert store.state("r") == model[3]
    with pytest.raises(CheckpointNotFoundError):
        store.rollback_to("r", 5)
    with pytest.raises(CheckpointNotFoundError):
        store.fork("r", 5, "h")


def test_kept_checkpoints_record_their_dropped_parents_hash(store: agentwal.Store) -> None:
    commit(store, "r", a=0)
    for i in range(1, 40):
        commit(store, "r", a=i)
    store.fork("r", 10, "f")
    hashes = {c.id: c.hash for c in store.history("r")}
    store.compact(keep_last=3)
    snap = store._engine._snap
    assert snap is not None
    txn = snap.begin_read()
    try:
        info = snap.reader(txn).run_info("r")
        assert info is not None and info.count == 4
        for cid, parent_hash in ((10, hashes[9]), (38, hashes[37]), (39, None), (40, None)):
            k = U64.pack(info.number) + U64.pack(cid)
            rec = cbor2.loads(snap.raw(txn).get("ckpt", k)[4:])
            assert rec[5].hex() == hashes[cid]
            # [..., origin, outbox digest | None, the dropped parent's hash]
            assert (rec[8].hex() if len(rec) == 9 else None) == parent_hash, cid
    finally:
        snap.end_read(txn)


def test_bytes_freed_is_the_bytes_of_the_values_deleted(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 70, model)
    store.snapshot()
    before = lmdb_values(store)
    report = store.compact(keep_last=20)
    after = lmdb_values(store)
    gone = {k: n for k, n in before.items() if k not in after}
    assert report.bytes_freed == sum(gone.values())
    assert report.objects_freed == sum(1 for db, k in gone if db == "objects" and len(k) == 8)
    assert report.checkpoints_dropped == sum(1 for db, _k in gone if db == "ckpt") == 50
    new = {k: n for k, n in after.items() if k not in before}
    assert all(db == "manifest" for db, _k in new)
    rewritten = [k for k in after if k in before and after[k] != before[k]
                 and k[0] in ("ckpt", "manifest")]
    assert report.bytes_written == sum(new.values()) + sum(after[k] for k in rewritten)


def test_compaction_survives_reopen_and_history_keeps_growing(path: str) -> None:
    model: dict[int, dict[str, Any]] = {}
    with agentwal.open(path, durability="none") as store:
        build(store, "r", 80, model)
        store.compact(keep_last=15)
        build(store, "r", 120, model, start=81)  # lists keep chaining off the kept head
    with agentwal.open(path) as store:
        check(store, "r", model, set(range(66, 121)))
        store.compact(keep_last=15)
        check(store, "r", model, set(range(106, 121)))
        assert store.compact(keep_last=15).checkpoints_dropped == 0  # stable
        check_history_counts(store)


def test_a_failed_compaction_changes_nothing(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 40, model)
    failpoints.arm("compact_before_commit")
    with pytest.raises(failpoints.FailpointFired):
        store.compact(keep_last=2)
    check(store, "r", model, set(range(1, 41)))
    check_history_counts(store)
    assert store.compact(keep_last=2).checkpoints_dropped == 38


def test_commits_continue_while_compaction_holds_the_fold_lock(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 40, model)
    done: list[Any] = []

    def during(_name: str) -> None:  # LMDB write transaction open, fold lock held
        t = threading.Thread(target=lambda: done.append(commit(store, "r", late=1)))
        t.start()
        t.join(10)
        done.append(store.state("r", at=5) == model[5])  # reads see the old state

    failpoints.arm("compact_before_commit", "call", fn=during)
    store.compact(keep_last=3)
    assert len(done) == 2 and done[0].id == 41 and done[1] is True
    assert [c.id for c in store.history("r")] == [41, 40, 39, 38]
    assert store.state("r") == {**model[40], "late": 1}


def test_compaction_races_threads_committing(store: agentwal.Store) -> None:
    stop = threading.Event()
    seen: list[BaseException] = []

    def work(run: str) -> None:
        n = 0
        while not stop.is_set() and n < 3000:  # paced: see test_store_delete
            try:
                commit(store, run, n=n, log=list(range(n % 100)))
                if n % 10 == 0:
                    store.state(run, at=max(1, n - 1))
            except CheckpointNotFoundError:
                pass  # compaction got there first
            except BaseException as exc:
                seen.append(exc)
                return
            n += 1
            time.sleep(0.0005)

    threads = [threading.Thread(target=work, args=(r,)) for r in ("a", "b")]
    for t in threads:
        t.start()
    try:
        for _ in range(6):
            store.compact(keep_last=5)
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not seen, seen
    store.compact(keep_last=5)
    for run in ("a", "b"):
        head = store.head(run)
        assert head is not None
        assert [c.id for c in store.history(run)] == list(range(head.id, head.id - 5, -1))
        assert store.state(run)["n"] == head.id - 1
    check_history_counts(store)


def test_a_kept_block_reads_from_its_manifest_and_the_versions_after_it(
        store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 100, model)
    store.compact(keep_last=70)  # keeps 31..100: only 31, the block's start, gets a manifest
    snap = store._engine._snap
    assert snap is not None
    txn = snap.begin_read()
    try:
        reader = snap.reader(txn)
        info = reader.run_info("r")
        assert info is not None
        got = [reader._manifest_before(info.number, c) for c in (31, 33, 63, 100)]
        # the dropped checkpoints' versions went with their deltas
        assert [reader._version_of(info.number, b"big", c) for c in (30, 34, 100)] == [
            None, None, 100]
    finally:
        snap.end_read(txn)
    assert got == [31, 31, 31, 31]
    assert store.stats()["manifests"] == 1
    check(store, "r", model, set(range(31, 101)))


# -- vacuum --------------------------------------------------------------------------


def test_vacuum_shrinks_the_file(path: str) -> None:
    model: dict[int, dict[str, Any]] = {}
    with agentwal.open(path, durability="none") as store:
        build(store, "r", 300, model)
        store.snapshot()
        data = os.path.join(path, "snapshot", "data.mdb")
        size = os.path.getsize(data)
        report = store.compact(keep_last=10, vacuum=True)
        assert report.vacuumed and report.file_bytes_before == size
        assert report.file_bytes_after == os.path.getsize(data)
        assert report.file_bytes_after < size * 0.7, (size, report)  # 290 of 300 dropped
        check(store, "r", model, set(range(291, 301)))
        build(store, "r", 320, model, start=301)  # the reopened environment takes folds
        store.snapshot()
        assert not os.path.exists(data + ".vacuum")
    with agentwal.open(path) as store:
        check(store, "r", model, set(range(291, 321)))
        check_history_counts(store)


def _read_for_a_while(store: agentwal.Store, seconds: float) -> None:
    """A thread begins a transaction (an LMDB read), reads, and rolls it back ``seconds`` later.

    Returns once the read is open. (A transaction is its thread's: the rollback
    happens in the thread that began it.)
    """
    begun = threading.Event()

    def hold() -> None:
        txn = store.begin("r")
        assert txn.get("step") is not None
        begun.set()
        time.sleep(seconds)
        txn.rollback()

    threading.Thread(target=hold, daemon=True).start()
    assert begun.wait(30)


def test_vacuum_waits_for_open_reads(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 30, model)
    _read_for_a_while(store, 0.3)  # another thread's transaction holds an LMDB read
    started = time.monotonic()
    report = store.compact(keep_last=3, vacuum=True)
    assert report.vacuumed and time.monotonic() - started >= 0.25
    check(store, "r", model, {28, 29, 30})


def test_vacuum_gives_up_on_a_read_that_stays_open(store: agentwal.Store,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from agentwal.local import maintenance as store_mod

    monkeypatch.setattr(store_mod, "_VACUUM_WAIT", 0.2)
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 30, model)
    txn = store.begin("r")
    txn.get("step")
    with pytest.raises(StoreBusyError) as ei:
        store.compact(keep_last=3, vacuum=True)
    assert ei.value.code == "store_busy" and "compaction itself is done" in str(ei.value)
    assert txn.get("step") == 30  # the open transaction still reads
    txn.rollback()
    check(store, "r", model, {28, 29, 30})  # compacted, not vacuumed
    assert not os.path.exists(os.path.join(store.path, "snapshot", "data.mdb.vacuum"))
    assert store.compact(vacuum=True).vacuumed


def test_vacuum_refuses_while_another_store_of_this_process_shares_the_file(
        store: agentwal.Store) -> None:
    commit(store, "r", a=1)
    commit(store, "r", a=2)
    store.snapshot()
    ro = agentwal.open(store.path, readonly=True)
    try:
        with pytest.raises(StoreBusyError):
            store.compact(keep_last=1, vacuum=True)
        assert [c.id for c in store.history("r")] == [2]
    finally:
        ro.close()
    assert store.compact(vacuum=True).vacuumed


def test_a_leftover_copy_is_removed_on_open(path: str) -> None:
    with agentwal.open(path) as s:
        commit(s, "r", a=1)
    leftover = os.path.join(path, "snapshot", "data.mdb.vacuum")
    with open(leftover, "wb") as f:
        f.write(b"half a copy")
    with agentwal.open(path, readonly=True) as ro:  # a reader leaves it alone
        assert os.path.exists(leftover) and ro.state("r") == {"a": 1}
    with agentwal.open(path) as s:
        assert not os.path.exists(leftover) and s.state("r") == {"a": 1}


# -- retain= -------------------------------------------------------------------------


def _wait_for(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_retain_keep_last_is_applied_by_the_fold_thread(path: str) -> None:
    store = agentwal.open(path, durability="none", wal_max_bytes=16 << 10,
                          segment_bytes=4096, retain=KeepLast(5))
    try:
        store._engine._retain_every = store._engine._retain_next = 0.0
        model: dict[int, dict[str, Any]] = {}
        build(store, "r", 60, model)
        for _ in range(20):  # incompressible: the WAL passes wal_max_bytes, a fold runs
            commit(store, "noise", pad=os.urandom(1500))
        _wait_for(lambda: store.stats()["retention_passes"] > 0)
        store.snapshot()
        store._engine._retain_next = 0.0
        passes = store.stats()["retention_passes"]
        with store._engine._lock:
            store._engine._want_fold()  # one more background fold, then a pass
        _wait_for(lambda: store.stats()["retention_passes"] > passes)
        assert [c.id for c in store.history("r")] == [60, 59, 58, 57, 56]
        assert store.state("r", at=56) == model[56]
        assert "retention_error" not in store.stats()
    finally:
        store.close()


def test_retain_is_rate_limited(path: str) -> None:
    store = agentwal.open(path, durability="none", wal_max_bytes=16 << 10,
                          segment_bytes=4096, retain=(KeepLast(5), KeepFor(dt.timedelta(0))))
    try:
        store._engine._retain_next = 0.0  # as if a minute had passed since the open
        for _ in range(60):
            commit(store, "r", pad=os.urandom(1500))
        _wait_for(lambda: store.stats()["folds"] >= 3)
        time.sleep(0.2)
        # One pass (the first commit found it due), then none within the minute.
        assert store.stats()["retention_passes"] == 1
    finally:
        store.close()


def test_retain_arguments() -> None:
    with pytest.raises(ValueError):
        KeepLast(0)
    with pytest.raises(ValueError):
        KeepLast(True)
    with pytest.raises(ValueError):
        KeepFor(dt.timedelta(seconds=-1))
    with pytest.raises(ValueError):
        KeepFor(5)  # type: ignore[arg-type]
    assert KeepLast(3) == KeepLast(3) and hash(KeepFor(dt.timedelta(1)))
    with pytest.raises(AttributeError):
        KeepLast(3).n = 4  # type: ignore[misc]


@pytest.mark.parametrize(("retain", "exc"), [
    ("x", TypeError), (5, TypeError), ((KeepLast(1), KeepLast(2)), ValueError),
    ((KeepFor(dt.timedelta(0)), KeepFor(dt.timedelta(1))), ValueError),
])
def test_open_refuses_a_bad_retain(path: str, retain: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        agentwal.open(path, retain=retain)


def test_a_read_only_store_takes_no_retain(path: str) -> None:
    with agentwal.open(path) as s:
        commit(s, "r", a=1)
    with pytest.raises(ValueError):
        agentwal.open(path, readonly=True, retain=KeepLast(3))


# -- damage is still told apart from compaction ----------------------------------------------


def _remove(store: agentwal.Store, db: str, run: str, cid: int) -> None:
    """Delete one LMDB record of ``run`` behind the store's back (damage, not compaction)."""
    snap = store._engine._snap
    assert snap is not None
    with snap.env.begin(write=True) as txn:
        info = snap.reader(txn).run_info(run)
        assert info is not None
        assert txn.delete(U64.pack(info.number) + U64.pack(cid), db=getattr(snap._dbs, db))


def test_a_missing_checkpoint_record_is_damage_not_a_gap(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 40, model)
    store.compact(keep_last=10)  # keeps 31..40
    _remove(store, "ckpt", "r", 35)  # no kept neighbour says it was dropped
    with pytest.raises(agentwal.CorruptionError):
        store.history("r")
    with pytest.raises(agentwal.CorruptionError):
        store.state("r", at=35)
    with pytest.raises(CheckpointNotFoundError):  # a real gap still reads as one
        store.state("r", at=20)


def test_a_missing_manifest_of_a_kept_checkpoint_is_damage(store: agentwal.Store) -> None:
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 70, model)
    store.compact(keep_last=40)  # keeps 31..70; 31, the block's start, gets a manifest
    _remove(store, "manifest", "r", 31)
    for cid in (31, 50, 69):  # never an older state: the block start says it has a manifest
        with pytest.raises(agentwal.CorruptionError, match="manifest of checkpoint 'r'/31"):
            store.state("r", at=cid)
        with pytest.raises(agentwal.CorruptionError, match="manifest of checkpoint 'r'/31"):
            store.get("r", "big", at=cid)
    assert store.state("r") == model[70]  # the head's fast path is intact


def test_pages_lmdb_freed_unwritten_at_the_end_are_not_truncation(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction frees pages LMDB allocated in the same transaction ("loose" pages), which
    LMDB never writes: the file may end before the meta's last page. The open check must
    see that those pages are free (listed in LMDB's free database) and accept the file;
    cutting a page the trees use must still be refused."""
    import random
    import shutil

    from agentwal.local.snapshot import lmdbfile as snapshot

    seen: list[tuple[int, bool]] = []
    real = snapshot._tail_is_free

    def spy(p: str, psize: int, size: int, meta: tuple[int, int, int]) -> bool:
        ok = real(p, psize, size, meta)
        seen.append((size // psize, ok))
        return ok

    monkeypatch.setattr(snapshot, "_tail_is_free", spy)
    data = os.path.join(path, "snapshot", "data.mdb")
    rng = random.Random(1)
    store = agentwal.open(path, durability="none")
    try:
        for _ in range(60):
            for i in range(rng.randint(1, 40)):
                with store.begin(rng.choice("abc")) as txn:
                    txn["a"] = i
                    txn["log"] = ["y" * 100] * (i % 12)
                    if i % 5 == 0:
                        txn["big"] = rng.randbytes(1500)
            op = rng.choice(["compact", "fold", "delete"])
            if op == "compact":
                store.compact(keep_last=rng.randint(1, 3))
            elif op == "fold":
                store.snapshot()
            else:
                with contextlib.suppress(RunNotFoundError):
                    store.delete_run(rng.choice("abc"))
            snapshot.check_lmdb_file(data)
            if seen and seen[-1][1]:
                break
    finally:
        store.close()
    assert seen and seen[-1][1], "the workload never left free pages past the end"
    with agentwal.open(path) as store:  # a sound file opens
        assert store.runs()
    copy = os.path.join(path, "cut.mdb")
    shutil.copy(data, copy)
    # cut into the pages the trees use (the last few pages may all be free ones)
    os.truncate(copy, os.path.getsize(copy) // 2 // 4096 * 4096)
    with pytest.raises(agentwal.CorruptionError, match="truncated"):
        snapshot.check_lmdb_file(copy)


def test_a_kept_origin_goes_once_origins_no_longer_count(store: agentwal.Store) -> None:
    """Found by the retention state machine: with a gap, few checkpoints left does not
    mean they are all among the last ``keep_last``."""
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 1, model)
    store.fork("r", 1, "f")
    build(store, "r", 4, model, start=2)
    store.compact(keep_last=1)
    check(store, "r", model, {1, 4})
    assert store.compact(keep_last=2, keep_fork_origins=False).runs == {"r": 1}
    check(store, "r", model, {4})


READER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import agentwal
with agentwal.open(sys.argv[2], readonly=True) as store:
    print("OPEN", store.state("r")["step"], flush=True)
    sys.stdin.readline()  # hold the store open until told
    store.refresh()
    print("STATE", store.state("r")["step"], flush=True)
"""


def test_vacuum_is_refused_while_another_process_has_the_store_open(path: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    model: dict[int, dict[str, Any]] = {}
    with agentwal.open(path, durability="none") as store:
        build(store, "r", 60, model)
        store.snapshot()
        reader = subprocess.Popen([sys.executable, "-c", READER, root, path],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert reader.stdout is not None and reader.stdin is not None
        try:
            assert reader.stdout.readline().split() == ["OPEN", "60"]
            with pytest.raises(StoreBusyError, match="another process"):
                store.compact(keep_last=3, vacuum=True)
            check(store, "r", model, {58, 59, 60})  # compacted, not vacuumed
            build(store, "r", 62, model, start=61)  # the reopened old file takes writes
            store.snapshot()
            reader.stdin.write("\n")
            reader.stdin.flush()
            assert reader.stdout.readline().split() == ["STATE", "62"]
        finally:
            reader.stdin.close()
            assert reader.wait(30) == 0
        size = os.path.getsize(os.path.join(path, "snapshot", "data.mdb"))
        report = store.compact(vacuum=True)  # alone now
        assert report.vacuumed and report.file_bytes_after < size
        check(store, "r", model, {58, 59, 60, 61, 62})
    # Another process opening after the vacuum reads the new file.
    out = subprocess.run([sys.executable, "-c", READER, root, path], input="\n",
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["OPEN", "62", "STATE", "62"], out.stderr


OPENER = r"""
import sys
sys.path.insert(0, sys.argv[1])
import agentwal
print("STARTING", flush=True)
with agentwal.open(sys.argv[2], readonly=True) as store:
    print("STATE", store.state("r")["step"], [c.id for c in store.history("r")], flush=True)
"""


def test_a_process_opening_during_the_swap_waits_and_reads_the_new_file(path: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    model: dict[int, dict[str, Any]] = {}
    opener: list[subprocess.Popen[str]] = []

    def during(_name: str) -> None:  # data.mdb replaced, LMDB's lock held, not reopened
        p = subprocess.Popen([sys.executable, "-c", OPENER, root, path],
                             stdout=subprocess.PIPE, text=True)
        opener.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "STARTING"
        time.sleep(0.3)  # it is now waiting on lock.mdb (or about to)

    with agentwal.open(path, durability="none") as store:
        build(store, "r", 40, model)
        failpoints.arm("vacuum_after_rename", "call", fn=during)
        assert store.compact(keep_last=3, vacuum=True).vacuumed
        out, _ = opener[0].communicate(timeout=60)
        assert opener[0].returncode == 0
        assert out.strip().split(maxsplit=2) == ["STATE", "40", "[40, 39, 38]"]
        build(store, "r", 42, model, start=41)
        store.snapshot()
    with agentwal.open(path) as store:
        check(store, "r", model, {38, 39, 40, 41, 42})


def test_compact_calls_the_blob_sweep_hook_after_its_transaction(store: agentwal.Store) -> None:
    """Unreferenced blobs are swept by ``BlobRefs.sweep``: compact (and the retain= pass)
    call it after the LMDB transaction, under the fold lock."""
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 10, model)
    calls: list[list[int]] = []
    store._engine.blobrefs.sweep = lambda: calls.append(  # type: ignore[attr-defined]
        [c.id for c in store.history("r")] if store._engine._fold_lock.locked() else [])
    store.compact(keep_last=2)
    assert calls == [[10, 9]]
    store._engine._retain, store._engine._retain_next = (1, None), 0.0
    store._engine.maintenance.retain_step()
    assert calls[-1] == [10]


def test_compaction_and_deletion_free_the_blob_files_nothing_kept_references(
        store: agentwal.Store) -> None:
    import io

    def blob_files() -> set[str]:
        root = os.path.join(store.path, "blobs")
        return {name for d in os.listdir(root) if d != "tmp"
                for name in os.listdir(os.path.join(root, d))}

    refs = []
    for i in range(1, 7):
        with store.begin("r") as txn:
            refs.append(txn.put_blob("weights", io.BytesIO(f"weights v{i}".encode() * 500)))
    with store.begin("other") as txn:
        txn.put_blob("weights", io.BytesIO(b"weights v1" * 500))  # shared with r's first
    assert len(blob_files()) == 6
    store.compact(keep_last=2)  # r keeps 5 and 6; v1 stays for "other"
    names = blob_files()
    assert len(names) == 3 and {r.sha256[2:] for r in (refs[0], refs[4], refs[5])} == names
    with store.open_blob("r", "weights", at=5) as f:
        assert f.read() == b"weights v5" * 500
    store.delete_run("r")
    store.snapshot()
    assert len(blob_files()) == 3  # until the next compact
    store.compact()
    assert blob_files() == {refs[0].sha256[2:]}
    with store.open_blob("other", "weights") as f:
        assert f.read() == b"weights v1" * 500


def test_stats_waits_out_a_vacuums_file_swap(store: agentwal.Store,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """stats() reads LMDB outside the store's views, so it must wait out the vacuum's file
    swap as a view does (regression: called while the vacuum waited for open reads, it
    could begin its read after the vacuum's last check; the swap then raised RuntimeError
    out of compact())."""
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 30, model)
    store.snapshot()
    snap = store._engine._snap
    assert snap is not None
    _read_for_a_while(store, 0.3)  # holds an LMDB read: the vacuum waits for it
    checked, began = threading.Event(), threading.Event()
    real_begin, real_swap, real_readers = snap.begin_read, snap.swap_in, snap.readers
    threads: list[threading.Thread] = []
    got: list[Any] = []

    def stats() -> None:
        try:
            got.append(store.stats()["folded_runs"])
        except BaseException as exc:  # reported below
            got.append(exc)

    def readers() -> int:  # the vacuum waits for reads to end: call stats() now
        if not threads:
            threads.append(threading.Thread(target=stats))
            threads[0].start()
        return real_readers()

    def begin_read() -> Any:  # stats() begins its read only after the vacuum's last check
        if not threads or threading.current_thread() is not threads[0]:
            return real_begin()
        checked.wait(2)
        t = real_begin()
        began.set()
        return t

    def swap_in(tmp: str) -> bool:
        checked.set()
        began.wait(2)  # with the fix, stats() is still waiting for the swap here
        return real_swap(tmp)

    monkeypatch.setattr(snap, "readers", readers)
    monkeypatch.setattr(snap, "begin_read", begin_read)
    monkeypatch.setattr(snap, "swap_in", swap_in)
    assert store.compact(keep_last=5, vacuum=True).vacuumed
    threads[0].join()
    assert got == [1], got
    check(store, "r", model, set(range(26, 31)))


def test_a_compaction_during_a_fork_keeps_its_origin(store: agentwal.Store,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """keep_fork_origins holds for a fork in flight (regression: a compaction that ran
    between the fork's check of its origin and its commit did not see the origin yet and
    dropped it; the new fork then named a checkpoint that no longer existed)."""
    model: dict[int, dict[str, Any]] = {}
    build(store, "r", 30, model)
    store.snapshot()
    compacted = threading.Event()
    failpoints.arm("compact_after_commit", "call", fn=lambda _name: compacted.set())
    real_raw_at = store._engine._raw_at
    threads: list[threading.Thread] = []

    def raw_at(*args: Any, **kwargs: Any) -> Any:  # the fork checked its origin: compact now
        if not threads:
            threads.append(threading.Thread(target=store.compact, kwargs={"keep_last": 3}))
            threads[0].start()
            compacted.wait(2)  # with the fix, the compaction waits for the fork instead
        return real_raw_at(*args, **kwargs)

    monkeypatch.setattr(store._engine, "_raw_at", raw_at)
    store.fork("r", 7, "f")
    threads[0].join()
    monkeypatch.undo()
    assert store.history("f")[-1].origin == ("r", 7)
    check(store, "r", model, {7, 28, 29, 30})
    assert store.state("r", at=7) == model[7] == store.state("f")
