#!/usr/bin/env python3
"""AgentWALSaver over a PostgreSQL store beside LangGraph's PostgresSaver, on one server.

Usage::

    .venv/bin/python bench/langgraph_postgres_compare.py                 # 4 threads x 200 steps
    .venv/bin/python bench/langgraph_postgres_compare.py --threads 2 --steps 50 --rounds 1

The workload is ``bench/langgraph_compare.py``'s (the Pregel loop's calls for
a one-node chat graph: ``put_writes`` of one new ~1 KiB message, then ``put``
of the next checkpoint holding the whole conversation), with both savers on
one throwaway server (``tests/pg.py``; ``fsync``, ``synchronous_commit`` and
``full_page_writes`` on), each in a schema of its own: ``AgentWALSaver`` over
``agentwal.open(dsn, durability="sync")``, and ``PostgresSaver`` (package
``langgraph-checkpoint-postgres``, in the ``dev`` extra) over a psycopg pool.
Bytes per checkpoint are the growth of ``pg_total_relation_size`` of the
schema's tables over the last 20 steps of every thread (pages of 8 KiB, so
coarse), divided by the checkpoints saved. Rounds alternate which saver goes
first; figures are medians, ratios the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from benchlib import make_durable
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph_compare import measure
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

import agentwal
from agentwal.integrations.langgraph import AgentWALSaver
from tests import pg


def schema_bytes(dsn: str) -> Any:
    def size(schema: str) -> int:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'm')", (schema,)).fetchone()
        return int(row[0]) if row else 0
    return size


def drop(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextlib.contextmanager
def agentwal_saver(dsn: str, schema: str) -> Iterator[AgentWALSaver]:
    """AgentWALSaver over a ``durability="sync"`` store in ``schema``, dropped afterwards."""
    try:
        with agentwal.open(dsn, schema=schema, worker_id="bench", durability="sync") as store:
            yield AgentWALSaver(store)
    finally:
        drop(dsn, schema)


@contextlib.contextmanager
def postgres_saver(dsn: str, schema: str, connections: int) -> Iterator[PostgresSaver]:
    """LangGraph's PostgresSaver on a pool of ``connections`` in ``schema``, dropped afterwards."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    kwargs = {"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0,
              "options": f"-c search_path={schema}"}
    try:
        with ConnectionPool(dsn, min_size=1, max_size=connections, kwargs=kwargs) as pool:
            saver = PostgresSaver(pool)  # type: ignore[arg-type]
            saver.setup()
            yield saver
    finally:
        drop(dsn, schema)


def run_agentwal(dsn: str, args: argparse.Namespace, rnd: int) -> dict[str, Any]:
    schema = f"lg_aw_{rnd}"
    with agentwal_saver(dsn, schema) as saver:
        return measure("AgentWALSaver (PostgreSQL)", saver, lambda: None, schema,
                       args.threads, args.steps, args.message_bytes, schema_bytes(dsn))


def run_postgres_saver(dsn: str, args: argparse.Namespace, rnd: int) -> dict[str, Any]:
    schema = f"lg_ps_{rnd}"
    with postgres_saver(dsn, schema, args.threads) as saver:
        return measure("PostgresSaver", saver, lambda: None, schema, args.threads,
                       args.steps, args.message_bytes, schema_bytes(dsn))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--message-bytes", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    why: list[str] = []
    server = pg.start(why)
    if server is None:
        sys.exit("no PostgreSQL server: " + "; ".join(why))
    try:
        make_durable(server)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        runs: dict[str, list[dict[str, Any]]] = {"postgres_saver": [], "agentwal": []}
        for rnd in range(args.rounds):
            order = [("postgres_saver", run_postgres_saver), ("agentwal", run_agentwal)]
            for name, run in order if rnd % 2 == 0 else order[::-1]:
                runs[name].append(run(server.dsn, args, rnd))
    finally:
        server.stop()
    med = statistics.median
    cols = ["puts_per_s", "get_tuple_p50_ms", "list_all_s", "bytes_per_checkpoint_at_end"]
    pairs = list(zip(runs["agentwal"], runs["postgres_saver"], strict=True))
    print(f"{args.threads} threads x {args.steps} steps, {args.message_bytes} B messages, "
          f"{args.rounds} rounds, PostgreSQL {version[0] if version else '?'} ({server.how}); "
          f"medians; load {os.getloadavg()[0]:.1f}")
    print(f"{'':28}" + "".join(f"{c:>29}" for c in cols))
    for rs in runs.values():
        print(f"{rs[0]['saver']:28}" + "".join(f"{med(r[c] for r in rs):>29,.3f}"
                                               for c in cols))
    print("agentwal / PostgresSaver (median of per-round ratios): " + ", ".join(
        f"{c} {med(a[c] / p[c] for a, p in pairs if p[c]):.3f}x" for c in cols))


if __name__ == "__main__":
    main()
