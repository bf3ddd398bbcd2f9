"""The store: open/close/reopen, reads, history, locking, read-only opens, modes, folds."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal import errors, failpoints
from agentwal.io import OsFileSystem, writer_holder
from agentwal.testing import crash as crash_store
from tests.helpers import commit, in_forked_child, increment_in_threads, refused_after_fork


def test_reopen_after_close_keeps_everything(path: str) -> None:
    with agentwal.open(path) as s:
        c1 = commit(s, "a", x=1)
        c2 = commit(s, "a", x=2, y=[1])
        commit(s, "b", z="z")
    with agentwal.open(path) as s:
        assert s.state("a") == {"x": 2, "y": [1]}
        assert s.state("b") == {"z": "z"}
        assert s.history("a") == [c2, c1]
        assert s.runs() == ["a", "b"]
        assert s.stats()["recovery"]["replayed"] == 0  # close() folded everything


def test_reopen_after_abandon_replays_the_wal(path: str) -> None:
    s = agentwal.open(path)
    commit(s, "a", x=1)
    s.snapshot()
    commit(s, "a", x=2)
    commit(s, "a", x=3)
    crash_store(s)  # like kill -9: nothing flushed or folded
    with agentwal.open(path) as s:
        assert s.get("a", "x") == 3
        rec = s.stats()["recovery"]
        assert rec["replayed"] == 2 and rec["applied_lsn"] == 1
        assert [c.id for c in s.history("a")] == [3, 2, 1]


def test_checkpoints_chain(store: agentwal.Store) -> None:
    c1 = commit(store, "r", a=1)
    c2 = commit(store, "r", a=2)
    assert (c1.id, c1.parent, c2.id, c2.parent) == (1, None, 2, 1)
    assert c2.lsn > c1.lsn
    assert len(c1.hash) == 64 and c1.hash != c2.hash
    assert c1.origin is None
    assert store.head("r") == c2
    assert store.history("r", limit=1) == [c2]
    assert store.history("r", limit=0) == []
    assert store.head("nope") is None
    assert store.history("nope") == []


def test_history_spans_memtable_and_lmdb(store: agentwal.Store) -> None:
    for i in range(5):
        commit(store, "r", i=i)
    store.snapshot()
    for i in range(5, 8):
        commit(store, "r", i=i)
    hist = store.history("r")
    assert [c.id for c in hist] == list(range(8, 0, -1))
    assert [c.id for c in store.history("r", limit=4)] == [8, 7, 6, 5]
    assert store.head("r") == hist[0]


def test_state_of_unknown_run(store: agentwal.Store) -> None:
    with pytest.raises(errors.RunNotFoundError) as ei:
        store.state("nope")
    assert ei.value.code == "run_not_found"
    assert store.get("nope", "k", default=7) == 7


def test_runs_never_conflict(store: agentwal.Store) -> None:
    t1 = store.begin("a")
    t2 = store.begin("b")
    t1["k"] = t1.get("k", 0) + 1
    t2["k"] = t2.get("k", 0) + 1
    t1.commit()
    t2.commit()
    assert store.get("a", "k") == store.get("b", "k") == 1


def test_write_write_conflict_applies_nothing(store: agentwal.Store) -> None:
    commit(store, "r", k=0)
    t1, t2 = store.begin("r"), store.begin("r")
    t1["k"] = 1
    t2["k"] = 2
    t2["other"] = 2
    t1.commit()
    with pytest.raises(errors.ConflictError) as ei:
        t2.commit()
    assert ei.value.code == "conflict" and ei.value.key == "k"
    assert t2.state == "rolled_back"
    assert store.state("r") == {"k": 1}
    assert store.stats()["conflicts"] == 1


def test_read_write_conflict(store: agentwal.Store) -> None:
    commit(store, "r", k=0)
    t1, t2 = store.begin("r"), store.begin("r")
    t2.get("k")
    t1["k"] = 1
    t1.commit()
    t2["unrelated"] = 1
    with pytest.raises(errors.ConflictError):
        t2.commit()


def test_prefix_read_conflicts_with_new_key_under_prefix(store: agentwal.Store) -> None:
    t1, t2 = store.begin("r"), store.begin("r")
    assert list(t2.items(prefix="msg/")) == []
    t1["msg/1"] = "hi"
    t1.commit()
    t2["count"] = 0
    with pytest.raises(errors.ConflictError):
        t2.commit()


def test_disjoint_keys_on_one_run_both_commit(store: agentwal.Store) -> None:
    t1, t2 = store.begin("r"), store.begin("r")
    t1["a"] = 1
    t2["b"] = 2
    c1 = t1.commit()
    c2 = t2.commit()
    assert c1 is not None and c2 is not None and c2.parent == c1.id
    assert store.state("r") == {"a": 1, "b": 2}


def test_concurrent_increments_with_retry_lose_nothing(path: str) -> None:
    store = agentwal.open(path, durability="sync")
    n_threads, per_thread = 8, 15
    increment_in_threads(store, "r", n_threads, per_thread)
    assert store.get("r", "n") == n_threads * per_thread
    assert store.head("r").id == n_threads * per_thread  # type: ignore[union-attr]
    store.close()


def test_group_commit_shares_fsyncs(path: str) -> None:
    store = agentwal.open(path, durability="sync")
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        for j in range(20):
            commit(store, f"run-{i}", j=j)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st = store.stats()
    assert st["commits"] == 160
    assert st["syncs"] <= st["batches"] <= 160
    assert st["synced_lsn"] == 160
    store.close()


def test_second_writer_in_process_is_locked_out(path: str) -> None:
    with agentwal.open(path):
        with pytest.raises(errors.StoreLockedError) as ei:
            agentwal.open(path)
        assert ei.value.pid == os.getpid()
        assert ei.value.code == "store_locked"
        assert "readonly=True" in str(ei.value)


_CHILD = """
import sys, agentwal
try:
    agentwal.open(sys.argv[1])
