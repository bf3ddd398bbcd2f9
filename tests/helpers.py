"""Helpers shared by test modules (not fixtures: plain functions)."""

from __future__ import annotations

from typing import Any

import agentwal


def commit(store: agentwal.Store, run: str, **values: Any) -> agentwal.Checkpoint:
    """One transaction on ``run`` putting ``values``; returns its checkpoint."""
    with store.begin(run) as txn:
        for k, v in values.items():
            txn[k] = v
    assert txn.checkpoint is not None
    return txn.checkpoint
