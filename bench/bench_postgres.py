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

Reported: steps per second per round and the median over rounds. Then, with
``--blob-mib N`` (default 32), one blob of N MiB of random bytes put with
``txn.put_blob`` and read back with ``open_blob`` on each backend: MiB/s each
way, and on PostgreSQL the blob tables' ``pg_total_relation_size`` against N.
Then, with ``--list-steps N`` (default 200), a conversation of N steps on
PostgreSQL whose ``messages`` list (one key, 300-byte messages) grows by
``txn.append``: the bytes its delta rows and values hold (append-shared
lists: each step's new message, plus a whole list every ``MAX_CHAIN`` steps)
beside the sum of the whole lists (what one whole value per step stores).
"""

from __future__ import annotations

import argparse
import io
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


def blob_rates(store: Any, mib: int) -> tuple[float, float]:
    """MiB/s of one put_blob and one full open_blob read of ``mib`` random MiB."""
    data = os.urandom(mib << 20)
    t0 = time.perf_counter()
    with store.begin("blob") as txn:
        txn.put_blob("b", io.BytesIO(data))
    t1 = time.perf_counter()
    with store.open_blob("blob", "b") as f:
        while f.read(1 << 20):
            pass
    t2 = time.perf_counter()
    return mib / (t1 - t0), mib / (t2 - t1)


def list_bytes(store: Any, dsn: str, schema: str, n: int) -> tuple[int, int]:
    """(bytes stored for a ``messages`` list grown by one message per step over ``n``
    steps, the sum of the whole list's length over those steps)."""
    for i in range(n):
        with store.begin("conversation") as txn:
            txn.append("messages", {"role": "agent", "text": f"{i} " + "m" * 280})
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT sum(coalesce(octet_length(d.inline), 0)), sum(d.vlen), "
            f"(SELECT sum(octet_length(v.data)) FROM {schema}.vals v WHERE v.digest IN "
            f"(SELECT digest FROM {schema}.deltas WHERE run = 'conversation')) "
            f"FROM {schema}.deltas d WHERE d.run = 'conversation' AND d.key = 'messages'"
            ).fetchone()
    assert row is not None
    return int(row[0] or 0) + int(row[2] or 0), int(row[1] or 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--blob-mib", type=int, default=32)
    ap.add_argument("--list-steps", type=int, default=200)
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
        for name, rates in results.items():
            shown = ", ".join(f"{x:,.0f}" for x in rates)
            print(f"{name:9s} steps/s per round: {shown}; median {statistics.median(rates):,.0f}")
        if args.blob_mib:
            for name, store in (("local", local), ("postgres", remote)):
                put, get = blob_rates(store, args.blob_mib)
                print(f"{name:9s} blob of {args.blob_mib} MiB: put {put:,.0f} MiB/s, "
                      f"open_blob read {get:,.0f} MiB/s")
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                row = conn.execute("SELECT pg_total_relation_size('bench.blob_chunks') + "
                                   "pg_total_relation_size('bench.blobs')").fetchone()
            size = int(row[0]) if row else 0
            print(f"postgres  blob tables: {size / (1 << 20):,.2f} MiB for {args.blob_mib} MiB "
                  f"of content ({size / (args.blob_mib << 20):.3f}x)")
        if args.list_steps:
            stored, whole = list_bytes(remote, server.dsn, "bench", args.list_steps)
            n = args.list_steps
            print(f"postgres  a {n}-step messages list: {stored / n:,.0f} bytes stored per step "
                  f"(whole lists: {whole / n:,.0f} per step; {whole / max(stored, 1):,.1f}x)")
        local.close()
        remote.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
