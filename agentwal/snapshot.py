"""The LMDB snapshot: the folded state, checkpoints and ``applied_lsn``.

Theory of operation: LMDB holds everything the WAL no longer needs to. It
is written only by the fold, and each fold is one LMDB write transaction
committed with ``sync=True`` that also stores ``applied_lsn``, the LSN of the
last record it covers. LMDB's copy-on-write B+tree and double meta page make
that commit atomic, so after any crash LMDB sits exactly at a fold boundary
and the WAL supplies every record after ``applied_lsn``.

This is the only module that imports ``lmdb``; every ``lmdb.Error`` becomes
an ``agentwal`` error here. Before mapping ``data.mdb`` it reads LMDB's two
meta pages itself and checks the file is as long as the newest meta says,
because touching a page past the end of a truncated map kills the process
with SIGBUS.

Databases (keys are bytes; integers big-endian so they sort):

- ``meta``:  ``applied_lsn`` -> CRC + u64, ``store_id`` -> CRC + 16 bytes,
  ``next_run`` -> CRC + u64
- ``runs``:  run (UTF-8) -> CRC + CBOR ``[run_no, head_id, head_hash, count]``
- ``state``: run_no (u64) + key (UTF-8) -> CRC + value CBOR, or 0xff + CBOR
  ref of a list node (``history.head_entry``: a growing list is not copied
  whole by every fold)
- ``ckpt``:  run_no (u64) + id (u64) -> CRC + CBOR
  ``[id, parent, lsn, created_at, meta, hash, origin, outbox_digest]``
  (``outbox_digest``: SHA-256 of the commit's outbox field, or null; records
  written before it existed have 7 elements)
- ``effects``: the effects ledger (``effects.py``), three kinds of key:
  ``b"k"`` + idempotency key -> CRC + entry CBOR map;
  ``b"p"`` + CBOR ``[run, checkpoint, ordinal]`` -> CRC + idempotency key
  (where a ``txn.effect`` entry sits); ``b"q"`` + lsn (u64) + index (u32) ->
  CRC + idempotency key, for each outbox entry not yet settled (dispatch order)
- ``delta``: run_no (u64) + id (u64) -> CRC + CBOR ``{key: ref | null}``, the
  checkpoint's change (``history.py`` defines refs)
- ``manifest``: run_no (u64) + id (u64) -> CRC + CBOR ``{key: ref}``, the full
  state at every id that is a multiple of ``history.MANIFEST_EVERY``
- ``objects``: address (u64) -> CRC + object record (kind byte + body):
  large values, list segments and list nodes, each stored once; addresses
  are allocated in increasing order, so new objects are appended
- ``refs``: address (u64) -> CRC + u64 reference count
- ``oids``: object id (SHA-256 of the record) -> CRC + u64 address: finds
  an object by content, so identical content is stored once

The ``state`` database is the fast path for each run's folded head; the
history databases rebuild any folded checkpoint from one manifest and at
most ``MANIFEST_EVERY - 1`` deltas. The fold writes a checkpoint's delta, its
manifest when one is due, and the objects and counts they need in the same
LMDB transaction as the checkpoint record, so history and state never
disagree after a crash. Reading history is ``history.py`` logic over
:class:`_TxnObjects`, the one adapter from LMDB to its ``Objects`` protocol.

Every stored value carries a CRC-32 of its key and bytes (LMDB has no
checksums of its own), checked on each read, so a flipped byte in a key or a
value is reported instead of read.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cbor2
import lmdb

from . import history
from .codec import CodecError, decode_meta, loads
from .effects import EffectRecord, decode_entry, outstanding
from .errors import (
    CorruptionError,
    DiskFullError,
    DurabilityError,
    ReadOnlyError,
    StoreClosedError,
    TooManyReadersError,
)
from .io import DISK_FULL_ERRNOS, OsFileSystem
from .types import Checkpoint

__all__ = ["FoldRun", "MapFull", "RunInfo", "Snapshot", "check_lmdb_file", "DB_NAMES",
           "RawEntries", "unseal"]

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_CRC = struct.Struct("<I")
_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_DATA_VERSION = 1
_DEFAULT_MAP = (1 << 40) if sys.maxsize > 2**32 else (1 << 30)
_DATA = "data.mdb"


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What LMDB knows of a run's head."""

    number: int
    head: int
    head_hash: bytes
    count: int  # checkpoints folded
    keys: int = 0  # keys in the run's folded state
    digest: int = 0  # XOR of those entries' CRCs: a missing or stale entry changes it


def _crc(key: bytes, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(key))


def _seal(key: bytes, data: bytes) -> bytes:
    """``data`` behind a CRC-32 of key and data, so a damaged key is caught too."""
    return _CRC.pack(_crc(key, data)) + data


