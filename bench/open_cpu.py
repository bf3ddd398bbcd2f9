#!/usr/bin/env python3
"""Thread CPU of ``agentwal.open``, for A/B runs of two checkouts on the same store.

Usage::

    .venv/bin/python bench/open_cpu.py wal MIB [--opens N] [--store DIR]
    .venv/bin/python bench/open_cpu.py history CHECKPOINTS [--opens N] [--store DIR]

``wal``: a store whose log holds MIB MiB of 1 KiB commits, left as after a
crash (nothing folded), so every open replays all of it. ``history``: a
cleanly closed store of CHECKPOINTS folded checkpoints over 10 runs (the log
keeps its folded frames, nothing to replay). Each open is released without a
fold (``benchlib.open_and_release``), so the next one finds the store as it
was; after one untimed open, N timed ones (default 5). Prints one JSON line:
``kind``, ``size``, ``opens_s`` (the main thread's CPU seconds of each open),
``median_s`` and the ``agentwal`` package timed.

Without ``--store`` the store is built in a scratch directory and removed. With
``--store DIR`` it is built there if DIR does not exist, and kept: run the script
alternately with ``PYTHONPATH`` pointing at a ``git archive`` of each engine, from
a directory outside the repository, and both time the same files
(docs/benchmarks.md, issue #16).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchlib import MIB, build_history_store, build_wal_store, open_and_release, scratch_dir

import agentwal


def build(kind: str, size: int, path: str) -> None:
    """Build the store of ``kind`` and ``size`` at ``path`` (a new directory)."""
    if kind == "wal":
        build_wal_store(path, size * MIB)
    else:
        build_history_store(path, size)


def time_opens(path: str, opens: int) -> list[float]:
    """Main-thread CPU seconds of ``opens`` opens of ``path``, after one untimed open."""
    open_and_release(path)
    cpu = []
    for _ in range(opens):
        t0 = time.thread_time()
        open_and_release(path)
        cpu.append(time.thread_time() - t0)
    return cpu


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("wal", "history"))
    ap.add_argument("size", type=int, help="MiB of log (wal) or folded checkpoints (history)")
    ap.add_argument("--opens", type=int, default=5, help="timed opens (default 5)")
    ap.add_argument("--store", help="build the store here if missing, and keep it")
    args = ap.parse_args(argv)
    if args.store:
        if not os.path.isdir(args.store):
            building = args.store + ".building"
            build(args.kind, args.size, building)
            os.rename(building, args.store)  # a build cut short is never taken for a store
        cpu = time_opens(args.store, args.opens)
    else:
        with scratch_dir() as d:
            path = os.path.join(d, "s.awal")
            build(args.kind, args.size, path)
            cpu = time_opens(path, args.opens)
    print(json.dumps({"kind": args.kind, "size": args.size,
                      "opens_s": [round(c, 5) for c in cpu],
                      "median_s": round(statistics.median(cpu), 5) if cpu else None,
                      "agentwal": os.path.dirname(agentwal.__file__)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