except agentwal.StoreLockedError as e:
    print("LOCKED", e.pid)
    sys.exit(0)
print("OPENED")
"""

_READER = """
import sys, agentwal
s = agentwal.open(sys.argv[1], readonly=True)
print(s.get("r", "k"), s.state("r")["k"], s.head("r").id)
try:
    s.begin("r")
except agentwal.ReadOnlyError:
    print("READONLY")
s.close()
"""


def test_second_writer_process_gets_store_locked_error_with_pid(path: str) -> None:
    with agentwal.open(path):
        out = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True,
                             text=True, check=True).stdout.split()
    assert out == ["LOCKED", str(os.getpid())]


def test_a_deleted_lock_file_does_not_let_a_second_writer_in(path: str) -> None:
    # An operator "cleaning a stale lock" removed LOCK under a running writer: a second
    # process then took a new LOCK file's lock, and both wrote the log (a scratch run:
    # verify found a damaged record and checkpoints the run record counted but lost).
    with agentwal.open(path) as s:
        commit(s, "r", k=1)
        os.unlink(os.path.join(path, "LOCK"))
        if sys.platform == "linux":  # `agentwal health` still sees the writer
            assert writer_holder(path)[0] is True
        out = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True,
                             text=True, check=True).stdout.split()
        assert out[0] == "LOCKED"
        commit(s, "r", k=2)
    with agentwal.open(path) as s:
        assert s.get("r", "k") == 2 and s.verify().ok


def test_readonly_open_from_another_process_sees_committed_state(path: str) -> None:
    with agentwal.open(path) as s:
        commit(s, "r", k=1)
        s.snapshot()
        commit(s, "r", k=2)  # in the WAL only
        out = subprocess.run([sys.executable, "-c", _READER, path], capture_output=True,
                             text=True, check=True).stdout.split()
    assert out == ["2", "2", "2", "READONLY"]


def test_readonly_refresh_sees_new_commits(path: str) -> None:
    with agentwal.open(path) as w:
        commit(w, "r", k=1)
        r = agentwal.open(path, readonly=True)
        commit(w, "r", k=2)
        w.snapshot()
        commit(w, "r", k=3)
        assert r.get("r", "k") == 1
        r.refresh()
        assert r.get("r", "k") == 3
        assert [c.id for c in r.history("r")] == [3, 2, 1]
        with pytest.raises(errors.ReadOnlyError):
            r.snapshot()
        r.close()


def test_readonly_open_of_missing_store(tmp_path: Path) -> None:
    with pytest.raises(errors.StoreNotFoundError):
        agentwal.open(str(tmp_path / "nothing"), readonly=True)


def test_closed_store_refuses_use(path: str) -> None:
    s = agentwal.open(path)
    txn = s.begin("r")
    txn["a"] = 1
    s.close()
    s.close()  # idempotent
    for call in (lambda: s.begin("r"), lambda: s.get("r", "a"), s.stats, s.snapshot,
                 lambda: s.state("r"), txn.commit):
        with pytest.raises(errors.StoreClosedError):
            call()


def test_files_are_private(path: str) -> None:
    with agentwal.open(path) as s:
        commit(s, "r", a=1)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(path, "wal")).st_mode) == 0o700
    for root, _dirs, files in os.walk(path):
        for name in files:
            mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
            assert mode & 0o077 == 0, (name, oct(mode))


def test_folds_keep_the_wal_short(path: str) -> None:
    s = agentwal.open(path, durability="none", wal_max_bytes=64 << 10, segment_bytes=16 << 10)
    for i in range(400):
        commit(s, f"r{i % 3}", i=i, pad="x" * 500)
    s.sync()
    st = s.stats()
    s.close()
    assert st["folds"] >= 1 or st["wal_bytes_since_fold"] < 64 << 10
    with agentwal.open(path) as s:
        assert s.get("r0", "i") == 399
        assert sum(len(s.history(r)) for r in s.runs()) == 400
    files = [n for n in os.listdir(os.path.join(path, "wal")) if n.endswith(".wal")]
    assert len(files) <= 2


def test_async_mode_sync_makes_commits_durable(path: str) -> None:
    s = agentwal.open(path, durability="async", sync_interval=10)
    commit(s, "r", a=1)
    st = s.stats()
    assert st["written_lsn"] == 1 and st["synced_lsn"] == 0
    s.sync()
    assert s.stats()["synced_lsn"] == 1
    s.close()


def test_async_background_flush(path: str) -> None:
    import time

    s = agentwal.open(path, durability="async", sync_interval=0.02)
    commit(s, "r", a=1)
    deadline = time.monotonic() + 5
    while s.stats()["synced_lsn"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.stats()["synced_lsn"] == 1
    s.close()


def test_bad_open_arguments(path: str) -> None:
    with pytest.raises(ValueError):
        agentwal.open(path, durability="sometimes")
    with pytest.raises(ValueError):
        agentwal.open(path, wal_max_bytes=10)
    assert agentwal.Durability("async") is agentwal.Durability.ASYNC


@pytest.mark.parametrize("map_size", [0, 4096, 32 << 10])
def test_a_tiny_map_size_is_a_usage_error_not_a_full_disk(path: str, map_size: int) -> None:
    # Regression: map_size=4096 (or up to ~40 KiB) made the first open fail with
    # DiskFullError, "no room to write the snapshot ... Free some space", on a disk with
    # plenty: the map (address space) was too small for LMDB's first pages.
    with pytest.raises(ValueError, match="map_size"):
        agentwal.open(path, map_size=map_size)
    assert not os.path.exists(path)  # nothing was created
    with agentwal.open(path, map_size=1 << 20) as s:  # the smallest accepted map works
        commit(s, "r", a=1)


class FlakyFs(OsFileSystem):
    """The OS file system with switchable fsync and write failures."""

    def __init__(self) -> None:
        self.fail_fsync = False
        self.enospc_writes = False

    def fsync(self, fd: int) -> None:
        if self.fail_fsync:
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)

    def pwrite(self, fd: int, offset: int, data: bytes) -> int:
        # Like a real disk: overwriting allocated bytes needs no space, growing a file does.
        if self.enospc_writes and offset + len(data) > self.size(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().pwrite(fd, offset, data)


def test_failed_fsync_poisons_the_writer(path: str) -> None:
    fs = FlakyFs()
    s = agentwal.open(path, fs=fs)
    commit(s, "r", a=1)
    fs.fail_fsync = True
    with pytest.raises(errors.DurabilityError) as ei:
        commit(s, "r", a=2)
    assert ei.value.code == "durability"
    fs.fail_fsync = False  # never retried, even when the disk "recovers"
    with pytest.raises(errors.DurabilityError):
        commit(s, "r", a=3)
    assert s.get("r", "a") == 1  # the failed commit never became visible
    s.close()  # skips the fold, releases the lock
    with agentwal.open(path) as s2:
        assert s2.get("r", "a") in (1, 2)  # the in-flight commit may or may not survive
        commit(s2, "r", a=4)


def test_disk_full_acknowledges_nothing_and_recovers(path: str) -> None:
    fs = FlakyFs()
    s = agentwal.open(path, fs=fs, segment_bytes=8192, wal_max_bytes=1 << 20)
    commit(s, "r", a=0)
    fs.enospc_writes = True
    with pytest.raises(errors.DiskFullError) as ei:
        for i in range(1, 100):
            commit(s, "r", a=i, pad="x" * 500)
    assert ei.value.code == "disk_full"
    last = s.get("r", "a")
    head = s.head("r")
    fs.enospc_writes = False
    c = commit(s, "r", a="after")  # works again once space returns
    assert head is not None and c.id == head.id + 1 and c.parent == head.id
    crash_store(s)
    with agentwal.open(path) as s2:
        assert s2.get("r", "a") == "after"
        assert [x.id for x in s2.history("r")] == list(range(c.id, 0, -1))
    assert last is not None


def test_import_starts_no_threads_and_opens_no_files() -> None:
    code = (
        "import os, threading, sys\n"
        "before = set(os.listdir('/proc/self/fd'))\n"
        "import agentwal, agentwal.testing\n"
        "after = set(os.listdir('/proc/self/fd'))\n"
        "print(threading.active_count(), len(after - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["1", "0"]


def test_stats_report(store: agentwal.Store) -> None:
    commit(store, "r", a=1)
    st = store.stats()
    for key in ("visible_lsn", "applied_lsn", "synced_lsn", "wal_segments", "wal_bytes",
                "lmdb_bytes", "commits", "recovery", "durability", "store_id"):
        assert key in st
    assert st["visible_lsn"] == 1 and st["commits"] == 1


def test_full_lmdb_map_is_grown(path: str) -> None:
    s = agentwal.open(path, durability="none", map_size=1 << 20)
    for i in range(40):
        commit(s, "r", **{f"k{i}": os.urandom(100_000)})  # incompressible: LMDB stores it
    s.snapshot()
    assert s.stats()["map_grows"] >= 1
    s.close()
    with agentwal.open(path, map_size=1 << 20) as s:  # reopens at the grown size
        assert len(s.state("r")) == 40
        commit(s, "r", more=os.urandom(200_000))


def test_commit_racing_close_is_refused(path: str) -> None:
    # Regression: a commit that passed the open check just before close() was
    # still written, into a new segment created after the lock was released.
    s = agentwal.open(path)
    commit(s, "r", a=1)
    pipe = s._engine._pipe
    assert pipe is not None
    s.close()
    with pytest.raises(errors.StoreClosedError):
        pipe.commit("r", 0, set(), set(), {"a": b"\x02"}, {})
    assert sorted(os.listdir(os.path.join(path, "wal"))) == ["00000000000000000001.wal"]


def _in_thread(fn: Any, timeout: float = 60) -> None:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it does not finish."""
    box: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the test thread
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "deadlocked"
    if box:
        raise box[0]


