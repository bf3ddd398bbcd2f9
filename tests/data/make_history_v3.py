"""Write ``history-v3.tar.gz``: a store whose snapshot has layout 3 (every object indexed).

Usage (from the repository root, with the code of a commit before layout 4,
e.g. ``48cb553``)::

    git archive 48cb553 agentwal | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old:. .venv/bin/python tests/data/make_history_v3.py

Layout 3 gives every object an ``oids`` entry, list nodes and list segment
leaves included, and keeps values under 1 KiB inline (in ``state`` and in
the delta). The store holds what ``make_history_v2.fill`` writes (a list
grown by list nodes with segment leaves, a large value, a fork, a
compacted run) plus run ``notes`` with mid-size maps (300-900 bytes) and a
list grown past a re-base (more than ``history.MAX_CHAIN`` versions), all
folded. ``expected.json`` holds the SHA-256 of every state at every kept
checkpoint as that code read it; ``tests/unit/test_history_upgrade.py``
compares this version's reads with it before and after the store goes on
under layout 4.
"""

from __future__ import annotations

import os
import tempfile

import agentwal
from tests.data.make_history_v2 import expected, fill, pack

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "history-v3.tar.gz")


def fill_notes(store: agentwal.Store) -> None:
    for i in range(1, 41):
        with store.begin("notes") as txn:
            txn["card"] = {"i": i, "text": "note " * (60 + 4 * i)}
            items = txn.get("items", [])
            items.append({"i": i, "body": f"item {i} " * 40})
            txn["items"] = items


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store.awal")
        with agentwal.open(path, durability="none") as store:
            fill_notes(store)
            fill(store)
            want = expected(store)
        pack(TARGET, path, want)


if __name__ == "__main__":
    main()
