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
  ``next_run`` -> CRC + u64, ``epoch:`` + run id -> CRC + u64 (the LSN of the
  run id's last deletion: its effect keys' epoch)
- ``runs``:  run (UTF-8) -> CRC + CBOR ``[run_no, head_id, head_hash, count,
  keys, digest]``, plus ``origin`` (``[run, id]``) once compaction dropped
  the first checkpoint of a fork (it still protects the origin); ``count``
  is the number of checkpoints LMDB holds (less than ``head_id`` once
  compaction dropped some)
- ``state``: run_no (u64) + key (UTF-8) -> CRC + value CBOR, or 0xff + CBOR
  ref of a list node (``history.head_entry``: a growing list is not copied
  whole by every fold)
- ``ckpt``:  run_no (u64) + id (u64) -> CRC + CBOR
  ``[id, parent, lsn, created_at, meta, hash, origin, outbox_digest]``
  (``outbox_digest``: SHA-256 of the commit's outbox field, or null; records
  written before it existed have 7 elements), plus a 9th element, the
  parent's hash, when compaction dropped the parent (the chain stays
  checkable, and a gap in the ids is told apart from damage)
- ``effects``: the effects ledger (``effects.py``), three kinds of key:
  ``b"k"`` + idempotency key -> CRC + entry CBOR map;
  ``b"p"`` + CBOR ``[run, checkpoint, ordinal]`` -> CRC + idempotency key
  (where a ``txn.effect`` entry sits); ``b"q"`` + lsn (u64) + index (u32) ->
  CRC + idempotency key, for each outbox entry not yet settled (dispatch order)
- ``delta``: run_no (u64) + id (u64) -> CRC + CBOR ``{key: ref | null}``, the
  checkpoint's change (``history.py`` defines refs)
- ``manifest``: run_no (u64) + id (u64) -> CRC + CBOR ``{key: ref}``, the full
  state at every id that is a multiple of ``history.MANIFEST_EVERY``, and at
  the first checkpoint kept after ones compaction dropped
- ``objects``: address (u64) -> CRC + object record (kind byte + body):
  large values, list segments and list nodes, each stored once; addresses
  are allocated in increasing order, so new objects are appended
- ``refs``: address (u64) -> CRC + u64 reference count
- ``oids``: object id (SHA-256 of the record) -> CRC + u64 address: finds
  an object by content, so identical content is stored once

The ``state`` database is the fast path for each run's folded head; the
history databases rebuild any folded checkpoint from the nearest manifest at
or before it and at most ``MANIFEST_EVERY - 1`` deltas. The fold writes a checkpoint's delta, its
manifest when one is due, and the objects and counts they need in the same
LMDB transaction as the checkpoint record, so history and state never
disagree after a crash. Reading history is ``history.py`` logic over
:class:`_TxnObjects`, the one adapter from LMDB to its ``Objects`` protocol.

*Run deletion* happens in a fold (``FoldRun.reset``): the run's state,
checkpoints, deltas and manifests are removed and their references released
in the fold's transaction, before anything committed after the deletion is
written under a new run number. *Compaction* (:meth:`Snapshot.compact`,
planned by ``retention.py``) is one write transaction too: new manifests
first, then each dropped checkpoint's record, delta and manifest, releasing
their references (an object left with none is deleted). A crash before
either commits leaves LMDB as it was; the WAL still holds a deletion.

