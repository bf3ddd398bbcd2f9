"""Tier ``missing log``: an operator's mistake on the log never looks like an empty store.

An agent process commits 20 steps and is killed (``os._exit``, no close).
Then the log is deleted (a cleanup cron job), truncated (at a frame boundary,
which reads like a clean end, or inside a frame), or replaced with an older
copy of itself, for a store never folded and for one folded after step 10.
Every case must make the open (read-only and writer) raise
``CorruptionError`` naming what is missing, leave every file as it was, and
make ``agentwal verify`` exit 1. Deterministic: no randomness, no timing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import agentwal
from agentwal.cli import main
from agentwal.errors import CorruptionError
from agentwal.local.wal import writer
from agentwal.local.wal.frame import parse_header
from agentwal.local.wal.reader import scan_segment
from agentwal.testing import SimulatedDisk, crash

STEPS = 20
FOLD_AT = 10
COPY_AT = 15

_AGENT = f"""
import os, shutil, sys
import agentwal
path, fold, copy_to = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
store = agentwal.open(path)
for i in range(1, {STEPS} + 1):
    with store.begin("chat") as txn:
        txn["step"] = i
        txn["text"] = "message %d " % i * 4
    if fold and i == {FOLD_AT}:
        store.snapshot()
    if i == {COPY_AT}:
        shutil.copytree(os.path.join(path, "wal"), copy_to)
os._exit(0)  # killed: no close, no final fold
"""


def _agent(path: Path, older: Path, *, fold: bool) -> None:
    subprocess.run([sys.executable, "-c", _AGENT, str(path), "1" if fold else "0", str(older)],
                   check=True, timeout=120)


def _segments(path: Path) -> list[Path]:
    return sorted((path / "wal").glob("*.wal"))


def _frame_ends(seg: Path) -> list[int]:
    data = seg.read_bytes()
    header = parse_header(data)
    assert not isinstance(header, str)
    return [f.end for f in scan_segment(data, header).frames]


def _digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and p.name not in ("lock.mdb", "LOCK")}


def _delete(path: Path, older: Path) -> None:
    for seg in _segments(path):
        seg.unlink()


def _truncate_at_frame(path: Path, older: Path) -> None:
    seg = _segments(path)[-1]
    ends = _frame_ends(seg)
    with open(seg, "r+b") as f:
        f.truncate(ends[len(ends) // 2])  # ends cleanly after a whole frame


def _truncate_in_frame(path: Path, older: Path) -> None:
    seg = _segments(path)[-1]
    ends = _frame_ends(seg)
    with open(seg, "r+b") as f:
        f.truncate(ends[-2] + 7)


def _older_copy(path: Path, older: Path) -> None:
    shutil.rmtree(path / "wal")
    shutil.copytree(older, path / "wal")


FAULTS = {"deleted": _delete, "truncated-at-frame": _truncate_at_frame,
          "truncated-in-frame": _truncate_in_frame, "older-copy": _older_copy}


@pytest.mark.parametrize("fold", [False, True], ids=["never-folded", "folded"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_damaged_log_is_refused_never_an_empty_store(tmp_path: Path, fault: str,
                                                      fold: bool) -> None:
    path, older = tmp_path / "s", tmp_path / "older-wal"
    _agent(path, older, fold=fold)
    FAULTS[fault](path, older)
    before = _digest(path)
    for readonly in (True, False):
        with pytest.raises(CorruptionError) as info:
            agentwal.open(path, readonly=readonly)
        message = str(info.value)
        assert "acknowledged" in message or "missing" in message
        assert "backup" in message  # says what to do
    assert _digest(path) == before  # nothing was changed
    result = CliRunner().invoke(main, ["verify", str(path)])
    assert result.exit_code == 1, result.output
    assert "corruption" in result.output


def test_an_undamaged_killed_store_opens_with_every_step(tmp_path: Path) -> None:
    path, older = tmp_path / "s", tmp_path / "older-wal"
    _agent(path, older, fold=False)
    with agentwal.open(path) as store:
        assert store.get("chat", "step") == STEPS
        assert store.verify().ok


def test_verify_reports_a_log_deleted_under_an_open_store(tmp_path: Path) -> None:
    with agentwal.open(tmp_path / "s") as store:
        for i in range(5):
            with store.begin("chat") as txn:
                txn["step"] = i
        ro = agentwal.open(tmp_path / "s", readonly=True)
        try:
            for seg in _segments(tmp_path / "s"):
                seg.unlink()
            report = ro.verify()
        finally:
            ro.close()
        assert not report.ok
        assert any("missing" in p.what for p in report.problems), report.problems
        crash(store)  # like a kill: the store must not fold over the deleted log


def test_a_store_without_a_log_mark_opens_and_gets_one(tmp_path: Path) -> None:
    """Stores made before LOGMARK existed open as before; the first writer open writes one."""
    path = tmp_path / "s"
    with agentwal.open(path) as store, store.begin("chat") as txn:
        txn["step"] = 1
    (path / "LOGMARK").unlink()
    with agentwal.open(path, readonly=True) as ro:
        assert ro.get("chat", "step") == 1
    assert not (path / "LOGMARK").exists()
    with agentwal.open(path) as store:
        assert store.get("chat", "step") == 1
    assert (path / "LOGMARK").exists()


def test_a_torn_acknowledged_slot_falls_back_to_the_other(tmp_path: Path) -> None:
    """A power cut tearing the slot being written leaves the other one, an older true LSN."""
    from agentwal.local.logmark import SLOT_OFFSETS, read_mark

    path = tmp_path / "s"
    store = agentwal.open(path)
    for i in range(3):
        with store.begin("chat") as txn:
            txn["step"] = i
    crash(store)
    raw = bytearray((path / "LOGMARK").read_bytes())
    sid = store.store_id
    slots = [read_mark(agentwal.io.OsFileSystem(), str(path), sid)]
    assert slots[0] is not None and slots[0].acked == 3
    for off in SLOT_OFFSETS:  # one slot holds 3, the other 2: tear either
        torn = bytearray(raw)
        torn[off + 3] ^= 0xFF
        (path / "LOGMARK").write_bytes(bytes(torn))
        mark = read_mark(agentwal.io.OsFileSystem(), str(path), sid)
        assert mark is not None and mark.acked in (2, 3)
    (path / "LOGMARK").write_bytes(bytes(raw))
    body = bytearray(raw)
    body[-1] ^= 0xFF  # the segment list is replaced atomically: damage there is damage
    (path / "LOGMARK").write_bytes(bytes(body))
    with pytest.raises(CorruptionError, match="LOGMARK"):
        agentwal.open(path, readonly=True)
    assert os.path.exists(path / "CONTROL")


# -- after a power cut (the simulated disk: only what was fsynced survives) -------------


def _power_cut_then_older_log(tmp_path: Path, steps: int, copy_at: int) -> tuple[Any, str]:
    """Commit ``steps`` sync steps on a simulated disk, keeping the log as it was after
    step ``copy_at``; cut the power; put that older log back. Returns (disk image, path)."""
    disk = SimulatedDisk()
    path = str(tmp_path / "s")
    os.makedirs(path)
    store = agentwal.open(path, fs=disk, segment_bytes=1 << 20)
    older: dict[str, bytes] = {}
    wal = os.path.join(path, "wal")
    for i in range(1, steps + 1):
        with store.begin("chat") as txn:
            txn["step"] = i
        if i == copy_at:
            for name in [n for n in disk.listdir(wal) if n.endswith(".wal")]:
                fd = disk.open_read(os.path.join(wal, name))
                older[name] = disk.read(fd)
                disk.close(fd)
    image = disk.crash_image("strict")  # only what was fsynced, names included
    crash(store)
    # one preallocated segment, same size
    assert sorted(n for n in image.listdir(wal) if n.endswith(".wal")) == sorted(older)
    for name, data in older.items():
        fd = image.open(os.path.join(wal, name), create=False)
        image.pwrite(fd, 0, data)
        image.fsync(fd)
        image.close(fd)
    return image, path


def test_an_older_log_is_noticed_after_a_power_cut(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The mark's slot is fsynced every MARK_SYNC_EVERY syncs, so a power cut cannot take
    the mark back further than that: an older copy of the log below it is refused."""
    monkeypatch.setattr(writer, "MARK_SYNC_SECONDS", 1e9)  # by count only: deterministic
    steps = writer.MARK_SYNC_EVERY + 20
    image, path = _power_cut_then_older_log(tmp_path, steps, copy_at=writer.MARK_SYNC_EVERY - 1)
    for readonly in (True, False):
        with pytest.raises(CorruptionError, match="acknowledged"):
            agentwal.open(path, fs=image, readonly=readonly)


