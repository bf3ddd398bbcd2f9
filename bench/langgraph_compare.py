#!/usr/bin/env python3
"""AgentWALSaver beside LangGraph's SqliteSaver on the same chat workload, in one run.

Usage::

    .venv/bin/python bench/langgraph_compare.py            # 4 threads x 200 steps
    .venv/bin/python bench/langgraph_compare.py --json
    .venv/bin/python bench/langgraph_compare.py --threads 2 --steps 50   # a quick look

The workload drives a saver the way the Pregel loop does for a one-node chat
graph: each step saves the node's write (one new ~1 KiB message) with
``put_writes`` on the current checkpoint, then ``put``s the next checkpoint
whose ``messages`` channel holds the whole conversation so far, with a new
version from the saver's ``get_next_version``. The LangGraph threads run in
parallel, one Python thread each, through one saver (as one process serving
several conversations would).

Each round runs both savers (alternating which goes first) on fresh files;
a figure is the median over rounds and a ratio the median of the ratios
within a round, so drift in a shared machine's load cancels. Both savers are
durable per call: agentwal ``durability="sync"``, SQLite in
WAL mode with ``synchronous=FULL`` (SqliteSaver's journal mode; FULL so a
commit is on disk when it returns, as agentwal's is). Measured:

- puts/s: checkpoints saved per second of wall time (the writes included);
- get_tuple p50/p95 of each thread's latest checkpoint at the end (200 messages);
- ``list`` of one thread's 200 checkpoints (all values decoded), seconds;
- bytes on disk per checkpoint at step 200: the growth of the files over the
  last 20 steps of every thread divided by the checkpoints saved, with the
  logs folded first (agentwal ``snapshot()``, SQLite ``wal_checkpoint``), and
  the average over the whole run. By default the only folds are the one
  before and the one after those 20 steps, so agentwal's figure includes
  LMDB's copy-on-write of every page that one fold touches (a store folded
  only once has no free pages to reuse); ``--fold-every N`` folds every N
  steps as well (both savers), as a long-running store does, and the figure
  is then the steady-state growth.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sqlite3
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from benchlib import scratch_dir
from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.sqlite import SqliteSaver

import agentwal
from agentwal.format import SPARE_NAME
from agentwal.integrations.langgraph import AgentWALSaver

TAIL = 20


def disk_bytes(path: str) -> int:
    """Bytes allocated on disk under ``path`` (a file or a directory).

    An agentwal store's ``wal/spare.wal.tmp`` is left out: the next log segment's
    zeros, made ahead of need while the current segment is half full and removed at
    close; counted, it adds a whole segment (MiBs) to whichever of the two footprints
    it happens to exist at. SqliteSaver's figure likewise leaves out its ``-wal`` file
    (``path`` is the database file).
    """
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            if f == SPARE_NAME:
                continue
            with contextlib.suppress(FileNotFoundError):  # a WAL segment just removed
                total += os.stat(os.path.join(root, f)).st_blocks * 512
    return total


def message(thread: int, step: int, size: int) -> AIMessage:
    words = f"thread {thread} step {step} " + os.urandom(size // 2).hex()
    return AIMessage(content=words[:size], id=str(uuid.uuid4()))


def drive(saver: BaseCheckpointSaver[Any], thread: str, t: int, start: int, steps: int,
          size: int, state: dict[str, Any]) -> None:
    """Steps ``start .. start+steps-1`` of one thread; ``state`` carries config/messages."""
    for step in range(start, start + steps):
        cfg = state["config"]
        msg = message(t, step, size)
        if cfg["configurable"].get("checkpoint_id"):
            saver.put_writes(cfg, [("messages", [msg])], str(uuid.uuid4()), "~agent")
        state["messages"].append(msg)
        version = saver.get_next_version(state.get("version"), None)
        state["version"] = version
        checkpoint = {
            "v": 4, "id": str(uuid6(clock_seq=step)),
            "ts": datetime.now(timezone.utc).isoformat(),
            "channel_values": {"messages": list(state["messages"])},
            "channel_versions": {"messages": version},
            "versions_seen": {"agent": {"messages": version}},
            "updated_channels": ["messages"],
        }
        state["config"] = saver.put(cfg, checkpoint,  # type: ignore[arg-type]
                                    {"source": "loop", "step": step, "parents": {}},
                                    {"messages": version})


def run_steps(saver: BaseCheckpointSaver[Any], states: list[dict[str, Any]], start: int,
              steps: int, size: int) -> float:
    t0 = time.perf_counter()
    workers = [threading.Thread(target=drive, args=(saver, f"thread-{t}", t, start, steps,
                                                    size, st))
               for t, st in enumerate(states)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - t0


def measure(name: str, saver: BaseCheckpointSaver[Any], fold: Any, where: str,
            threads: int, steps: int, size: int,
            footprint: Any = disk_bytes, fold_every: int = 0) -> dict[str, Any]:
    """Drive ``saver``; ``footprint(where)`` is its storage in bytes (default: on disk).

    ``fold_every``: also fold after every that many steps (0: only before and
    after the last ``TAIL`` steps); the folds are not timed.
    """
    states = [{"config": {"configurable": {"thread_id": f"thread-{t}", "checkpoint_ns": ""}},
               "messages": []} for t in range(threads)]

    def run(start: int, n: int) -> float:
        chunk = fold_every or n
        took = 0.0
        for at in range(start, start + n, max(chunk, 1)):
            took += run_steps(saver, states, at, min(chunk, start + n - at), size)
            if fold_every and at + chunk < start + n:
                fold()
        return took

    head = max(steps - TAIL, 0)
    elapsed = run(0, head)
    fold()
    before = footprint(where)
    elapsed += run(head, steps - head)
    fold()
    after = footprint(where)
    cfgs = [{"configurable": {"thread_id": f"thread-{t}", "checkpoint_ns": ""}}
            for t in range(threads)]
    lat = []
    for _ in range(25):
        for cfg in cfgs:
            t0 = time.perf_counter()
            tup = saver.get_tuple(cfg)
            lat.append(time.perf_counter() - t0)
            assert tup is not None and len(tup.checkpoint["channel_values"]["messages"]) == steps
    t0 = time.perf_counter()
    listed = list(saver.list(cfgs[0]))
    list_s = time.perf_counter() - t0
    assert len(listed) == steps
    q = statistics.quantiles(lat, n=20)
    return {
        "saver": name, "threads": threads, "steps": steps, "message_bytes": size,
        "puts_per_s": threads * steps / elapsed,
        "get_tuple_p50_ms": statistics.median(lat) * 1e3, "get_tuple_p95_ms": q[18] * 1e3,
        "list_all_s": list_s,
        "bytes_per_checkpoint_at_end": (after - before) / (threads * (steps - head)),
        "bytes_per_checkpoint_avg": after / (threads * steps),
        "disk_bytes": after,
    }


def run_agentwal(d: str, args: argparse.Namespace) -> dict[str, Any]:
    path = os.path.join(d, "lg.awal")
    with agentwal.open(path, durability="sync") as store:
        saver = AgentWALSaver(store, readable=not args.no_view)
        return measure("AgentWALSaver" + (" (no view)" if args.no_view else ""), saver,
                       store.snapshot, path, args.threads, args.steps, args.message_bytes,
                       fold_every=args.fold_every)


def run_sqlite(d: str, args: argparse.Namespace) -> dict[str, Any]:
    path = os.path.join(d, "lg.sqlite")
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    saver = SqliteSaver(conn)

    def fold() -> None:
        with saver.lock:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    try:
        return measure("SqliteSaver", saver, fold, d, args.threads, args.steps,
                       args.message_bytes, fold_every=args.fold_every)
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--message-bytes", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds; each runs both savers, in alternating order (default 5)")
    ap.add_argument("--no-view", action="store_true",
                    help="AgentWALSaver(readable=False): no readable copy for the CLI")
    ap.add_argument("--fold-every", type=int, default=0, metavar="N",
                    help="also fold (agentwal snapshot(), SQLite wal_checkpoint) after every N "
                         "steps, as a long-running store's background folds do (default 0: "
                         "only before and after the last 20 steps)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"sqlite": [], "agentwal": []}
    for rnd in range(args.rounds):
        order = [("sqlite", run_sqlite), ("agentwal", run_agentwal)]
        for name, run in order if rnd % 2 == 0 else order[::-1]:
            with scratch_dir("lg-bench-") as d:
                runs[name].append(run(d, args))
    med = statistics.median
    cols = ["puts_per_s", "get_tuple_p50_ms", "get_tuple_p95_ms", "list_all_s",
            "bytes_per_checkpoint_at_end", "bytes_per_checkpoint_avg"]
    summary = {name: {"saver": rs[0]["saver"], **{c: med(r[c] for r in rs) for c in cols}}
               for name, rs in runs.items()}
    pairs = list(zip(runs["agentwal"], runs["sqlite"], strict=True))
    ratios = {  # median over rounds of the ratio within a round
        "puts_per_s": med(a["puts_per_s"] / q["puts_per_s"] for a, q in pairs),
        "get_tuple_p50": med(a["get_tuple_p50_ms"] / q["get_tuple_p50_ms"] for a, q in pairs),
        "list_all": med(a["list_all_s"] / q["list_all_s"] for a, q in pairs),
        "bytes_per_checkpoint_at_end": med(a["bytes_per_checkpoint_at_end"]
                                           / q["bytes_per_checkpoint_at_end"] for a, q in pairs),
    }
    if args.json:
        json.dump({"rounds": runs, "median": summary, "ratios": ratios,
                   "fold_every": args.fold_every, "python": sys.version.split()[0],
                   "machine": platform.machine(),
                   "load": os.getloadavg()}, sys.stdout, indent=2)
        print()
        return
    print(f"{args.threads} threads x {args.steps} steps, {args.message_bytes} B messages, "
          f"{args.rounds} rounds, folds every {args.fold_every or 'TAIL'} steps "
          f"(medians; load {os.getloadavg()[0]:.1f})")
    print(f"{'':26}" + "".join(f"{c:>29}" for c in cols))
    for r in summary.values():
        print(f"{r['saver']:26}" + "".join(f"{r[c]:>29,.3f}" for c in cols))
    print("agentwal / sqlite (median of per-round ratios):",
          ", ".join(f"{k} {v:.3f}x" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
