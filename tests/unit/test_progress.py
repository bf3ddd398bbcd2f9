"""``progress=`` of verify, backup and compact: the phases documented in api.md, in order,
each rising to its total; the result is the same as without it; what it raises propagates
and leaves nothing half-done."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal.local.verify.snapshot_checks import SNAPSHOT_PARTS


class Recorder:
    def __init__(self, fail_at: str | None = None) -> None:
        self.calls: list[tuple[str, int, int | None]] = []
        self.fail_at = fail_at

    def __call__(self, phase: str, done: int, total: int | None) -> None:
        self.calls.append((phase, done, total))
        if phase.split(":")[0] == self.fail_at:
            raise KeyboardInterrupt  # what Ctrl-C in a CLI's callback looks like

    def phases(self) -> list[str]:
        """The phases in order, without the part a phase names after a colon."""
        out: list[str] = []
        for phase, _, _ in self.calls:
            if not out or out[-1] != phase.split(":")[0]:
                out.append(phase.split(":")[0])
        return out

    def check_each_phase_rises_to_its_total(self) -> None:
        for phase in self.phases():
            calls = [(d, t) for p, d, t in self.calls if p.split(":")[0] == phase]
            dones = [d for d, _ in calls]
            assert dones == sorted(dones), (phase, calls)
            total = calls[-1][1]
            if total is not None:
                assert dones[-1] == total and all(t == total for _, t in calls), (phase, calls)


def _fill(path: str, runs: int = 3, steps: int = 6) -> None:
    with agentwal.open(path, wal_max_bytes=1 << 20) as s:
        for r in range(runs):
            for i in range(steps):
                with s.begin(f"run-{r}") as txn:
                    txn["step"] = i
                    txn["text"] = "x" * 200 * i
        with s.begin("run-0") as txn:
            txn.put_blob("report", io.BytesIO(b"%PDF" * 1000), media_type="application/pdf")


@pytest.fixture
def path(tmp_path: Path) -> str:
    p = str(tmp_path / "p.awal")
    _fill(p)
    return p


@pytest.mark.parametrize("readonly", [False, True])
def test_verify_reports_snapshot_log_and_blobs(path: str, readonly: bool) -> None:
    rec = Recorder()
    with agentwal.open(path, readonly=readonly) as s:
        report = s.verify(progress=rec)
        plain = s.verify()
    assert report == plain and report.ok
    assert rec.phases() == ["snapshot", "log", "blobs"]
    rec.check_each_phase_rises_to_its_total()
    assert rec.calls[-1] == ("blobs", report.checked["blob_bytes"], report.checked["blob_bytes"])
    parts = [p for p, _, _ in rec.calls if p.startswith("snapshot:")]
    assert parts == [f"snapshot: {part}" for part in SNAPSHOT_PARTS] + ["snapshot: effects"]
    assert rec.calls[len(parts) - 1] == ("snapshot: effects", 11, 11)
    assert [d for p, d, _ in rec.calls[:3]] == [0, 1, 2]  # told as each part begins


def test_backup_reports_log_snapshot_and_blobs(path: str, tmp_path: Path) -> None:
    rec = Recorder()
    with agentwal.open(path, readonly=True) as s:
        rep = s.backup(str(tmp_path / "copy.awal"), progress=rec)
    assert rec.phases() == ["log", "snapshot", "blobs"]
    rec.check_each_phase_rises_to_its_total()
    assert ("snapshot: LMDB copy", 0, 1) in rec.calls and ("snapshot: LMDB copy", 1, 1) in rec.calls
    assert rec.calls[-1][2] is None
    with agentwal.open(rep.path, readonly=True) as copy:
        assert copy.verify().ok and copy.runs() == ["run-0", "run-1", "run-2"]


def test_a_raising_callback_stops_the_backup_and_publishes_nothing(path: str,
                                                                   tmp_path: Path) -> None:
    dest = str(tmp_path / "copy.awal")
    with agentwal.open(path) as s, pytest.raises(KeyboardInterrupt):
        s.backup(dest, progress=Recorder(fail_at="snapshot"))
    assert not os.path.exists(dest)


def test_compact_reports_fold_runs_and_vacuum(path: str) -> None:
    rec = Recorder()
    with agentwal.open(path) as s:
        rep = s.compact(keep_last=2, vacuum=True, progress=rec)
        assert [c.id for c in s.history("run-1")] == [6, 5]
    assert rep.checkpoints_dropped == 5 + 4 + 4  # run-0 has a 7th checkpoint: the blob
    assert rec.phases() == ["fold", "runs", "vacuum"]
    rec.check_each_phase_rises_to_its_total()
    assert ("runs", 3, 3) in rec.calls


def test_a_raising_callback_before_the_commit_drops_nothing(path: str) -> None:
    with agentwal.open(path) as s:
        before = {r: [c.id for c in s.history(r)] for r in s.runs()}
        with pytest.raises(KeyboardInterrupt):
            s.compact(keep_last=1, progress=Recorder(fail_at="runs"))
        assert {r: [c.id for c in s.history(r)] for r in s.runs()} == before
        assert s.verify().ok
        assert s.compact(keep_last=1).checkpoints_dropped > 0  # the store goes on


def test_copy_runs_reports_checkpoints(path: str, tmp_path: Path) -> None:
    rec = Recorder()
    with agentwal.open(path, readonly=True) as src, \
            agentwal.open(str(tmp_path / "dest.awal")) as dest:
        rep = src.copy_runs(dest, runs=["run-1", "run-2"], progress=rec)
        assert [c.id for c in dest.history("run-2")] == [c.id for c in src.history("run-2")]
    assert rec.phases() == ["checkpoints"]
    rec.check_each_phase_rises_to_its_total()
    assert rec.calls[0] == ("checkpoints", 0, 12) and rec.calls[-1] == ("checkpoints", 12, 12)
    assert rep.checkpoints == 12


def test_progress_is_keyword_only(path: str, tmp_path: Path) -> None:
    with agentwal.open(path) as s:
        bad: Any = s.verify
        with pytest.raises(TypeError):
            bad(Recorder())
        bad = s.backup
        with pytest.raises(TypeError):
            bad(str(tmp_path / "c.awal"), Recorder())
