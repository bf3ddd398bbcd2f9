"""A store with something of everything the viewer shows."""

from __future__ import annotations

import io
from typing import Any

import pytest

import agentwal

HTML = "<script>window.__pwned = 1</script><b>bold?</b>"


def _interrupted(ctx: agentwal.EffectContext) -> Any:
    raise KeyboardInterrupt  # no outcome recorded: the intent stays in doubt


def fill(path: str) -> None:
    """run-a: 5 checkpoints growing ``messages``, then a rollback to #2; run-b forked from
    run-a #3; a value holding HTML; a blob; an in-doubt effect; an outbox entry."""
    with agentwal.open(path, durability="none") as s:
        for i in range(5):
            with s.begin("run-a") as txn:
                txn["messages"] = [{"role": "user", "content": f"message {j}"}
                                   for j in range(i + 1)]
                txn["step"] = i
                txn["html"] = HTML
                txn["long"] = "x" * 5000
                txn.meta(step=i)
        s.fork("run-a", 3, "run-b")
        s.rollback_to("run-a", 2)
        with s.begin("run-b") as txn:
            txn["step"] = 99
            txn.put_blob("report", io.BytesIO(b"%PDF-1.4 fake"), media_type="application/pdf")
            txn.defer("send-email", mode="at_least_once", args={"to": "ops@example.com"})
        with pytest.raises(KeyboardInterrupt), s.begin("run-b") as txn:
            txn.effect("charge-card", _interrupted, mode="at_most_once",
                       args={"amount": 4900, "note": HTML})
