#!/usr/bin/env python3
"""Thread CPU per operation of one engine, for A/B runs of two checkouts.

Usage::

    .venv/bin/python bench/commit_cpu.py KIND N     # KIND: single | agent | get | grow | append

``single``: a transaction putting a 20-key dict of about 1 KiB under one
key; ``agent``: an agent step (get ``step``, put a 20-message list of about
10 KiB, three small keys, ``txn.meta``); ``get``: ``store.get`` of that
1 KiB dict from the memtable; ``grow``: a step of a long conversation (get
``messages``, add a ~1 KiB message, put the list back, commit), ``append``:
the same step through ``txn.append`` (the 200 warm-up steps grow the list
to 200 messages, so the timed steps are steps 201 to 200 + N).
``durability="none"``, 200 warm-up
operations, then N timed ones; prints ``{"kind": ..., "us": ...}``. To
compare two engines, run it alternately with ``PYTHONPATH`` pointing at a
``git archive`` of each (docs/benchmarks.md, issue #16) from a directory
outside the repository, so the checkout's own ``agentwal`` is not imported.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from benchlib import scratch_dir

import agentwal

KINDS = ("single", "agent", "get", "grow", "append")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in KINDS or not argv[1].isdigit():
        print(__doc__, file=sys.stderr)
        return 2
    kind, n = argv[0], int(argv[1])
    value = {f"k{i}": "x" * 40 + str(i) for i in range(20)}
    messages = [{"role": "user", "content": "w " * 250} for _ in range(20)]
    with scratch_dir() as d:
        store = agentwal.open(os.path.join(d, "s.awal"), durability="none")
        try:

            def single(i: int) -> None:
                with store.begin("r") as txn:
                    txn.put("value", value)

            def agent(i: int) -> None:
                with store.begin("r") as txn:
                    step = txn.get("step", 0)
                    txn.put("messages", list(messages))
                    txn.put("step", step + 1)
                    txn.put("tokens", i)
                    txn.put("tool", "search")
                    txn.meta(node="agent", step=step)

            def get(i: int) -> Any:
                return store.get("r", "value")

            def grow(i: int) -> None:
                with store.begin("r") as txn:
                    grown = txn.get("messages", [])
                    grown.append({"role": "user", "content": "w " * 500, "i": i})
                    txn.put("messages", grown)

            def append(i: int) -> None:
                with store.begin("r") as txn:
                    txn.append("messages", {"role": "user", "content": "w " * 500, "i": i})

            op = {"single": single, "agent": agent, "get": get, "grow": grow,
                  "append": append}[kind]
            if kind == "get":
                single(0)
            for i in range(200):
                op(i)
            t0 = time.thread_time()
            for i in range(n):
                op(i)
            us = (time.thread_time() - t0) / n * 1e6
        finally:
            store.close()
    print(json.dumps({"kind": kind, "us": round(us, 2), "agentwal": os.path.dirname(
        agentwal.__file__)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
