"""Helpers shared by test modules (not fixtures: plain functions)."""

from __future__ import annotations

import threading
from typing import Any

import agentwal


def commit(store: agentwal.Store, run: str, **values: Any) -> agentwal.Checkpoint:
    """One transaction on ``run`` putting ``values``; returns its checkpoint."""
    with store.begin(run) as txn:
        for k, v in values.items():
            txn[k] = v
    assert txn.checkpoint is not None
    return txn.checkpoint


def increment_in_threads(store: agentwal.Store, run: str, threads: int, each: int) -> None:
    """``threads`` threads each add 1 to ``run``'s key ``n`` ``each`` times, retrying conflicts."""

    def worker() -> None:
        for _ in range(each):
            while True:
                try:
                    with store.begin(run) as txn:
                        txn["n"] = txn.get("n", 0) + 1
                    break
                except agentwal.ConflictError:
                    continue

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
