"""Reading the snapshot: every read, bound to one LMDB transaction.

Theory of operation: a :class:`SnapshotReader` holds one LMDB transaction
(a read transaction from :meth:`Snapshot.begin_read`, or the write
transaction of a fold or a compaction, whose writers extend it) and the
database handles; every method reads as of that transaction. Each value is
unsealed (its CRC-32 over key and bytes checked) before it is decoded, and
an LMDB failure while reading is damage to the file: a damaged entry is
reported as ``CorruptionError``, never read (``base.py``). This module has
the meta, run, state, checkpoint and scan reads and the hot one-value read;
the history reads are in ``history_reads.py`` and the ledger reads in
``ledger_reads.py``, both built on the same :class:`~.base.ReaderBase`. The
reader writes nothing and owns no lifetime: whoever began the transaction
ends it.
"""

from __future__ import annotations

import struct
import threading
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

from ... import history
from ...codec import CodecError, decode_meta, loads
from ...errors import CorruptionError
from ...history import HEAD_REF
from ...types import Checkpoint
from .env import Error
from .history_reads import HistoryReads
from .layout import (
    CRC,
    DB_NAMES,
    EPOCH,
    OBJECT_SPLIT,
    U64,
    CheckpointRecord,
    Dbs,
    RunInfo,
    object_record,
)
from .ledger_reads import LedgerReads
from .objects import TxnObjects

__all__ = ["HeadLists", "RawEntries", "SnapshotReader", "read_value"]

_HEAD_REF_BYTE = bytes([HEAD_REF])
_pack_u64 = U64.pack
_unpack_crc = CRC.unpack_from


def read_value(directory: str, dbs: Dbs, txn: Any, run_no: int, key: str,
               lists: HeadLists | None = None) -> bytes | None:
    """:meth:`SnapshotReader.get` without building a reader: the hot read of one value.

    The same checks in the same order (the seal's CRC-32, then the head
    entry's form); a failure takes the reader's path, so the error is the
    same as :meth:`SnapshotReader.get` raises.
    """
    k = _pack_u64(run_no) + key.encode()
    try:
        raw = txn.get(k, db=dbs.state)
    except Error:
        return SnapshotReader(directory, dbs, txn).get(run_no, key)  # raises the translated error
    if raw is None:
        return None
    data: bytes = raw[4:]
    if len(raw) < 4 or _unpack_crc(raw)[0] != zlib.crc32(data, zlib.crc32(k)):
        return SnapshotReader(directory, dbs, txn, lists).get(run_no, key)  # damage
    if data and data[0] == HEAD_REF:
        # a value by ref, read here when it is one whole leaf, or a write-once key's value
        # held inline (layout 4); anything else (a list, parts, damage) takes the reader's
        # path
        leaf = _leaf_value(dbs, txn, data) if data[1] == 0x82 else None
        return leaf if leaf is not None else SnapshotReader(directory, dbs, txn, lists).get(
            run_no, key)
    return data


def _leaf_value(dbs: Dbs, txn: Any, entry: bytes) -> bytes | None:
    """The value a head entry ``0xff + [1, addr]`` names, if its leaf is one sound entry;
    of a write-once entry ``0xff + [ref, id]``, the ref's (inline, or such a leaf)."""
    try:
        obj = loads(entry[1:])
        if type(obj[1]) is int and type(obj[0]) is bytes:  # write-once, inline
            return obj[0]
        if type(obj[0]) is list:  # write-once, by ref
            obj = obj[0]
        if obj[0] != history.VALUE:
            return None
        addr = obj[1]
        k = _pack_u64(addr)
        raw = txn.get(k, db=dbs.objects)
    except (CodecError, Error, IndexError, TypeError, OverflowError, struct.error):
        return None
    if raw is None or len(raw) < 5 or _unpack_crc(raw)[0] != zlib.crc32(raw[4:], zlib.crc32(k)):
        return None
    form = raw[4:]
    if form[0] == OBJECT_SPLIT:
        return None
    try:
        record = object_record(form)
    except CodecError:
        return None
    return record[1:] if record[:1] in (b"\x00", b"\x02") else None  # a leaf, plain or not


