"""``txn.prefetch``: a hint that changes no result and reads nothing by itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import agentwal


def test_prefetched_reads_are_the_same_and_only_reads_count(
        open_store: Callable[..., Any]) -> None:
    store = open_store()
    with store.begin("r") as txn:
        for i in range(5):
            txn[f"v/{i}"] = {"i": i}
        txn["w/a/1"] = "x"
        txn["other"] = 1
    txn = store.begin("r")
    txn.prefetch("v/", "w/", "nothing/")
    txn["v/9"] = "mine"  # read-your-writes over what was fetched
    assert [txn.get(f"v/{i}") for i in range(5)] == [{"i": i} for i in range(5)]
    assert txn.get("v/9") == "mine" and txn.get("v/7") is None
    assert dict(txn.items("w/a/")) == {"w/a/1": "x"} and txn.get("other") == 1
    with store.begin("r") as other:  # a write under a fetched prefix txn never read
        other["w/b/1"] = "y"
    txn.commit()  # fetching was no read: no conflict
    assert store.get("r", "v/9") == "mine" and store.get("r", "w/b/1") == "y"
    txn = store.begin("r")
    txn.prefetch("v/")
    txn.get("v/1")
    with store.begin("r") as other:
        other["v/1"] = "changed"
    txn["z"] = 1
    with pytest.raises(agentwal.ConflictError):  # a read of a fetched key counts
        txn.commit()
