"""Reads: ``store.get`` of one key and ``store.state`` of a run with 100 keys.

Each is measured twice: with the data still in the memtable (committed, not
yet folded) and after ``snapshot()`` has folded it into LMDB.
"""

from __future__ import annotations

import os

import pytest
from benchlib import values

import agentwal

KEYS = 100


@pytest.fixture(params=["memtable", "folded"])
def filled(request, scratch):
    store = agentwal.open(os.path.join(scratch, "s.awal"), durability="none")
    vals = values(KEYS)
    with store.begin("run-1") as txn:
        for i in range(KEYS):
            txn.put(f"key-{i:03d}", vals[i])
    for step in range(10):  # some history, so the run's head is not its first checkpoint
        with store.begin("run-1") as txn:
            txn.put("key-000", vals[step])
    if request.param == "folded":
        store.snapshot()
    yield request.param, store
    store.close()


def test_get(benchmark, filled):
    where, store = filled
    benchmark.extra_info["where"] = where
    value = benchmark(store.get, "run-1", "key-050")
    assert isinstance(value, bytes) and len(value) == 1024


def test_state_100_keys(benchmark, filled):
    where, store = filled
    benchmark.extra_info["where"] = where
    state = benchmark(store.state, "run-1")
    assert len(state) == KEYS
