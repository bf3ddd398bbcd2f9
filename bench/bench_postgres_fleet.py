#!/usr/bin/env python3
"""A fleet on one PostgreSQL server: steps/s by worker count beside pgbench, and failover time.

Usage::

    .venv/bin/python bench/bench_postgres_fleet.py                      # 1 2 4 8 workers, 3 s
    .venv/bin/python bench/bench_postgres_fleet.py --workers 1 2 4 --seconds 5 --ttl 1 2 5

*Scaling*: N worker processes, each with its own store handle (its own pool
and heartbeat) on its own run, start together and run agent steps
(``begin``, ``get``, two ``put``, commit; ``durability="sync"``) for
``--seconds``; reported are the total steps/s and steps/s per worker. Beside
each N, ``pgbench -c N -j N`` runs a one-row ``INSERT`` transaction for the
same time against the same server: what the server itself does with N
clients committing synchronously, the ceiling for one-commit steps.

*Failover*: a worker process commits in a loop with ``lease_ttl=T``; it is
killed with SIGKILL; another process polls ``store.lease(run)`` every 50 ms
and commits. Reported: seconds from the kill to that commit, per TTL.

The server is a throwaway one started as the tests start one (``tests/pg.py``)
with ``fsync``, ``synchronous_commit`` and ``full_page_writes`` on.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from benchlib import make_durable

from agentwal import LeaseHeldError
from agentwal.postgres import open_postgres
from tests import pg

SCHEMA = "fleet"


def _steps(dsn: str, run: str, start: Any, seconds: float, out: Any) -> None:
    """One worker: wait for the start, then count steps for ``seconds``."""
    store = open_postgres(dsn, schema=SCHEMA, worker_id=run, durability="sync", pool_size=2)
    store.lease(run)
    start.wait()
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        with store.begin(run) as txn:
            i = txn.get("i", 0)
            txn["i"] = i + 1
            txn[f"messages/{i:06d}"] = {"role": "agent", "text": "m" * 280}
        n += 1
    store.close()
    out.put(n)


def scaling(dsn: str, workers: int, seconds: float, tag: str) -> float:
    """Total steps/s of ``workers`` processes on their own runs."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_steps, args=(dsn, f"{tag}-w{i}", start, seconds, out))
             for i in range(workers)]
    for p in procs:
        p.start()
    time.sleep(2.0)  # every worker has opened and leased its run (spawn + import)
    start.set()
    total = sum(out.get(timeout=120 + seconds) for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def pgbench(binary: str, dsn: str, clients: int, seconds: float, script: str) -> float:
    """pgbench's transactions/s for a one-row INSERT with ``clients`` clients."""
    cmd = [binary, "-n", "-c", str(clients), "-j", str(clients), "-T", str(int(seconds)),
           "-f", script, dsn]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    for line in done.stdout.splitlines():
        if line.startswith("tps ="):
            return float(line.split()[2])
    raise RuntimeError(f"no tps line in pgbench's output:\n{done.stdout}\n{done.stderr}")


def _holder(dsn: str, run: str, ttl: float, ready: Any) -> None:
    store = open_postgres(dsn, schema=SCHEMA, worker_id="holder", lease_ttl=ttl,
                          durability="sync")
    store.lease(run)
    ready.set()
    while True:
        with store.begin(run) as txn:
            txn["n"] = txn.get("n", 0) + 1


def failover(dsn: str, ttl: float, run: str) -> float:
    """Seconds from SIGKILL of the holder to the next worker's first commit."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_holder, args=(dsn, run, ttl, ready))
    holder.start()
    ready.wait(60)
    time.sleep(ttl)  # a few renewals in
    taker = open_postgres(dsn, schema=SCHEMA, worker_id="taker", lease_ttl=ttl,
                          durability="sync")
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    killed = time.perf_counter()
    holder.join()
    while True:
        try:
            taker.lease(run)
            break
        except LeaseHeldError:
            time.sleep(0.05)
    with taker.begin(run) as txn:
        txn["n"] = txn.get("n", 0) + 1
    took = time.perf_counter() - killed
    taker.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--ttl", type=float, nargs="+", default=[1.0, 2.0, 5.0])
    args = ap.parse_args()
    why: list[str] = []
    server = pg.start(why)
    if server is None:
        sys.exit("no PostgreSQL server: " + "; ".join(why))
    scratch = tempfile.mkdtemp(prefix="agentwal-fleet-")
    try:
        make_durable(server)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS pgbench_one (v double precision)")
            version = conn.execute("SHOW server_version").fetchone()
        open_postgres(server.dsn, schema=SCHEMA, worker_id="setup").close()
        binary = _pgbench_binary()
        script = os.path.join(scratch, "insert.sql")
        Path(script).write_text("INSERT INTO pgbench_one (v) VALUES (random());\n")
        print(f"server: {server.how}, PostgreSQL {version[0] if version else '?'}; "
              f"cpus {os.cpu_count()}; load {os.getloadavg()[0]:.1f}; pgbench {binary}")
        print(f"{'workers':>7} {'steps/s':>9} {'per worker':>10} {'pgbench tps':>11}")
        for n in args.workers:
            rate = scaling(server.dsn, n, args.seconds, f"n{n}")
            tps = pgbench(binary, server.dsn, n, args.seconds, script)
            print(f"{n:>7} {rate:>9,.0f} {rate / n:>10,.0f} {tps:>11,.0f}")
        print(f"{'ttl s':>7} {'kill -9 to next commit, s':>26}")
        for ttl in args.ttl:
            print(f"{ttl:>7.1f} {failover(server.dsn, ttl, f'failover-{ttl}'):>26.2f}")
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def _pgbench_binary() -> str:
    """pgbench from pgserver's install, else the system's, else PATH's."""
    candidates = []
    try:
        import pgserver  # type: ignore[import-untyped]

        candidates.append(Path(pgserver.__file__).parent / "pginstall" / "bin" / "pgbench")
    except ImportError:
        pass
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True)
    for c in candidates:
        if c.exists():
            return str(c)
    found = shutil.which("pgbench")
    if found is None:
        sys.exit("no pgbench binary (pgserver's, /usr/lib/postgresql/*/bin, or on PATH)")
    return found


if __name__ == "__main__":
    main()
