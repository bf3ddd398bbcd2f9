#!/usr/bin/env python3
"""AgentWALSaver on PostgreSQL, two checkouts of agentwal alternating on one server (A/B).

Usage::

    git archive <rev> | tar -x -C /tmp/before          # the code to compare against
    .venv/bin/python bench/saver_ab.py /tmp/before .   # 6 pairs, 4 threads
    .venv/bin/python bench/saver_ab.py /tmp/before . --pairs 8 --postgres-saver
    .venv/bin/python bench/saver_ab.py /tmp/before . --cpu   # client and server CPU per step

Each measurement runs in a child process that imports agentwal from the
checkout it is given (its ``bench/`` too), against one throwaway server
(``tests/pg.py``, made durable as in ``langgraph_postgres_compare.py``) in a
schema of its own; the two checkouts alternate which goes first, pair by pair,
so a change of the machine's load hits both alike. The default measurement is
``saver_cpu.measure`` (4 threads: steps per second; one thread: CPU and wall
per step); ``--cpu`` measures one thread's steps instead, with the CPU time of
the server's processes over the same steps (read from ``/proc``: this works
only with the server on this machine). Prints each run, then medians and the
per-pair ratios B/A, and their median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def server_cpu() -> float:
    """Seconds of CPU used so far by the processes named ``postgres`` on this machine."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if comm == "postgres":
            fields = stat.rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def child(tree: str, dsn: str, schema: str, args: argparse.Namespace) -> dict[str, float]:
    """One measurement with the code of ``tree`` (run in a process of its own)."""
    sys.path[:0] = [tree, os.path.join(tree, "bench")]
    import agentwal

    if not agentwal.__file__ or not agentwal.__file__.startswith(os.path.abspath(tree)):
        raise SystemExit(f"agentwal came from {agentwal.__file__}, not {tree}")
    from langgraph_compare import drive
    from langgraph_postgres_compare import agentwal_saver, postgres_saver
    from saver_cpu import measure

    opener = (postgres_saver(dsn, schema, args.threads + 1) if schema.startswith("ps")
              else agentwal_saver(dsn, schema))
    with opener as saver:
        if not args.cpu:
            return measure(saver, args.threads, args.warm, args.steps, args.message_bytes)
        state: dict[str, Any] = {"config": {"configurable": {"thread_id": "t",
                                                             "checkpoint_ns": ""}},
                                 "messages": []}
        drive(saver, "t", 0, 0, args.warm, args.message_bytes, state)
        s0, c0, w0 = server_cpu(), time.thread_time(), time.perf_counter()
        drive(saver, "t", 0, args.warm, args.steps, args.message_bytes, state)
        s1, c1, w1 = server_cpu(), time.thread_time(), time.perf_counter()
    n = args.steps
    return {"client_ms": (c1 - c0) / n * 1e3, "server_ms": (s1 - s0) / n * 1e3,
            "wall_ms": (w1 - w0) / n * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="checkout A (the code before)")
    ap.add_argument("b", help="checkout B (the code after)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100, help="timed steps (per thread)")
    ap.add_argument("--warm", type=int, default=100, help="steps before timing")
    ap.add_argument("--message-bytes", type=int, default=1024)
    ap.add_argument("--cpu", action="store_true",
                    help="one thread: client and server CPU per step")
    ap.add_argument("--postgres-saver", action="store_true",
                    help="also LangGraph's PostgresSaver once per pair (with B's checkout)")
    ap.add_argument("--child", nargs=3, metavar=("TREE", "DSN", "SCHEMA"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args)))
        return
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from benchlib import make_durable

    from tests import pg

    why: list[str] = []
    server = pg.start(why)
    if server is None:
        sys.exit("no PostgreSQL server: " + "; ".join(why))
    make_durable(server)
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": [], "PostgresSaver": []}
    passed = [a for a in sys.argv[1:] if a not in (args.a, args.b)]
    try:
        for i in range(args.pairs):
            order = [("A", args.a), ("B", args.b)]
            todo = order if i % 2 == 0 else order[::-1]
            if args.postgres_saver:
                todo.append(("PostgresSaver", args.b))
            for name, tree in todo:
                schema = ("ps" if name == "PostgresSaver" else "aw") + f"_{name.lower()}_{i}"
                out = subprocess.run([sys.executable, __file__, args.a, args.b, *passed,
                                      "--child", os.path.abspath(tree), server.dsn, schema],
                                     capture_output=True, text=True, check=False)
                if out.returncode:
                    sys.exit(out.stderr[-3000:])
                got = json.loads(out.stdout.strip().splitlines()[-1])
                runs[name].append(got)
                print(f"{name:13} " + "  ".join(f"{k} {v:8.2f}" for k, v in got.items())
                      + f"  load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        server.stop()
    med = statistics.median
    for key in runs["A"][0]:
        a, b = [r[key] for r in runs["A"]], [r[key] for r in runs["B"]]
        # A pair whose A figure is 0 has no ratio (the server's CPU is read from /proc in
        # clock ticks: a tiny run can use none).
        ratios = [y / x for x, y in zip(a, b, strict=True) if x]
        print(f"{key}: A median {med(a):.2f}, B median {med(b):.2f}; B/A per pair "
              + (" ".join(f"{r:.2f}" for r in ratios) + f"; median {med(ratios):.3f}"
                 if ratios else "none (A measured 0)"))
    if runs["PostgresSaver"] and "rate" in runs["B"][0]:
        ps = [r["rate"] for r in runs["PostgresSaver"]]
        for name in ("A", "B"):
            ratios = [r["rate"] / p for r, p in zip(runs[name], ps, strict=True)]
            print(f"{name} / PostgresSaver steps/s per pair " + " ".join(f"{r:.2f}"
                  for r in ratios) + f"; median {med(ratios):.3f} (PostgresSaver median "
                  f"{med(ps):.1f})")


if __name__ == "__main__":
    main()