def check_lmdb_file(path: str) -> None:
    """Refuse a ``data.mdb`` that is shorter than its meta pages say (before mapping it).

    Raises:
        CorruptionError: the file is truncated or its meta pages are damaged.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(2 * 65536)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CorruptionError(path, None, f"cannot read: {exc.strerror}") from None
    if size == 0:
        return
    if len(head) < 160:
        raise CorruptionError(path, 0, f"LMDB file is {size} bytes, shorter than a meta page")
    # Page 0 holds a meta; its header is 16 bytes, then MDB_meta.
    magic, version = struct.unpack_from("<II", head, 16)
    if magic != _LMDB_MAGIC:
        raise CorruptionError(path, 16, "not an LMDB file (bad meta magic)")
    if version != _LMDB_DATA_VERSION:
        raise CorruptionError(path, 20, f"LMDB data version {version}, expected "
                              f"{_LMDB_DATA_VERSION}")
    # mm_dbs[0].md_pad holds the page size (offset 16 + 4 + 4 + 8 + 8 = 40).
    (psize,) = struct.unpack_from("<I", head, 40)
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise CorruptionError(path, 40, f"LMDB page size {psize} is not plausible")
    if size < 2 * psize or len(head) < 2 * psize:
        raise CorruptionError(path, size, "LMDB file is shorter than its two meta pages")
    best: tuple[int, int] | None = None
    for page in (0, 1):
        base = page * psize + 16
        m, v = struct.unpack_from("<II", head, base)
        if m != _LMDB_MAGIC or v != _LMDB_DATA_VERSION:
            raise CorruptionError(path, base, f"LMDB meta page {page} is damaged")
        last_pg, txnid = struct.unpack_from("<QQ", head, base + 120)
        if best is None or txnid > best[1]:
            best = (last_pg, txnid)
    assert best is not None
    need = (best[0] + 1) * psize
    if size < need:
        raise CorruptionError(path, size,
                              f"LMDB file is truncated: {size} bytes, its meta needs {need}")


class Snapshot:
    """The LMDB environment under ``<store>/snapshot``."""

    def __init__(self, directory: str, *, readonly: bool, map_size: int = _DEFAULT_MAP) -> None:
        self.directory = directory
        self.readonly = readonly
        self._write_lock = threading.Lock()
        data = os.path.join(directory, _DATA)
        if readonly and not os.path.exists(data):
            raise CorruptionError(data, None, "the snapshot is missing")
        if not readonly:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        check_lmdb_file(data)
        try:
            shared = _acquire(directory, readonly, map_size)
        except lmdb.Error as exc:
            raise self._translate(exc, "cannot open the snapshot") from None
        self._shared: _Shared | None = shared
        self.env = shared.env
        self._meta, self._runs, self._state, self._ckpt, self._effects = shared.dbs[:5]
        self._delta, self._manifest, self._objects, self._refs, self._oids = shared.dbs[5:10]

    # -- errors -------------------------------------------------------------------

    def _translate(self, exc: Exception, what: str, *, reading: bool = False) -> Exception:
        """The agentwal error for an ``lmdb.Error``.

        Reading goes through the memory map, where I/O cannot fail with an
        error code: any failure while reading is damage to the file.
        """
        path = os.path.join(self.directory, _DATA)
        if isinstance(exc, lmdb.ReadonlyError):
            return ReadOnlyError(self.directory)
        if "closed/deleted" in str(exc):  # the store was closed under a read
            return StoreClosedError(os.path.dirname(self.directory))
        if isinstance(exc, lmdb.ReadersFullError):
            return TooManyReadersError(path)
        if (isinstance(exc, (lmdb.MapFullError, lmdb.DiskError)) or "No space" in str(exc)
                or getattr(exc, "code", None) in DISK_FULL_ERRNOS):
            return DiskFullError(path, f"no room to write the snapshot {path!r} ({what}); "
                                 "LMDB is unchanged and the WAL keeps everything. Free some "
                                 "space; the next fold tries again.")
        if reading or isinstance(exc, (lmdb.CorruptedError, lmdb.InvalidError,
                                       lmdb.PageNotFoundError, lmdb.VersionMismatchError,
                                       lmdb.BadValsizeError, lmdb.NotFoundError,
                                       lmdb.BadDbiError, lmdb.BadTxnError,
                                       lmdb.IncompatibleError)):
            return CorruptionError(path, None, f"{what}: {exc}")
        return DurabilityError(path, f"{what}: {exc}")

    def _corrupt(self, what: str) -> CorruptionError:
        return CorruptionError(os.path.join(self.directory, _DATA), None, what)

    def _open(self, key: bytes, raw: bytes | None, what: str) -> bytes | None:
        if raw is None:
            return None
        if len(raw) < 4 or _CRC.unpack_from(raw)[0] != _crc(key, raw[4:]):
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

    # -- reading ------------------------------------------------------------------

    def begin_read(self) -> Any:
        """A read transaction: a consistent view of the last fold. End it with :meth:`end_read`."""
        shared = self._live()
        try:
            txn = self.env.begin(buffers=False)
        except lmdb.Error as exc:
            raise self._translate(exc, "cannot begin a read") from None
        with _shared_lock:
            shared.readers += 1
        return txn

    def end_read(self, txn: Any) -> None:
        """End a read transaction from :meth:`begin_read` (once)."""
        with contextlib.suppress(lmdb.Error):
            txn.abort()
        if self._shared is not None:
            with _shared_lock:
                self._shared.readers -= 1

    def _live(self) -> _Shared:
        if self._shared is None:
            raise lmdb_closed(self.directory)
        return self._shared

    def meta(self, txn: Any) -> tuple[int, uuid.UUID | None]:
        """``(applied_lsn, store_id)`` as of ``txn``."""
        with self._reading("the snapshot's meta"):
            applied = self._open(b"applied_lsn", txn.get(b"applied_lsn", db=self._meta),
                                 "applied_lsn")
            sid = self._open(b"store_id", txn.get(b"store_id", db=self._meta), "store id")
        if applied is not None and len(applied) != 8:
            raise self._corrupt("applied_lsn in the snapshot is damaged")
        if sid is not None and len(sid) != 16:
            raise self._corrupt("store id in the snapshot is damaged")
        lsn = _U64.unpack(applied)[0] if applied is not None else 0
        return lsn, (uuid.UUID(bytes=sid) if sid is not None else None)

    def log_pos(self, txn: Any) -> tuple[int, int] | None:
        """(segment first LSN, offset) where the log continues after ``applied_lsn``."""
        with self._reading("the log position"):
            raw = self._open(b"log_pos", txn.get(b"log_pos", db=self._meta), "log position")
        if raw is None:
            return None
        if len(raw) != 16:
            raise self._corrupt("the log position in the snapshot is damaged")
        return _U64.unpack_from(raw, 0)[0], _U64.unpack_from(raw, 8)[0]

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """Turn LMDB failures while reading into agentwal errors."""
        try:
            yield
        except lmdb.Error as exc:
            raise self._translate(exc, f"cannot read {what}", reading=True) from None

    def run_info(self, txn: Any, run: str) -> RunInfo | None:
        """The folded head of ``run``, or None."""
        with self._reading(f"run {run!r}"):
            obj = self._load(run.encode(), txn.get(run.encode(), db=self._runs), f"run {run!r}")
        if obj is None:
            return None
        if not (isinstance(obj, list) and len(obj) == 6
                and all(isinstance(obj[i], int) for i in (0, 1, 3, 4, 5))
                and isinstance(obj[2], bytes)):
            raise self._corrupt(f"run record of {run!r} is malformed")
        return RunInfo(obj[0], obj[1], obj[2], obj[3], obj[4], obj[5])

    def runs(self, txn: Any) -> list[str]:
        """Every folded run id (each record's checksum verified)."""
        out = []
        with self._reading("the run list"), txn.cursor(db=self._runs) as cur:
            for k, v in cur.iternext():
                k = bytes(k)
                self._open(k, v, f"run record {k!r}")
                out.append(k.decode("utf-8", "replace"))
        return out

    def get(self, txn: Any, run_no: int, key: str) -> bytes | None:
        """The stored value bytes of ``key`` in run ``run_no``, or None."""
        with self._reading(f"key {key!r}"):
            k = _U64.pack(run_no) + key.encode()
            data = self._open(k, txn.get(k, db=self._state), f"value of key {key!r}")
            return None if data is None else self._head_value(txn, data, key)

    def items(self, txn: Any, info: RunInfo, prefix: str = "") -> dict[str, bytes]:
        """``{key: value bytes}`` of a run, optionally only keys under ``prefix``.

        A whole-run scan is checked against the run record's key count and
        digest, so an entry whose key was damaged (and now sorts elsewhere) or
        a stale page is reported instead of silently missing.
        """
        start = _U64.pack(info.number) + prefix.encode()
        out: dict[str, bytes] = {}
        digest = 0
        with self._reading("a run's keys"), txn.cursor(db=self._state) as cur:
            found = cur.set_range(start)
            while found:
                k, v = bytes(cur.key()), cur.value()
                if not k.startswith(start):
                    self._open(k, v, "the entry after a run's keys")  # damage sorts here too
                    break
                key = k[8:].decode("utf-8", "replace")
                data = self._open(k, v, f"value of key {key!r}")
                assert data is not None
                out[key] = self._head_value(txn, data, key)
                digest ^= _CRC.unpack_from(v)[0]
                found = cur.next()
        if not prefix and (len(out) != info.keys or digest != info.digest):
            raise self._corrupt(f"run #{info.number} holds {len(out)} readable keys (digest "
                                f"{digest:08x}); its record says {info.keys} ({info.digest:08x})")
        return out

    def checkpoint(self, txn: Any, run: str, run_no: int, cid: int) -> Checkpoint | None:
        """One folded checkpoint, or None."""
        with self._reading(f"checkpoint {run!r}/{cid}"):
            k = _U64.pack(run_no) + _U64.pack(cid)
            obj = self._load(k, txn.get(k, db=self._ckpt), f"checkpoint {run!r}/{cid}")
        return None if obj is None else self._ckpt_from(run, obj)

    def checkpoints(self, txn: Any, run: str, run_no: int,
                    before: int | None = None) -> Iterator[Checkpoint]:
        """Folded checkpoints of a run, newest first (only ids below ``before`` if given)."""
        base = _U64.pack(run_no)
        upper = _U64.pack(run_no + 1) if before is None else base + _U64.pack(max(before, 1))
        with self._reading(f"checkpoints of {run!r}"), txn.cursor(db=self._ckpt) as cur:
            if not cur.set_range(upper):
                if not cur.last():
                    return
            elif not cur.prev():
                return
            expect: int | None = None
            for k, v in cur.iterprev():
                if not bytes(k).startswith(base):
                    self._open(bytes(k), v, "the entry before a run's checkpoints")
                    if expect is not None and expect != 0:
                        raise self._corrupt(f"checkpoints of {run!r} end at {expect + 1}, "
                                            "not at 1")
                    return
                c = self._ckpt_from(run, self._load(bytes(k), v, f"checkpoint of {run!r}"))
                if expect is not None and c.id != expect:
                    raise self._corrupt(f"checkpoint {expect} of {run!r} is missing "
                                        f"(found {c.id})")
                expect = c.id - 1
                yield c
            if expect is not None and expect != 0:
                raise self._corrupt(f"checkpoints of {run!r} end at {expect + 1}, not at 1")

    def _ckpt_from(self, run: str, obj: Any) -> Checkpoint:
        if not (isinstance(obj, list) and len(obj) in (7, 8)):
            raise self._corrupt(f"checkpoint record of {run!r} is malformed")
        cid, parent, lsn, created, meta_raw, hsh, origin = obj[:7]
        if not (isinstance(cid, int) and (parent is None or isinstance(parent, int))
                and isinstance(lsn, int) and isinstance(created, (int, float))
                and isinstance(meta_raw, bytes) and isinstance(hsh, bytes)
                and (origin is None or (isinstance(origin, list) and len(origin) == 2))
                and (len(obj) == 7 or obj[7] is None
                     or (isinstance(obj[7], bytes) and len(obj[7]) == 32))):
            raise self._corrupt(f"checkpoint record of {run!r} has a field of the wrong type")
        try:
            meta = decode_meta(meta_raw)
        except CodecError as exc:
            raise self._corrupt(f"checkpoint {run!r}/{cid} metadata: {exc}") from None
        org = (origin[0], origin[1]) if origin else None
        return Checkpoint(run, cid, parent, lsn, float(created), meta, hsh.hex(), org)

    # -- the effects ledger ---------------------------------------------------------

    def _entry(self, k: bytes, v: Any) -> EffectRecord:
        data = self._open(k, v, "an effects-ledger entry")
        assert data is not None
        try:
            return decode_entry(data)
        except CodecError as exc:
            raise self._corrupt(f"effects-ledger entry {k[1:]!r}: {exc}") from None

    def effect(self, txn: Any, key: str) -> EffectRecord | None:
        """The folded ledger entry with idempotency key ``key``, or None."""
        k = b"k" + key.encode()
        with self._reading("the effects ledger"):
            v = txn.get(k, db=self._effects)
            return None if v is None else self._entry(k, v)

    def effect_key_at(self, txn: Any, run: str, checkpoint: int, ordinal: int) -> str | None:
        """The key of the ``txn.effect`` entry at this position, or None."""
        k = _pos_key(run, checkpoint, ordinal)
        with self._reading("the effects ledger"):
            data = self._open(k, txn.get(k, db=self._effects), "an effect position")
        return None if data is None else data.decode("utf-8", "replace")

    def effects(self, txn: Any) -> Iterator[EffectRecord]:
        """Every folded ledger entry, in key order."""
        for k, v in self._effect_rows(txn, b"k", "the effects ledger"):
            yield self._entry(k, v)

    def outbox(self, txn: Any) -> list[str]:
        """Keys of folded outbox entries not yet settled, in commit order."""
        out = []
        for k, v in self._effect_rows(txn, b"q", "the outbox"):
            data = self._open(k, v, "an outbox entry")
            assert data is not None
            out.append(data.decode("utf-8", "replace"))
        return out

    def _effect_rows(self, txn: Any, kind: bytes, what: str) -> Iterator[tuple[bytes, Any]]:
        """``(key, sealed value)`` of the ``effects`` rows of one kind (b"k", b"p", b"q")."""
        with self._reading(what), txn.cursor(db=self._effects) as cur:
            found = cur.set_range(kind)
            while found:
                k = bytes(cur.key())
                if not k.startswith(kind):
                    break
                yield k, cur.value()
                found = cur.next()

    def _put_effect(self, txn: Any, entry: EffectRecord, raw: bytes) -> None:
        k = b"k" + entry.key.encode()
        txn.put(k, _seal(k, raw), db=self._effects)
        key = entry.key.encode()
        if entry.ordinal is not None:
            pk = _pos_key(entry.run, entry.checkpoint, entry.ordinal)
            txn.put(pk, _seal(pk, key), db=self._effects)
        if entry.order is not None:
            qk = b"q" + _U64.pack(entry.order[0]) + _U32.pack(entry.order[1])
            if outstanding(entry):
                txn.put(qk, _seal(qk, key), db=self._effects)
            else:
                txn.delete(qk, db=self._effects)

    def _expirable(self, txn: Any, e: EffectRecord, before: float) -> bool:
        """A settled entry last updated before ``before`` that nothing can meet again.

        Business keys and outbox entries expire by age alone (that is what the
        retention is for). An entry keyed by its position expires only once
        its run's folded head is past that checkpoint: a step can only start
        at the head, so a position behind it is never re-run, while one at the
        head may still be (an agent waiting, then resuming).
        """
        if outstanding(e) or e.updated_at >= before:
            return False
        if e.keyed or e.deferred:
            return True
        info = self.run_info(txn, e.run)
        return info is not None and info.head > e.checkpoint

    def _expire_effects(self, txn: Any, before: float) -> None:
        doomed = [e for e in self.effects(txn) if self._expirable(txn, e, before)]
        for e in doomed:
            txn.delete(b"k" + e.key.encode(), db=self._effects)
            if e.ordinal is not None:
                txn.delete(_pos_key(e.run, e.checkpoint, e.ordinal), db=self._effects)
    # -- history ------------------------------------------------------------------

    def _head_value(self, txn: Any, data: bytes, key: str) -> bytes:
        """A ``state`` entry's value bytes (a list stored by ref is rebuilt)."""
        try:
            return history.head_value(_TxnObjects(self, txn), data)
        except CodecError as exc:
            raise self._corrupt(f"value of key {key!r}: {exc}") from None

    def _history_record(self, txn: Any, db: Any, run: str, number: int, cid: int,
                        manifest: bool) -> dict[str, history.Ref | None] | None:
        k = _U64.pack(number) + _U64.pack(cid)
        what = f"{'manifest' if manifest else 'delta'} of checkpoint {run!r}/{cid}"
        data = self._open(k, txn.get(k, db=db), what)
        if data is None:
            return None
        try:
            return history.decode_refs(data, manifest=manifest)
        except CodecError as exc:
            raise self._corrupt(f"{what}: {exc}") from None

    def _refs_at(self, txn: Any, run: str, number: int, cid: int) -> dict[str, history.Ref]:
        """``{key: ref}`` of a run's state at folded checkpoint ``cid`` (0: empty)."""
        base = history.manifest_base(cid)
        refs: dict[str, history.Ref] = {}
        if base:
            found = self._history_record(txn, self._manifest, run, number, base, True)
            if found is None:
                raise self._corrupt(f"manifest of checkpoint {run!r}/{base} is missing")
            refs = {k: v for k, v in found.items() if v is not None}
        for i in range(base + 1, cid + 1):
            delta = self._history_record(txn, self._delta, run, number, i, False)
            if delta is None:
                raise self._corrupt(f"delta of checkpoint {run!r}/{i} is missing")
            history.apply_delta(refs, delta)
        return refs

    def state_at(self, txn: Any, run: str, info: RunInfo, cid: int,
                 key: str | None = None) -> dict[str, bytes]:
        """``{key: value bytes}`` of a run at folded checkpoint ``cid`` (only ``key`` if given).

        Rebuilt from the manifest at or before ``cid`` and the deltas after
        it (at most ``history.MANIFEST_EVERY - 1``).

        Raises:
            CorruptionError: a record or object is missing or damaged.
        """
        with self._reading(f"the state of {run!r} at {cid}"):
            refs = self._refs_at(txn, run, info.number, cid)
            if key is not None:
                refs = {key: refs[key]} if key in refs else {}
            objs = _TxnObjects(self, txn)
            try:
                return {k: history.resolve(objs, r) for k, r in refs.items()}
            except CodecError as exc:
                raise self._corrupt(f"state of {run!r} at {cid}: {exc}") from None

    def _fold_history(self, txn: Any, number: int, fr: FoldRun,
                      head: int) -> dict[str, history.Ref | None]:
        """Write each new checkpoint's delta (and manifest when due) with its objects.

        Returns each written key's ref at the last checkpoint (for ``state``).
        """
        objs = _TxnObjects(self, txn)
        deltas = fr.deltas
        if deltas is None:
            deltas = [{} for _ in fr.checkpoints[:-1]] + [fr.writes]
        base = _U64.pack(number)
        # The ref map at the previous checkpoint: needed to chain list values
        # and to write manifests; rebuilt (bounded) only when either happens.
        need = any(history.is_manifest(c.id) for c, _h, _m in fr.checkpoints) or any(
            _maybe_list(v) for d in deltas for v in d.values())
        refs = self._refs_at(txn, fr.run, number, head) if need else None
        last: dict[str, history.Ref | None] = {}
        try:
            for (c, _h, _m), delta in zip(fr.checkpoints, deltas, strict=True):
                dref: dict[str, history.Ref | None] = {}
                for key, value in delta.items():
                    prev = refs.get(key) if refs is not None and value is not None else None
                    dref[key] = None if value is None else history.store_value(objs, value, prev)
                dk = base + _U64.pack(c.id)
                self._drop_history(txn, objs, self._delta, fr.run, number, c.id, False)
                txn.put(dk, _seal(dk, history.encode_refs(dref)), db=self._delta)
                last.update(dref)
                if refs is not None:
                    history.apply_delta(refs, dref)
                if history.is_manifest(c.id):
                    assert refs is not None
                    self._drop_history(txn, objs, self._manifest, fr.run, number, c.id, True)
                    for ref in refs.values():
                        history.retain(objs, ref)
                    txn.put(dk, _seal(dk, history.encode_refs(refs)), db=self._manifest)
        except CodecError as exc:
            raise self._corrupt(f"history of {fr.run!r}: {exc}") from None
        return last

    def _drop_history(self, txn: Any, objs: _TxnObjects, db: Any, run: str, number: int,
                      cid: int, manifest: bool) -> None:
        """Release the refs of a delta or manifest about to be replaced or removed."""
        old = self._history_record(txn, db, run, number, cid, manifest)
        if old is not None:
            for ref in old.values():
                history.release(objs, ref)

    # -- folding ------------------------------------------------------------------

    def fold(self, applied_lsn: int, store_id: uuid.UUID, runs: list[FoldRun],
             log_pos: tuple[int, int] | None = None,
             effects: list[tuple[EffectRecord, bytes]] | None = None,
             expire_before: float | None = None) -> None:
        """Write a frozen memtable into LMDB in one synced transaction.

        ``effects`` are ledger entries to store (latest per key); settled
        entries last updated before ``expire_before`` are dropped.

        Raises:
            MapFull: the map is full; :meth:`grow` it (no reads open) and retry.
            DiskFullError / DurabilityError / CorruptionError: LMDB failed.
        """
        if self.readonly:
            raise ReadOnlyError(self.directory)
        with self._write_lock:
            try:
                # The environment has sync=True and metasync=True: the commit
                # fdatasyncs the data pages, then the meta page.
                with self.env.begin(write=True) as txn:
                    self._fold_into(txn, applied_lsn, store_id, runs, log_pos)
                    for entry, raw in effects or ():
                        self._put_effect(txn, entry, raw)
                    if expire_before is not None:
                        self._expire_effects(txn, expire_before)
            except lmdb.MapFullError:
                raise MapFull(self.env.info()["map_size"]) from None
            except lmdb.Error as exc:
                raise self._translate(exc, "fold failed") from None

    def forget_readers(self, n: int) -> None:
        """Drop ``n`` read transactions from the count (their owner is closing)."""
        if self._shared is not None and n:
            with _shared_lock:
                self._shared.readers = max(0, self._shared.readers - n)

    def readers(self) -> int:
        """Read transactions open on this environment in this process (all users)."""
        return self._live().readers

    def grow(self) -> int:
        """Double the map size; only call with no read transaction open. Returns the new size."""
        shared = self._live()
        with self._write_lock, _shared_lock:
            if shared.readers:
                raise RuntimeError("cannot resize the LMDB map while reads are open")
            size = int(self.env.info()["map_size"]) * 2
            try:
                self.env.set_mapsize(size)
            except lmdb.Error as exc:
                raise self._translate(exc, "cannot grow the map") from None
            return size

    def _fold_into(self, txn: Any, applied_lsn: int, store_id: uuid.UUID,
                   runs: list[FoldRun], log_pos: tuple[int, int] | None) -> None:
        raw_next = self._open(b"next_run", txn.get(b"next_run", db=self._meta), "next run number")
        if raw_next is not None and len(raw_next) != 8:
            raise self._corrupt("the next run number in the snapshot is damaged")
        next_run = _U64.unpack(raw_next)[0] if raw_next is not None else 1
        for fr in runs:
            info = self.run_info(txn, fr.run)
            if info is None:
                number, count, nkeys, digest = next_run, 0, 0, 0
                next_run += 1
            else:
                number, count, nkeys, digest = info.number, info.count, info.keys, info.digest
            base = _U64.pack(number)
            heads = self._fold_history(txn, number, fr, info.head if info is not None else 0)
            for key, value in fr.writes.items():
                k = base + key.encode()
                old = txn.get(k, db=self._state)
                if old is not None:
                    self._open(k, old, f"value of key {key!r}")  # never fold over damage
                    nkeys -= 1
                    digest ^= _CRC.unpack_from(old)[0]
                if value is None:
                    txn.delete(k, db=self._state)
                else:
                    sealed = _seal(k, history.head_entry(value, heads.get(key)))
                    txn.put(k, sealed, db=self._state)
                    nkeys += 1
                    digest ^= _CRC.unpack_from(sealed)[0]
            for c, hsh, meta_raw in fr.checkpoints:
                rec = [c.id, c.parent, c.lsn, c.created_at, meta_raw, hsh,
                       list(c.origin) if c.origin else None,
                       (fr.outboxes or {}).get(c.id)]
                ck = base + _U64.pack(c.id)
                txn.put(ck, _seal(ck, cbor2.dumps(rec)), db=self._ckpt)
            head, head_hash, _meta = fr.checkpoints[-1]
            count += len(fr.checkpoints)
            rk = fr.run.encode()
            txn.put(rk, _seal(rk, cbor2.dumps([number, head.id, head_hash, count, nkeys, digest])),
                    db=self._runs)
        for name, value in ((b"next_run", _U64.pack(next_run)), (b"store_id", store_id.bytes),
                            (b"applied_lsn", _U64.pack(applied_lsn))):
            txn.put(name, _seal(name, value), db=self._meta)
        if log_pos is not None:  # where the log continues: recovery skips what is folded
            txn.put(b"log_pos", _seal(b"log_pos", _U64.pack(log_pos[0]) + _U64.pack(log_pos[1])),
                    db=self._meta)
        else:
            txn.delete(b"log_pos", db=self._meta)

    def stats(self) -> dict[str, int]:
        """LMDB file size and entry counts."""
        txn = self.begin_read()  # counted, so a map resize waits for it
        try:
            info = self.env.info()
            st = self.env.stat()
            counts = {name: txn.stat(db)["entries"]
                      for name, db in (("folded_runs", self._runs), ("state_keys", self._state),
                                       ("checkpoints", self._ckpt), ("deltas", self._delta),
                                       ("manifests", self._manifest),
                                       ("objects", self._objects),
                                       ("effect_index_entries", self._effects))}
        except lmdb.Error as exc:
            raise self._translate(exc, "cannot read stats", reading=True) from None
        finally:
            self.end_read(txn)
        path = os.path.join(self.directory, _DATA)
        return {"lmdb_bytes": os.path.getsize(path) if os.path.exists(path) else 0,
                "lmdb_last_page": info["last_pgno"], "lmdb_page_size": st["psize"], **counts}

    def close(self) -> None:
        """Release the environment (idempotent); the last user closes it."""
        shared, self._shared = self._shared, None
        if shared is not None:
            _release(shared)

    def inline_values(self, txn: Any, prefix: bytes) -> set[bytes]:
        """Every value held inline whose bytes start with ``prefix``, in state and history.

        Scans the ``state``, ``delta`` and ``manifest`` databases whole
        (every record's checksum is checked, so damage stops the scan rather
        than hiding a value): head entries, and the inline refs of every
        delta and manifest. Values stored as objects (:data:`history.LARGE`
        bytes or more) are not looked at. Used to find blob references.

        Raises:
            CorruptionError: a record fails its checksum or does not decode.
        """
        out: set[bytes] = set()
        with self._reading("values in state and history"):
            with txn.cursor(db=self._state) as cur:
                for k, v in cur.iternext():
                    data = self._open(bytes(k), v, "a state entry")
                    if data is not None and data.startswith(prefix):
                        out.add(data)
            for db, manifest in ((self._delta, False), (self._manifest, True)):
                what = "a manifest" if manifest else "a delta"
                with txn.cursor(db=db) as cur:
                    for k, v in cur.iternext():
                        data = self._open(bytes(k), v, what)
                        if data is None or prefix not in data:
                            continue
                        try:
                            refs = history.decode_refs(data, manifest=manifest)
                        except CodecError as exc:
                            raise self._corrupt(f"{what}: {exc}") from None
                        out.update(r for r in refs.values()
                                   if isinstance(r, bytes) and r.startswith(prefix))
        return out

    # -- verify and backup ----------------------------------------------------------

    def raw(self, txn: Any) -> RawEntries:
        """The sealed entries of every database as of ``txn``, for ``verify``."""
        return RawEntries(self, txn)

    def copy_to(self, directory: str) -> None:
        """Write a consistent, compacted copy of the environment as ``directory/data.mdb``.

        LMDB copies from one read transaction, so folds may run meanwhile and
        the copy is the state of one fold boundary. ``directory`` must exist
        and hold no ``data.mdb``; the caller fsyncs the copy.

        Raises:
            DiskFullError / DurabilityError: the copy could not be written.
        """
        self._live()
        try:
            self.env.copy(directory, compact=True)
        except lmdb.Error as exc:
            raise self._translate(exc, f"cannot copy the snapshot to {directory!r}") from None


def _maybe_list(value: bytes | None) -> bool:
    """True if ``value`` may become a list node (large, and a CBOR array)."""
    return value is not None and len(value) >= history.LARGE and value[0] >> 5 == 4


class _TxnObjects:
    """``history.Objects`` over an LMDB transaction (writes need a write transaction)."""

    def __init__(self, snap: Snapshot, txn: Any) -> None:
        self._snap = snap
        self._txn = txn
        self._next: int | None = None

    def _u64(self, key: bytes, raw: bytes | None, what: str) -> int | None:
        data = self._snap._open(key, raw, what)
        if data is None:
            return None
        if len(data) != 8:
            raise self._snap._corrupt(f"{what} is damaged")
        return int(_U64.unpack(data)[0])

    def find(self, oid: bytes) -> int | None:
        return self._u64(oid, self._txn.get(oid, db=self._snap._oids),
                         f"address of object {oid.hex()}")

    def get(self, addr: int) -> bytes | None:
        k = _U64.pack(addr)
        return self._snap._open(k, self._txn.get(k, db=self._snap._objects), f"object @{addr}")

    def add(self, oid: bytes, record: bytes) -> int:
        if self._next is None:
            with self._txn.cursor(db=self._snap._objects) as cur:
                self._next = _U64.unpack(cur.key())[0] + 1 if cur.last() else 1
        addr, self._next = self._next, self._next + 1
        k, a = _U64.pack(addr), _U64.pack(addr)
        self._txn.put(k, _seal(k, record), db=self._snap._objects, append=True)
        self._txn.put(k, _seal(k, _U64.pack(0)), db=self._snap._refs, append=True)
        self._txn.put(oid, _seal(oid, a), db=self._snap._oids)
        return addr

    def delete(self, addr: int, oid: bytes) -> None:
        k = _U64.pack(addr)
        self._txn.delete(k, db=self._snap._objects)
        self._txn.delete(k, db=self._snap._refs)
        self._txn.delete(oid, db=self._snap._oids)

    def count(self, addr: int) -> int:
        k = _U64.pack(addr)
        n = self._u64(k, self._txn.get(k, db=self._snap._refs), f"reference count @{addr}")
        return 0 if n is None else n

    def set_count(self, addr: int, n: int) -> None:
        k = _U64.pack(addr)
        self._txn.put(k, _seal(k, _U64.pack(n)), db=self._snap._refs)


class MapFull(Exception):
    """The LMDB map is full; the store grows it when no read is open, then retries."""

    def __init__(self, size: int) -> None:
        self.size = size
        super().__init__(f"LMDB map of {size} bytes is full")


def _pos_key(run: str, checkpoint: int, ordinal: int) -> bytes:
    return b"p" + cbor2.dumps([run, checkpoint, ordinal])


def lmdb_closed(directory: str) -> StoreClosedError:
    return StoreClosedError(os.path.dirname(directory))


@dataclass
class _Shared:
    """One LMDB environment per directory and process, shared by every Snapshot on it."""

    key: str
    env: Any
    dbs: tuple[Any, ...]
    users: int = 1
    readers: int = 0  # read transactions open, across users


#: The named databases, in the order ``Snapshot`` unpacks them (new ones go last).
_DB_NAMES = (b"meta", b"runs", b"state", b"ckpt", b"effects", b"delta", b"manifest", b"objects",
             b"refs", b"oids")

# LMDB forbids opening one environment twice in a process (its locks are per
# process), so a writer and read-only stores in the same process share it.
_shared_lock = threading.Lock()
_shared: dict[str, _Shared] = {}


def _acquire(directory: str, readonly: bool, map_size: int) -> _Shared:
    key = os.path.realpath(directory)
    with _shared_lock:
        found = _shared.get(key)
        if found is not None:
            found.users += 1
            return found
        # A read-only store still opens the environment for writing when it
        # can, so a writer opened later in this process can share it.
        writable = not readonly or os.access(directory, os.W_OK)
        env = lmdb.open(directory, map_size=map_size, max_dbs=16, max_readers=1024, sync=True,
                        metasync=True, writemap=False, readahead=False, meminit=False,
                        readonly=not writable, lock=True, mode=0o600, create=not readonly)
        try:
            if writable:
                env.reader_check()
            # Handles opened in their own (committed) transaction stay valid.
            try:
                dbs = tuple(env.open_db(name, create=not readonly) for name in _DB_NAMES)
            except lmdb.NotFoundError:  # read-only, and a database is missing
                raise CorruptionError(
                    os.path.join(directory, _DATA), None,
                    "the snapshot lacks a database this version of agentwal keeps (it was "
                    "written by an older version)",
                    "Open the store once for writing (not read-only) to add it.") from None
            with env.begin() as txn:
                for name, db in zip(_DB_NAMES, dbs, strict=True):
                    flags = db.flags(txn)  # type: ignore[call-arg]
                    if any(flags.values()):  # created plain: a set flag is a damaged record
                        raise CorruptionError(os.path.join(directory, _DATA), None,
                                              f"database {name.decode()} has flags {flags}")
        except BaseException:
            env.close()
            raise
        if not readonly:
            # LMDB syncs its files but not their names: make snapshot/ and its
            # files durable before a fold can let WAL segments go.
            OsFileSystem().fsync_dir(directory)
            OsFileSystem().fsync_dir(os.path.dirname(os.path.abspath(directory)))
        entry = _shared[key] = _Shared(key, env, dbs)
        return entry


def _release(entry: _Shared) -> None:
    with _shared_lock:
        entry.users -= 1
        if entry.users > 0:
            return
        _shared.pop(entry.key, None)
    with contextlib.suppress(lmdb.Error):
        entry.env.close()


@dataclass
class FoldRun:
    """One run's share of a fold: final key writes and new checkpoints in order.

    ``deltas[i]`` is the change checkpoint ``checkpoints[i]`` made; None
    (callers that do not track it) records ``writes`` as the last
    checkpoint's change and the others as empty.
    """

    run: str
    writes: dict[str, bytes | None]
    checkpoints: list[tuple[Checkpoint, bytes, bytes]]
    deltas: list[dict[str, bytes | None]] | None = None
    #: checkpoint id -> SHA-256 of its outbox field (checkpoints with an outbox)
    outboxes: dict[int, bytes] | None = None


#: The named databases, by the names ``verify`` reports.
DB_NAMES = tuple(n.decode() for n in _DB_NAMES)


def unseal(key: bytes, raw: bytes) -> bytes | None:
    """The value behind a sealed entry, or None if its CRC-32 does not cover key and value."""
    if len(raw) < 4 or _CRC.unpack_from(raw)[0] != _crc(key, raw[4:]):
        return None
    return bytes(raw[4:])


class RawEntries:
    """The raw (sealed) entries of the snapshot's databases in one read transaction.

    ``verify`` reads through this and nothing else, so it sees every byte LMDB
    stores and never trusts a checked accessor. LMDB failures (a damaged
    B-tree) become ``CorruptionError``.
    """

    def __init__(self, snap: Snapshot, txn: Any) -> None:
        self._snap = snap
        self._txn = txn
        self._dbs = dict(zip(DB_NAMES, snap._live().dbs, strict=False))

    def entries(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(key, sealed value)`` of database ``db`` in key order (only keys under ``prefix``)."""
        with self._snap._reading(f"database {db}"), self._txn.cursor(db=self._dbs[db]) as cur:
            found = cur.set_range(prefix) if prefix else cur.first()
            while found:
                k = bytes(cur.key())
                if not k.startswith(prefix):
                    return
                yield k, bytes(cur.value())
                found = cur.next()

    def get(self, db: str, key: bytes) -> bytes | None:
        """The sealed value of ``key`` in database ``db``, or None."""
        with self._snap._reading(f"database {db}"):
            raw = self._txn.get(key, db=self._dbs[db])
        return None if raw is None else bytes(raw)
