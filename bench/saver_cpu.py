#!/usr/bin/env python3
"""Where a LangGraph saver step's time goes: this process's CPU per step, beside wall time.

Usage::

    .venv/bin/python bench/saver_cpu.py                  # local files: AgentWALSaver, SqliteSaver
    .venv/bin/python bench/saver_cpu.py --postgres       # and both savers on a throwaway server

Drives each saver with ``bench/langgraph_compare.py``'s workload (the Pregel
loop's ``put_writes`` of one ~1 KiB message, then ``put`` of the checkpoint
holding the whole conversation), first from one Python thread, then from
``--threads`` threads at once, and reports per step:

- ``cpu ms``: CPU time of the driving thread (``time.thread_time``), one thread:
  the Python work of a step (the saver, agentwal or the driver, psycopg),
  without the server's or the disk's time;
- ``wall ms``: wall time of that step, one thread;
- ``N-thread steps/s`` and ``process CPU``: the rate with N threads, and this
  process's CPU time over that wall time (100 % is one core: with the GIL, a
  process that is near 100 % is bound by its own Python CPU, not by the disk
  or the server).

The figures say which goal a change can move: a saver whose N-thread run is
near 100 % of a core gains throughput only by less CPU per step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import scratch_dir
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph_compare import drive

import agentwal
from agentwal.integrations.langgraph import AgentWALSaver

Opener = Callable[[], contextlib.AbstractContextManager[BaseCheckpointSaver[Any]]]


def _state(t: int) -> dict[str, Any]:
    return {"config": {"configurable": {"thread_id": f"thread-{t}", "checkpoint_ns": ""}},
            "messages": []}


def measure(saver: BaseCheckpointSaver[Any], threads: int, warm: int, steps: int,
            size: int) -> dict[str, float]:
    """One thread's CPU and wall per step, then ``threads`` threads' rate and CPU share."""
    one = _state(0)
    drive(saver, "thread-0", 0, 0, warm, size, one)
    cpu, wall = time.thread_time(), time.perf_counter()
    drive(saver, "thread-0", 0, warm, steps, size, one)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    states = [_state(t) for t in range(1, threads + 1)]
    for t, st in enumerate(states, 1):
        drive(saver, f"thread-{t}", t, 0, warm, size, st)
    workers = [threading.Thread(target=drive, args=(saver, f"thread-{t}", t, warm, steps, size,
                                                    st))
               for t, st in enumerate(states, 1)]
    pcpu, pwall = time.process_time(), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    pcpu, pwall = time.process_time() - pcpu, time.perf_counter() - pwall
    return {"cpu_ms": cpu / steps * 1e3, "wall_ms": wall / steps * 1e3,
            "rate": threads * steps / pwall, "process_cpu": pcpu / pwall}


def local_savers(d: str) -> dict[str, Opener]:
    @contextlib.contextmanager
    def aw() -> Iterator[BaseCheckpointSaver[Any]]:
        with agentwal.open(os.path.join(d, "lg.awal"), durability="sync") as store:
            yield AgentWALSaver(store)

    @contextlib.contextmanager
    def sq() -> Iterator[BaseCheckpointSaver[Any]]:
        conn = sqlite3.connect(os.path.join(d, "lg.sqlite"), check_same_thread=False,
                               isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()

    return {"AgentWALSaver": aw, "SqliteSaver": sq}


def postgres_savers(dsn: str, threads: int) -> dict[str, Opener]:
    from langgraph_postgres_compare import agentwal_saver, postgres_saver

    return {"AgentWALSaver (PostgreSQL)": lambda: agentwal_saver(dsn, "cpu_aw"),
            "PostgresSaver": lambda: postgres_saver(dsn, "cpu_pg", threads + 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100, help="timed steps per thread")
    ap.add_argument("--warm", type=int, default=100,
                    help="steps per thread before timing (the conversation's length then)")
    ap.add_argument("--message-bytes", type=int, default=1024)
    ap.add_argument("--postgres", action="store_true",
                    help="also both savers on a throwaway PostgreSQL server (tests/pg.py)")
    args = ap.parse_args()
    rows: list[tuple[str, dict[str, float]]] = []
    with scratch_dir() as d:
        openers = local_savers(d)
        server = None
        if args.postgres:
            from tests import pg

            why: list[str] = []
            server = pg.start(why)
            if server is None:
                sys.exit("no PostgreSQL server: " + "; ".join(why))
            openers.update(postgres_savers(server.dsn, args.threads))
        try:
            for name, opener in openers.items():
                with opener() as saver:
                    rows.append((name, measure(saver, args.threads, args.warm, args.steps,
                                               args.message_bytes)))
        finally:
            if server is not None:
                server.stop()
    print(f"{args.steps} steps per thread after {args.warm}, {args.message_bytes} B messages; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'saver':28} {'cpu ms':>8} {'wall ms':>8} {f'{args.threads}-thread steps/s':>18} "
          f"{'process CPU':>12}")
    for name, r in rows:
        print(f"{name:28} {r['cpu_ms']:8.2f} {r['wall_ms']:8.2f} {r['rate']:18.1f} "
              f"{r['process_cpu'] * 100:11.0f}%")


if __name__ == "__main__":
    main()