class HeadLists:
    """Lists rebuilt from list nodes for head entries, per LMDB commit.

    A head entry (``0xff`` + a list node's ref) is rebuilt node by node on
    every read; the rebuilt bytes are kept here under the id of the LMDB
    commit the read transaction sees and the entry's bytes, so later reads of
    that state take them whole. A read transaction's id names one committed
    state of one environment (the snapshot empties this when it swaps its
    environment); only read transactions use it (a write transaction's id is
    not committed yet). Bounded by the bytes it holds: emptied when full.
    """

    __slots__ = ("_bytes", "_entries", "_limit", "_lock")

    def __init__(self, limit: int = 16 << 20) -> None:
        self._entries: dict[tuple[int, bytes], bytes] = {}
        self._bytes = 0
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, tid: int, entry: bytes) -> bytes | None:
        return self._entries.get((tid, entry))

    def put(self, tid: int, entry: bytes, body: bytes) -> None:
        if len(body) > self._limit // 4:
            return
        with self._lock:
            if self._bytes + len(body) > self._limit:
                self.clear()
            self._entries[(tid, entry)] = body
            self._bytes += len(body)

    def clear(self) -> None:
        self._entries = {}
        self._bytes = 0


class SnapshotReader(HistoryReads, LedgerReads):
    """The snapshot as of one LMDB transaction (``txn``), read through checked accessors."""

    # -- meta, runs, state and checkpoints ----------------------------------------------

    def meta(self) -> tuple[int, uuid.UUID | None]:
        """``(applied_lsn, store_id)`` as of ``txn``."""
        with self._reading("the snapshot's meta"):
            applied = self._open(b"applied_lsn", self._txn.get(b"applied_lsn", db=self._meta),
                                 "applied_lsn")
            sid = self._open(b"store_id", self._txn.get(b"store_id", db=self._meta), "store id")
        if applied is not None and len(applied) != 8:
            raise self._corrupt("applied_lsn in the snapshot is damaged")
        if sid is not None and len(sid) != 16:
            raise self._corrupt("store id in the snapshot is damaged")
        lsn = U64.unpack(applied)[0] if applied is not None else 0
        return lsn, (uuid.UUID(bytes=sid) if sid is not None else None)

    def log_pos(self) -> tuple[int, int] | None:
        """(segment first LSN, offset) where the log continues after ``applied_lsn``."""
        with self._reading("the log position"):
            raw = self._open(b"log_pos", self._txn.get(b"log_pos", db=self._meta), "log position")
        if raw is None:
            return None
        if len(raw) != 16:
            raise self._corrupt("the log position in the snapshot is damaged")
        return U64.unpack_from(raw, 0)[0], U64.unpack_from(raw, 8)[0]

    def epoch(self, run: str) -> int:
        """LSN of the last deletion of run id ``run`` folded into LMDB (0: none)."""
        k = EPOCH + run.encode()
        with self._reading(f"the epoch of {run!r}"):
            data = self._open(k, self._txn.get(k, db=self._meta), f"the epoch of {run!r}")
        if data is None:
            return 0
        if len(data) != 8:
            raise self._corrupt(f"the epoch of {run!r} is damaged")
        return int(U64.unpack(data)[0])

    def run_info(self, run: str) -> RunInfo | None:
        """The folded head of ``run``, or None."""
        with self._reading(f"run {run!r}"):
            rk = run.encode()
            obj = self._load(rk, self._txn.get(rk, db=self._runs), f"run {run!r}")
        if obj is None:
            return None
        info = RunInfo.decode(obj)
        if info is None:
            raise self._corrupt(f"run record of {run!r} is malformed")
        return info

    def runs(self) -> list[str]:
        """Every folded run id (each record's checksum verified)."""
        out = []
        with self._reading("the run list"), self._txn.cursor(db=self._runs) as cur:
            for k, v in cur.iternext():
                k = bytes(k)
                self._open(k, v, f"run record {k!r}")
                out.append(k.decode("utf-8", "replace"))
        return out

    def get(self, run_no: int, key: str) -> bytes | None:
        """The stored value bytes of ``key`` in run ``run_no``, or None."""
        with self._reading(f"key {key!r}"):
            k = U64.pack(run_no) + key.encode()
            data = self._open(k, self._txn.get(k, db=self._state), f"value of key {key!r}")
            return None if data is None else self._head_value(data, key)

    def items(self, info: RunInfo, prefix: str = "") -> dict[str, bytes]:
        """``{key: value bytes}`` of a run, optionally only keys under ``prefix``.

        A whole-run scan is checked against the run record's key count and
        digest, so an entry whose key was damaged (and now sorts elsewhere) or
        a stale page is reported instead of silently missing.
        """
        start = U64.pack(info.number) + prefix.encode()
        out: dict[str, bytes] = {}
        digest = 0
        with self._reading("a run's keys"), self._txn.cursor(db=self._state) as cur:
            found = cur.set_range(start)
            while found:
                k, v = bytes(cur.key()), cur.value()
                if not k.startswith(start):
                    self._open(k, v, "the entry after a run's keys")  # damage sorts here too
                    break
                key = k[8:].decode("utf-8", "replace")
                data = self._open(k, v, f"value of key {key!r}")
                assert data is not None
                out[key] = self._head_value(data, key)
                digest ^= CRC.unpack_from(v)[0]
                found = cur.next()
        if not prefix and (len(out) != info.keys or digest != info.digest):
            raise self._corrupt(f"run #{info.number} holds {len(out)} readable keys (digest "
                                f"{digest:08x}); its record says {info.keys} ({info.digest:08x})")
        return out

    def checkpoint(self, run: str, run_no: int, cid: int) -> Checkpoint | None:
        """One folded checkpoint, or None."""
        with self._reading(f"checkpoint {run!r}/{cid}"):
            k = U64.pack(run_no) + U64.pack(cid)
            obj = self._load(k, self._txn.get(k, db=self._ckpt), f"checkpoint {run!r}/{cid}")
        return None if obj is None else self._ckpt_from(run, obj)

    def checkpoints(self, run: str, run_no: int,
                    before: int | None = None) -> Iterator[Checkpoint]:
        """Folded checkpoints of a run, newest first (only ids below ``before`` if given)."""
        base = U64.pack(run_no)
        upper = U64.pack(run_no + 1) if before is None else base + U64.pack(max(before, 1))
        with self._reading(f"checkpoints of {run!r}"), self._txn.cursor(db=self._ckpt) as cur:
            if not cur.set_range(upper):
                if not cur.last():
                    return
            elif not cur.prev():
                return
            # Ids are consecutive, except below a checkpoint whose parent
            # compaction dropped (its record carries the parent's hash).
            expect: int | None = None
            gap = False
            for k, v in cur.iterprev():
                if not bytes(k).startswith(base):
                    self._open(bytes(k), v, "the entry before a run's checkpoints")
                    if expect is not None and expect != 0 and not gap:
                        raise self._corrupt(f"checkpoints of {run!r} end at {expect + 1}, "
                                            "not at 1")
                    return
                obj = self._load(bytes(k), v, f"checkpoint of {run!r}")
                c = self._ckpt_from(run, obj)
                if expect is not None and c.id != expect and not (gap and c.id < expect):
                    raise self._corrupt(f"checkpoint {expect} of {run!r} is missing "
                                        f"(found {c.id})")
                expect, gap = c.id - 1, _parent_dropped(obj)
                yield c
            if expect is not None and expect != 0 and not gap:
                raise self._corrupt(f"checkpoints of {run!r} end at {expect + 1}, not at 1")

    def retained(self, run: str, run_no: int, cid: int) -> bool:
        """True if folded checkpoint ``cid`` (below the run's head) is kept, False if dropped.

        Raises:
            CorruptionError: it is missing and no compaction dropped it.
        """
        base = U64.pack(run_no)
        k = base + U64.pack(cid)
        with self._reading(f"checkpoint {run!r}/{cid}"), self._txn.cursor(db=self._ckpt) as cur:
            if cur.set_range(k):
                found = bytes(cur.key())
                if found == k:
                    return True
                if found.startswith(base):
                    obj = self._load(found, cur.value(), f"checkpoint of {run!r}")
                    self._ckpt_from(run, obj)
                    if _parent_dropped(obj):  # its parent, and the ids between, were dropped
                        return False
        raise self._corrupt(f"checkpoint {cid} of {run!r} is missing")

    def _ckpt_from(self, run: str, obj: Any) -> Checkpoint:
        if not (isinstance(obj, list) and len(obj) in (7, 8, 9, 10)):
            raise self._corrupt(f"checkpoint record of {run!r} is malformed")
        rec = CheckpointRecord.decode(obj)
        if rec is None:
            raise self._corrupt(f"checkpoint record of {run!r} has a field of the wrong type")
        try:
            meta = decode_meta(rec.meta)
        except CodecError as exc:
            raise self._corrupt(f"checkpoint {run!r}/{rec.id} metadata: {exc}") from None
        return Checkpoint(run, rec.id, rec.parent, rec.lsn, rec.created_at, meta, rec.hash.hex(),
                          rec.origin)

    # -- head values ------------------------------------------------------------------

    def _head_value(self, data: bytes, key: str) -> bytes:
        """A ``state`` entry's value bytes (a list stored by ref is rebuilt, or taken from
        :class:`HeadLists`)."""
        lists = self._lists
        if lists is not None and data[:1] == _HEAD_REF_BYTE:
            tid = self._txn.id()
            hit = lists.get(tid, data)
            if hit is not None:
                return hit
        try:
            body = history.head_value(TxnObjects(self), data)
        except CodecError as exc:
            raise self._corrupt(f"value of key {key!r}: {exc}") from None
        if lists is not None and data[:1] == _HEAD_REF_BYTE:
            lists.put(tid, bytes(data), body)
        return body

    # -- scans --------------------------------------------------------------------------

    def _prefixed(self, db: Any, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every ``(key, raw value)`` of ``db`` whose key starts with ``prefix``."""
        out = []
        with self._txn.cursor(db=db) as cur:
            found = cur.set_range(prefix)
            while found:
                k = bytes(cur.key())
                if not k.startswith(prefix):
                    break
                out.append((k, bytes(cur.value())))
                found = cur.next()
        return out

    def inline_values(self, prefix: bytes, *, damaged: list[str] | None = None) -> set[bytes]:
        """Every value held inline whose bytes start with ``prefix``, in state and history.

        Scans the ``state``, ``delta`` and ``manifest`` databases whole
        (every record's checksum is checked, so damage stops the scan rather
        than hiding a value): head entries, and the inline refs of every
        delta and manifest. Values stored as objects (:data:`history.LARGE`
        bytes or more) are not looked at. Used to find blob references.

        Args:
            prefix: the leading bytes of the values wanted.
            damaged: if given, a record that fails its checksum or does not
                decode is described here and skipped instead of raising
                (``verify``, which reports the record itself elsewhere).

        Raises:
            CorruptionError: a record fails its checksum or does not decode
                (without ``damaged``), or LMDB's pages are damaged.
        """
        out: set[bytes] = set()

        def checked(k: bytes, v: Any, what: str, manifest: bool | None) -> Any:
            try:
                data = self._open(k, v, what)
                if manifest is None or data is None or prefix not in data:
                    return data
                try:
                    return history.decode_refs(data, manifest=manifest)
                except CodecError as exc:
                    raise self._corrupt(f"{what}: {exc}") from None
            except CorruptionError as exc:
                if damaged is None:
                    raise
                damaged.append(exc.reason)
                return None

        with self._reading("values in state and history"):
            with self._txn.cursor(db=self._state) as cur:
                for k, v in cur.iternext():
                    data = checked(bytes(k), v, "a state entry", None)
                    if data is not None and data.startswith(prefix):
                        out.add(data)
            for db, manifest in ((self._delta, False), (self._manifest, True)):
                what = "a manifest" if manifest else "a delta"
                with self._txn.cursor(db=db) as cur:
                    for k, v in cur.iternext():
                        refs = checked(bytes(k), v, what, manifest)
                        if not isinstance(refs, dict):
                            continue
                        out.update(r for r in refs.values()
                                   if isinstance(r, bytes) and r.startswith(prefix))
        return out

    def raw(self) -> RawEntries:
        """The sealed entries of every database as of this transaction, for ``verify``."""
        return RawEntries(self)


class RawEntries:
    """The raw (sealed) entries of the snapshot's databases in one read transaction.

    ``verify`` reads through this and nothing else, so it sees every byte LMDB
    stores and never trusts a checked accessor. LMDB failures (a damaged
    B-tree) become ``CorruptionError``.
    """

    def __init__(self, reader: SnapshotReader) -> None:
        self._reader = reader
        self._txn = reader._txn
        self._dbs = dict(zip(DB_NAMES, reader._dbs, strict=True))

    def entries(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(key, sealed value)`` of database ``db`` in key order (only keys under ``prefix``)."""
        if self._dbs[db] is None:  # an optional database a read-only old store lacks
            return
        with self._reader._reading(f"database {db}"), self._txn.cursor(db=self._dbs[db]) as cur:
            found = cur.set_range(prefix) if prefix else cur.first()
            while found:
                k = bytes(cur.key())
                if not k.startswith(prefix):
                    return
                yield k, bytes(cur.value())
                found = cur.next()

    def get(self, db: str, key: bytes) -> bytes | None:
        """The sealed value of ``key`` in database ``db``, or None."""
        if self._dbs[db] is None:
            return None
        with self._reader._reading(f"database {db}"):
            raw = self._txn.get(key, db=self._dbs[db])
        return None if raw is None else bytes(raw)


def _parent_dropped(obj: list[Any]) -> bool:
    """True if a checkpoint record carries its parent's hash (compaction dropped the parent)."""
    return len(obj) >= 9 and obj[8] is not None

