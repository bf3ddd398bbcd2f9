#!/usr/bin/env python3
"""Where AgentWALSaver's bytes per checkpoint go: LMDB pages per database over one fold.

Usage::

    .venv/bin/python bench/langgraph_pages.py                    # 4 threads x 200 steps
    .venv/bin/python bench/langgraph_pages.py --fold-every 10    # with regular folds

Drives the agentwal side of ``bench/langgraph_compare.py`` the same way (its
``run_steps``: ``put_writes`` then ``put`` per step, the threads in parallel,
``durability="sync"``), folds before the last 20 steps and after them, and
prints for each LMDB database the branch, leaf and overflow pages and the
entries that last fold added (``stat()`` of each named database), then the
pages in use it added beside the pages the file grew by. The difference is
LMDB's copy-on-write: every page a write transaction touches is copied, and
the pages freed that way are reused only by a later transaction, so a
store folded once before has none to reuse. The file growth divided by the
checkpoints saved is the benchmark's "bytes per checkpoint at step 200".
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from benchlib import scratch_dir
from langgraph_compare import TAIL, disk_bytes, run_steps

import agentwal
from agentwal.integrations.langgraph import AgentWALSaver
from agentwal.local.snapshot.layout import DB_KEYS


def pages(store: agentwal.Store, path: str) -> dict[str, Any]:
    """``{database: (branch, leaf, overflow, entries)}`` and the file's page count."""
    snap = store._engine._snap  # the bench looks inside: LMDB's own counts per database
    assert snap is not None
    out: dict[str, Any] = {}
    with snap.env.begin() as txn:
        for name, db in zip(DB_KEYS, snap._dbs, strict=True):
            if db is None:
                continue
            st = txn.stat(db)
            out[name.decode()] = (st["branch_pages"], st["leaf_pages"], st["overflow_pages"],
                                  st["entries"])
    out["_last_page"] = snap.env.info()["last_pgno"]
    out["_disk"] = disk_bytes(path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--message-bytes", type=int, default=1024)
    ap.add_argument("--fold-every", type=int, default=0, metavar="N")
    args = ap.parse_args()
    with scratch_dir("lg-pages-") as d:
        path = os.path.join(d, "lg.awal")
        with agentwal.open(path, durability="sync") as store:
            saver = AgentWALSaver(store)
            states = [{"config": {"configurable": {"thread_id": f"thread-{t}",
                                                   "checkpoint_ns": ""}}, "messages": []}
                      for t in range(args.threads)]

            def run(start: int, n: int) -> None:
                chunk = args.fold_every or n
                for at in range(start, start + n, max(chunk, 1)):
                    run_steps(saver, states, at, min(chunk, start + n - at), args.message_bytes)
                    if args.fold_every and at + chunk < start + n:
                        store.snapshot()

            head = max(args.steps - TAIL, 0)
            run(0, head)
            store.snapshot()
            a = pages(store, path)
            run(head, args.steps - head)
            store.snapshot()
            b = pages(store, path)
    saved = args.threads * (args.steps - head)
    print(f"{args.threads} threads x {args.steps} steps, the fold of the last {saved} "
          f"checkpoints (folds every {args.fold_every or 'TAIL'} steps)")
    print(f"{'database':10} {'branch':>7} {'leaf':>6} {'overflow':>9} {'entries':>8}")
    used = 0
    for name in (k.decode() for k in DB_KEYS):
        if name not in b:
            continue
        grew = [y - x for x, y in zip(a.get(name, (0, 0, 0, 0)), b[name], strict=True)]
        used += sum(grew[:3])
        if any(grew):
            print(f"{name:10} {grew[0]:>7} {grew[1]:>6} {grew[2]:>9} {grew[3]:>8}")
    grown = b["_last_page"] - a["_last_page"]
    print(f"pages in use added {used}, file grew {grown} pages "
          f"(copy-on-write and free-list pages: {grown - used})")
    print(f"bytes on disk per checkpoint: {(b['_disk'] - a['_disk']) / saved:,.0f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