def test_abandoned_transaction_collected_inside_the_store_does_not_deadlock(path: str) -> None:
    # Regression: Transaction.__del__ took the store lock, which the collecting
    # thread could already hold (GC runs at any allocation).
    import gc

    s = agentwal.open(path, durability="none")

    class Step:
        pass

    def churn() -> None:
        old = gc.get_threshold()
        gc.set_threshold(1)
        try:
            for i in range(300):
                st = Step()
                st.self = st  # type: ignore[attr-defined]
                st.txn = s.begin("a")  # type: ignore[attr-defined]
                del st
                with s.begin("b") as t:
                    t["k"] = i
        finally:
            gc.set_threshold(*old)

    _in_thread(churn)
    assert s.get("b", "k") == 299
    s.close()


def test_finished_transactions_free_their_reader_slot(path: str) -> None:
    # Regression: a finished transaction kept its LMDB read transaction (and
    # reader slot) until garbage collection; 1024 of them exhausted the table.
    with agentwal.open(path, durability="none") as s:
        done = []
        for i in range(1100):
            with s.begin("r") as txn:
                txn["i"] = i
            done.append(txn)
        assert s.get("r", "i") == 1099


def test_refresh_while_other_threads_read(path: str) -> None:
    # Regression: refresh() ended the LMDB transaction other threads were
    # reading through, and they reported CorruptionError.
    with agentwal.open(path, durability="none") as w:
        commit(w, "r", k=0)
        w.snapshot()
        ro = agentwal.open(path, readonly=True)
        errors_seen: list[BaseException] = []
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                try:
                    ro.state("r")
                    ro.history("r")
                except BaseException as exc:
                    errors_seen.append(exc)
                    return

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        for i in range(30):
            commit(w, "r", k=i)
            if i % 10 == 0:
                w.snapshot()
            ro.refresh()
        stop.set()
        for t in threads:
            t.join()
        ro.close()
    assert not errors_seen, errors_seen[:3]


