"""The commit pipeline: OCC validation and its counter, failure rollback of a whole queued
batch, group commit, fsync policy per durability mode, pruning of ``last_write``.

Driven through the public store API; the pipeline's ``flush_lock`` is held by a test only
to make a batch deterministic (commits queue behind a leader that cannot write yet).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import agentwal
from agentwal import errors, failpoints
from agentwal.format import SPARE_NAME
from agentwal.io import OsFileSystem
from agentwal.local.commit import CommitPipeline
from tests.helpers import commit, increment_in_threads


class FaultyFs(OsFileSystem):
    """The OS file system with switchable faults, counting fsyncs.

    ``enospc_growing``: like a real disk, overwriting allocated bytes needs no space but
    growing a file does. ``eio_writes``: every pwrite fails. ``fsync_delay``: slow fsyncs.
    """

    def __init__(self) -> None:
        self.enospc_growing = False
        self.eio_writes = False
        self.fsync_delay = 0.0
        self.fsyncs = 0
        #: descriptors of the spare segment while it is one: the fold thread makes it
        #: off the commit path, so its fsyncs are not counted
        self.spare_fds: set[int] = set()

    def open(self, path: str, create: bool = True) -> int:
        fd = super().open(path, create)
        if os.path.basename(path) == SPARE_NAME:
            self.spare_fds.add(fd)
        return fd

    def rename(self, src: str, dst: str) -> None:
        if os.path.basename(src) == SPARE_NAME:  # it becomes a segment
            self.spare_fds.clear()
        super().rename(src, dst)

    def pwrite(self, fd: int, offset: int, data: bytes) -> int:
        if self.eio_writes:
            raise OSError(errno.EIO, "Input/output error")
        if self.enospc_growing and offset + len(data) > self.size(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().pwrite(fd, offset, data)

    def fsync(self, fd: int) -> None:
        if fd in self.spare_fds:
            super().fsync(fd)
            return
        if self.fsync_delay:
            time.sleep(self.fsync_delay)
        self.fsyncs += 1
        super().fsync(fd)


@pytest.fixture
def fs() -> FaultyFs:
    return FaultyFs()


@pytest.fixture
def sync_store(path: str, fs: FaultyFs) -> Iterator[agentwal.Store]:
    s = agentwal.open(path, durability="sync", fs=fs, segment_bytes=4096, wal_max_bytes=64 << 20)
    yield s
    s.close()


def pipe_of(store: agentwal.Store) -> CommitPipeline:
    pipe = store._engine._pipe
    assert pipe is not None
    return pipe


def queue_behind_a_blocked_leader(store: agentwal.Store,
                                  jobs: list[Callable[[], Any]],
                                  before_release: Callable[[], None] = lambda: None,
                                  ) -> list[Any]:
    """Run ``jobs`` in threads while the log cannot be written, so all of them queue; then
    let the leader write them as one batch. Returns each job's result or exception."""
    pipe = pipe_of(store)
    results: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except BaseException as exc:  # the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    with pipe.flush_lock:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(pipe.pending) < len(jobs):
            assert time.monotonic() < deadline, "commits did not queue"
            assert all(t.is_alive() for t in threads), results
            time.sleep(0.001)
        before_release()
    for t in threads:
        t.join(10)
    return results


# -- validation -----------------------------------------------------------------------------


def test_conflicts_are_counted_and_consume_no_lsn_or_checkpoint_id(store: agentwal.Store) -> None:
    c1 = commit(store, "r", k=0, other=0)
    t_write, t_read, t_prefix = store.begin("r"), store.begin("r"), store.begin("r")
    c2 = commit(store, "r", k=1)

    t_write["k"] = 2  # write-write
    t_read.get("k")  # read-write
    t_read["x"] = 1
    list(t_prefix.items(prefix="k"))  # a prefix it read gained a write
    t_prefix["y"] = 1
    for t in (t_write, t_read, t_prefix):
        with pytest.raises(errors.ConflictError):
            t.commit()
    st = store.stats()
    assert st["conflicts"] == 3
    assert st["commits"] == 2 and st["next_lsn"] == c2.lsn + 1

    c3 = commit(store, "r", k=3)
    assert (c3.lsn, c3.id, c3.parent) == (c2.lsn + 1, c2.id + 1, c2.id)
    assert c1.id == 1 and store.get("r", "k") == 3 and store.get("r", "x") is None


def test_a_clean_commit_counts_no_conflict(store: agentwal.Store) -> None:
    t1, t2 = store.begin("r"), store.begin("r")
    t1["a"] = 1
    t2.get("b")  # read a key nobody wrote
    t2["b"] = 2
    t1.commit()
    t2.commit()
    assert store.stats()["conflicts"] == 0


