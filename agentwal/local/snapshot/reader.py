"""Reading the snapshot: every read, bound to one LMDB transaction.

Theory of operation: a :class:`SnapshotReader` holds one LMDB transaction
(a read transaction from :meth:`Snapshot.begin_read`, or the write
transaction of a fold or a compaction, whose writers extend it) and the
database handles; every method reads as of that transaction. Each value is
unsealed (its CRC-32 over key and bytes checked) before it is decoded, and
an LMDB failure while reading is damage to the file (:func:`env.translate`
with ``reading=True``): a damaged entry is reported as ``CorruptionError``,
never read. History (``state_at``, list values) is ``history.py`` logic over
:class:`~.objects.TxnObjects`. The reader writes nothing and owns no
lifetime: whoever began the transaction ends it.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

from ... import history
from ...codec import CodecError, decode_meta, loads
from ...effects import STATUSES, EffectRecord, decode_entry
from ...errors import CorruptionError
from ...history import HEAD_REF
from ...types import Checkpoint
from .env import Error, translate
from .layout import (
    CRC,
    DATA,
    DB_NAMES,
    EFFECTS_INDEX,
    EPOCH,
    HISTORY_INDEX,
    OBJECT_SPLIT,
    U16,
    U64,
    CheckpointRecord,
    Dbs,
    RunInfo,
    crc,
    object_record,
    pos_key,
    run_index_prefix,
    status_index_prefix,
    version_key,
)
from .objects import TxnObjects

__all__ = ["HeadLists", "RawEntries", "SnapshotReader", "read_value"]

_HEAD_REF_BYTE = bytes([HEAD_REF])
_LEAF_REF = bytes([0x82, history.VALUE])  # CBOR [1, ...]: a head ref to a large value's leaf
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
        # a large value by ref, read here when it is one whole leaf; anything else (a list,
        # parts, damage) takes the reader's path
        leaf = _leaf_value(dbs, txn, data) if data[1:3] == _LEAF_REF else None
        return leaf if leaf is not None else SnapshotReader(directory, dbs, txn, lists).get(
            run_no, key)
    return data


def _leaf_value(dbs: Dbs, txn: Any, entry: bytes) -> bytes | None:
    """The value a head entry ``0xff + [1, addr]`` names, if its leaf is one sound entry."""
    try:
        addr = loads(entry[1:])[1]
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
    return record[1:] if record[:1] == b"\x00" else None


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


class SnapshotReader:
    """The snapshot as of one LMDB transaction (``txn``), read through checked accessors."""

    def __init__(self, directory: str, dbs: Dbs, txn: Any,
                 lists: HeadLists | None = None) -> None:
        self.directory = directory
        self._lists = lists
        self._txn = txn
        self._dbs = dbs
        (self._meta, self._runs, self._state, self._ckpt, self._effects, self._delta,
         self._manifest, self._objects, self._refs, self._oids, self._versions) = dbs
        self._indexed: bool | None = None  # the history index marker, once read

    # -- sealed values ----------------------------------------------------------------

    def _corrupt(self, what: str) -> CorruptionError:
        return CorruptionError(os.path.join(self.directory, DATA), None, what)

    def _open(self, key: bytes, raw: bytes | None, what: str) -> bytes | None:
        if raw is None:
            return None
        if len(raw) < 4 or CRC.unpack_from(raw)[0] != crc(key, raw[4:]):
            raise self._corrupt(f"checksum mismatch in {what}")
        return bytes(raw[4:])

    def _load(self, key: bytes, raw: bytes | None, what: str) -> Any:
        data = self._open(key, raw, what)
        if data is None:
            return None
        try:
            return loads(data)
        except CodecError as exc:
            raise self._corrupt(f"{what}: {exc}") from None

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

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """Turn LMDB failures while reading into agentwal errors."""
        try:
            yield
        except Error as exc:
            raise translate(exc, self.directory, f"cannot read {what}", reading=True) from None

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

    # -- the effects ledger -----------------------------------------------------------

    def _entry(self, k: bytes, v: Any) -> EffectRecord:
        data = self._open(k, v, "an effects-ledger entry")
        assert data is not None
        try:
            return decode_entry(data)
        except CodecError as exc:
            raise self._corrupt(f"effects-ledger entry {k[1:]!r}: {exc}") from None

    def effect(self, key: str) -> EffectRecord | None:
        """The folded ledger entry with idempotency key ``key``, or None."""
        k = b"k" + key.encode()
        with self._reading("the effects ledger"):
            v = self._txn.get(k, db=self._effects)
            return None if v is None else self._entry(k, v)

    def effect_key_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        """The key of the ``self._txn.effect`` entry at this position, or None."""
        k = pos_key(run, checkpoint, ordinal)
        with self._reading("the effects ledger"):
            data = self._open(k, self._txn.get(k, db=self._effects), "an effect position")
        return None if data is None else data.decode("utf-8", "replace")

    def effects(self) -> Iterator[EffectRecord]:
        """Every folded ledger entry, in key order."""
        for k, v in self._effect_rows(b"k", "the effects ledger"):
            yield self._entry(k, v)

    def effects_indexed(self) -> bool:
        """True if the ledger's run and status indexes are complete (format 2)."""
        k = EFFECTS_INDEX
        with self._reading("the effects index marker"):
            data = self._open(k, self._txn.get(k, db=self._meta), "the effects index marker")
        return data is not None

    def effects_of(self, run: str | None, status: str | None) -> list[EffectRecord] | None:
        """The folded entries of ``run`` and/or ``status`` through the indexes, in key order.

        Each entry read is checked against the query (a digest collision in
        an index key only costs its read). None if the store has no indexes
        yet, or if neither filter is given: scan :meth:`effects` instead.
        """
        if (run is None and status is None) or not self.effects_indexed():
            return None
        if status is not None:
            prefix = status_index_prefix(STATUSES.index(status), run)
        else:
            assert run is not None
            prefix = run_index_prefix(run)
        out = []
        for k, v in self._effect_rows(prefix, "the effects index"):
            data = self._open(k, v, "an effects index row")
            assert data is not None
            entry = self.effect(data.decode("utf-8", "replace"))
            if entry is None:
                raise self._corrupt(f"the effects index names {data!r}, which is missing")
            if (run is None or entry.run == run) and (status is None or entry.status == status):
                out.append(entry)
        return out

    def outbox(self) -> list[str]:
        """Keys of folded outbox entries not yet settled, in commit order."""
        out = []
        for k, v in self._effect_rows(b"q", "the outbox"):
            data = self._open(k, v, "an outbox entry")
            assert data is not None
            out.append(data.decode("utf-8", "replace"))
        return out

    def _effect_rows(self, kind: bytes, what: str) -> Iterator[tuple[bytes, Any]]:
        """``(key, sealed value)`` of the ``effects`` rows of one kind (b"k", b"p", b"q"),
        or of any key prefix."""
        with self._reading(what), self._txn.cursor(db=self._effects) as cur:
            found = cur.set_range(kind)
            while found:
                k = bytes(cur.key())
                if not k.startswith(kind):
                    break
                yield k, cur.value()
                found = cur.next()

    # -- history ----------------------------------------------------------------------

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

    def _history_record(self, db: Any, run: str, number: int, cid: int,
                        manifest: bool) -> dict[str, history.Ref | None] | None:
        k = U64.pack(number) + U64.pack(cid)
        what = f"{'manifest' if manifest else 'delta'} of checkpoint {run!r}/{cid}"
        data = self._open(k, self._txn.get(k, db=db), what)
        if data is None:
            return None
        try:
            return history.decode_refs(data, manifest=manifest)
        except CodecError as exc:
            raise self._corrupt(f"{what}: {exc}") from None

    def _manifest_before(self, number: int, cid: int) -> int:
        """Id of the run's nearest manifest at or before ``cid`` (0: none)."""
        prefix = U64.pack(number)
        with self._txn.cursor(db=self._manifest) as cur:
            found = cur.prev() if cur.set_range(prefix + U64.pack(cid + 1)) else cur.last()
            if not found:
                return 0
            k = bytes(cur.key())
        if len(k) != 16 or not k.startswith(prefix):
            return 0
        return int(U64.unpack_from(k, 8)[0])

    def history_indexed(self) -> bool:
        """True if the ``versions`` index covers every delta (format 3)."""
        if self._indexed is None:
            k = HISTORY_INDEX
            with self._reading("the history index marker"):
                data = self._open(k, self._txn.get(k, db=self._meta), "the history index marker")
            self._indexed = data is not None and self._versions is not None
        return self._indexed

    def _manifest_refs(self, run: str, number: int, cid: int) -> dict[str, history.Ref]:
        found = self._history_record(self._manifest, run, number, cid, True)
        if found is None:
            raise self._corrupt(f"manifest of checkpoint {run!r}/{cid} is missing")
        return {k: v for k, v in found.items() if v is not None}

    def _delta_refs(self, run: str, number: int, cid: int) -> dict[str, history.Ref | None]:
        delta = self._history_record(self._delta, run, number, cid, False)
        if delta is None:
            raise self._corrupt(f"delta of checkpoint {run!r}/{cid} is missing")
        return delta

    def _refs_at(self, run: str, number: int, cid: int) -> dict[str, history.Ref]:
        """``{key: ref}`` of a run's state at folded checkpoint ``cid`` (0: empty).

        The nearest manifest at or before ``cid``, then, for each key whose
        latest version at or before ``cid`` is newer than it, that version's
        ref from its delta. A store without the index (format 2) is read
        through its regular manifests instead.
        """
        if not self.history_indexed():
            return self._refs_at_manifests(run, number, cid)
        if not cid:
            return {}
        base = self._base_of(run, number, cid)
        refs = self._manifest_refs(run, number, base) if base else {}
        deltas: dict[int, dict[str, history.Ref | None]] = {}
        for key, vid in self._latest_versions(number, cid, base):
            delta = deltas.get(vid)
            if delta is None:
                delta = deltas[vid] = self._delta_refs(run, number, vid)
            if key not in delta:
                raise self._corrupt(f"the versions of {run!r} name key {key!r} at checkpoint "
                                    f"{vid}, whose delta does not hold it")
            ref = delta[key]
            if ref is None:
                refs.pop(key, None)
            else:
                refs[key] = ref
        return refs

    def _base_of(self, run: str, number: int, cid: int) -> int:
        """The manifest a read at ``cid`` starts from (0: none): the nearest at or before it,
        which may not be older than the start of ``cid``'s kept block."""
        base = self._manifest_before(number, cid)
        start = self._version_of(number, b"", cid)  # the block start marker at or before cid
        if start is not None and start > base:
            raise self._corrupt(f"manifest of checkpoint {run!r}/{start} is missing")
        return base

    def _latest_versions(self, number: int, cid: int, after: int) -> Iterator[tuple[str, int]]:
        """``(key, id)`` of each key of run ``number`` whose latest version at or before
        ``cid`` is after ``after`` (a seek per key, so a key's older versions cost nothing)."""
        prefix = U64.pack(number)
        upper = U64.pack(cid + 1)
        with self._txn.cursor(db=self._versions) as cur:
            found = cur.set_range(prefix)
            while found:
                k = bytes(cur.key())
                if not k.startswith(prefix) or len(k) < 18:
                    if k.startswith(prefix):
                        raise self._corrupt(f"a versions entry of run #{number} is malformed")
                    return
                group = k[:10 + U16.unpack_from(k, 8)[0]]
                if len(group) == 10:  # the block start markers: not a key
                    found = cur.set_range(group + b"\xff" * 8)
                    continue
                # the key's first version after cid (or the next key's), then the one before
                at = cur.prev() if cur.set_range(group + upper) else cur.last()
                if at:
                    k = bytes(cur.key())
                    self._open(k, cur.value(), "a versions entry")
                    if len(k) == len(group) + 8 and k.startswith(group):
                        vid = int(U64.unpack_from(k, len(group))[0])
                        if after < vid <= cid:
                            yield group[10:].decode("utf-8", "replace"), vid
                found = cur.set_range(group + b"\xff" * 8)

    def _version_of(self, number: int, key: bytes, cid: int) -> int | None:
        """Id of the latest version of ``key`` at or before ``cid`` (None: none)."""
        group = version_key(number, key, 0)[:-8]
        with self._txn.cursor(db=self._versions) as cur:
            at = cur.prev() if cur.set_range(group + U64.pack(cid + 1)) else cur.last()
            if not at:
                return None
            k = bytes(cur.key())
            if len(k) != len(group) + 8 or not k.startswith(group):
                return None
            self._open(k, cur.value(), "a versions entry")
            return int(U64.unpack_from(k, len(group))[0])

    def _ref_of(self, run: str, number: int, cid: int, key: str) -> history.Ref | None:
        """The ref of ``key`` in a run's state at folded checkpoint ``cid`` (None: absent)."""
        if not self.history_indexed():
            return self._refs_at_manifests(run, number, cid).get(key)
        base = self._base_of(run, number, cid)
        vid = self._version_of(number, key.encode(), cid)
        if vid is not None and vid > base:
            delta = self._delta_refs(run, number, vid)
            if key not in delta:
                raise self._corrupt(f"the versions of {run!r} name key {key!r} at checkpoint "
                                    f"{vid}, whose delta does not hold it")
            return delta[key]
        return self._manifest_refs(run, number, base).get(key) if base else None

    def _refs_at_manifests(self, run: str, number: int, cid: int) -> dict[str, history.Ref]:
        """:meth:`_refs_at` of a store without the versions index (format 2): the regular
        manifest at or before ``cid`` plus at most ``MANIFEST_EVERY - 1`` deltas."""
        base = self._manifest_before(number, cid) if cid else 0
        # The regular manifest is kept with its checkpoint, so a nearer one than
        # it can only be a compaction's; a farther one means it is missing.
        if history.manifest_base(cid) > base:
            base = history.manifest_base(cid)
        refs = self._manifest_refs(run, number, base) if base else {}
        for i in range(base + 1, cid + 1):
            history.apply_delta(refs, self._delta_refs(run, number, i))
        return refs

    def state_at(self, run: str, info: RunInfo, cid: int, key: str | None = None,
                 damaged: dict[str, str] | None = None) -> dict[str, bytes]:
        """``{key: value bytes}`` of a run at folded checkpoint ``cid`` (only ``key`` if given).

        Rebuilt from the nearest manifest at or before ``cid`` and the latest
        version of each key changed after it (:meth:`_refs_at`); one key costs
        one seek and its delta. With ``damaged`` (salvage),
        a value whose objects are missing or damaged is left out and named
        there with the reason, instead of failing the whole state.

        Raises:
            CorruptionError: a record or object is missing or damaged (with
                ``damaged``: the manifest or a delta, so no key is known).
        """
        with self._reading(f"the state of {run!r} at {cid}"):
            if key is not None:
                ref = self._ref_of(run, info.number, cid, key)
                refs = {} if ref is None else {key: ref}
            else:
                refs = self._refs_at(run, info.number, cid)
            objs = TxnObjects(self)
            if damaged is not None:
                out = {}
                for k, r in refs.items():
                    try:
                        out[k] = history.resolve(objs, r)
                    except (CodecError, CorruptionError) as exc:
                        damaged[k] = str(exc)
                return out
            try:
                return {k: history.resolve(objs, r) for k, r in refs.items()}
            except CodecError as exc:
                raise self._corrupt(f"state of {run!r} at {cid}: {exc}") from None

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

