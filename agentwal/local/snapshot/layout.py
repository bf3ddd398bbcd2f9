"""The LMDB schema: databases, keys, sealed values and the records they hold.

Theory of operation: this module is the one description of what the
snapshot stores, shared by the reader, the fold writer, compaction and
``verify``. It holds no LMDB handle and imports no ``lmdb``: keys are built
and values sealed and unsealed here, over plain bytes.

Databases (keys are bytes; integers big-endian so they sort):

- ``meta``:  ``applied_lsn`` -> CRC + u64, ``store_id`` -> CRC + 16 bytes,
  ``next_run`` -> CRC + u64, ``epoch:`` + run id -> CRC + u64 (the LSN of the
  run id's last deletion: its effect keys' epoch), ``layout`` -> CRC + u64 (4:
  a fold of layout 4 wrote here, :data:`LAYOUT`)
- ``runs``:  run (UTF-8) -> CRC + CBOR ``[run_no, head_id, head_hash, count,
  keys, digest]``, plus ``origin`` (``[run, id]``) once compaction dropped
  the first checkpoint of a fork (it still protects the origin); ``count``
  is the number of checkpoints LMDB holds (less than ``head_id`` once
  compaction dropped some)
- ``state``: run_no (u64) + key (UTF-8) -> CRC + value CBOR, or 0xff + CBOR
  ref of a list node or (format 3) of a large value's leaf
  (``history.head_entry``: a growing list is not copied whole by every
  fold, and a large value is stored once, in ``objects``; an entry a
  format-2 fold wrote may still hold a large value inline, read alike); or
  (layout 4) 0xff + CBOR ``[ref, id]`` for a *write-once* key, whose only
  version is checkpoint ``id`` and which has no ``versions`` entry
  (``history.head_ref``)
- ``ckpt``:  run_no (u64) + id (u64) -> CRC + CBOR
  ``[id, parent, lsn, created_at, meta, hash, origin, outbox_digest]``
  (``outbox_digest``: SHA-256 of the commit's outbox field, or null; records
  written before it existed have 7 elements), plus a 9th element, the
  parent's hash, when compaction dropped the parent (the chain stays
  checkable, and a gap in the ids is told apart from damage; else null when a
  10th follows), and a 10th, ``{key: [base count, base length]}``, when the
  commit's record logged some keys as appends (a form-2 delta): ``verify``
  rebuilds the hashed delta from it and the folded values
- ``effects``: the effects ledger (``effects.py``), three kinds of key:
  ``b"k"`` + idempotency key -> CRC + entry CBOR map;
  ``b"p"`` + CBOR ``[run, checkpoint, ordinal]`` -> CRC + idempotency key
  (where a ``txn.effect`` entry sits); ``b"q"`` + lsn (u64) + index (u32) ->
  CRC + idempotency key, for each outbox entry not yet settled (dispatch order);
  and two indexes of the ``k`` rows (format 2, :data:`EFFECTS_INDEX`):
  ``b"r"`` + run digest + key digest -> CRC + idempotency key, every entry by
  run; ``b"s"`` + status (one byte, its place in ``effects.STATUSES``) + run
  digest + key digest -> CRC + idempotency key, every entry by status, then
  run (digests: the first 8 and 16 bytes of the SHA-256 of the run id and of
  the idempotency key, which keep the keys short; a reader checks each
  entry's run and status, so a digest collision costs a read, never a
  wrong answer). ``meta`` ``effects_index`` -> CRC + u64
  (the index version, 1) says both are complete: a store written before has
  no marker, and its first fold builds them
- ``delta``: run_no (u64) + id (u64) -> CRC + CBOR ``{key: ref | null}``, the
  checkpoint's change (``history.py`` defines refs)
- ``manifest``: run_no (u64) + id (u64) -> CRC + CBOR ``{key: ref}``, the full
  state at the first checkpoint kept after ones compaction dropped (a store
  written before the version index, format 2, also has one at every id that
  is a multiple of ``history.MANIFEST_EVERY``; each is a full state, so it
  stays valid)
- ``versions`` (format 3, :data:`HISTORY_INDEX`): run_no (u64) + key length
  (u16) + key (UTF-8) + id (u64) -> CRC + nothing, one entry per key a
  checkpoint's delta holds: the key's versions in id order, so the state at
  a checkpoint is, per key, the latest version at or before it, its ref read
  from that checkpoint's delta (or from the nearest manifest at or before
  it, when that is newer). A checkpoint costs the keys it changed, never
  the whole state (layout 4: but a write-once key's, whose ``state`` entry
  names its one version; the fold that changes it again writes that
  version's entry back). ``meta`` ``history_index`` -> CRC + u64 (the version, 1)
  says it is complete; a store written before has none, is read through
  its regular manifests, and gets it at its first fold or compaction. The
  empty key's entries (length 0, so they sort first) mark the checkpoints
  that start a kept block after ones compaction dropped: each has a
  manifest, and a read at or after it must start from that manifest or a
  later one (a missing manifest is damage, never a silently older state)
- ``objects``: address (u64) -> CRC + object record (kind byte + body):
  large values, list segments and list nodes, each stored once; addresses
  are allocated in increasing order, so new objects are appended. A record
  longer than :data:`OBJECT_WHOLE` (format 3) is stored in parts, so it
  does not take a whole LMDB overflow page for a few bytes over one: the
  address's entry is ``0xfe`` + u32 record length + u16 part count, and
  address + u16 part number (1, 2 ...) -> CRC + the part's bytes (whole
  pages' worth as one overflow entry, the rest in parts of at most
  :data:`OBJECT_PART` bytes, which LMDB packs into shared leaf pages). A
  record of :data:`OBJECT_COMPRESS` bytes or more is stored zstd-compressed
  (``0xfd`` + the frame) when that saves a 16th; its id and its address's
  meaning stay those of the record itself
- ``refs``: address (u64) -> CRC + u64 reference count
- ``oids``: object id (SHA-256 of the record) -> CRC + u64 address: finds
  a large value's leaf by content, so identical content is stored once.
  From layout 4 (``meta`` :data:`LAYOUT`) list nodes, list segments and
  mid-size values (plain leaves, kind 2) are added without an entry: a
  fold then inserts no random SHA-256 keys (each touched, and so copied,
  a page of this database) for the objects a growing list makes

The ``state`` database is the fast path for each run's folded head.

Every stored value carries a CRC-32 of its key and bytes (LMDB has no
checksums of its own), checked on each read, so a flipped byte in a key or a
value is reported instead of read.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import cbor2

from ...codec import pack_payload, unpack_payload
from ...format import FLAG_ZSTD
from ...types import Checkpoint

__all__ = ["DATA", "DB_NAMES", "EFFECTS_INDEX", "EFFECTS_INDEX_VERSION", "EPOCH",
           "HISTORY_INDEX", "HISTORY_INDEX_VERSION", "LAYOUT", "LAYOUT_VERSION", "LOCK",
           "OPTIONAL_DBS", "VACUUM",
           "CheckpointRecord", "Dbs", "FoldRun", "OBJECT_PART", "OBJECT_WHOLE", "RunInfo",
           "appends_field", "crc", "implied_versions", "index_keys", "object_entries",
           "object_form", "object_record", "object_split",
           "pos_key", "run_index_prefix", "run_part", "seal", "starts_block", "status_index_prefix",
           "unseal",
           "version_key", "version_parts"]

U64 = struct.Struct(">Q")
U32 = struct.Struct(">I")
U16 = struct.Struct(">H")
CRC = struct.Struct("<I")
#: The LMDB data file under ``<store>/snapshot``.
DATA = "data.mdb"
#: ``meta`` key prefix: ``epoch:`` + run id -> u64 LSN of the run id's last deletion
EPOCH = b"epoch:"
LOCK = "lock.mdb"
#: The compacted copy a vacuum writes before renaming it over ``data.mdb``.
VACUUM = "data.mdb.vacuum"

#: The named databases, in the order :class:`Dbs` holds them (new ones go last).
DB_KEYS = (b"meta", b"runs", b"state", b"ckpt", b"effects", b"delta", b"manifest", b"objects",
           b"refs", b"oids", b"versions")
#: Databases a store of an older format may lack: a read-only open of one has no handle
#: (None) and reads without them; the first writer creates them.
OPTIONAL_DBS = frozenset({b"versions"})
#: The named databases, by the names ``verify`` reports.
DB_NAMES = tuple(n.decode() for n in DB_KEYS)


class Dbs(NamedTuple):
    """The handles of the named databases of one environment (opaque LMDB handles)."""

    meta: Any
    runs: Any
    state: Any
    ckpt: Any
    effects: Any
    delta: Any
    manifest: Any
    objects: Any
    refs: Any
    oids: Any
    versions: Any  # None: a read-only open of a store written before it existed


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

    @classmethod
    def decode(cls, obj: Any) -> RunInfo | None:
        """The run record ``obj`` (decoded CBOR of a ``runs`` value), or None if malformed.

        ``[number, head, head_hash, count, keys, digest]``, with a seventh
        item ``[origin run, origin checkpoint]`` once compaction dropped a
        fork's first checkpoint. The one decoder of it: the reader raises
        ``CorruptionError`` on None, verify reports it.
        """
        if not (isinstance(obj, list) and len(obj) in (6, 7)
                and all(isinstance(obj[i], int) for i in (0, 1, 3, 4, 5))
                and isinstance(obj[2], bytes)
                and (len(obj) == 6 or (isinstance(obj[6], list) and len(obj[6]) == 2
                                       and isinstance(obj[6][0], str)
                                       and isinstance(obj[6][1], int)))):
            return None
        origin = (obj[6][0], obj[6][1]) if len(obj) == 7 else None
        return cls(obj[0], obj[1], obj[2], obj[3], obj[4], obj[5], origin)


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """A ``ckpt`` value, decoded: the fields the schema above lists, in their order."""

    id: int
    parent: int | None
    lsn: int
    created_at: float
    meta: bytes  # the encoded metadata (``codec.decode_meta``)
    hash: bytes
    origin: tuple[str, int] | None
    outbox: bytes | None  # the digest of the commit's outbox entries, if it had any
    #: the dropped parent's hash (compaction): the chain goes on from it
    parent_hash: bytes | None = None
    #: keys the commit's record logged as appends: key -> (base count, base length)
    appends: dict[str, tuple[int, int]] | None = None

    @property
    def parent_dropped(self) -> bool:
        """True if compaction dropped the parent (the record carries its hash)."""
        return self.parent_hash is not None

    @classmethod
    def decode(cls, obj: Any) -> CheckpointRecord | None:
        """The record ``obj`` (decoded CBOR of a ``ckpt`` value), or None if malformed.

        The one decoder of it: the reader raises ``CorruptionError`` on None,
        verify reports it (after checks of its own: no bool for an int, a
        whole SHA-256, the origin's types).
        """
        if not (isinstance(obj, list) and len(obj) in (7, 8, 9, 10)):
            return None
        cid, parent, lsn, created, meta_raw, hsh, origin = obj[:7]
        if not (isinstance(cid, int) and (parent is None or isinstance(parent, int))
                and isinstance(lsn, int) and isinstance(created, (int, float))
                and isinstance(meta_raw, bytes) and isinstance(hsh, bytes)
                and (origin is None or (isinstance(origin, list) and len(origin) == 2))
                and (len(obj) == 7 or obj[7] is None
                     or (isinstance(obj[7], bytes) and len(obj[7]) == 32))
                and (len(obj) < 9 or (isinstance(obj[8], bytes) and len(obj[8]) == 32)
                     or (len(obj) == 10 and obj[8] is None))):
            return None
        appends = None
        if len(obj) == 10:
            appends = appends_field(obj[9])
            if appends is None:
                return None
        return cls(cid, parent, lsn, float(created), meta_raw, hsh,
                   (origin[0], origin[1]) if origin is not None else None,
                   obj[7] if len(obj) >= 8 else None, obj[8] if len(obj) >= 9 else None,
                   appends)


def crc(key: bytes, data: bytes) -> int:
    """The CRC-32 a sealed value carries: over its key, then its bytes."""
    return zlib.crc32(data, zlib.crc32(key))


def seal(key: bytes, data: bytes) -> bytes:
    """``data`` behind a CRC-32 of key and data, so a damaged key is caught too."""
    return CRC.pack(crc(key, data)) + data


def unseal(key: bytes, raw: bytes) -> bytes | None:
    """The value behind a sealed entry, or None if its CRC-32 does not cover key and value."""
    if len(raw) < 4 or CRC.unpack_from(raw)[0] != crc(key, raw[4:]):
        return None
    return bytes(raw[4:])


#: ``meta`` key whose presence says the ``effects`` database holds the run and
#: status indexes of every ledger entry; its value is the index version.
EFFECTS_INDEX = b"effects_index"
EFFECTS_INDEX_VERSION = 1


def run_part(run: str) -> bytes:
    """A run id as an index key part: the first 8 bytes of its SHA-256."""
    return hashlib.sha256(run.encode()).digest()[:8]


def run_index_prefix(run: str) -> bytes:
    """The prefix of a run's ``b"r"`` rows."""
    return b"r" + run_part(run)


def status_index_prefix(status_no: int, run: str | None = None) -> bytes:
    """The prefix of the ``b"s"`` rows of one status (and of one run under it)."""
    return b"s" + bytes([status_no]) + (run_part(run) if run is not None else b"")


def index_keys(run: str, status_no: int, key: str) -> tuple[bytes, bytes]:
    """The ``b"r"`` and ``b"s"`` index rows of the ledger entry ``key``."""
    tail = run_part(run) + hashlib.sha256(key.encode()).digest()[:16]
    return b"r" + tail, b"s" + bytes([status_no]) + tail


#: ``meta`` key whose presence says the ``versions`` database indexes every delta entry
#: (format 3); its value is the index version. Without it history is read through the
#: regular manifests of format 2.
HISTORY_INDEX = b"history_index"
HISTORY_INDEX_VERSION = 1


#: ``meta`` key whose presence says a fold of layout 4 or later wrote this snapshot: its
#: list nodes, list segments and mid-size values may be objects no ``oids`` entry names
#: (``history.indexed``; plain leaves, kind 2); its value is the layout (4). A snapshot
#: without it (layout 3 or older) indexes every object it holds.
LAYOUT = b"layout"
LAYOUT_VERSION = 4


def version_key(run_no: int, key: bytes, cid: int) -> bytes:
    """The ``versions`` entry of ``key`` (UTF-8) changed at checkpoint ``cid`` of run ``run_no``.

    The length before the key keeps each key's entries together and in id
    order (no key's entries sort among another's).
    """
    return U64.pack(run_no) + U16.pack(len(key)) + key + U64.pack(cid)


def starts_block(record: Any) -> bool:
    """True if a decoded ``ckpt`` record starts a kept block: compaction dropped its parent.

    Its 9th field then holds the parent's hash, whether or not a 10th (the
    appends of a form-2 commit) follows; a record with appends and its parent
    kept has null there.
    """
    return isinstance(record, list) and len(record) >= 9 and isinstance(record[8], bytes)


def implied_versions(k: bytes, delta_keys: Iterable[str] = (),
                     record: Any = None) -> list[bytes]:
    """The ``versions`` entries that what is stored under ``k`` implies (pure).

    ``k`` is a ``delta``/``ckpt`` key (run number + checkpoint id, 16 bytes);
    ``delta_keys`` the keys its delta holds, ``record`` its decoded checkpoint
    record (or None). One entry per delta key, and the block start entry (the
    empty key) when the record starts a kept block (:func:`starts_block`). The
    one derivation of the index, used by the fold writer when it builds the
    index of an older snapshot and by salvage when it rebuilds it.
    """
    if len(k) != 16:
        return []
    number, cid = U64.unpack_from(k)[0], U64.unpack_from(k, 8)[0]
    out = [version_key(number, key.encode(), cid) for key in delta_keys]
    if starts_block(record):
        out.append(version_key(number, b"", cid))
    return out


def version_parts(k: bytes) -> tuple[int, bytes, int] | None:
    """``(run number, key, id)`` of a ``versions`` entry's key, or None if malformed."""
    if len(k) < 18:
        return None
    n = U16.unpack_from(k, 8)[0]
    if len(k) != 18 + n:
        return None
    return U64.unpack_from(k)[0], k[10:10 + n], U64.unpack_from(k, 10 + n)[0]


#: Object records up to this long are one ``objects`` entry (LMDB keeps such a
#: value on a shared leaf page; a longer one would take its own overflow pages).
OBJECT_WHOLE = 1900
#: The most bytes of a record one small part holds.
OBJECT_PART = 500
#: First byte of an ``objects`` entry that heads a record stored in parts (records
#: start with their kind, 0 or 1).
OBJECT_SPLIT = 0xFE
#: First byte of a record's stored form when it is zstd-compressed (then the frame).
OBJECT_ZSTD = 0xFD
#: Records at least this long are compressed when zstd saves a 16th or more.
OBJECT_COMPRESS = 512
_PAGE = 4096  # LMDB's usual page; an overflow entry of n pages holds n * 4096 - 16 bytes
_PAGE_HEADER = 16


def object_form(record: bytes) -> bytes:
    """What the ``objects`` entries hold for ``record``: itself, or ``0xfd`` + a zstd frame."""
    packed, flags = pack_payload(record, "an object", threshold=OBJECT_COMPRESS)
    return bytes([OBJECT_ZSTD]) + packed if flags else record


def object_record(form: bytes) -> bytes:
    """Undo :func:`object_form`; :class:`CodecError` for a bad frame."""
    if form[:1] == bytes([OBJECT_ZSTD]):
        return unpack_payload(form[1:], FLAG_ZSTD)
    return form


def object_entries(addr: int, record: bytes) -> list[tuple[bytes, bytes]]:
    """The ``objects`` entries (key, unsealed bytes) that store ``record`` (its
    :func:`object_form`) at ``addr``."""
    record = object_form(record)
    k = U64.pack(addr)
    if len(record) <= OBJECT_WHOLE:
        return [(k, record)]
    parts: list[bytes] = []
    at = 0
    pages = (len(record) + _PAGE_HEADER + CRC.size) // _PAGE
    if pages:  # whole overflow pages, filled exactly (the CRC's 4 bytes included)
        at = pages * _PAGE - _PAGE_HEADER - CRC.size
        parts.append(record[:at])
    rest = len(record) - at
    if rest:  # the rest in parts of equal size, at most OBJECT_PART bytes each
        size = -(-rest // -(-rest // OBJECT_PART))
        parts.extend(record[i:i + size] for i in range(at, len(record), size))
    head = bytes([OBJECT_SPLIT]) + U32.pack(len(record)) + U16.pack(len(parts))
    return [(k, head)] + [(k + U16.pack(i), p) for i, p in enumerate(parts, 1)]


def object_split(head: bytes) -> tuple[int, int] | None:
    """``(record length, part count)`` if an ``objects`` entry heads a record in parts."""
    if head[:1] != bytes([OBJECT_SPLIT]):
        return None
    if len(head) != 7:
        return (-1, -1)  # malformed: the caller reports it
    return U32.unpack_from(head, 1)[0], U16.unpack_from(head, 5)[0]


def pos_key(run: str, checkpoint: int, ordinal: int) -> bytes:
    """The ``effects`` key of the ``txn.effect`` entry at a position."""
    return b"p" + cbor2.dumps([run, checkpoint, ordinal])


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
    #: checkpoint id -> the keys its commit record logged as appends: key -> (base
    #: count, base length), kept in the checkpoint record (its 10th field)
    appends: dict[int, dict[str, tuple[int, int]]] | None = None


def appends_field(obj: Any) -> dict[str, tuple[int, int]] | None:
    """A checkpoint record's 10th field ``{key: [base count, base length]}``; None if malformed."""
    if not (isinstance(obj, dict) and obj):
        return None
    out: dict[str, tuple[int, int]] = {}
    for k, v in obj.items():
        if not (isinstance(k, str) and isinstance(v, list) and len(v) == 2
                and type(v[0]) is int and type(v[1]) is int and v[0] >= 0 and v[1] >= 1):
            return None
        out[k] = (v[0], v[1])
    return out
