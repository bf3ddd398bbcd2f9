"""Commit latency per durability mode: one transaction putting one ~1 KiB value.

``sync`` is dominated by one fdatasync per commit (nobody to share it with on
one thread); ``async`` and ``none`` show the engine's own cost per commit.
The store keeps the default ``wal_max_bytes``, so a long run includes folds,
as a real one would. Multi-threaded group commit and the baselines are in
``bench/compare.py``.
"""

from __future__ import annotations

import itertools
import os

import pytest
from benchlib import values

import agentwal


@pytest.mark.parametrize("durability", ["sync", "async", "none"])
def test_commit_1kib(benchmark, scratch, durability):
    store = agentwal.open(os.path.join(scratch, "s.awal"), durability=durability)
    vals = itertools.cycle(values())

    def commit():
        with store.begin("run-1") as txn:
            txn.put("value", next(vals))

    try:
        benchmark.extra_info["durability"] = durability
        benchmark(commit)
        stats = store.stats()
        benchmark.extra_info["syncs_per_commit"] = round(stats["syncs"] / stats["commits"], 3)
    finally:
        store.close()


def test_commit_read_modify_write(benchmark, scratch):
    """A typical agent step: read two keys, write three (``sync``)."""
    store = agentwal.open(os.path.join(scratch, "s.awal"))
    vals = itertools.cycle(values())
    with store.begin("run-1") as txn:
        txn["step"] = 0
        txn["messages"] = []

    def step():
        with store.begin("run-1") as txn:
            n = txn["step"]
            msgs = txn["messages"][-8:]
            msgs.append({"role": "tool", "n": n})
            txn["messages"] = msgs
            txn["step"] = n + 1
            txn["scratch"] = next(vals)

    try:
        benchmark(step)
    finally:
        store.close()
