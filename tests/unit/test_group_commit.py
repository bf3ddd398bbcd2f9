"""Group commit's two stages: the next batch is written while an fsync is in flight.

A file system whose next fsync of a segment blocks until the test lets it go
holds one commit inside fdatasync; a second commit then writes its record
meanwhile. Checked: that record is not acknowledged by the fsync it missed,
a failed fsync fails it too and stops the writer, and no room for it fails
only it (the first commit is still acknowledged and the next commit takes
its LSN).
"""

from __future__ import annotations

import errno
import os
import signal
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
from tests.helpers import commit


class GateFs(OsFileSystem):
    """The OS file system; once armed, the next fsync of a segment waits for ``go``.

    ``fail``: that fsync then fails with EIO. ``enospc_next_write``: the next
    pwrite fails with ENOSPC (nothing written).
    """

    def __init__(self) -> None:
        self.armed = False
        self.inside = threading.Event()
        self.go = threading.Event()
        self.fail = False
        self.enospc_next_write = False
        self.wal_fds: set[int] = set()
        self.fsyncs = 0

    def open(self, path: str, create: bool = True) -> int:
        fd = super().open(path, create)
        if ".wal" in path and SPARE_NAME not in path:  # a segment (the spare is made aside)
            self.wal_fds.add(fd)
        return fd

    def pwrite(self, fd: int, offset: int, data: bytes) -> int:
        if self.enospc_next_write and fd in self.wal_fds:
            self.enospc_next_write = False
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().pwrite(fd, offset, data)

    def fsync(self, fd: int) -> None:
        if self.armed and fd in self.wal_fds:
            self.armed = False
            self.inside.set()
            assert self.go.wait(30)
            if self.fail:
                raise OSError(errno.EIO, "Input/output error")
        self.fsyncs += 1
        super().fsync(fd)


@pytest.fixture
def fs() -> GateFs:
    return GateFs()


@pytest.fixture
def store(path: str, fs: GateFs) -> Iterator[agentwal.Store]:
    s = agentwal.open(path, durability="sync", fs=fs, segment_bytes=1 << 20)
    with s.begin("warm") as txn:  # the first segment exists and is synced
        txn.put("k", 0)
    yield s
    s.close()


def pipe_of(store: agentwal.Store) -> CommitPipeline:
    pipe = store._engine._pipe
    assert pipe is not None
    return pipe


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # the test inspects it
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def put(store: agentwal.Store, run: str, value: Any) -> Callable[[], Any]:
    def go() -> Any:
        with store.begin(run) as txn:
            txn.put("k", value)
        head = store.head(run)
        assert head is not None
        # acknowledged only once durable: the writer's synced LSN covers it
        assert pipe_of(store).writer.synced_lsn >= head.lsn
        return head
    return go


def wait_until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.001)


def hold_first_in_fsync(store: agentwal.Store, fs: GateFs
                        ) -> tuple[threading.Thread, list[Any], int]:
    """Start commit A and return once its fsync is in flight (blocked); A's LSN."""
    pipe = pipe_of(store)
    fs.armed = True
    ta, ra = in_thread(put(store, "a", 1))
    assert fs.inside.wait(30)
    return ta, ra, pipe.writer.written_lsn


def test_the_next_commit_is_written_during_an_fsync_and_waits_for_its_own(
        store: agentwal.Store, fs: GateFs) -> None:
    pipe = pipe_of(store)
    ta, ra, a_lsn = hold_first_in_fsync(store, fs)
    tb, rb = in_thread(put(store, "b", 2))
    wait_until(lambda: pipe.writer.written_lsn > a_lsn)  # B's record is in the OS
    assert pipe.writer.synced_lsn < a_lsn  # A's fsync has not returned
    assert store.get("b", "k") is None and store.get("a", "k") is None  # nothing visible yet
    assert tb.is_alive() and ta.is_alive()
    before = fs.fsyncs
    fs.go.set()
    ta.join(30)
    tb.join(30)
    a, b = ra[0], rb[0]
    assert isinstance(a, agentwal.Checkpoint) and isinstance(b, agentwal.Checkpoint), (ra, rb)
    assert (a.lsn, b.lsn) == (a_lsn, a_lsn + 1)
    # B was written after A's fsync began, so it had one of its own
    assert fs.fsyncs - before >= 2
    assert store.get("a", "k") == 1 and store.get("b", "k") == 2


