"""bench/bench_workspace.py runs on a small tree and reports every figure (timings unchecked)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_workspace.py"


@pytest.mark.skipif(shutil.which("git") is None, reason="the benchmark runs git beside agentwal")
def test_the_workspace_benchmark_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--files", "300", "--rounds", "2",
                           "--keep", str(tmp_path)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for row in ("first snapshot", "status, 1 file changed", "snapshot, 1 file changed",
                "snapshot, 100 files changed", "restore the round's first checkpoint (",
                "CPU time (user + system, medians)",
                "bytes added by the one-file snapshot"):
        assert row in out
    # the one-file snapshot adds the file plus at most 4 KiB (the goal)
    tail = out.split("(file ")[1]
    overhead = int(tail.split(" + ")[1].split(")")[0].replace(",", ""))
    assert overhead <= 4096
