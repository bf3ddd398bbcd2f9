"""The spare segment: the next segment's file, zero-filled and synced ahead of need.

The writer asks for one once the current segment is half full
(``spare_wanted``); the store's fold thread makes it
(``Writer.prepare_spare``), and the next rotation only writes a header into
it, syncs and renames it. These tests call ``prepare_spare``
themselves (the writer alone, on the OS or the simulated disk), then one test
goes through a store and its fold thread.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

import agentwal
from agentwal import failpoints
from agentwal.errors import DiskFullError
from agentwal.format import REC_COMMIT, SEGMENT_HEADER_SIZE, SPARE_NAME
from agentwal.io import FileSystem, OsFileSystem, read_all
from agentwal.local.wal import PendingRecord, Writer, list_segments
from agentwal.local.wal.frame import parse_header
from agentwal.testing import FaultPlan, SimulatedDisk
from agentwal.testing.hooks import crash

KIB = 1024


def writer(fs: FileSystem, wal_dir: str, first: int = 8 * KIB) -> Writer:
    w = Writer(fs, wal_dir, uuid.uuid4(), 64 * KIB, first, prepare_ahead=True)
    w.start(1)
    return w


def want_spare(w: Writer) -> None:
    """Ask for a spare now, as a half-full segment does (see the first test)."""
    w.spare_wanted = True


def with_spare(fs: FileSystem, wal_dir: str) -> Writer:
    """A writer whose spare for the next segment is ready."""
    w = writer(fs, wal_dir)
    want_spare(w)
    assert w.prepare_spare()
    return w


def logged(fs: FileSystem, wal_dir: str) -> list[int]:
    """The LSNs of every frame the segments in ``wal_dir`` hold, in order."""
    return [f.lsn for s in list_segments(fs, wal_dir) for f in s.scan().frames]


def fill(w: Writer, lsn: int, n: int, size: int = 1000) -> int:
    """Append ``n`` records of ``size`` bytes from ``lsn``, one batch each; the next LSN."""
    for i in range(n):
        w.append([PendingRecord(lsn + i, REC_COMMIT, 0, bytes([i % 251 + 1]) * size)])
    w.sync()
    return lsn + n


def wal_dir(tmp_path: Path) -> str:
    d = tmp_path / "wal"
    d.mkdir()
    return str(d)


def test_a_rotation_turns_the_prepared_spare_into_the_next_segment(tmp_path: Path) -> None:
    d = wal_dir(tmp_path)
    fs = OsFileSystem()
    w = writer(fs, d)
    assert not w.spare_wanted and not w.prepare_spare()  # a fresh segment wants none yet
    nxt = fill(w, 1, 3)
    assert not w.spare_wanted  # 3 KiB of 8
    nxt = fill(w, nxt, 1)
    assert w.spare_wanted  # half full: the next one is asked for
    assert w.prepare_spare()
    spare = os.path.join(d, SPARE_NAME)
    assert read_all(fs, spare) == bytes(16 * KIB)  # the next size, zeros on disk
    assert not w.spare_wanted
    assert w.size_bytes() == 8 * KIB + 16 * KIB

    nxt = fill(w, nxt, 8)  # 8 KiB holds 7 records of 1 KiB: the 8th rotates
    assert not os.path.exists(spare)
    segs = list_segments(fs, d)
    assert [s.first_lsn for s in segs] == [1, 8]
    assert len(segs[1].data) == 16 * KIB
    header = parse_header(segs[1].data[:SEGMENT_HEADER_SIZE])
    assert not isinstance(header, str) and header.number == 1 and header.first_lsn == 8
    scans = [s.scan() for s in segs]
    assert [sc.state for sc in scans] == ["clean", "clean"]
    assert [f.lsn for sc in scans for f in sc.frames] == list(range(1, nxt))
    assert not w.spare_wanted  # 5 KiB of the new 16
    fill(w, nxt, 3)
    assert w.spare_wanted  # and the one after it is wanted once this one is half full
    w.close()


def test_a_spare_of_the_wrong_size_is_removed_and_the_segment_made_in_place(
        tmp_path: Path) -> None:
    d = wal_dir(tmp_path)
    fs = OsFileSystem()
    w = with_spare(fs, d)
    big = PendingRecord(1, REC_COMMIT, 0, b"x" * (20 * KIB))  # larger than the 16 KiB spare
    w.append([big])
    w.append([PendingRecord(2, REC_COMMIT, 0, b"y" * (30 * KIB))])
    w.sync()
    assert SPARE_NAME not in os.listdir(d)
    assert logged(fs, d) == [1, 2]
    w.close()


def test_a_clean_close_removes_an_unused_spare(tmp_path: Path) -> None:
    d = wal_dir(tmp_path)
    w = with_spare(OsFileSystem(), d)
    w.remove_spare()
    w.close()
    assert SPARE_NAME not in os.listdir(d)
    assert not w.prepare_spare()  # a closed writer makes none


def test_no_room_for_the_spare_leaves_none_and_the_rotation_reports_disk_full() -> None:
    # Room for the first 8 KiB segment and a little more, not for a 16 KiB spare.
    disk = SimulatedDisk(FaultPlan(budget=8 * KIB + 6 * KIB))
    disk.mkdir("/s")
    disk.mkdir("/s/wal")
    w = writer(disk, "/s/wal")
    want_spare(w)
    assert not w.prepare_spare()
    assert SPARE_NAME not in disk.listdir("/s/wal")
    nxt = fill(w, 1, 7)  # fits in the first segment
    with pytest.raises(DiskFullError):
        fill(w, nxt, 1)  # needs the next segment: nothing of it is written
    assert w.broken is None  # no room is not a broken writer
    assert w.synced_lsn == nxt - 1
    assert [n for n in disk.listdir("/s/wal") if n.endswith(".tmp")] == []


def test_a_failed_spare_write_is_not_an_error_of_any_commit() -> None:
    disk = SimulatedDisk(FaultPlan(write_errors={3: errno.EIO}))
    disk.mkdir("/s")
    disk.mkdir("/s/wal")
    w = writer(disk, "/s/wal")
    want_spare(w)
    ops = 0
    while not w.prepare_spare() and ops < 5:  # the faulty write is one of the first few
        w.spare_wanted = True
        ops += 1
    nxt = fill(w, 1, 12)
    assert w.broken is None and w.synced_lsn == nxt - 1
    assert [f.lsn for s in list_segments(disk, "/s/wal") for f in s.scan().frames] == \
        list(range(1, nxt))


def test_a_store_prepares_spares_in_the_background_and_recovery_removes_a_left_one(
        tmp_path: Path) -> None:
    path = str(tmp_path / "s.awal")
    spare = os.path.join(path, "wal", SPARE_NAME)
    opts = {"durability": "sync", "segment_bytes": 16 * KIB, "wal_max_bytes": 1 << 20}
    s = agentwal.open(path, **opts)
    values = {}

    def put(store: agentwal.Store, i: int) -> None:
        v = os.urandom(450).hex()  # incompressible: ~1 KiB of log per commit
        with store.begin("r") as txn:
            txn.put(f"k{i}", v)
        values[f"k{i}"] = v

    seen = 0  # commits after which the fold thread's spare was on disk
    for i in range(300):
        put(s, i)
        there = os.path.exists(spare)
        seen += there
        if there and seen >= 3 and len([n for n in os.listdir(os.path.join(path, "wal"))
                              if n.endswith(".wal")]) >= 3:
            break
        time.sleep(0.002)  # give the fold thread a moment; no timing is asserted
    assert seen >= 3, "the fold thread never made a spare"
    segs = sorted(n for n in os.listdir(os.path.join(path, "wal")) if n.endswith(".wal"))
    assert len(segs) >= 3
    # A process that dies leaves its spare: the next open removes it and reads everything.
    assert os.path.exists(spare)  # seen after the last commit; nothing has used it since
    crash(s)
    assert os.path.exists(spare)
    with agentwal.open(path, readonly=True) as ro:  # a reader neither removes nor reports it
        assert ro.stats()["recovery"]["actions"] == [] and os.path.exists(spare)
    s2 = agentwal.open(path, **opts)
    try:
        # not damage: gone, and not reported as a crash leftover (an operator reads actions)
        assert s2.stats()["recovery"]["actions"] == []
        assert not os.path.exists(spare)
        assert {k: s2.get("r", k) for k in values} == values
        for i in range(1000, 1300):  # until the new writer makes its own spare
            put(s2, i)
            if os.path.exists(spare):
                break
            time.sleep(0.002)
        assert os.path.exists(spare)
    finally:
        s2.close()
    assert not os.path.exists(spare)  # a clean close removes it


def test_the_next_spare_is_not_made_in_the_file_a_rotation_is_renaming(tmp_path: Path) -> None:
    # Regression: the fold thread asked for a spare while a rotation was between taking
    # the last one and renaming it; it opened that same file by name, truncated it and
    # zero-filled it, so the segment name got a file without a header.
    d = wal_dir(tmp_path)
    fs = OsFileSystem()
    w = with_spare(fs, d)
    made: list[bool] = []
    helper: list[threading.Thread] = []

    def meanwhile(_name: str) -> None:  # the rotation's header is synced, not yet renamed
        w.spare_wanted = True
        t = threading.Thread(target=lambda: made.append(w.prepare_spare()))
        t.start()
        helper.append(t)
        t.join(0.2)  # it must wait for the rename, not open the file now

    failpoints.arm("segment_preallocated", "call", fn=meanwhile)
    try:
        nxt = fill(w, 1, 12)
    finally:
        failpoints.disarm()
    helper[0].join(30)
    assert made == [True]
    for seg in list_segments(fs, d):
        assert seg.header is not None, seg.problem
    assert logged(fs, d) == list(range(1, nxt))
    # a new, whole spare, sized for the segment after the 16 KiB one
    assert read_all(fs, os.path.join(d, SPARE_NAME)) == bytes(32 * KIB)
    w.close()


def test_a_request_for_a_spare_that_exists_is_settled(tmp_path: Path) -> None:
    # Regression: a segment made without the spare (the fold thread was busy) asked again
    # when half full while the late spare (for the segment after it) was ready;
    # prepare_spare returned True but left spare_wanted set, so every commit woke the
    # fold thread for nothing and it never went idle.
    d = wal_dir(tmp_path)
    w = with_spare(OsFileSystem(), d)
    want_spare(w)  # as the next half-full segment asks
    assert w.prepare_spare() and not w.spare_wanted
    w.close()
    want_spare(w)  # a closed writer makes none, and the request is settled too
    assert not w.prepare_spare() and not w.spare_wanted


def test_a_spare_removed_by_an_operator_is_not_used_and_nothing_breaks(tmp_path: Path) -> None:
    # An operator's cleanup of *.tmp files under a live writer: the rotation renamed the
    # deleted spare by name, failed, and stopped the writer (DurabilityError).
    d = wal_dir(tmp_path)
    fs = OsFileSystem()
    w = with_spare(fs, d)
    os.remove(os.path.join(d, SPARE_NAME))
    nxt = fill(w, 1, 12)  # rotates: the segment is made in place instead
    assert w.broken is None and w.synced_lsn == nxt - 1
    assert logged(fs, d) == list(range(1, nxt))
    w.close()
