"""The writer's HEALTH file: its settings and its last fold/retention failure, on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import agentwal
from agentwal import health
from agentwal.errors import DiskFullError, DurabilityError
from agentwal.local.healthfile import HEALTH_FILE, HealthFile, read_health
from agentwal.testing import SimulatedDisk
from agentwal.testing import crash as crash_store


def test_a_writer_records_its_settings_once(tmp_path: Path) -> None:
    path = str(tmp_path / "s.awal")
    with agentwal.open(path, wal_max_bytes=1 << 20, durability="async") as s:
        sid = s.stats()["store_id"]
    doc = read_health(path, sid)
    assert doc is not None
    assert doc["settings"] == {"wal_max_bytes": 1 << 20, "durability": "async"}
    assert doc["fold"] is None and doc["retention"] is None
    before = os.stat(os.path.join(path, HEALTH_FILE)).st_mtime_ns
    agentwal.open(path, wal_max_bytes=1 << 20, durability="async").close()
    assert os.stat(os.path.join(path, HEALTH_FILE)).st_mtime_ns == before  # unchanged: no write
    agentwal.open(path, wal_max_bytes=2 << 20).close()
    assert read_health(path, sid)["settings"]["wal_max_bytes"] == 2 << 20  # type: ignore[index]


def test_a_fold_failing_on_the_simulated_disk_is_recorded_then_cleared(tmp_path: Path) -> None:
    path = str(tmp_path / "s.awal")
    disk = SimulatedDisk()
    s = agentwal.open(path, fs=disk, durability="none", wal_max_bytes=1 << 20)
    sid = s.stats()["store_id"]
    for i in range(5):
        with s.begin("r") as txn:
            txn["i"] = i
    disk.faults.fsync_errors.update(range(10**6))  # every fsync from now on: EIO
    with pytest.raises(DurabilityError):
        s.snapshot()  # the fold syncs the log first: EIO, the writer stops
    doc = read_health(path, sid)
    assert doc is not None and doc["fold"] is not None
    assert doc["fold"]["code"] == "durability"
    assert "Input/output error" in doc["fold"]["error"], doc["fold"]
    crash_store(s)
    disk.faults.fsync_errors.clear()
    s = agentwal.open(path, fs=disk, durability="none", wal_max_bytes=1 << 20)
    assert read_health(path, sid)["fold"] is not None  # type: ignore[index]  # until a fold works
    with s.begin("r") as txn:
        txn["i"] = 99
    s.snapshot()
    assert read_health(path, sid)["fold"] is None  # type: ignore[index]
    s.close()


def test_a_failed_fold_is_in_a_read_only_inspect_with_when_and_the_error(
        tmp_path: Path) -> None:
    path = str(tmp_path / "s.awal")
    with agentwal.open(path) as s:
        with s.begin("r") as txn:
            txn["x"] = 1
        sid = s.stats()["store_id"]
    rec = HealthFile(path, sid)
    rec.failed("fold", DurabilityError(path, "cannot sync the log: No space left on device"))
    with agentwal.open(path, readonly=True) as ro:
        st = health.inspect(ro, path)
    assert "cannot sync the log: No space left on device" in st["health_record"]["fold"]["error"]
    assert any(a.startswith("the last fold failed") and "No space left" in a
               for a in st["attention"]), st["attention"]
    rec.succeeded("fold")
    rec.failed("retention", DiskFullError(path, "no room"))
    with agentwal.open(path, readonly=True) as ro:
        st = health.inspect(ro, path)
    assert not any("fold failed" in a for a in st["attention"])
    assert [a for a in st["attention"] if a.startswith("the last retention pass failed")]
    assert st["health_record"]["retention"]["code"] == "disk_full"


@pytest.mark.parametrize("content, why", [
    (b"\x00\x00garbage", "not a JSON document"),
    (b'{"format": 7}', "format 7"),
    (b'{"format": 1, "store_id": "other"}', "another store"),
    (b'{"format": 1, "store_id": "SID", "fold": {"at": "x"}}', "malformed"),
])
def test_a_damaged_health_file_never_stops_an_open(tmp_path: Path, content: bytes,
                                                   why: str) -> None:
    path = str(tmp_path / "s.awal")
    with agentwal.open(path) as s:
        sid = s.stats()["store_id"]
    with open(os.path.join(path, HEALTH_FILE), "wb") as f:
        f.write(content.replace(b"SID", sid.encode()))
    with agentwal.open(path, readonly=True) as ro:
        st = health.inspect(ro, path)
    assert why in st["health_record"]["unreadable"]
    assert st["wal_max_bytes_from"] == "default"
    with agentwal.open(path) as s, s.begin("r") as txn:  # a writer replaces it
        txn["x"] = 1
    assert read_health(path, sid)["fold"] is None  # type: ignore[index]


def test_a_store_without_health_reads_as_none_recorded(tmp_path: Path) -> None:
    path = str(tmp_path / "s.awal")
    with agentwal.open(path) as s, s.begin("r") as txn:
        txn["x"] = 1
    os.unlink(os.path.join(path, HEALTH_FILE))  # as a store made before the file existed
    with agentwal.open(path, readonly=True) as ro:
        st = health.inspect(ro, path)
        assert ro.get("r", "x") == 1
    assert st["health_record"] is None
    assert st["wal_max_bytes"] == health.DEFAULT_WAL_MAX_BYTES
    assert st["wal_max_bytes_from"] == "default"
    assert json.dumps(st, default=str)  # --json carries it as null
