"""Retention: bytes on disk of a 1000-checkpoint run, before and after compact and vacuum.

The workload: one run, 1000 steps of an agent. Each step appends one ~200
byte message to ``messages`` (the whole list is put, as agents do), stores a
distinct ~2 KiB tool output under ``observation`` (a content-addressed
object each time) and sets two small keys. Durability ``none``; the WAL is
folded (``snapshot()``) before each measure.

Printed: the size of ``snapshot/data.mdb`` and the pages LMDB uses
(``(last page + 1) x page size``) after the 1000 steps, after
``compact(keep_last=100)`` (LMDB keeps the file and reuses the freed pages:
the file does not shrink) and after ``compact(vacuum=True)`` (the file is
rewritten compactly); the report's ``bytes_freed``; the time each call took;
and a check that the 100 kept checkpoints read back unchanged.

Run: ``.venv/bin/python bench/bench_retention.py [steps] [keep_last]``.
Not collected by pytest (no ``test_`` prefix); ``make bench`` does not run it.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any

import agentwal


def build(path: str, steps: int) -> tuple[agentwal.Store, dict[int, dict[str, Any]]]:
    rng = random.Random(7)
    store = agentwal.open(path, durability="none", wal_max_bytes=16 << 20)
    messages: list[dict[str, Any]] = []
    want: dict[int, dict[str, Any]] = {}
    for step in range(1, steps + 1):
        messages.append({"role": "user" if step % 2 else "assistant", "step": step,
                         "text": rng.randbytes(80).hex()})
        state = {"messages": messages, "observation": rng.randbytes(2048), "step": step,
                 "plan": {"next": rng.choice(["search", "answer", "ask"]), "n": step}}
        with store.begin("agent") as txn:
            for k, v in state.items():
                txn[k] = v
        want[step] = {k: (list(v) if isinstance(v, list) else v) for k, v in state.items()}
    store.snapshot()
    return store, want


def sizes(store: agentwal.Store) -> tuple[int, int]:
    st = store.stats()
    return st["lmdb_bytes"], (st["lmdb_last_page"] + 1) * st["lmdb_page_size"]


def main(steps: int = 1000, keep: int = 100) -> None:
    root = tempfile.mkdtemp(prefix="agentwal-bench-retention-")
    try:
        t = time.perf_counter()
        store, want = build(os.path.join(root, "s"), steps)
        built = time.perf_counter() - t
        rows = [(f"after {steps} steps", *sizes(store), "", f"{built:.1f} s to build")]
        t = time.perf_counter()
        report = store.compact(keep_last=keep)
        took = time.perf_counter() - t
        rows.append((f"compact(keep_last={keep})", *sizes(store),
                     f"{report.bytes_freed:,}", f"{took * 1000:.0f} ms"))
        t = time.perf_counter()
        vac = store.compact(vacuum=True)
        took = time.perf_counter() - t
        rows.append(("compact(vacuum=True)", *sizes(store), "", f"{took * 1000:.0f} ms"))
        kept = [c.id for c in store.history("agent")]
        assert kept == list(range(steps, steps - keep, -1)), kept[:5]
        for cid in (steps - keep + 1, steps - keep // 2, steps):
            assert store.state("agent", at=cid) == want[cid], cid
        store.close()
        print(f"{'':28} {'data.mdb':>12} {'pages used':>12} {'bytes_freed':>12}  time")
        for name, file_b, used_b, freed, note in rows:
            print(f"{name:28} {file_b:>12,} {used_b:>12,} {freed:>12}  {note}")
        print(f"checkpoints dropped: {report.checkpoints_dropped}, objects freed: "
              f"{report.objects_freed}, manifests written: {report.manifests_written}; "
              f"vacuum: {vac.file_bytes_before:,} -> {vac.file_bytes_after:,} bytes; "
              f"the {keep} kept checkpoints read back unchanged")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
