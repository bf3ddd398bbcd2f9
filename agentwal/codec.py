"""Encoding of values and commit payloads: CBOR with limits, zstd for bulk.

Theory of operation: values are encoded once, when ``txn.put`` is called, so
an unencodable value fails at once and changes nothing; from then on the
engine moves bytes (memtable, WAL, LMDB) and decodes only when a caller
reads. Nothing is ever pickled. Decoding input from disk is bounded in depth
(:data:`~agentwal.format.MAX_CBOR_DEPTH`) and decompressed size, and every
decoder failure becomes :class:`CodecError`, which the layer that knows the
file turns into ``CorruptionError(path, offset, ...)``.

A commit payload is one CBOR array::

    [run, id, parent, created_at, meta, hash(32 bytes), origin, delta]

where ``meta`` is the CBOR-encoded metadata map as a byte string (hashed as
it is stored, so the hash can be recomputed from the bytes on disk) and
``delta`` is the CBOR map ``{key: value-bytes | None}`` (None deletes),
zstd-compressed when the frame's ``FLAG_ZSTD`` is set. Keeping the delta as
its own byte string lets committers encode and compress it outside the
commit lock.

A key put with ``txn.put_blob`` stores a *blob reference* as its whole
value: CBOR tag :data:`~agentwal.format.BLOB_TAG` around ``[sha256, size]``
(``[sha256, size, media_type]`` with a media type), read back as a
:class:`~agentwal.types.BlobRef`. The tag is accepted only as a whole
stored value (:func:`decode_stored`); nested anywhere, like any tag agentwal
does not write, it is refused, and ``check_value`` refuses a ``BlobRef``
inside a value, so user data can never look like a reference.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import hashlib
import threading
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard

import cbor2
import zstandard

from .errors import CorruptionError, UnencodableValueError
from .format import (
    BLOB_REF_PREFIX,
    COMPRESS_THRESHOLD,
    FLAG_APPENDS,
    FLAG_ZSTD,
    MAX_CBOR_DEPTH,
    MAX_DECOMPRESSED,
    TREE_MEDIA_TYPE,
)
from .types import BlobRef, TreeRef

__all__ = [
    "Append",
    "Joined",
    "Value",
    "append_base",
    "append_encoded",
    "append_tail",
    "array_head",
    "array_header_size",
    "join_append",
    "decode_delta_entries",
    "CodecError",
    "CommitRecord",
    "DecodedValues",
    "decode_commit",
    "check_value",
    "decode_delta",
    "decode_meta",
    "decode_stored",
    "decode_value",
    "encode_commit",
    "encode_commit_fields",
    "encode_delta",
    "logged_delta",
    "encode_meta",
    "encode_value",
    "pack_payload",
    "unpack_payload",
    "whole",
    "decode_blob_ref",
    "encode_blob_ref",
    "is_blob_ref",
    "chain_hash",
    "checkpoint_hash",
]

Delta = dict[str, "bytes | None"]
#: An *append entry* of a form-2 delta (``format.FLAG_APPENDS``): ``(base count, base
#: length, tail)``: the key's value becomes the list it held at the parent checkpoint,
#: which has ``base count`` items and is ``base length`` bytes encoded, followed by the
#: items of ``tail`` (the CBOR array of what was appended).
Append = tuple[int, int, bytes]


class CodecError(Exception):
    """Bytes that do not decode; the caller knows the file and offset."""


_tls = threading.local()


def _compressor() -> Any:
    c = getattr(_tls, "zc", None)
    if c is None:
        c = _tls.zc = zstandard.ZstdCompressor(level=3)
    return c


def _decompressor() -> Any:
    d = getattr(_tls, "zd", None)
    if d is None:
        d = _tls.zd = zstandard.ZstdDecompressor()
    return d


#: Deepest container nesting a value may have when stored. The decoder allows
#: MAX_CBOR_DEPTH; a set costs two levels (tag and array), a leaf such as a
#: Decimal up to two more; the rest is margin.
MAX_VALUE_DEPTH = MAX_CBOR_DEPTH - 8
_SEQUENCES = (list, tuple)
_SETS = (set, frozenset)
_ONE_MINUTE = datetime.timedelta(minutes=1)
_SCALARS = (str, bytes, bool, int, float, type(None), uuid.UUID)


def _subclass_reason(obj: object) -> str:
    """Why a subclass of a storable scalar (an enum member, a ``str`` subclass) is refused."""
    base = next((b for b in _SCALARS if isinstance(obj, b)), None)
    kind = f"enum member {obj!r}" if isinstance(obj, enum.Enum) else \
        f"a {type(obj).__name__} (a subclass of {base.__name__ if base else 'object'})"
    if base is None:
        return f"{kind} is not storable: store its .value or its name"
    return (f"{kind} would read back as a plain {base.__name__}: store "
            + ("its .value" if isinstance(obj, enum.Enum) else f"{base.__name__}(x)")
            + " instead")


#: Exact scalar types the fast walk takes as they are (a subclass takes the full check).
_PLAIN_SCALARS = frozenset({str, bytes, bool, int, float, type(None)})


def _plain(obj: object, depth: int) -> bool:
    """True if ``obj`` is exact scalars in exact dicts (str keys) and lists, within the depth.

    :func:`check_value`'s fast path, the shape of nearly every agent value:
    one look at each item's exact type, no stack of pairs. Whatever it
    accepts the full walk accepts too; anything else (tuples, sets,
    datetimes, subclasses...) it leaves to the full walk, so what is refused
    and how does not change.
    """
    t = type(obj)
    if t in _PLAIN_SCALARS:
        return True
    if depth > MAX_VALUE_DEPTH:
        return False
    if t is dict:
        for k, v in obj.items():  # type: ignore[attr-defined]
            if type(k) is not str:
                return False
            if type(v) not in _PLAIN_SCALARS and not _plain(v, depth + 1):
                return False
        return True
    if t is list:
        for v in obj:  # type: ignore[attr-defined]  # noqa: SIM110 (a loop beats all() here)
            if type(v) not in _PLAIN_SCALARS and not _plain(v, depth + 1):
                return False
        return True
    return False


def check_value(key: str, value: object) -> None:
    """Refuse what would not read back as it was written.

    Allowed: None, bool, int, float, str, bytes/bytearray, list, tuple, dict,
    set/frozenset, aware datetime (not an offset in (0, 1 minute)), finite Decimal
    (not -0), UUID, nested within :data:`MAX_VALUE_DEPTH` levels. Tuples read
    back as lists (as tuples where they are dict keys or set members) and
    bytearrays as bytes; everything else reads back equal. Subclasses of the
    scalar types (a ``str`` or ``int`` enum, ``numpy.float64``) and enum
    members are refused: they would read back as the plain base type.

    Raises:
        UnencodableValueError: naming ``key`` and the offending part.
    """
    if _plain(value, 1):
        return
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        obj, depth = stack.pop()
        if type(obj) in _SCALARS:
            continue
        if isinstance(obj, (*_SCALARS, enum.Enum)):
            raise UnencodableValueError(key, _subclass_reason(obj))
        if depth > MAX_VALUE_DEPTH:
            raise UnencodableValueError(key, f"it nests containers deeper than {MAX_VALUE_DEPTH}")
        if isinstance(obj, dict):
            stack.extend((k, depth + 1) for k in obj)
            stack.extend((v, depth + 1) for v in obj.values())
        elif isinstance(obj, _SEQUENCES):
            stack.extend((v, depth + 1) for v in obj)
        elif isinstance(obj, _SETS):
            stack.extend((v, depth + 2) for v in obj)
        elif isinstance(obj, datetime.datetime):
            offset = obj.utcoffset()
            if offset is None:
                raise UnencodableValueError(key, "a naive datetime (give it a tzinfo)")
            if datetime.timedelta(0) < offset < _ONE_MINUTE:
                # cbor2 writes such an offset as "...Z:30", which it cannot read back.
                raise UnencodableValueError(key, "a datetime whose UTC offset is positive and "
                                            "under one minute")
        elif isinstance(obj, decimal.Decimal):
            if not obj.is_finite():
                raise UnencodableValueError(key, f"Decimal {obj} (only finite Decimals)")
            if obj.is_zero() and obj.is_signed():
                raise UnencodableValueError(key, "Decimal -0 (its sign would be lost)")
        elif isinstance(obj, bytearray):
            continue
        elif isinstance(obj, TreeRef):
            raise UnencodableValueError(key, "a TreeRef is stored only as a whole value, by "
                                        "txn.put_tree(key, path)")
        elif isinstance(obj, BlobRef):
            raise UnencodableValueError(key, "a BlobRef is stored only as a whole value, by "
                                        "txn.put_blob(key, ref), never with put or inside "
                                        "another value")
        else:
            raise UnencodableValueError(key, f"type {type(obj).__name__} is not storable")


def _array_head(data: bytes) -> tuple[int, int] | None:
    """``(count, header bytes)`` of a definite-length CBOR array, else None."""
    if not data or data[0] >> 5 != 4:
        return None
    info = data[0] & 0x1F
    if info < 24:
        return info, 1
    if info > 27:  # indefinite length (cbor2 never writes it) or reserved
        return None
    size = 1 << (info - 24)
    if len(data) < 1 + size:
        return None
    return int.from_bytes(data[1:1 + size], "big"), 1 + size


def _array_header(count: int) -> bytes:
    """The shortest CBOR header of an array of ``count`` items (what cbor2 writes)."""
    if count < 24:
        return bytes([0x80 | count])
    for info, size in ((24, 1), (25, 2), (26, 4)):
        if count < 1 << (8 * size):
            return bytes([0x80 | info]) + count.to_bytes(size, "big")
    return b"\x9b" + count.to_bytes(8, "big")


def append_encoded(stored: bytes, tail: bytes) -> bytes | None:
    """The CBOR of the array ``stored`` followed by the items of the array ``tail``.

    Byte for byte what encoding the joined list writes, made without decoding
    either: one new header, then both bodies. None if ``stored`` is not a
    definite-length array (``tail`` must be one, from :func:`encode_value`).
    """
    head = _array_head(stored)
    more = _array_head(tail)
    if head is None or more is None:
        return None
    # One allocation and one copy of each body (a growing list is the big part).
    return b"".join((_array_header(head[0] + more[0]), memoryview(stored)[head[1]:],
                     memoryview(tail)[more[1]:]))


class Joined:
    """A list value an append made: ``base``'s items, then ``tail``'s, joined when first read.

    Holding a grown list this way costs what was appended, not the list: a
    commit of an append (``txn.append``, a re-put that only grew) and the
    memtable keep ``Joined`` values, and only a reader that needs the bytes
    (``whole``) joins them, once (the result is kept; the parts are let go).
    ``whole()`` is byte for byte :func:`append_encoded` of the base's bytes
    and the tail. ``count`` and ``len()`` (items, encoded bytes) are known
    without joining. Immutable as a value: concurrent readers may join it
    twice, never see another value.
    """

    __slots__ = ("_base", "_tail", "_whole", "count", "length")

    def __init__(self, base: bytes | Joined, tail: memoryview, count: int, length: int) -> None:
        self._base: bytes | Joined | None = base
        self._tail: memoryview | None = tail  # the tail's items (its array header skipped)
        self._whole: bytes | None = None
        self.count = count
        self.length = length

    @classmethod
    def of(cls, stored: bytes | Joined, tail: bytes) -> Joined | None:
        """``stored`` (an encoded list, or a Joined) with the items of ``tail`` appended;
        None if ``stored`` is not a definite-length array."""
        if type(stored) is Joined:
            head: tuple[int, int] | None = (stored.count, array_header_size(stored.count))
        else:
            head = _array_head(stored)  # type: ignore[arg-type]
        more = _array_head(tail)
        if head is None or more is None:
            return None
        count = head[0] + more[0]
        length = (len(_array_header(count)) + len(stored) - head[1] + len(tail) - more[1])
        return cls(stored, memoryview(tail)[more[1]:], count, length)

    def __len__(self) -> int:
        return self.length

    def whole(self) -> bytes:
        """The encoded list (joined on the first call, then kept)."""
        done = self._whole
        if done is not None:
            return done
        tails: list[memoryview] = []
        node: bytes | Joined = self
        while type(node) is Joined:
            # Parts first, then _whole: another thread's whole() sets _whole before it
            # lets the parts go, so a missing _whole here means the parts were there.
            tail, below, joined = node._tail, node._base, node._whole
            if joined is not None:
                node = joined
                break
            assert tail is not None and below is not None
            tails.append(tail)
            node = below
        base: bytes = node  # type: ignore[assignment]
        head = _array_head(base)
        assert head is not None
        tails.append(memoryview(base)[head[1]:])
        tails.append(memoryview(_array_header(self.count)))
        tails.reverse()
        done = self._whole = b"".join(tails)
        self._base = self._tail = None
        return done


#: A stored value as the memtable and a transaction's writes hold it.
Value = bytes | Joined


def whole(value: Value | None) -> bytes | None:
    """The bytes of ``value`` (a :class:`Joined` joined), None as is."""
    return value.whole() if type(value) is Joined else value  # type: ignore[return-value]


def array_head(data: bytes) -> tuple[int, int] | None:
    """``(item count, header length)`` of a definite-length CBOR array, else None."""
    return _array_head(data)


def array_header_size(count: int) -> int:
    """Bytes of the shortest CBOR header of an array of ``count`` items."""
    return len(_array_header(count))


def append_base(stored: bytes) -> tuple[int, int] | None:
    """``(item count, encoded length)`` of a stored CBOR array (the base of an append)."""
    head = _array_head(stored)
    return None if head is None else (head[0], len(stored))


def join_append(base: Value, entry: Append) -> Joined | None:
    """The value an append entry makes of ``base`` (a :class:`Joined`, joined when read);
    None if ``base`` is not its base.

    ``base`` must be an array of exactly the entry's count and length (so a log
    replayed over another value than the one the commit extended is refused).
    """
    count, length, tail = entry
    if len(base) != length:
        return None
    if type(base) is Joined:
        if base.count != count:
            return None
    elif append_base(base) != (count, length):  # type: ignore[arg-type]
        return None
    return Joined.of(base, tail)


def append_tail(value: bytes, count: int, length: int) -> bytes | None:
    """The tail an append entry ``(count, length, tail)`` carried, rebuilt from its result.

    ``value`` is what the entry made (header, the base's items, the tail's
    items): the base's items are its first ``length - header(count)`` body
    bytes. None if ``value`` cannot be such a result. ``verify`` rebuilds a
    form-2 delta this way from folded values, without the base.
    """
    head = _array_head(value)
    if head is None or head[0] < count:
        return None
    skip = head[1] + length - len(_array_header(count))
    if skip > len(value) or length < len(_array_header(count)):
        return None
    return _array_header(head[0] - count) + value[skip:]


def encode_value(key: str, value: object) -> bytes:
    """Check and CBOR-encode one value, or raise :class:`UnencodableValueError` naming ``key``.

    Nothing is ever written that the bounded decoder would refuse to read or
    would read back as something else (see :func:`check_value`).
    """
    check_value(key, value)
    try:
        return bytes(cbor2.dumps(value))
    except (cbor2.CBOREncodeError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise UnencodableValueError(key, str(exc) or type(exc).__name__) from None


def decode_stored(data: bytes, path: str, what: str) -> Any:
    """Decode a stored value; damage becomes :class:`CorruptionError` naming ``path``.

    A blob reference (a value put with ``txn.put_blob``) reads as a
    :class:`~agentwal.types.BlobRef`.
    """
    try:
        return decode_value(data)
    except CodecError as exc:
        raise CorruptionError(path, None, f"{what}: {exc}") from None


#: Types whose values cannot change once decoded (a blob or tree ref is a frozen dataclass).
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes, BlobRef, TreeRef})
_AS_IS, _FLAT_DICT, _FLAT_LIST, _ABSENT = 0, 1, 2, 3
#: The kinds of a :class:`DecodedValues` entry: served as is, as a new dict, as a new
#: list, or absent (``default``).
AS_IS, FLAT_DICT, FLAT_LIST, ABSENT = _AS_IS, _FLAT_DICT, _FLAT_LIST, _ABSENT


class DecodedValues:
    """Recently decoded small values, by read slot: a repeated read skips the CBOR decode.

    An entry holds the stored bytes and their value; it serves a read only
    if the bytes read now are equal, so it can never return another value
    than decoding would. Only values a caller cannot change through the
    result are kept: immutable scalars as they are, and dicts or lists of
    immutable scalars, returned as a fresh shallow copy each time (the kept
    one is a copy too, never the object a caller got). Bounded: emptied when
    full. Safe from any thread (each step is one dict operation).

    An entry may also carry a *stamp* (``store.get``: the engine's LSN of
    the state it was read at, see ``Engine.stamp``), and a slot may be kept
    as absent: a reader that knows the state has not moved since that
    stamp may serve the entry without reading the stored bytes at all
    (:attr:`entries`: ``slot -> (bytes or None, kept value, kind, stamp)``).
    """

    __slots__ = ("_limit", "_small", "entries")

    def __init__(self, limit: int = 1024, small: int = 512) -> None:
        self.entries: dict[tuple[str, str], tuple[bytes | None, Any, int, int | None]] = {}
        self._limit = limit
        self._small = small

    def decode(self, run: str, key: str, data: bytes, path: str, label: str = "",
               stamp: int | None = None) -> Any:
        """``decode_stored(data, path, f"{label}{run!r}/{key!r}")``, from the entry of
        ``(run, key)`` if it holds ``data``; the entry is kept with ``stamp``."""
        slot = (run, key)
        hit = self.entries.get(slot)
        if hit is not None and hit[0] == data:
            kind = hit[2]
            if hit[3] != stamp:
                self.entries[slot] = (hit[0], hit[1], kind, stamp)
            if kind == _AS_IS:
                return hit[1]
            return dict(hit[1]) if kind == _FLAT_DICT else list(hit[1])
        value = decode_stored(data, path, f"{label}{run!r}/{key!r}")
        if len(data) <= self._small:
            t = type(value)
            if t in _IMMUTABLE:
                kept, kind = value, _AS_IS
            elif t is dict and all(type(v) in _IMMUTABLE for v in value.values()):
                kept, kind = dict(value), _FLAT_DICT
            elif t is list and all(type(v) in _IMMUTABLE for v in value):
                kept, kind = list(value), _FLAT_LIST
            else:
                return value
            self._keep(slot, (bytes(data), kept, kind, stamp))
        return value

    def absent(self, run: str, key: str, stamp: int) -> None:
        """Keep ``(run, key)`` as absent in the state of ``stamp``."""
        self._keep((run, key), (None, None, _ABSENT, stamp))

    def _keep(self, slot: tuple[str, str],
              entry: tuple[bytes | None, Any, int, int | None]) -> None:
        if len(self.entries) >= self._limit:
            self.entries.clear()
        self.entries[slot] = entry

    def clear(self) -> None:
        self.entries.clear()


def _refuse_tag(decoder: Any) -> Any:
    raise cbor2.CBORDecodeError("a CBOR tag agentwal never writes")


def _unknown_tag(decoder: Any, tag: Any) -> Any:
    raise cbor2.CBORDecodeError(f"unknown CBOR tag {tag.tag}")


# Tags cbor2 would turn into objects agentwal never stores (regex, MIME message,
# IP addresses, fractions, shared values, dates...): refused, like unknown tags,
# so hostile bytes cannot make the decoder build them.
_REFUSED = dict.fromkeys((5, 21, 22, 23, 24, 25, 28, 29, 30, 32, 33, 34, 35, 36, 52, 54, 100,
                          256, 260, 261, 1004, 43000), _refuse_tag)


def loads(data: bytes) -> Any:
    """Decode CBOR from disk within the depth limit; :class:`CodecError` on any failure."""
    try:
        return cbor2.loads(data, max_depth=MAX_CBOR_DEPTH, semantic_decoders=_REFUSED,
                           tag_hook=_unknown_tag)
    except (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError, RecursionError,
            MemoryError, LookupError) as exc:
        raise CodecError(f"undecodable CBOR: {exc}") from None


def decode_value(data: bytes) -> Any:
    """Decode one stored value (a blob reference as a :class:`~agentwal.types.BlobRef`,
    a tree's as a :class:`~agentwal.types.TreeRef`)."""
    if data[:5] == BLOB_REF_PREFIX:
        ref = decode_blob_ref(data)
        return TreeRef(ref.sha256, ref.size) if ref.media_type == TREE_MEDIA_TYPE else ref
    return loads(data)


def logged_delta(delta: Mapping[str, Value | None],
                 appends: dict[str, Append] | None) -> Mapping[str, Any]:
    """The map a commit logs and hashes: ``delta`` with each appended key's whole value
    replaced, in place, by its append entry ``[count, length, tail]``."""
    if not appends:
        return delta
    return {k: list(appends[k]) if k in appends else whole(v) for k, v in delta.items()}


def encode_delta(delta: Mapping[str, Value | None], *, compress: bool = True,
                 threshold: int = COMPRESS_THRESHOLD,
                 appends: dict[str, Append] | None = None) -> tuple[bytes, int, bytes]:
    """Encode a delta; returns ``(bytes, flags, sha256 of the uncompressed bytes)``.

    ``appends`` (keys of ``delta`` whose change is an append) makes a form-2
    delta (:func:`logged_delta`, ``FLAG_APPENDS`` in the flags). Deltas of at
    least ``threshold`` bytes (:data:`COMPRESS_THRESHOLD`, the least the
    format compresses, by default) are zstd-compressed when ``compress`` is
    true and that makes them at least 1/16 smaller.
    """
    raw = bytes(cbor2.dumps(logged_delta(delta, appends)))
    digest = hashlib.sha256(raw).digest()
    packed, flags = pack_payload(raw, "<commit>", compress=compress, threshold=threshold)
    return packed, flags | (FLAG_APPENDS if appends else 0), digest


def pack_payload(raw: bytes, what: str, *, compress: bool = True,
                 threshold: int = COMPRESS_THRESHOLD) -> tuple[bytes, int]:
    """``(bytes, flags)`` for a record payload: zstd when it helps by 1/16 or more
    (tried from ``threshold`` bytes, never below :data:`COMPRESS_THRESHOLD`).

    Raises:
        UnencodableValueError: ``raw`` is over the decompression limit.
    """
    if len(raw) > MAX_DECOMPRESSED:  # recovery would refuse to inflate it
        raise UnencodableValueError(what, f"it is {len(raw)} bytes encoded, over the "
                                    f"{MAX_DECOMPRESSED} byte limit; split it up")
    if compress and len(raw) >= max(threshold, COMPRESS_THRESHOLD):
        packed = _compressor().compress(raw)
        if len(packed) <= len(raw) - (len(raw) >> 4):
            return packed, FLAG_ZSTD
    return raw, 0


def unpack_payload(data: bytes, flags: int) -> bytes:
    """Undo :func:`pack_payload`; :class:`CodecError` for a bad or oversized frame."""
    if not flags & FLAG_ZSTD:
        return data
    try:
        # zstandard ignores max_output_size when the frame declares its size.
        declared = zstandard.frame_content_size(data)
        if declared > MAX_DECOMPRESSED:
            raise CodecError(f"zstd frame declares {declared} bytes, over the limit")
        return bytes(_decompressor().decompress(data, max_output_size=MAX_DECOMPRESSED))
    except zstandard.ZstdError as exc:
        raise CodecError(f"bad zstd frame: {exc}") from None


def decode_delta(data: bytes, flags: int) -> Delta:
    """Decode (and decompress) a form-1 delta; :class:`CodecError` if it is malformed."""
    delta = decode_delta_entries(data, flags & ~FLAG_APPENDS)
    return {k: v for k, v in delta.items() if not isinstance(v, tuple)}


def decode_delta_entries(data: bytes, flags: int) -> dict[str, bytes | Append | None]:
    """Decode (and decompress) a delta: whole values, None, and append entries, in order.

    Append entries ``[count, length, tail]`` (as :data:`Append` tuples) are
    accepted only with ``FLAG_APPENDS`` (a form-2 record); :class:`CodecError`
    if anything is malformed.
    """
    delta = loads(unpack_payload(data, flags))
    if not isinstance(delta, dict):
        raise CodecError("delta is not a map")
    out: dict[str, bytes | Append | None] = delta
    for k, v in delta.items():
        if not isinstance(k, str):
            raise CodecError("delta entry is not str -> bytes|None")
        if v is None or isinstance(v, bytes):
            continue
        if not flags & FLAG_APPENDS:
            raise CodecError("delta entry is not str -> bytes|None")
        if not (isinstance(v, list) and len(v) == 3 and type(v[0]) is int and v[0] >= 0
                and type(v[1]) is int and v[1] >= 1 and isinstance(v[2], bytes)
                and _array_head(v[2]) is not None):
            raise CodecError(f"append entry of {k!r} is not [count, length, tail array]")
        out[k] = (v[0], v[1], v[2])
    return out


class CommitRecord(NamedTuple):
    """A decoded commit payload (before the delta is decompressed)."""

    run: str
    id: int
    parent: int | None
    created_at: float
    meta: bytes  # the CBOR map, exactly as hashed
    hash: bytes
    origin: tuple[str, int] | None
    delta: bytes
    #: CBOR list of outbox entries ``[name, mode, args bytes, key | None,
    #: idempotent]`` (``txn.defer``), hashed as stored; None when there are none
    deferred: bytes | None = None
    #: idempotency keys of the effects the committing transaction recorded
    #: (``txn.effect``), in call order; the commit marks their ledger entries
    #: ``committed_in`` this checkpoint. Not hashed (the ledger is not history).
    effects: tuple[str, ...] = ()


_EMPTY_MAP = b"\xa0"


def encode_meta(meta: dict[str, Any]) -> bytes:
    """Encode checkpoint metadata once; these bytes are stored and hashed as they are."""
    if not meta:  # the usual case: cbor2 writes the empty map as this byte too
        return _EMPTY_MAP
    return bytes(cbor2.dumps(meta))


def decode_meta(data: bytes) -> dict[str, Any]:
    """Decode checkpoint metadata; :class:`CodecError` if it is not a map."""
    if data == _EMPTY_MAP:  # the usual case, a fresh dict without the decoder
        return {}
    meta = loads(data)
    if not isinstance(meta, dict):
        raise CodecError("checkpoint metadata is not a map")
    return meta


def encode_commit(rec: CommitRecord) -> bytes:
    """Encode a commit payload."""
    return encode_commit_fields(rec.run, rec.id, rec.parent, rec.created_at, rec.meta, rec.hash,
                                rec.origin, rec.delta, rec.deferred, rec.effects)


def encode_commit_fields(run: str, cid: int, parent: int | None, created_at: float,
                         meta: bytes, hsh: bytes, origin: tuple[str, int] | None, delta: bytes,
                         deferred: bytes | None = None, effects: tuple[str, ...] = ()) -> bytes:
    """:func:`encode_commit` of the fields themselves (the commit path builds no record)."""
    fields = [run, cid, parent, created_at, meta, hsh,
              list(origin) if origin is not None else None, delta]
    if deferred is not None or effects:
        fields.append(deferred)
    if effects:
        fields.append(list(effects))
    return bytes(cbor2.dumps(fields))


def decode_commit(payload: bytes) -> CommitRecord:
    """Decode a commit payload, checking every field's type (``meta`` stays encoded)."""
    obj = loads(payload)
    if not isinstance(obj, list) or len(obj) not in (8, 9, 10):
        raise CodecError("commit payload is not an 8-, 9- or 10-element array")
    run, cid, parent, created, meta, hsh, origin, delta = obj[:8]
    deferred = obj[8] if len(obj) >= 9 else None
    effects = obj[9] if len(obj) == 10 else []
    ok = (
        isinstance(run, str)
        and isinstance(cid, int)
        and cid >= 1
        and (parent is None or isinstance(parent, int))
        and isinstance(created, (int, float))
        and isinstance(meta, bytes)
        and isinstance(hsh, bytes)
        and len(hsh) == 32
        and isinstance(delta, bytes)
        and (deferred is None or isinstance(deferred, bytes))
        and isinstance(effects, list)
        and all(isinstance(k, str) for k in effects)
        and (
            origin is None
            or (isinstance(origin, list) and len(origin) == 2 and isinstance(origin[0], str)
                and isinstance(origin[1], int))
        )
    )
    if not ok:
        raise CodecError("commit payload has a field of the wrong type")
    org = (origin[0], origin[1]) if origin is not None else None
    return CommitRecord(run, cid, parent, float(created), meta, hsh, org, delta, deferred,
                        tuple(effects))


def checkpoint_hash(
    parent_hash: bytes,
    run: str,
    cid: int,
    parent: int | None,
    created_at: float,
    meta: bytes,
    origin: tuple[str, int] | None,
    delta_digest: bytes,
    deferred: bytes | None = None,
) -> bytes:
    """SHA-256 chaining a checkpoint to its parent: covers the fields and the change.

    ``sha256(parent_hash || cbor([run, id, parent, created_at, origin]) || meta
    bytes || sha256(delta bytes) [|| sha256(deferred bytes)])``; ``meta`` is
    the stored encoding, so the hash can be recomputed from what is on disk.
    The outbox part is there only when the commit has deferred effects.
    """
    outbox_digest = hashlib.sha256(deferred).digest() if deferred is not None else None
    return chain_hash(parent_hash, run, cid, parent, created_at, meta, origin, delta_digest,
                      outbox_digest)


def chain_hash(
    parent_hash: bytes,
    run: str,
    cid: int,
    parent: int | None,
    created_at: float,
    meta: bytes,
    origin: tuple[str, int] | None,
    delta_digest: bytes,
    outbox_digest: bytes | None,
) -> bytes:
    """:func:`checkpoint_hash` from the digests of the delta and the outbox.

    A verifier that kept ``sha256(outbox bytes)`` instead of the bytes (the
    snapshot's checkpoint record) recomputes the hash with this.
    """
    org = list(origin) if origin is not None else None
    body = cbor2.dumps([run, cid, parent, created_at, org])
    tail = outbox_digest if outbox_digest is not None else b""
    return hashlib.sha256(parent_hash + body + meta + delta_digest + tail).digest()


# -- blob references -----------------------------------------------------------------


def encode_blob_ref(ref: BlobRef) -> bytes:
    """The stored value of a key put with ``txn.put_blob``: the tag around ``[sha, size(, mt)]``."""
    fields: list[Any] = [bytes.fromhex(ref.sha256), ref.size]
    if ref.media_type is not None:
        fields.append(ref.media_type)
    return BLOB_REF_PREFIX + bytes(cbor2.dumps(fields))


def is_blob_ref(data: object) -> TypeGuard[bytes]:
    """True if stored value bytes are a blob reference (they start with its tag).

    A ``Joined`` (a list an append made) never is one.
    """
    return type(data) is bytes and data[:5] == BLOB_REF_PREFIX


def decode_blob_ref(data: bytes) -> BlobRef:
    """Decode a blob reference, exactly as :func:`encode_blob_ref` writes it.

    Raises:
        CodecError: not a blob reference, a field of the wrong type, or bytes
            that are not the canonical encoding (trailing bytes included).
    """
    if data[:5] != BLOB_REF_PREFIX:
        raise CodecError("not a blob reference")
    obj = loads(data[5:])
    if not (isinstance(obj, list) and len(obj) in (2, 3) and isinstance(obj[0], bytes)
            and len(obj[0]) == 32 and isinstance(obj[1], int) and not isinstance(obj[1], bool)
            and obj[1] >= 0 and (len(obj) == 2 or isinstance(obj[2], str))):
        raise CodecError("malformed blob reference")
    try:
        ref = BlobRef(obj[0].hex(), obj[1], obj[2] if len(obj) == 3 else None)
    except ValueError as exc:
        raise CodecError(f"malformed blob reference: {exc}") from None
    if encode_blob_ref(ref) != data:
        raise CodecError("blob reference is not in its canonical encoding")
    return ref