def test_a_failed_fsync_fails_the_commit_written_during_it_and_stops_the_writer(
        path: str, store: agentwal.Store, fs: GateFs) -> None:
    pipe = pipe_of(store)
    fs.fail = True
    ta, ra, a_lsn = hold_first_in_fsync(store, fs)
    tb, rb = in_thread(put(store, "b", 2))
    wait_until(lambda: pipe.writer.written_lsn > a_lsn)
    fs.go.set()
    ta.join(30)
    tb.join(30)
    assert isinstance(ra[0], errors.DurabilityError), ra
    assert isinstance(rb[0], errors.DurabilityError), rb
    assert store.head("a") is None and store.head("b") is None
    assert store.get("a", "k") is None and store.get("b", "k") is None
    with pytest.raises(errors.DurabilityError), store.begin("c") as txn:
        txn.put("k", 3)


def test_no_room_for_the_commit_written_during_an_fsync_fails_only_it(
        path: str, store: agentwal.Store, fs: GateFs) -> None:
    pipe = pipe_of(store)
    ta, ra, a_lsn = hold_first_in_fsync(store, fs)
    fs.enospc_next_write = True
    tb, rb = in_thread(put(store, "b", 2))
    tb.join(30)  # fails at once, while A is still inside its fsync
    assert isinstance(rb[0], errors.DiskFullError), rb
    assert ta.is_alive()
    fs.go.set()
    ta.join(30)
    a = ra[0]
    assert isinstance(a, agentwal.Checkpoint), ra
    assert a.lsn == a_lsn
    c = put(store, "c", 3)()
    assert c.lsn == a.lsn + 1  # B's LSN, given back
    assert store.head("b") is None
    assert pipe.writer.broken is None
    store.close()
    again = agentwal.open(path, durability="sync")
    try:
        assert again.get("a", "k") == 1 and again.get("c", "k") == 3
        assert again.get("b", "k") is None
        assert again.verify().ok
    finally:
        again.close()


def test_a_backup_settles_a_record_that_sync_wrote_for_a_committer_still_on_its_way(
        tmp_path: Any, store: agentwal.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # store.sync() writes every queued record, other committers' too, and only
    # fsyncs; a committer still on its way to flush_lock then finds its record
    # written. A backup that takes flush_lock first must settle that record
    # itself: waiting for the committer (who waits for flush_lock) hung forever.
    pipe = pipe_of(store)
    real = CommitPipeline._drive
    on_its_way, go_on = threading.Event(), threading.Event()

    def late_drive(self: CommitPipeline, pc: Any) -> None:
        if threading.current_thread().name == "late-committer":
            on_its_way.set()
            assert go_on.wait(30)
        real(self, pc)

    monkeypatch.setattr(CommitPipeline, "_drive", late_drive)
    out: list[Any] = []
    late = threading.Thread(target=lambda: out.append(put(store, "late", 7)()),
                            name="late-committer")
    late.start()
    assert on_its_way.wait(30)  # its record is queued; it has not reached flush_lock
    store.sync()  # writes the queued record (and fsyncs it), publishes nothing
    assert pipe.writer.written_lsn > (store.head("warm") or pytest.fail()).lsn
    tb, rb = in_thread(lambda: store.backup(str(tmp_path / "copy")))
    tb.join(20)
    hung = tb.is_alive()
    go_on.set()
    late.join(30)
    tb.join(30)
    assert not hung, "backup waited for a committer that waits for it"
    assert not isinstance(rb[0], BaseException), rb
    assert isinstance(out[0], agentwal.Checkpoint), out
    assert store.get("late", "k") == 7
    with agentwal.open(str(tmp_path / "copy"), readonly=True) as copy:
        assert copy.get("late", "k") == 7  # the backup holds the settled record


@pytest.mark.parametrize("point", ["after_wal_append", "before_fsync", "after_fsync"])
@pytest.mark.parametrize("durability", ["sync", "async"])
def test_ctrl_c_inside_the_write_or_sync_stage_ends_the_commit_first(
        path: str, point: str, durability: str) -> None:
    # Regression: a KeyboardInterrupt (Ctrl-C, a notebook's "interrupt") that landed
    # between the write and the publish stopped the writer ("commit interrupted by
    # KeyboardInterrupt; the store accepts no more commits. Check the disk"). The
    # commit now ends first, then the interrupt is raised; the store goes on.
    if point != "after_wal_append" and durability == "async":
        pytest.skip("an async commit does not fsync")
    with agentwal.open(path, durability=durability) as s:
        commit(s, "r", n=1)
        failpoints.arm(point, "call", fn=lambda _n: os.kill(os.getpid(), signal.SIGINT))
        try:
            with pytest.raises(KeyboardInterrupt), s.begin("r") as txn:
                txn["n"] = 2
        finally:
            failpoints.disarm()
        assert txn.state == "committed" and txn.checkpoint is not None
        assert s.get("r", "n") == 2
        commit(s, "r", n=3)  # not DurabilityError
        assert s.head("r").id == 3
    with agentwal.open(path) as s:
        assert s.get("r", "n") == 3
