#!/usr/bin/env python3
"""Reads of a long run on PostgreSQL: the head's state, an old checkpoint's, a small prefix.

Usage::

    .venv/bin/python bench/bench_postgres_reads.py                  # 2,000 steps
    .venv/bin/python bench/bench_postgres_reads.py --steps 5000 --repeat 20

One run of ``--steps`` commits on a throwaway server (``tests/pg.py``), each
step rewriting five small "hot" keys (a counter, channel versions: what a
LangGraph saver rewrites every step) and adding one ~300-byte message under
its own key ``messages/NNNNNN`` and one pending write ``w/NNNNNN/0``. Then,
each ``--repeat`` times, the median milliseconds of

- ``state(run)``: the head's whole state;
- ``state(run, at=steps // 2)``: an old checkpoint's;
- ``txn.items("w/<last>/")`` at the head: one checkpoint's writes, as the
  saver's ``get_tuple`` and ``list`` read them;
- ``get(run, "hot/0", at=steps // 2)``: one key at an old checkpoint.

The server runs with ``fsync=off`` (reads do not flush); only the read
path's cost is measured, on whatever code the script is run from (run it
from another checkout's ``bench/`` to compare).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agentwal
from tests import pg


def fill(store: Any, steps: int) -> None:
    for i in range(steps):
        with store.begin("run") as txn:
            for h in range(5):
                txn[f"hot/{h}"] = i
            txn[f"messages/{i:06d}"] = {"role": "agent", "text": "m" * 280}
            txn[f"w/{i:06d}/0"] = {"task": "t", "value": i}


def median_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    why: list[str] = []
    server = pg.start(why)
    if server is None:
        sys.exit("no PostgreSQL server: " + "; ".join(why))
    try:
        store = agentwal.open(server.dsn, schema="reads", worker_id="bench", durability="async")
        fill(store, args.steps)
        mid, last = args.steps // 2, args.steps - 1

        def items() -> None:
            with store.begin("run") as txn:
                assert len(list(txn.items(f"w/{last:06d}/"))) == 1

        rows = {
            "state(run)": lambda: store.state("run"),
            f"state(run, at={mid})": lambda: store.state("run", at=mid),
            "txn.items(one checkpoint's writes)": items,
            f"get(run, 'hot/0', at={mid})": lambda: store.get("run", "hot/0", at=mid),
        }
        print(f"{args.steps} steps, {args.steps * 7} delta rows; median of {args.repeat}, ms")
        for name, fn in rows.items():
            print(f"  {name:38s} {median_ms(fn, args.repeat):9.2f}")
        store.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
