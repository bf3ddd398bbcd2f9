"""Helpers shared by test modules (not fixtures: plain functions)."""

from __future__ import annotations

import hashlib
import io
import os
import random
import struct
import threading
from collections.abc import Callable
from typing import Any

import agentwal
from agentwal.testing import raw_snapshot


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


def check_history_counts(store: agentwal.Store) -> dict[str, int]:
    """Recount every history reference in ``store``'s LMDB and compare with what it stores.

    Each object's count must equal the delta entries, manifest entries and
    list nodes naming it (and be > 0: nothing unreferenced is left behind),
    nothing may name a missing object, and the content index must map the
    SHA-256 of each object found by content to its address. Returns entry counts per database.
    """
    import collections
    import struct

    from agentwal import history

    u64 = struct.Struct(">Q")
    with raw_snapshot(store) as raw:
        want: collections.Counter[int] = collections.Counter()
        sizes: dict[str, int] = {}
        for name, db in (("deltas", "delta"), ("manifests", "manifest")):
            n = 0
            for _k, v in raw.entries(db):
                n += 1
                for ref in history.decode_refs(bytes(v)[4:], manifest=False).values():
                    if isinstance(ref, tuple):
                        want[ref[1]] += 1
            sizes[name] = n
        objects = _object_records(raw)
        for rec in objects.values():
            want.update(history._children(rec))
        counts = {u64.unpack(bytes(k))[0]: u64.unpack(bytes(v)[4:])[0]
                  for k, v in raw.entries("refs")}
        oids = {bytes(k): u64.unpack(bytes(v)[4:])[0] for k, v in raw.entries("oids")}
        assert set(want) <= set(objects), f"missing objects: {set(want) - set(objects)}"
        assert counts == {a: want[a] for a in objects}
        assert all(n > 0 for n in counts.values()), "an unreferenced object was left"
        # every id names its object; every leaf found by content has its id (layout 4:
        # nodes and plain leaves need none, and a layout-3 node may still have one)
        assert all(history.object_id(objects[a]) == oid for oid, a in oids.items())
        assert {history.object_id(rec): a for a, rec in objects.items()
                if history.indexed(rec)}.items() <= oids.items()
        sizes["objects"] = len(objects)
        return sizes


def _object_records(raw: Any) -> dict[int, bytes]:
    """``{address: record}`` of every object, records stored in parts joined (format 3)."""
    from agentwal.local.snapshot.layout import object_record, object_split

    u64 = struct.Struct(">Q")
    heads: dict[int, bytes] = {}
    parts: dict[int, list[bytes]] = {}
    for k, v in raw.entries("objects"):
        addr = u64.unpack_from(bytes(k))[0]
        if len(k) == 8:
            heads[addr] = bytes(v)[4:]
        else:
            assert len(k) == 10 and int.from_bytes(k[8:], "big") == len(parts.get(addr, [])) + 1
            parts.setdefault(addr, []).append(bytes(v)[4:])
    out = {}
    for addr, head in heads.items():
        split = object_split(head)
        if split is None:
            assert addr not in parts
            out[addr] = object_record(head)
        else:
            pieces = parts.pop(addr, [])
            record = b"".join(pieces)
            assert split == (len(record), len(pieces)), (addr, split)
            out[addr] = object_record(record)
    assert not parts, f"parts of no object: {sorted(parts)}"
    return out


def lmdb_values(store: agentwal.Store) -> dict[tuple[str, bytes], int]:
    """``{(database, key): stored value length}`` of every LMDB entry of ``store``."""
    out: dict[tuple[str, bytes], int] = {}
    with raw_snapshot(store) as raw:
        for name in ("meta", "runs", "state", "ckpt", "effects", "delta", "manifest",
                     "objects", "refs", "oids"):
            out.update(((name, k), len(v)) for k, v in raw.entries(name))
    return out

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


def in_forked_child(child: Callable[[list[str]], None]) -> str:
    """Run ``child(said)`` in a child process forked now; what it appended to ``said``,
    space-separated. The child never returns into the test (it ends with ``os._exit``);
    an exception in it is its last word and fails the test here."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        said: list[str] = []
        code = 1
        try:
            os.close(r)
            child(said)
            code = 0
        except BaseException as exc:
            said.append(repr(exc))
        finally:  # never back into pytest in the child
            os.write(w, " ".join(said).encode())
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        said_there = f.read()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, said_there
    return said_there


def refused_after_fork(call: Callable[[], Any]) -> str:
    """In a forked child: "fork" if ``call()`` raises StoreClosedError naming the fork,
    "ALLOWED" if it works, else the error's text."""
    try:
        call()
    except agentwal.StoreClosedError as exc:
        return "fork" if "forked" in str(exc) else str(exc)
    return "ALLOWED"