def test_replayed_log_counts_toward_the_next_fold(path: str) -> None:
    # Regression: after recovery the fold threshold ignored the replayed bytes,
    # so a process that always crashed early grew the WAL (and open time) forever.
    replayed = []
    for life in range(6):
        s = agentwal.open(path, durability="none", wal_max_bytes=64 << 10,
                          segment_bytes=16 << 10)
        replayed.append(s.stats()["recovery"]["replayed"])
        for i in range(40):
            commit(s, "r", life=life, i=i, pad=os.urandom(1000))  # incompressible
        deadline = time.monotonic() + 5
        while s.stats()["wal_bytes_since_fold"] >= 64 << 10 and time.monotonic() < deadline:
            time.sleep(0.01)  # the background fold catches up
        crash_store(s)
    assert max(replayed) <= 130, replayed  # ~ two folds' worth at most, not 40 x lives


def test_store_dropped_without_close_releases_its_lock(path: str) -> None:
    # Regression: the background threads kept an unclosed store alive forever.
    import gc

    s = agentwal.open(path)
    commit(s, "r", a=1)
    del s
    gc.collect()
    with agentwal.open(path) as again:  # not StoreLockedError
        assert again.get("r", "a") == 1


_EXIT_WHILE_FOLDING = """
import os, sys
import agentwal
s = agentwal.open(sys.argv[1], durability="none", wal_max_bytes=1 << 20)
value = os.urandom(20000)  # incompressible: the log fills and folds follow one another
for i in range(60):
    with s.begin("r") as txn:
        txn[f"k{i % 10}"] = value
        txn["i"] = i
print("EXITING", flush=True)
# no close(): the program ends with the store open, its fold thread most likely folding
"""


