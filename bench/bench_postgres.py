#!/usr/bin/env python3
"""Agent steps per second on PostgreSQL beside the local engine, on this machine.

Usage::

    .venv/bin/python bench/bench_postgres.py                 # 3 rounds of 3 s per variant
    .venv/bin/python bench/bench_postgres.py --rounds 5 --seconds 5

A *step* is what an agent loop does per node: ``begin``, ``get`` of one key,
two ``put`` (a counter and a 300-byte message under its own key), commit.
Variants, interleaved round by round so load changes hit them alike:

- ``local``: the local engine, ``durability="sync"`` (one fdatasync per commit).
- ``postgres``: ``agentwal.open("postgresql://...")`` with ``durability="sync"``
  on a throwaway server started the way the tests start one (``tests/pg.py``:
  pgserver or the system's ``initdb``), with the server's own ``fsync=on`` and
  ``synchronous_commit=on`` (the tests' server turns them off; this one does not).

Reported: steps per second per round and the median over rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from benchlib import bench_root, fs_type, make_durable

import agentwal
from tests import pg


def steps(store: Any, run: str, seconds: float) -> float:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        with store.begin(run) as txn:
            i = txn.get("i", 0)
            txn["i"] = i + 1
            txn[f"messages/{i:06d}"] = {"role": "agent", "text": "m" * 280}
        n += 1
    return n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    why: list[str] = []
    server = pg.start(why)
    if server is None:
        sys.exit("no PostgreSQL server: " + "; ".join(why))
    root = ""
    try:
        make_durable(server)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        print(f"server: {server.how}, PostgreSQL {version[0] if version else '?'}; "
              f"cpus {os.cpu_count()}")
        root = tempfile.mkdtemp(prefix="agentwal-bench-", dir=bench_root())
        print(f"local store on {fs_type(root)} ({root})")
        local = agentwal.open(os.path.join(root, "s.awal"), durability="sync")
        remote = agentwal.open(server.dsn, schema="bench", worker_id="bench",
                               durability="sync")
        results: dict[str, list[float]] = {"local": [], "postgres": []}
        for r in range(args.rounds):
            results["local"].append(steps(local, f"r{r}", args.seconds))
            results["postgres"].append(steps(remote, f"r{r}", args.seconds))
        local.close()
        remote.close()
        for name, rates in results.items():
            shown = ", ".join(f"{x:,.0f}" for x in rates)
            print(f"{name:9s} steps/s per round: {shown}; median {statistics.median(rates):,.0f}")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
