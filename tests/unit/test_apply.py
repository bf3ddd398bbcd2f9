"""local/apply.py: one mapping of records into a memtable, for live publish and replay."""

from __future__ import annotations

from typing import Any

import agentwal
from agentwal.codec import whole
from agentwal.local.memtable import Memtable
from agentwal.local.reads import epoch_at


def dump(mem: Memtable) -> dict[str, Any]:
    """Everything a memtable holds, as plain values.

    Version chains are pruned by the readers open when a record is applied
    (none during replay), so only each key's newest version is compared.
    """
    return {
        "runs": {run: {"checkpoints": rm.checkpoints,
                       "deltas": [rm.delta(i) for i in range(len(rm.deltas))],
                       "outboxes": rm.outboxes, "deleted": rm.deleted,
                       "newest": {k: (chain[-1][0], whole(chain[-1][1]))
                                  for k, chain in rm.versions.items()}}
                 for run, rm in mem.runs.items()},
        "effects": dict(mem.effects),
        "positions": dict(mem.effect_pos),
        "log_pos": mem.log_pos,
    }


def test_replaying_the_log_rebuilds_exactly_the_live_memtable(path: str) -> None:
    """Every kind of record (commits with metadata, effects and an outbox, ledger writes
    of dispatch, a deletion and a commit to the deleted id, a fork): a read-only store
    opened on the log replays it into the table the writer published live."""
    store = agentwal.open(path, durability="sync")
    try:
        # Nothing asks for a fold before the deletion (the log is far below
        # wal_max_bytes), so the fork, which takes the fold lock itself, comes first.
        for i in range(3):
            with store.begin("a") as txn:
                txn["n"] = i
                txn.meta(step=i)
                txn.effect("charge", lambda ctx: 7, mode="at_most_once", args=i)
                txn.defer("mail", mode="at_least_once", args={"i": i})
        with store.begin("b") as txn:
            txn["list"] = list(range(50))
            txn.defer("mail", mode="at_least_once", args="b", key="business-1")
        store.fork("b", 1, "c")
        with store._engine._fold_lock:  # no fold: the whole log stays in the writer's memtable
            store.dispatch({"mail": lambda ctx: "sent"}, limit=2)
            store.delete_run("a")  # (this one wakes the fold thread)
            with store.begin("a") as txn:  # the id again: a new epoch for its outbox keys
                txn["n"] = "again"
                txn.defer("mail", mode="at_least_once", args="again")
            with store.begin("b") as txn:  # a form-2 record: replay joins it as live did
                txn.append("list", 50)
            with store.begin("b") as txn:
                del txn["list"]
            live = dump(store._engine._active)
            assert store._engine._frozen is None and live["runs"]["a"]["deleted"]
            with agentwal.open(path, readonly=True) as ro:
                replayed = dump(ro._engine._active)
    finally:
        store.close()
    assert replayed == live


def test_the_epoch_is_the_newest_deletion_at_the_lsn_else_the_folded_one() -> None:
    older, newer = Memtable(), Memtable()
    older.apply_delete(5, "r")
    newer.apply_delete(9, "r")
    assert epoch_at((newer, older), "r", 12, lambda _r: 1) == 9
    assert epoch_at((newer, older), "r", 7, lambda _r: 1) == 5  # the newer one came after
    assert epoch_at((newer, None), "r", 4, lambda _r: 1) == 1  # LMDB's
    assert epoch_at((newer,), "other", 12, lambda _r: 0) == 0