def test_a_program_that_ends_with_the_store_open_while_folding_exits(path: str) -> None:
    # Regression: the dropped-store finalizer also ran at interpreter exit, closing LMDB
    # under the fold thread, and the process hung for ever (9 exits in 10 hung).
    for attempt in range(3):
        out = subprocess.run([sys.executable, "-c", _EXIT_WHILE_FOLDING, path],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["EXITING"]
        with agentwal.open(path) as s:  # every commit, as after a crash of the process
            assert s.get("r", "i") == 59
            assert s.head("r").id == 60 * (attempt + 1)


def test_a_store_dropped_mid_fold_can_be_opened_again_at_once(path: str) -> None:
    # Regression: the fold thread held the dropped store until its fold ended, and the
    # store's reference cycles kept it until the next cyclic collection: a new open
    # in the same process raised StoreLockedError "(another Store object)".
    folding, release = threading.Event(), threading.Event()

    def slow(_name: str) -> None:
        folding.set()
        release.wait(30)

    failpoints.arm("fold_after_freeze", "call", fn=slow)
    try:
        s = agentwal.open(path, wal_max_bytes=64 << 10)
        for i in range(40):
            commit(s, "r", v=bytes(4000), i=i)
        assert folding.wait(30)
        del s
        threading.Timer(0.3, release.set).start()  # the fold ends while open() waits
        with agentwal.open(path) as again:  # not StoreLockedError
            assert again.get("r", "i") == 39
    finally:
        release.set()
        failpoints.disarm()


def test_a_second_writer_in_the_process_is_still_refused(path: str) -> None:
    # What open() waits for is a dropped store only: a live one is a clear error.
    with agentwal.open(path) as s:
        commit(s, "r", a=1)
        with pytest.raises(errors.StoreLockedError, match="another Store object"):
            agentwal.open(path)
        assert s.get("r", "a") == 1


def test_open_skips_the_frames_a_fold_covers(path: str) -> None:
    # The fold stores where the log continues; recovery starts there, so a
    # cleanly closed store with a long history opens without re-reading it.
    with agentwal.open(path) as s:
        for i in range(50):
            commit(s, "r", i=i)
    seg = os.path.join(path, "wal", sorted(n for n in os.listdir(os.path.join(path, "wal"))
                                           if n.endswith(".wal"))[-1])
    with open(seg, "r+b") as f:  # flip a byte inside the first (folded) frame
        f.seek(64 + 40)
        byte = f.read(1)[0]
        f.seek(64 + 40)
        f.write(bytes([byte ^ 0xFF]))
    with agentwal.open(path) as s:  # not read, so not an error
        assert s.get("r", "i") == 49
        commit(s, "r", i=50)
    with agentwal.open(path) as s:
        assert s.get("r", "i") == 50


def test_a_fold_after_a_failed_one_folds_everything(path: str) -> None:
    # The leftover frozen table goes first, then the active one, in one call.
    from agentwal import failpoints

    with agentwal.open(path, durability="none") as s:
        commit(s, "r", a=1)
        failpoints.arm("fold_before_commit", exc=errors.DiskFullError(path))
        with pytest.raises(errors.DiskFullError):
            s.snapshot()
        commit(s, "r", a=2)  # lands in the new active table
        s.snapshot()
        st = s.stats()
        assert st["applied_lsn"] == st["visible_lsn"] == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_store_does_not_cross_a_fork(path: str) -> None:
    # Regression: a child forked after the store was opened (multiprocessing's default
    # start method on Linux) committed through the parent's engine: its commits were
    # acknowledged, then lost, and the parent's WAL was left with a torn record.
    s = agentwal.open(path)
    commit(s, "r", n=1)

    def child(said: list[str]) -> None:  # every use of the inherited store is refused
        said += [refused_after_fork(call) for call in (
            lambda: commit(s, "child", n=1), lambda: s.get("r", "n"), lambda: s.state("r"),
            lambda: s.snapshot())]
        s.close()  # closes nothing of the parent's (no fold, no LMDB close)
        try:
            agentwal.open(path)
            said.append("OPENED")
        except errors.StoreLockedError:
            said.append("locked")
        with agentwal.open(path, readonly=True) as ro:  # a reader of its own is fine
            said.append(str(ro.get("r", "n")))

    said = in_forked_child(child)
    assert said == "fork fork fork fork locked 1"
    for n in range(2, 30):  # the parent goes on as if nothing happened
        commit(s, "r", n=n)
    s.close()
    with agentwal.open(path) as again:
        assert again.get("r", "n") == 29
        assert "child" not in again.runs()
        assert again.verify().ok