*Vacuum* (:meth:`vacuum_copy`, :meth:`swap_in`): LMDB's compacting copy
(``copyfd(compact=True)``) is written to ``data.mdb.vacuum`` and fsynced;
with no read open and no other user of the environment in the process,
the environment is closed and the copy renamed over ``data.mdb`` (then the
directory fsynced) while this process holds LMDB's exclusive lock on
``lock.mdb`` (byte 0: what every process holds shared while it has the
environment open). If another process has it open (a read-only store) the
lock is refused and the old file stays (``StoreBusyError``): its lock table
and mappings describe the old file. Held through the reopen, the lock makes
this process LMDB's exclusive opener, which rebuilds the lock table from the
new file's meta; a process opening meanwhile waits for it. The lock's file
descriptor stays open as long as the environment (closing any descriptor of
``lock.mdb`` drops every lock this process holds on it, LMDB's included).
A crash before the rename leaves the old file (a writer's open removes the
leftover copy); after it, the new one: both hold the same folded state.

Every stored value carries a CRC-32 of its key and bytes (LMDB has no
checksums of its own), checked on each read, so a flipped byte in a key or a
value is reported instead of read.
"""

from __future__ import annotations

import contextlib
import fcntl
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

from . import failpoints, history, retention
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
#: ``meta`` key prefix: ``epoch:`` + run id -> u64 LSN of the run id's last deletion
_EPOCH = b"epoch:"
_LOCK = "lock.mdb"
#: The compacted copy a vacuum writes before renaming it over ``data.mdb``.
_VACUUM = "data.mdb.vacuum"


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What LMDB knows of a run's head."""

    number: int
    head: int
    head_hash: bytes
    count: int  # checkpoints folded
    keys: int = 0  # keys in the run's folded state
    digest: int = 0  # XOR of those entries' CRCs: a missing or stale entry changes it
    #: a fork's origin, kept here once compaction dropped its first checkpoint
    origin: tuple[str, int] | None = None


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
    best: tuple[int, int, int] | None = None
    for page in (0, 1):
        base = page * psize + 16
        m, v = struct.unpack_from("<II", head, base)
        if m != _LMDB_MAGIC or v != _LMDB_DATA_VERSION:
            raise CorruptionError(path, base, f"LMDB meta page {page} is damaged")
        last_pg, txnid = struct.unpack_from("<QQ", head, base + 120)
        if best is None or txnid > best[1]:
            best = (last_pg, txnid, struct.unpack_from("<Q", head, base + 64)[0])
    assert best is not None
    need = (best[0] + 1) * psize
    if size < need and not (size % psize == 0 and _tail_is_free(path, psize, size, best)):
        raise CorruptionError(path, size,
                              f"LMDB file is truncated: {size} bytes, its meta needs {need}")


_P_BRANCH, _P_LEAF, _F_BIGDATA = 0x01, 0x02, 0x01
_P_INVALID = (1 << 64) - 1


def _tail_is_free(path: str, psize: int, size: int, meta: tuple[int, int, int]) -> bool:
    """True if every page between the end of the file and the meta's last page is free.

    LMDB does not write a page that a transaction allocated and freed again
    (a "loose" page); when such pages are the highest ones, the file ends
    before the meta's last page. They are listed in the free database, are
    never read, and the file is sound. A truncated file instead lacks pages
    the trees still use. The free database is walked by hand from the meta's
    root (bounded; any page outside the file or not parsing means no).
    """
    tail = set(range(size // psize, meta[0] + 1))
    free: set[int] = set()
    stack = [meta[2]]
    seen = 0
    with open(path, "rb") as f:
        def page(pgno: int) -> bytes | None:
            if (pgno + 1) * psize > size:
                return None
            f.seek(pgno * psize)
            return f.read(psize)

        while stack:
            pgno = stack.pop()
            seen += 1
            if pgno == _P_INVALID or seen > 100_000:
                return pgno == _P_INVALID and tail <= free
            data = page(pgno)
            if data is None:
                return False
            flags, lower = struct.unpack_from("<HH", data, 10)
            for i in range(max(0, min((lower - 16) >> 1, (psize - 16) // 2))):
                node = struct.unpack_from("<H", data, 16 + 2 * i)[0]
                if node + 8 > psize:
                    return False
                lo, hi, nflags, ksize = struct.unpack_from("<HHHH", data, node)
                if flags & _P_BRANCH:
                    stack.append(lo | hi << 16 | nflags << 32)
                    continue
                if not flags & _P_LEAF:
                    return False
                dpos, dsize = node + 8 + ksize, lo | hi << 16
                if nflags & _F_BIGDATA:
                    first = page(struct.unpack_from("<Q", data, dpos)[0]) if dpos + 8 <= psize \
                        else None
                    if first is None:
                        return False
                    start = struct.unpack_from("<Q", data, dpos)[0] * psize + 16
                    f.seek(start)
                    ids = f.read(dsize)
                elif dpos + dsize <= psize:
                    ids = data[dpos:dpos + dsize]
                else:
                    return False
                if len(ids) < 8 or len(ids) % 8:
                    return False
                count = struct.unpack_from("<Q", ids)[0]
                if 8 * (count + 1) > len(ids):
                    return False
                free.update(struct.unpack_from(f"<{count}Q", ids, 8))
    return tail <= free


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
            with contextlib.suppress(FileNotFoundError):  # a vacuum interrupted before its rename
                os.unlink(os.path.join(directory, _VACUUM))
        check_lmdb_file(data)
        try:
            shared = _acquire(directory, readonly, map_size)
        except lmdb.Error as exc:
            raise self._translate(exc, "cannot open the snapshot") from None
        self._shared: _Shared | None = shared
        self._bind(shared)

    def _bind(self, shared: _Shared) -> None:
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
        with _shared_lock:  # not while a vacuum swaps the environment
            shared = self._live()
            try:
                txn = shared.env.begin(buffers=False)
            except lmdb.Error as exc:
                raise self._translate(exc, "cannot begin a read") from None
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

    def epoch(self, txn: Any, run: str) -> int:
        """LSN of the last deletion of run id ``run`` folded into LMDB (0: none)."""
        k = _EPOCH + run.encode()
        with self._reading(f"the epoch of {run!r}"):
            data = self._open(k, txn.get(k, db=self._meta), f"the epoch of {run!r}")
        if data is None:
            return 0
        if len(data) != 8:
            raise self._corrupt(f"the epoch of {run!r} is damaged")
        return int(_U64.unpack(data)[0])

    def run_info(self, txn: Any, run: str) -> RunInfo | None:
        """The folded head of ``run``, or None."""
        with self._reading(f"run {run!r}"):
            obj = self._load(run.encode(), txn.get(run.encode(), db=self._runs), f"run {run!r}")
        if obj is None:
            return None
        if not (isinstance(obj, list) and len(obj) in (6, 7)
                and all(isinstance(obj[i], int) for i in (0, 1, 3, 4, 5))
                and isinstance(obj[2], bytes)
                and (len(obj) == 6 or (isinstance(obj[6], list) and len(obj[6]) == 2
                                       and isinstance(obj[6][0], str)
                                       and isinstance(obj[6][1], int)))):
            raise self._corrupt(f"run record of {run!r} is malformed")
        origin = (obj[6][0], obj[6][1]) if len(obj) == 7 else None
        return RunInfo(obj[0], obj[1], obj[2], obj[3], obj[4], obj[5], origin)

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
                expect, gap = c.id - 1, len(obj) == 9
                yield c
            if expect is not None and expect != 0 and not gap:
                raise self._corrupt(f"checkpoints of {run!r} end at {expect + 1}, not at 1")

    def retained(self, txn: Any, run: str, run_no: int, cid: int) -> bool:
        """True if folded checkpoint ``cid`` (below the run's head) is kept, False if dropped.

        Raises:
            CorruptionError: it is missing and no compaction dropped it.
        """
        base = _U64.pack(run_no)
        k = base + _U64.pack(cid)
        with self._reading(f"checkpoint {run!r}/{cid}"), txn.cursor(db=self._ckpt) as cur:
            if cur.set_range(k):
                found = bytes(cur.key())
                if found == k:
                    return True
                if found.startswith(base):
                    obj = self._load(found, cur.value(), f"checkpoint of {run!r}")
                    self._ckpt_from(run, obj)
                    if len(obj) == 9:  # its parent, and the ids between, were dropped
                        return False
        raise self._corrupt(f"checkpoint {cid} of {run!r} is missing")

    def _ckpt_from(self, run: str, obj: Any) -> Checkpoint:
        if not (isinstance(obj, list) and len(obj) in (7, 8, 9)):
            raise self._corrupt(f"checkpoint record of {run!r} is malformed")
        cid, parent, lsn, created, meta_raw, hsh, origin = obj[:7]
        if not (isinstance(cid, int) and (parent is None or isinstance(parent, int))
                and isinstance(lsn, int) and isinstance(created, (int, float))
                and isinstance(meta_raw, bytes) and isinstance(hsh, bytes)
                and (origin is None or (isinstance(origin, list) and len(origin) == 2))
                and (len(obj) == 7 or obj[7] is None
                     or (isinstance(obj[7], bytes) and len(obj[7]) == 32))
                and (len(obj) < 9 or (isinstance(obj[8], bytes) and len(obj[8]) == 32))):
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

    def _manifest_before(self, txn: Any, number: int, cid: int) -> int:
        """Id of the run's nearest manifest at or before ``cid`` (0: none)."""
        prefix = _U64.pack(number)
        with txn.cursor(db=self._manifest) as cur:
            found = cur.prev() if cur.set_range(prefix + _U64.pack(cid + 1)) else cur.last()
            if not found:
                return 0
            k = bytes(cur.key())
        if len(k) != 16 or not k.startswith(prefix):
            return 0
        return int(_U64.unpack_from(k, 8)[0])

    def _refs_at(self, txn: Any, run: str, number: int, cid: int) -> dict[str, history.Ref]:
        """``{key: ref}`` of a run's state at folded checkpoint ``cid`` (0: empty)."""
        base = self._manifest_before(txn, number, cid) if cid else 0
        # The regular manifest is kept with its checkpoint, so a nearer one than
        # it can only be a compaction's; a farther one means it is missing.
        if history.manifest_base(cid) > base:
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
            if fr.reset:  # deleted: what follows starts afresh, in a new epoch
                if info is not None:
                    self._drop_run(txn, fr.run, info)
                    info = None
                ek = _EPOCH + fr.run.encode()
                txn.put(ek, _seal(ek, _U64.pack(fr.reset)), db=self._meta)
            if not fr.checkpoints:
                continue
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
            run_rec: list[Any] = [number, head.id, head_hash, count, nkeys, digest]
            if info is not None and info.origin is not None:
                run_rec.append(list(info.origin))
            txn.put(rk, _seal(rk, cbor2.dumps(run_rec)), db=self._runs)
        for name, value in ((b"next_run", _U64.pack(next_run)), (b"store_id", store_id.bytes),
                            (b"applied_lsn", _U64.pack(applied_lsn))):
            txn.put(name, _seal(name, value), db=self._meta)
        if log_pos is not None:  # where the log continues: recovery skips what is folded
            txn.put(b"log_pos", _seal(b"log_pos", _U64.pack(log_pos[0]) + _U64.pack(log_pos[1])),
                    db=self._meta)
        else:
            txn.delete(b"log_pos", db=self._meta)

    # -- deleting and compacting ----------------------------------------------------

    def _prefixed(self, txn: Any, db: Any, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every ``(key, raw value)`` of ``db`` whose key starts with ``prefix``."""
        out = []
        with txn.cursor(db=db) as cur:
            found = cur.set_range(prefix)
            while found:
                k = bytes(cur.key())
                if not k.startswith(prefix):
                    break
                out.append((k, bytes(cur.value())))
                found = cur.next()
        return out

    def _drop_run(self, txn: Any, run: str, info: RunInfo) -> None:
        """Remove a run from LMDB: state, checkpoints, deltas, manifests (releasing refs),
        and the positions of its effects-ledger entries (the entries stay)."""
        objs = _TxnObjects(self, txn)
        prefix = _U64.pack(info.number)
        try:
            for db, manifest in ((self._delta, False), (self._manifest, True)):
                for k, _raw in self._prefixed(txn, db, prefix):
                    self._drop_history(txn, objs, db, run, info.number,
                                       _U64.unpack_from(k, 8)[0], manifest)
                    txn.delete(k, db=db)
        except CodecError as exc:
            raise self._corrupt(f"history of {run!r}: {exc}") from None
        for db in (self._state, self._ckpt):
            for k, _raw in self._prefixed(txn, db, prefix):
                txn.delete(k, db=db)
        # Ledger entries stay; their positions in the deleted history go
        # (``_pos_key``: b"p" + CBOR [run, checkpoint, ordinal]).
        for k, _raw in self._prefixed(txn, self._effects, b"p\x83" + cbor2.dumps(run)):
            txn.delete(k, db=self._effects)
        txn.delete(run.encode(), db=self._runs)

    def compact(self, runs: list[str] | None, *, keep_last: int | None, cutoff: float | None,
                keep_origins: bool, origins: set[tuple[str, int]] | None = None
                ) -> retention.Tally:
        """Drop old checkpoints in one synced write transaction (``retention.py`` plans it).

        Args:
            runs: the runs to compact (None: every folded run).
            keep_last: keep each run's last ``keep_last`` ids.
            cutoff: keep checkpoints created at or after this time (seconds).
            keep_origins: keep every checkpoint a fork's origin names.
            origins: more ``(run, id)`` origins to keep (forks not yet folded).

        Returns:
            What was dropped, freed and written.

        Raises:
            MapFull: a new manifest did not fit; grow the map and call again.
            DiskFullError / DurabilityError / CorruptionError: LMDB failed or
                a record is damaged; nothing was changed.
        """
        if self.readonly:
            raise ReadOnlyError(self.directory)
        with self._write_lock:
            try:
                with self.env.begin(write=True) as txn:
                    tally = retention.Tally()
                    protected: dict[str, set[int]] = {}
                    if keep_origins:
                        for run, cid in self._fork_origins(txn) | (origins or set()):
                            protected.setdefault(run, set()).add(cid)
                    for run in self.runs(txn) if runs is None else runs:
                        info = self.run_info(txn, run)
                        if info is None or (keep_last is not None and info.head <= keep_last):
                            continue  # every id is among the last keep_last: nothing to drop
                        self._compact_run(txn, run, info, tally, keep_last=keep_last,
                                          cutoff=cutoff, protected=protected.get(run, set()))
                    failpoints.hit("compact_before_commit")
            except lmdb.MapFullError:
                raise MapFull(self.env.info()["map_size"]) from None
            except lmdb.Error as exc:
                raise self._translate(exc, "compaction failed") from None
        return tally

    def _fork_origins(self, txn: Any) -> set[tuple[str, int]]:
        """Every ``(run, id)`` a folded fork started from."""
        out: set[tuple[str, int]] = set()
        for run in self.runs(txn):
            info = self.run_info(txn, run)
            if info is None:
                continue
            if info.origin is not None:
                out.add(info.origin)
                continue
            first = self.checkpoint(txn, run, info.number, 1)
            if first is not None and first.origin is not None:
                out.add(first.origin)
        return out

    def _compact_run(self, txn: Any, run: str, info: RunInfo, tally: retention.Tally, *,
                     keep_last: int | None, cutoff: float | None, protected: set[int]) -> None:
        """Carry out the plan for one run (new manifests, parent hashes, then the drops)."""
        prefix = _U64.pack(info.number)
        recs: dict[int, list[Any]] = {}
        with self._reading(f"checkpoints of {run!r}"):
            for k, raw in self._prefixed(txn, self._ckpt, prefix):
                obj = self._load(k, raw, f"checkpoint of {run!r}")
                recs[self._ckpt_from(run, obj).id] = obj
        ids = sorted(recs)
        keep = retention.choose([(c, float(recs[c][3])) for c in ids], keep_last=keep_last,
                                cutoff=cutoff, protected=protected)
        if len(keep) == len(ids):
            return
        manifests = {_U64.unpack_from(k, 8)[0]
                     for k, _raw in self._prefixed(txn, self._manifest, prefix)}
        plan = retention.plan_run(ids, keep, manifests)
        objs = _CountingObjects(self, txn, tally)
        try:
            for c in plan.manifests:  # first: they retain what the drops release
                refs = self._refs_at(txn, run, info.number, c)
                for ref in refs.values():
                    history.retain(objs, ref)
                k = prefix + _U64.pack(c)
                sealed = _seal(k, history.encode_refs(refs))
                txn.put(k, sealed, db=self._manifest)
                tally.manifests_written += 1
                tally.bytes_written += len(sealed)
            for c in plan.orphans:  # [..., origin, outbox digest, parent hash]
                k = prefix + _U64.pack(c)
                outbox = recs[c][7] if len(recs[c]) > 7 else None
                sealed = _seal(k, cbor2.dumps([*recs[c][:7], outbox, recs[c - 1][5]]))
                txn.put(k, sealed, db=self._ckpt)
                tally.bytes_written += len(sealed)
            for c in plan.drop:
                k = prefix + _U64.pack(c)
                for db, manifest in ((self._delta, False), (self._manifest, True)):
                    raw = txn.get(k, db=db)
                    if raw is not None:
                        self._drop_history(txn, objs, db, run, info.number, c, manifest)
                        tally.bytes_freed += len(raw)
                        txn.delete(k, db=db)
                raw = txn.get(k, db=self._ckpt)
                tally.bytes_freed += len(raw)
                txn.delete(k, db=self._ckpt)
        except CodecError as exc:
            raise self._corrupt(f"history of {run!r}: {exc}") from None
        origin = info.origin
        if origin is None and 1 in plan.drop and recs[1][6] is not None:
            origin = (recs[1][6][0], recs[1][6][1])  # the run stays a fork of it
        rec: list[Any] = [info.number, info.head, info.head_hash, info.count - len(plan.drop),
                          info.keys, info.digest]
        if origin is not None:
            rec.append(list(origin))
        rk = run.encode()
        txn.put(rk, _seal(rk, cbor2.dumps(rec)), db=self._runs)
        tally.runs[run] = len(plan.drop)

    # -- vacuum ---------------------------------------------------------------------

    def users(self) -> int:
        """Stores of this process sharing the environment (this one included)."""
        return self._live().users

    def vacuum_copy(self) -> str:
        """Write LMDB's compacting copy beside ``data.mdb`` and fsync it; returns its path.

        Raises:
            DiskFullError: no room for the copy (removed; nothing changed).
            DurabilityError: writing or syncing it failed (removed; nothing changed).
        """
        if self.readonly:
            raise ReadOnlyError(self.directory)
        tmp = os.path.join(self.directory, _VACUUM)
        self.discard(tmp)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                self.env.copyfd(fd, compact=True)
                os.fsync(fd)
            finally:
                os.close(fd)
        except lmdb.Error as exc:
            self.discard(tmp)
            raise self._translate(exc, "cannot write the compacted copy") from None
        except OSError as exc:
            self.discard(tmp)
            if exc.errno in DISK_FULL_ERRNOS:
                raise DiskFullError(tmp, f"no room for the compacted copy {tmp!r}; the store "
                                    "is unchanged. Free some space and vacuum again.") from None
            raise DurabilityError(tmp, f"cannot write the compacted copy: "
                                  f"{exc.strerror or exc}") from None
        return tmp

    def discard(self, tmp: str) -> None:
        """Remove a compacted copy that will not be used."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)

    def swap_in(self, tmp: str) -> bool:
        """Make the compacted copy ``tmp`` the snapshot and reopen the environment on it.

        The caller holds every write out and has checked that no read
        transaction is open and no other store of this process shares the
        environment (:meth:`readers`, :meth:`users`).

        Returns:
            False (``tmp`` removed, nothing changed) if another process has
            the environment open.

        Raises:
            DurabilityError: the rename, the directory sync or the reopen failed;
                this snapshot is closed (reopen the store).
        """
        with _shared_lock:
            shared = self._live()
            if shared.users != 1 or shared.readers:
                raise RuntimeError("the environment is in use: cannot swap its file")
            map_size = int(shared.env.info()["map_size"])
            data = os.path.join(self.directory, _DATA)
            try:
                shared.env.close()  # drops this process's locks on lock.mdb
                if shared.probe is not None:
                    os.close(shared.probe)
                    shared.probe = None
                probe = os.open(os.path.join(self.directory, _LOCK), os.O_RDWR)
                try:
                    fcntl.lockf(probe, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
                except OSError:
                    os.close(probe)  # another process has it open: keep the old file
                    self.discard(tmp)
                    shared.env, shared.dbs = _open_env(self.directory, False, map_size)
                    self._bind(shared)
                    return False
                shared.probe = probe
                os.replace(tmp, data)
                failpoints.hit("vacuum_after_rename")
                OsFileSystem().fsync_dir(self.directory)
                check_lmdb_file(data)
                shared.env, shared.dbs = _open_env(self.directory, False, map_size)
            except (OSError, lmdb.Error, CorruptionError) as exc:
                _shared.pop(shared.key, None)
                self._shared = None
                raise DurabilityError(data, f"cannot swap in the compacted snapshot: {exc}; "
                                      "reopen the store") from None
        self._bind(shared)
        return True

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


class _CountingObjects(_TxnObjects):
    """``_TxnObjects`` that adds what each deleted object freed to a compaction's tally."""

    def __init__(self, snap: Snapshot, txn: Any, tally: retention.Tally) -> None:
        super().__init__(snap, txn)
        self._tally = tally

    def delete(self, addr: int, oid: bytes) -> None:
        k = _U64.pack(addr)
        for key, db in ((k, self._snap._objects), (k, self._snap._refs), (oid, self._snap._oids)):
            raw = self._txn.get(key, db=db)
            self._tally.bytes_freed += 0 if raw is None else len(raw)
        self._tally.objects_freed += 1
        super().delete(addr, oid)


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
    #: after a vacuum: the descriptor of lock.mdb whose lock made this process LMDB's
    #: exclusive opener; closed only after the environment (it would drop LMDB's lock)
    probe: int | None = None


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
        env, dbs = _open_env(directory, readonly, map_size)
        entry = _shared[key] = _Shared(key, env, dbs)
        return entry


def _open_env(directory: str, readonly: bool, map_size: int) -> tuple[Any, tuple[Any, ...]]:
    """Open the LMDB environment and its databases (checking their flags)."""
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
    return env, dbs


def _release(entry: _Shared) -> None:
    with _shared_lock:
        entry.users -= 1
        if entry.users > 0:
            return
        _shared.pop(entry.key, None)
    with contextlib.suppress(lmdb.Error):
        entry.env.close()
    if entry.probe is not None:
        os.close(entry.probe)


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
    #: LSN of the run's deletion (0: none): remove it from LMDB first, and record the
    #: LSN as the run id's epoch (``checkpoints`` follow the deletion)
    reset: int = 0


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