def test_conflict_with_a_commit_that_is_queued_but_not_yet_written(
        store: agentwal.Store) -> None:
    commit(store, "r", k=0)
    seen: dict[str, Any] = {}
    begun, go = threading.Event(), threading.Event()

    def late_step() -> None:  # a transaction is one thread's: begun and committed here
        late = store.begin("r")
        late["k"] = "late"
        begun.set()
        go.wait(30)
        seen["late"] = _outcome(late.commit)

    t = threading.Thread(target=late_step)
    t.start()
    assert begun.wait(30)

    def while_queued() -> None:
        # "first" is validated and queued, nothing written or visible yet.
        seen["visible"] = store.get("r", "k")
        go.set()
        t.join(30)  # raised within the validation's 5 s wait; a wrongly accepted one queues

    (first,) = queue_behind_a_blocked_leader(store, [lambda: commit(store, "r", k="first")],
                                             while_queued)
    assert seen["visible"] == 0
    assert isinstance(seen.get("late"), errors.ConflictError), seen
    assert seen["late"].key == "k"
    assert store.get("r", "k") == "first"
    assert store.head("r") == first
    assert store.stats()["conflicts"] == 1


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return exc


def test_conflicts_are_still_seen_after_last_write_is_pruned(path: str) -> None:
    s = agentwal.open(path, durability="none")
    try:
        commit(s, "r", k=0)
        old = s.begin("r")  # snapshot before k changes
        commit(s, "r", k=1)
        for i in range(600):  # past the 512-commit pruning point
            commit(s, "r", **{f"x{i}": i})
        old["k"] = "stale"
        with pytest.raises(errors.ConflictError):
            old.commit()
        assert s.get("r", "k") == 1
    finally:
        s.close()


def last_write_entries(store: agentwal.Store) -> int:
    return sum(len(w) for w in pipe_of(store).last_write.values())


def test_last_write_is_pruned_when_no_view_needs_it(store: agentwal.Store) -> None:
    for i in range(601):
        commit(store, "r", **{f"k{i}": i})
    assert last_write_entries(store) <= 601 - 512 + 1


# Regression (was an xfail: the bug is fixed).

def test_last_write_is_pruned_under_group_commit(store: agentwal.Store) -> None:
    commit(store, "r", k=0)  # an odd count, then batches of 16: never a multiple of 512

    def job(i: int, j: int) -> Callable[[], Any]:
        return lambda: commit(store, "r", **{f"k{i}_{j}": j})

    for i in range(33):
        results = queue_behind_a_blocked_leader(store, [job(i, j) for j in range(16)])
        assert all(isinstance(r, agentwal.Checkpoint) for r in results), results
    st = store.stats()
    assert st["commits"] == 1 + 33 * 16 and st["batches"] == 1 + 33
    assert last_write_entries(store) <= 512  # no view is open: all of it could go


# -- failure rollback -----------------------------------------------------------------------


def test_a_failed_write_fails_the_whole_batch_and_puts_lsn_and_heads_back(
        sync_store: agentwal.Store, fs: FaultyFs) -> None:
    s = sync_store
    a1 = commit(s, "a", k=0)
    b1 = commit(s, "b", k=0)
    old = s.begin("a")  # began before the failed batch; writes "k" later
    next_lsn = s.stats()["next_lsn"]
    pad = [os.urandom(1500) for _ in range(4)]  # incompressible: the batch needs a new segment

    jobs = [lambda: commit(s, "a", k=1, kpad=pad[0]),
            lambda: commit(s, "a", j=1, jpad=pad[1]),  # chains on the queued head of "a"
            lambda: commit(s, "b", k=1, pad=pad[2]),
            lambda: commit(s, "c", k=1, pad=pad[3])]  # a new run

    def fill_the_disk() -> None:
        fs.enospc_growing = True

    results = queue_behind_a_blocked_leader(s, jobs, fill_the_disk)
    assert all(isinstance(r, errors.DiskFullError) for r in results), results

    # nothing of the batch is visible, nothing was counted
    st = s.stats()
    assert st["next_lsn"] == next_lsn and st["visible_lsn"] == next_lsn - 1
    assert st["commits"] == 2 and st["writer_broken"] is None
    assert s.head("a") == a1 and s.head("b") == b1 and s.head("c") is None
    assert s.get("a", "j") is None and s.get("c", "k") is None

    fs.enospc_growing = False
    old["k"] = "after"  # the failed write of "k" left no trace in conflict tracking
    a2 = old.commit()
    assert a2 is not None and (a2.lsn, a2.id, a2.parent) == (next_lsn, 2, 1)
    c1 = commit(s, "c", k="after")
    assert (c1.lsn, c1.id, c1.parent) == (next_lsn + 1, 1, None)
    b2 = commit(s, "b", k="after")
    assert (b2.lsn, b2.id, b2.parent) == (next_lsn + 2, 2, 1)
    s.close()

    with agentwal.open(s.path) as again:
        assert again.state("a") == {"k": "after"}
        assert [c.id for c in again.history("a")] == [2, 1]
        lsns = sorted(c.lsn for r in again.runs() for c in again.history(r))
        assert lsns == list(range(1, len(lsns) + 1))  # no gap where the batch failed


