"""A store with every kind of stored thing, and raw access to its LMDB entries (for damage).

``build`` makes a store whose snapshot holds every database's kinds of
entries: several runs, a fork and a rollback, inline values, large values
(leaf objects), a growing list (list nodes), deletions, a compacted run (a
manifest, and a block start in the versions index), outboxes and
effects-ledger entries, and optionally a WAL tail that no fold has covered.
``Raw`` edits the LMDB file of a *closed* store directly (with valid seals,
like a careful forger), for tests that need damage the CRC cannot see.
"""

from __future__ import annotations

import os
import random
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cbor2
import lmdb

import agentwal
from agentwal.snapshot import DB_NAMES
from agentwal.testing import crash as crash_store

U64 = struct.Struct(">Q")


@dataclass
class Built:
    """What ``build`` made: runs and a few checkpoint ids worth damaging."""

    path: str
    runs: list[str]
    outbox: int  # a checkpoint of "chat" whose commit had an outbox
    head: int  # "chat"'s head
    tail: int  # commits left in the WAL, unfolded


def _ok(ctx: agentwal.EffectContext) -> Any:
    return {"called": ctx.args}


def build(path: str, *, tail: int = 0, steps: int = 45) -> Built:
    """Make the store at ``path`` and close it (``tail`` more commits are left unfolded)."""
    s = agentwal.open(path, durability="none", segment_bytes=1 << 16, wal_max_bytes=1 << 22)
    outbox = 0
    for i in range(1, steps + 1):
        with s.begin("chat") as txn:
            msgs = txn.get("messages", [])
            msgs.append({"role": "user" if i % 2 else "agent", "text": f"message {i} " * 30})
            txn["messages"] = msgs
            txn["step"] = i
            if i % 5 == 0:
                # a large value that zstd cannot shrink: a leaf object found by content
                txn["blob"] = random.Random(i).randbytes(1500)
            if i % 9 == 0:
                txn.delete("scratch")
            else:
                txn["scratch"] = {"i": i}
            if i == 7:
                txn.defer("notify", mode="at_least_once", args={"step": i})
                outbox = i
            if i == 11:
                txn.effect("tool", _ok, mode="at_least_once", args={"q": i})
            txn.meta(node="agent", step=i)
        if i == 20:
            s.snapshot()
    s.dispatch({"notify": _ok})
    s.fork("chat", 10, "chat-b")
    with s.begin("chat-b") as txn:
        txn["step"] = -1
    s.rollback_to("chat", 30)
    for i in range(1, 13):  # a compacted run: its kept block starts with a manifest
        with s.begin("pruned") as txn:
            txn["n"] = i
            txn["note"] = f"note {i} " * (1 + i % 3)
    s.compact(runs=["pruned"], keep_last=4)
    head = steps + 1
    s.close()
    if tail:
        s = agentwal.open(path, durability="sync")
        for j in range(tail):
            with s.begin("chat") as txn:
                txn["step"] = 1000 + j
        head += tail
        crash_store(s)  # like a crash: the tail stays in the WAL
    return Built(path, ["chat", "chat-b", "pruned"], outbox, head, tail)


def seal(key: bytes, data: bytes) -> bytes:
    return struct.pack("<I", zlib.crc32(data, zlib.crc32(key))) + data


class Raw:
    """Direct access to a closed store's LMDB databases (one write transaction)."""

    def __init__(self, store: str) -> None:
        self.env = lmdb.open(os.path.join(store, "snapshot"), max_dbs=16, map_size=1 << 30)
        self.dbs = {n: self.env.open_db(n.encode()) for n in DB_NAMES}
        self.txn = self.env.begin(write=True)

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, exc: object, *rest: object) -> None:
        if exc is None:
            self.txn.commit()
        else:
            self.txn.abort()
        self.env.close()

    def entries(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        with self.txn.cursor(db=self.dbs[db]) as cur:
            for k, v in cur:
                yield bytes(k), bytes(v)

    def get(self, db: str, key: bytes) -> bytes:
        raw = self.txn.get(key, db=self.dbs[db])
        assert raw is not None, (db, key)
        return bytes(raw)[4:]

    def put(self, db: str, key: bytes, data: bytes) -> None:
        """Store ``data`` under ``key`` with a valid seal."""
        self.txn.put(key, seal(key, data), db=self.dbs[db])

    def put_raw(self, db: str, key: bytes, raw: bytes) -> None:
        self.txn.put(key, raw, db=self.dbs[db])

    def delete(self, db: str, key: bytes) -> None:
        assert self.txn.delete(key, db=self.dbs[db]), (db, key)

    def load(self, db: str, key: bytes) -> Any:
        return cbor2.loads(self.get(db, key))

    def dump(self, db: str, key: bytes, obj: Any) -> None:
        self.put(db, key, cbor2.dumps(obj))

    def run_no(self, run: str) -> int:
        return int(self.load("runs", run.encode())[0])

    def key(self, run: str, cid: int) -> bytes:
        return U64.pack(self.run_no(run)) + U64.pack(cid)

    def state_key(self, run: str, key: str) -> bytes:
        return U64.pack(self.run_no(run)) + key.encode()

    def fix_run_digest(self, run: str, old_raw: bytes | None, new_raw: bytes | None) -> None:
        """Keep a run record's key count and digest right after a state entry changed."""
        rec = self.load("runs", run.encode())
        for raw, sign in ((old_raw, -1), (new_raw, 1)):
            if raw is not None:
                rec[4] += sign
                rec[5] ^= struct.unpack_from("<I", raw)[0]
        self.dump("runs", run.encode(), rec)
