"""Write ``history-v2.tar.gz``: a store whose snapshot has the format-2 history layout.

Usage (from the repository root, with the code of a commit before the versions
index, e.g. ``a5f19dc``)::

    git archive a5f19dc agentwal | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old .venv/bin/python tests/data/make_history_v2.py

Format 2 keeps a full manifest at every checkpoint id that is a multiple of
32 and has no ``versions`` database. The store holds: run ``chat`` (70
checkpoints: a growing list by list nodes, a large value as a leaf object,
a key deleted and put back, so both regular manifests 32 and 64 exist),
run ``chat-b`` forked from ``chat`` at 40, and run ``pruned`` compacted to
its last 20 checkpoints (a block that starts with a compaction's manifest),
all folded. ``expected.json`` beside the store holds the SHA-256 of the
state of every run at every kept checkpoint as read by that code (its
canonical JSON, :func:`digest`), which
``tests/unit/test_history_upgrade.py`` compares with what this version
reads, before and after the store is upgraded in place.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from typing import Any

import agentwal

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "history-v2.tar.gz")


def fill(store: agentwal.Store) -> None:
    for i in range(1, 71):
        with store.begin("chat") as txn:
            msgs = txn.get("messages", [])
            msgs.append({"i": i, "text": f"message {i} " * 6})
            txn["messages"] = msgs
            txn["step"] = i
            if i % 10 == 0:
                txn["big"] = f"{i}:" + "b" * 1100
            if i % 9 == 0:
                txn.delete("scratch")
            else:
                txn["scratch"] = {"i": i}
    store.fork("chat", 40, "chat-b")
    for i in range(1, 6):
        with store.begin("chat-b") as txn:
            txn["step"] = -i
    for i in range(1, 81):
        with store.begin("pruned") as txn:
            txn["n"] = i
            txn[f"k{i % 7}"] = "v" * (i * 20)
    store.compact(runs=["pruned"], keep_last=20)
    store.snapshot()
    store.compact(vacuum=True)  # a compacted file: no stale pages in the fixture


def digest(state: dict[str, Any]) -> str:
    """A state's SHA-256 over its canonical JSON (what ``expected.json`` holds)."""
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def expected(store: agentwal.Store) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for run in store.runs():
        out[run] = {str(c.id): digest(store.state(run, at=c.id)) for c in store.history(run)}
    return out


def pack(target: str, path: str, want: Any) -> None:
    """Write ``target``: the closed store at ``path`` as ``store.awal`` and ``want`` as
    ``expected.json``."""
    with tarfile.open(target, "w:gz") as tar:
        tar.add(path, arcname="store.awal",  # lock.mdb is LMDB's, made on open
                filter=lambda t: None if t.name.endswith("lock.mdb") else t)
        data = json.dumps(want, sort_keys=True).encode()
        info = tarfile.TarInfo("expected.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    print(target, os.path.getsize(target))


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store.awal")
        with agentwal.open(path, durability="none") as store:
            fill(store)
            want = expected(store)
        pack(TARGET, path, want)


if __name__ == "__main__":
    main()