def test_a_failed_write_that_is_not_disk_full_stops_the_writer(
        sync_store: agentwal.Store, fs: FaultyFs) -> None:
    s = sync_store
    commit(s, "r", k=0)
    fs.eio_writes = True
    with pytest.raises(errors.DurabilityError) as ei:
        commit(s, "r", k=1)
    fs.eio_writes = False
    with pytest.raises(errors.DurabilityError) as again:
        commit(s, "r", k=2)  # never retried
    # a fresh error each time (one object is never raised in many threads),
    # caused by the original failure
    assert again.value is not ei.value and again.value.__cause__ is ei.value
    assert again.value.reason == ei.value.reason
    assert s.get("r", "k") == 0
    assert s.stats()["writer_broken"]


def test_an_exception_that_is_not_ours_fails_the_batch_and_stops_the_writer(
        sync_store: agentwal.Store) -> None:
    s = sync_store
    commit(s, "r", k=0)

    def arm() -> None:
        failpoints.arm("before_fsync")

    results = queue_behind_a_blocked_leader(
        s, [lambda: commit(s, "r", a=1), lambda: commit(s, "r", b=1)], arm)
    kinds = sorted(type(r).__name__ for r in results)
    # the leader sees the foreign exception; the commit that queued with it, the stop
    assert kinds == ["DurabilityError", "FailpointFired"], results
    with pytest.raises(errors.DurabilityError, match="FailpointFired"):
        commit(s, "r", c=1)
    assert s.get("r", "a") is None and s.get("r", "b") is None


# -- group commit and the fsync policy ------------------------------------------------------


def test_commits_queued_behind_a_busy_log_share_one_write_and_one_fsync(
        sync_store: agentwal.Store) -> None:
    s = sync_store
    pipe = pipe_of(s)
    before = s.stats()

    def job(i: int) -> Callable[[], Any]:
        def run() -> Any:
            c = commit(s, f"run-{i}", v=i)
            # on return: durable, and visible to this thread and everyone else
            assert pipe.writer.synced_lsn >= c.lsn
            assert s.get(f"run-{i}", "v") == i
            assert s.head(f"run-{i}") == c
            return c

        return run

    results = queue_behind_a_blocked_leader(s, [job(i) for i in range(8)])
    assert all(isinstance(r, agentwal.Checkpoint) for r in results), results
    st = s.stats()
    assert st["commits"] - before["commits"] == 8
    assert st["batches"] - before["batches"] == 1
    assert st["syncs"] - before["syncs"] == 1
    assert sorted(r.lsn for r in results) == list(range(before["next_lsn"],
                                                        before["next_lsn"] + 8))


def test_eight_threads_share_fsyncs_and_see_their_commits_on_return(
        sync_store: agentwal.Store, fs: FaultyFs) -> None:
    s = sync_store
    pipe = pipe_of(s)
    fs.fsync_delay = 0.003  # a disk slow enough for committers to pile up
    per_thread = 10
    barrier = threading.Barrier(8)
    problems: list[str] = []

    def worker(i: int) -> None:
        run = f"t{i}"
        barrier.wait()
        for j in range(per_thread):
            c = commit(s, run, j=j)
            if pipe.writer.synced_lsn < c.lsn:
                problems.append(f"{run}/{j} acknowledged before it was durable")
            if s.get(run, "j") != j or s.head(run) != c:
                problems.append(f"{run}/{j} not visible on return")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not problems, problems
    st = s.stats()
    assert st["commits"] == 8 * per_thread
    assert st["syncs"] == st["batches"] < st["commits"]  # one fsync per batch, shared
    for i in range(8):
        assert [c.id for c in s.history(f"t{i}")] == list(range(per_thread, 0, -1))
        assert s.get(f"t{i}", "j") == per_thread - 1


def test_sync_mode_fsyncs_every_sequential_commit(sync_store: agentwal.Store,
                                                  fs: FaultyFs) -> None:
    before = fs.fsyncs
    for i in range(5):
        commit(sync_store, "r", i=i)
    st = sync_store.stats()
    assert fs.fsyncs - before == 5
    assert st["syncs"] == st["batches"] == st["commits"] == 5
    assert st["synced_lsn"] == 5


def test_none_mode_never_fsyncs_a_commit(path: str, fs: FaultyFs) -> None:
    s = agentwal.open(path, durability="none", fs=fs, wal_max_bytes=64 << 20)
    try:
        before = fs.fsyncs
        for i in range(5):
            commit(s, "r", i=i)
        st = s.stats()
        assert fs.fsyncs == before
        assert st["syncs"] == 0 and st["batches"] == st["commits"] == 5
        assert st["synced_lsn"] == 0 and st["written_lsn"] == 5
        assert s.get("r", "i") == 4  # visible without being durable
        s.sync()
        assert s.stats()["syncs"] == 1 and s.stats()["synced_lsn"] == 5
    finally:
        s.close()


def test_an_immediate_retry_after_a_conflict_does_not_spin(path: str) -> None:
    # Regression: a conflict with a commit still on its way to disk was raised
    # at once, and a retry begun before that commit was visible conflicted
    # again: 8 threads x 50 increments cost over 100,000 conflicts. Now the
    # loser waits for the winner to settle, so each commit makes at most one
    # conflict per other thread.
    s = agentwal.open(path, durability="sync")
    increment_in_threads(s, "r", 8, 50)
    assert s.get("r", "n") == 400
    assert s.stats()["conflicts"] <= 400 * 7
    s.close()
