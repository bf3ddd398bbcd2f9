"""Every benchmark script still runs: each on a tiny size, checking what it prints, never a
timing (bench/report.py and bench/bench_workspace.py have tests of their own), and the
pytest-benchmark files run once each with ``--benchmark-disable``, their largest sizes left out.

The PostgreSQL scripts run on the tests' server (``AGENTWAL_PG=dsn``: tests/pg.py hands them
that server instead of starting one, and ``benchlib.make_durable`` leaves its settings alone).
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
    # (its reads and ledger run shrunk in tests/test_bench_report.py's quick report)
    ("compare.py", ["--quick", "--seconds", "0.02", "--rounds", "1", "--no-open", "--no-reads",
                    "--no-ledger"], "1-thread sync vs"),
    ("commit_cpu.py", ["agent", "20"], '"kind": "agent"'),
    ("commit_cpu.py", ["grow", "5"], '"kind": "grow"'),
    ("open_cpu.py", ["wal", "1", "--opens", "1"], '"kind": "wal"'),
    ("open_cpu.py", ["history", "30", "--opens", "1"], '"kind": "history"'),
    ("bench_loop_lag.py", ["--rounds", "1", "--seconds", "0.1"], "| acommit |"),
    ("bench_retention.py", ["12", "4"], "the 4 kept checkpoints read back unchanged"),
    ("test_bench_blobs.py", ["--mib", "1", "--rounds", "1"], "put_blob"),
    ("test_bench_effects.py", ["--rounds", "1", "--seconds", "0.05"], "recorded replay"),
    ("test_bench_history.py", ["--steps", "6"], "state() head:"),
    ("test_bench_verify.py", ["--steps", "4"], "runs  checkpoints"),
    ("profile_commit.py", ["--commits", "40"], "instrumented:"),
    ("langgraph_compare.py", ["--threads", "1", "--steps", "3", "--rounds", "1"],
     "agentwal / sqlite"),
    ("langgraph_pages.py", ["--threads", "1", "--steps", "3"], "bytes on disk per checkpoint"),
    ("saver_cpu.py", ["--threads", "2", "--steps", "3", "--warm", "2"], "SqliteSaver "),
    ("bench_logmark.py", ["--rounds", "1", "--commits", "10"], "with the slot write"),
    ("bench_footprint.py", ["--stores", "5", "--steps", "5"], "empty store:"),
    ("value_pages.py", ["--count", "3"], "disk / value"),
]
# the same, on a PostgreSQL server (the schemas and table each one leaves are dropped after)
PG_SCRIPTS = [
    ("bench_postgres.py", ["--rounds", "1", "--seconds", "0.1", "--blob-mib", "1",
                           "--list-steps", "40"],
     "postgres  blob tables:"),
    ("bench_postgres_reads.py", ["--steps", "6", "--repeat", "1"], "42 delta rows"),
    ("bench_postgres_fleet.py", ["--workers", "1", "--seconds", "1", "--ttl", "0.3"],
     "kill -9 to next commit"),
    ("langgraph_postgres_compare.py", ["--threads", "1", "--steps", "3", "--rounds", "1"],
     "agentwal / PostgresSaver"),
    ("saver_cpu.py", ["--threads", "2", "--steps", "3", "--warm", "2", "--postgres"],
     "AgentWALSaver (PostgreSQL) "),
    ("saver_ab.py", [str(BENCH.parent), str(BENCH.parent), "--pairs", "1", "--threads", "2",
                     "--steps", "2", "--warm", "2", "--postgres-saver"],
     "B / PostgresSaver steps/s per pair"),
    ("saver_ab.py", [str(BENCH.parent), str(BENCH.parent), "--pairs", "1", "--steps", "2",
                     "--warm", "2", "--cpu"], "server_ms: A median"),
]

#: the scripts that need the langgraph extra
_LANGGRAPH = {"langgraph_compare.py", "langgraph_pages.py", "langgraph_postgres_compare.py",
              "saver_cpu.py", "saver_ab.py"}


@pytest.mark.parametrize(("script", "args", "says"), SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_the_benchmark_script_runs_on_a_tiny_size(script: str, args: list[str], says: str,
                                                  tmp_path: Path) -> None:
    if script in _LANGGRAPH and importlib.util.find_spec("langgraph") is None:
        pytest.skip("the langgraph extra is not installed")
    env = {**os.environ, "AGENTWAL_BENCH_DIR": str(tmp_path / "stores"),
           "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert says in done.stdout, done.stdout
    stores = tmp_path / "stores"
    assert not stores.exists() or not any(stores.iterdir())  # it cleaned up after itself


@pytest.mark.parametrize(("script", "args", "says"), PG_SCRIPTS, ids=[s[0] for s in PG_SCRIPTS])
def test_the_postgres_benchmark_script_runs_on_a_tiny_size(
        script: str, args: list[str], says: str, tmp_path: Path, pg_dsn: str) -> None:
    import psycopg

    if script in _LANGGRAPH and importlib.util.find_spec("langgraph") is None:
        pytest.skip("the langgraph extra is not installed")
    env = {**os.environ, "AGENTWAL_BENCH_DIR": str(tmp_path / "stores"),
           "TMPDIR": str(tmp_path), "AGENTWAL_PG": "dsn", "AGENTWAL_PG_DSN": pg_dsn}
    try:
        done = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300,
                              check=False)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for schema in ("bench", "fleet", "reads"):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            conn.execute("DROP TABLE IF EXISTS public.pgbench_one")
            left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'lg_%' "
                                "OR nspname LIKE 'cpu_%'").fetchall()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert says in done.stdout, done.stdout
    assert left == []  # langgraph_postgres_compare.py drops its schemas itself
    stores = tmp_path / "stores"
    assert not stores.exists() or not any(stores.iterdir())


def test_the_pytest_benchmark_files_run_once_each(tmp_path: Path) -> None:
    # the 64 MiB log and the 100,000-checkpoint store take longer to build than the rest
    env = {**os.environ, "AGENTWAL_BENCH_DIR": str(tmp_path / "stores"),
           "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(BENCH), "-p", "no:cacheprovider",
         "--benchmark-disable", "-k", "not 64 and not 100000"], cwd=BENCH.parent,
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-2000:]
    stores = tmp_path / "stores"
    assert not stores.exists() or not any(stores.iterdir())
