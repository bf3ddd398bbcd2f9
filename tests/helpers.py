"""Helpers shared by test modules (not fixtures: plain functions)."""

from __future__ import annotations

import hashlib
import io
import random
import struct
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


class Generated(io.RawIOBase):
    """A deterministic binary stream of ``size`` bytes made as it is read (never held whole).

    Piece ``i`` of each 1 MiB is a fixed random block with ``i`` and the seed
    in its first 16 bytes, so no two MiB are equal; ``sha256`` is the hash
    of what was read so far (all of it once ``read`` returned b"").
    """

    _BLOCK = random.Random(0).randbytes(1 << 20)

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed, self.pos = size, seed, 0
        self._hash = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self.size - self.pos)
        done = 0
        while done < n:
            i, off = divmod(self.pos + done, len(self._BLOCK))
            piece = struct.pack(">QQ", i, self.seed) + self._BLOCK[16:]
            take = min(n - done, len(piece) - off)
            view[done:done + take] = piece[off:off + take]
            done += take
        self._hash.update(view[:n])
        self.pos += n
        return n

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    @staticmethod
    def digest(size: int, seed: int = 0) -> str:
        """The SHA-256 of a whole stream, computed by reading one."""
        g = Generated(size, seed)
        while g.read(1 << 20):
            pass
        return g.sha256