def test_what_a_power_cut_hides_is_only_the_last_mark_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stated limit (durability.md, "Known limits"): a log put back to a copy taken
    after the mark's last fsync opens to that copy, which is all the mark can tell."""
    monkeypatch.setattr(writer, "MARK_SYNC_SECONDS", 1e9)
    steps = writer.MARK_SYNC_EVERY + 20
    image, path = _power_cut_then_older_log(tmp_path, steps, copy_at=writer.MARK_SYNC_EVERY + 5)
    with agentwal.open(path, fs=image, readonly=True) as store:
        assert store.get("chat", "step") == writer.MARK_SYNC_EVERY + 5


_ROTATE_AFTER_FOLD = """
import sys
import agentwal
from agentwal.testing import failpoints
store = agentwal.open(sys.argv[1], segment_bytes=4096, wal_max_bytes=1 << 20)
for i in range(1, 6):
    with store.begin("chat") as txn:
        txn["step"] = i
store.snapshot()  # the fold covers every record: the current segment is now stale
# The next segment is made and named; the process dies before the log mark names it.
failpoints.arm("after_segment_create", "kill", exit_code=137)
with store.begin("chat") as txn:
    txn["step"] = 6
    txn["big"] = "x" * 6000
"""

_OPEN_AND_DIE = """
import sys
import agentwal
from agentwal.testing import failpoints
failpoints.arm(sys.argv[2], "kill", exit_code=137)
agentwal.open(sys.argv[1])
"""


@pytest.mark.parametrize("point", ["recovery_after_repair", "recovery_after_replay"])
def test_a_recovery_killed_after_removing_stale_segments_is_no_missing_log(
        tmp_path: Path, point: str) -> None:
    """Regression: recovery removed the stale segment the log mark still named last.

    A fold covered every record, then the next segment was named but the
    process died before the mark said so. Recovery removes the stale segment;
    if it died before the writer rewrote the mark, the next open refused the
    store ("segment ... is missing") although every record is in LMDB or in
    the newer segment.
    """
    path = tmp_path / "s"
    done = subprocess.run([sys.executable, "-c", _ROTATE_AFTER_FOLD, str(path)], timeout=120)
    assert done.returncode == 137
    before = _segments(path)
    assert len(before) == 2, before  # the stale segment and the new one
    done = subprocess.run([sys.executable, "-c", _OPEN_AND_DIE, str(path), point], timeout=120)
    assert done.returncode == 137
    with agentwal.open(str(path)) as store:
        assert store.get("chat", "step") == 5  # step 6 was never acknowledged
        assert store.verify().ok
