"""``history.Objects`` over an LMDB transaction: the one adapter from LMDB to history.

Theory of operation: history (``history.py``) stores large values, list
segments and list nodes once each, as objects with reference counts, over
a six-method ``Objects`` protocol. :class:`TxnObjects` implements it on the
``objects``, ``refs`` and ``oids`` databases through a reader's transaction
(writes need a write transaction: a fold's or a compaction's). Addresses
are allocated in increasing order, so new objects are appended. A record
too long for a shared LMDB page is stored in parts beside its address
(``layout.object_entries``) and joined again on read, each part checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import history, retention
from ...codec import CodecError
from .layout import U16, U64, object_entries, object_record, object_split, seal

if TYPE_CHECKING:
    from .base import ReaderBase

__all__ = ["CountingObjects", "TxnObjects", "maybe_list"]


def maybe_list(value: bytes | None) -> bool:
    """True if ``value`` may become a list node (large, and a CBOR array)."""
    return value is not None and len(value) >= history.LARGE and value[0] >> 5 == 4


class TxnObjects:
    """``history.Objects`` over an LMDB transaction (writes need a write transaction)."""

    def __init__(self, reader: ReaderBase) -> None:
        self._reader = reader
        self._txn = reader._txn
        self._next: int | None = None

    def _u64(self, key: bytes, raw: bytes | None, what: str) -> int | None:
        data = self._reader._open(key, raw, what)
        if data is None:
            return None
        if len(data) != 8:
            raise self._reader._corrupt(f"{what} is damaged")
        return int(U64.unpack(data)[0])

    def find(self, oid: bytes) -> int | None:
        return self._u64(oid, self._txn.get(oid, db=self._reader._oids),
                         f"address of object {oid.hex()}")

    def get(self, addr: int) -> bytes | None:
        k = U64.pack(addr)
        head = self._reader._open(k, self._txn.get(k, db=self._reader._objects),
                                  f"object @{addr}")
        if head is None:
            return None
        split = object_split(head)
        form = head if split is None else self._join(addr, *split)
        try:
            return object_record(form)
        except CodecError as exc:
            raise self._reader._corrupt(f"object @{addr}: {exc}") from None

    def _join(self, addr: int, size: int, count: int) -> bytes:
        """The stored form of an object kept in parts, each part's seal checked."""
        k = U64.pack(addr)
        parts = []
        for i in range(1, count + 1):
            pk = k + U16.pack(i)
            part = self._reader._open(pk, self._txn.get(pk, db=self._reader._objects),
                                      f"part {i} of object @{addr}")
            if part is None:
                raise self._reader._corrupt(f"part {i} of object @{addr} is missing")
            parts.append(part)
        record = b"".join(parts)
        if size < 0 or len(record) != size:
            raise self._reader._corrupt(f"object @{addr} joins to {len(record)} bytes from "
                                        f"its parts, its head says {size}")
        return record

    def _keys(self, addr: int) -> list[bytes]:
        """The ``objects`` keys of an object: its address, then its parts' keys, if any."""
        k = U64.pack(addr)
        raw = self._txn.get(k, db=self._reader._objects)
        split = None if raw is None else object_split(bytes(raw[4:]))
        count = split[1] if split is not None and split[1] > 0 else 0
        return [k] + [k + U16.pack(i) for i in range(1, count + 1)]

    def add(self, oid: bytes | None, record: bytes) -> int:
        if self._next is None:
            with self._txn.cursor(db=self._reader._objects) as cur:
                self._next = U64.unpack_from(cur.key())[0] + 1 if cur.last() else 1
        addr, self._next = self._next, self._next + 1
        for k, data in object_entries(addr, record):
            self._txn.put(k, seal(k, data), db=self._reader._objects, append=True)
        a = U64.pack(addr)
        self._txn.put(a, seal(a, U64.pack(0)), db=self._reader._refs, append=True)
        if oid is not None:  # found by content (a large value's leaf)
            self._txn.put(oid, seal(oid, a), db=self._reader._oids)
        return addr

    def delete(self, addr: int, oid: bytes) -> None:
        for k in self._keys(addr):
            self._txn.delete(k, db=self._reader._objects)
        k = U64.pack(addr)
        self._txn.delete(k, db=self._reader._refs)
        if self.find(oid) == addr:  # an unindexed object's equal may be indexed elsewhere
            self._txn.delete(oid, db=self._reader._oids)

    def count(self, addr: int) -> int:
        k = U64.pack(addr)
        n = self._u64(k, self._txn.get(k, db=self._reader._refs), f"reference count @{addr}")
        return 0 if n is None else n

    def set_count(self, addr: int, n: int) -> None:
        k = U64.pack(addr)
        self._txn.put(k, seal(k, U64.pack(n)), db=self._reader._refs)


class CountingObjects(TxnObjects):
    """``TxnObjects`` that adds what each deleted object freed to a compaction's tally."""

    def __init__(self, reader: ReaderBase, tally: retention.Tally) -> None:
        super().__init__(reader)
        self._tally = tally

    def delete(self, addr: int, oid: bytes) -> None:
        k = U64.pack(addr)
        r = self._reader
        for key, db in ([(p, r._objects) for p in self._keys(addr)]
                        + [(k, r._refs)] + ([(oid, r._oids)] if self.find(oid) == addr else [])):
            raw = self._txn.get(key, db=db)
            self._tally.bytes_freed += 0 if raw is None else len(raw)
        self._tally.objects_freed += 1
        super().delete(addr, oid)
