"""Every benchmark script still runs: each on a tiny size, checking what it prints, never a
timing (bench/report.py and bench/bench_workspace.py have tests of their own).

bench/bench_postgres.py is left out: it starts a PostgreSQL server of its own (tests/pg.py)
with fsync on, which costs more than the rest of this file; its backend has tests/postgres.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

# script, tiny arguments, a line its report always prints
SCRIPTS = [
    ("compare.py", ["--quick", "--seconds", "0.02", "--rounds", "1", "--no-open"],
     "1-thread sync vs"),
    ("commit_cpu.py", ["agent", "20"], '"kind": "agent"'),
    ("commit_cpu.py", ["grow", "5"], '"kind": "grow"'),
    ("bench_loop_lag.py", ["--rounds", "1", "--seconds", "0.1"], "| acommit |"),
    ("bench_retention.py", ["12", "4"], "the 4 kept checkpoints read back unchanged"),
    ("test_bench_blobs.py", ["--mib", "1", "--rounds", "1"], "put_blob"),
    ("test_bench_effects.py", ["--rounds", "1", "--seconds", "0.05"], "recorded replay"),
    ("test_bench_history.py", ["--steps", "6"], "state() head:"),
    ("test_bench_verify.py", ["--steps", "4"], "runs  checkpoints"),
    ("profile_commit.py", ["--commits", "40"], "instrumented:"),
    ("langgraph_compare.py", ["--threads", "1", "--steps", "3", "--rounds", "1"],
     "agentwal / sqlite"),
]


@pytest.mark.parametrize(("script", "args", "says"), SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_the_benchmark_script_runs_on_a_tiny_size(script: str, args: list[str], says: str,
                                                  tmp_path: Path) -> None:
    if script == "langgraph_compare.py" and importlib.util.find_spec("langgraph") is None:
        pytest.skip("the langgraph extra is not installed")
    env = {**os.environ, "AGENTWAL_BENCH_DIR": str(tmp_path / "stores"),
           "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert says in done.stdout, done.stdout
    stores = tmp_path / "stores"
    assert not stores.exists() or not any(stores.iterdir())  # it cleaned up after itself
