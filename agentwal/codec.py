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

where ``delta`` is the CBOR map ``{key: value-bytes | None}`` (None deletes),
zstd-compressed when the frame's ``FLAG_ZSTD`` is set. Keeping the delta as
its own byte string lets committers encode and compress it outside the
commit lock.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any

import cbor2
import zstandard

from .errors import CorruptionError, UnencodableValueError
from .format import COMPRESS_THRESHOLD, FLAG_ZSTD, MAX_CBOR_DEPTH, MAX_DECOMPRESSED

__all__ = [
    "CodecError",
    "CommitRecord",
    "decode_commit",
    "decode_delta",
    "decode_stored",
    "decode_value",
    "encode_commit",
    "encode_delta",
    "encode_value",
]

Delta = dict[str, "bytes | None"]


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


#: Deepest nesting a value may have when stored: decoding allows MAX_CBOR_DEPTH,
#: and a value can sit a few levels down (meta inside a commit record).
MAX_VALUE_DEPTH = MAX_CBOR_DEPTH - 8
_CONTAINERS = (list, tuple, dict, set, frozenset)


def _depth_exceeds(value: object, limit: int) -> bool:
    """Whether containers nest deeper than ``limit`` (iterative; leaves cost a type check)."""
    stack = [(value, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > limit:
            return True
        children = obj.values() if isinstance(obj, dict) else obj
        for child in children:  # type: ignore[attr-defined]
            if isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1))
    return False


def encode_value(key: str, value: object) -> bytes:
    """CBOR-encode one value, or raise :class:`UnencodableValueError` naming ``key``.

    A value nested deeper than :data:`MAX_VALUE_DEPTH` is refused here, so
    nothing is ever written that the bounded decoder would refuse to read.
    """
    try:
        data = bytes(cbor2.dumps(value))
    except (cbor2.CBOREncodeError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise UnencodableValueError(key, str(exc) or type(exc).__name__) from None
    # Each level costs at least one byte, so only long encodings can be too deep.
    if (len(data) > MAX_VALUE_DEPTH and isinstance(value, _CONTAINERS)
            and _depth_exceeds(value, MAX_VALUE_DEPTH)):
        raise UnencodableValueError(key, f"it nests containers deeper than {MAX_VALUE_DEPTH}")
    return data


def decode_stored(data: bytes, path: str, what: str) -> Any:
    """Decode a stored value; damage becomes :class:`CorruptionError` naming ``path``."""
    try:
        return loads(data)
    except CodecError as exc:
        raise CorruptionError(path, None, f"{what}: {exc}") from None


def loads(data: bytes) -> Any:
    """Decode CBOR from disk within the depth limit; :class:`CodecError` on any failure."""
    try:
        return cbor2.loads(data, max_depth=MAX_CBOR_DEPTH)
    except (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError, RecursionError,
            MemoryError, LookupError) as exc:
        raise CodecError(f"undecodable CBOR: {exc}") from None


def decode_value(data: bytes) -> Any:
    """Decode one stored value."""
    return loads(data)


def encode_delta(delta: Delta) -> tuple[bytes, int, bytes]:
    """Encode a delta; returns ``(bytes, flags, sha256 of the uncompressed bytes)``."""
    raw = bytes(cbor2.dumps(delta))
    digest = hashlib.sha256(raw).digest()
    if len(raw) >= COMPRESS_THRESHOLD:
        packed = _compressor().compress(raw)
        if len(packed) < len(raw):
            return packed, FLAG_ZSTD, digest
    return raw, 0, digest


def decode_delta(data: bytes, flags: int) -> Delta:
    """Decode (and decompress) a delta; :class:`CodecError` if it is malformed."""
    if flags & FLAG_ZSTD:
        try:
            # zstandard ignores max_output_size when the frame declares its size.
            declared = zstandard.frame_content_size(data)
            if declared > MAX_DECOMPRESSED:
                raise CodecError(f"zstd frame declares {declared} bytes, over the limit")
            data = _decompressor().decompress(data, max_output_size=MAX_DECOMPRESSED)
        except zstandard.ZstdError as exc:
            raise CodecError(f"bad zstd frame: {exc}") from None
    delta = loads(data)
    if not isinstance(delta, dict):
        raise CodecError("delta is not a map")
    for k, v in delta.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, bytes)):
            raise CodecError("delta entry is not str -> bytes|None")
    return delta


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """A decoded commit payload (before the delta is decompressed)."""

    run: str
    id: int
    parent: int | None
    created_at: float
    meta: dict[str, Any]
    hash: bytes
    origin: tuple[str, int] | None
    delta: bytes


def encode_commit(rec: CommitRecord) -> bytes:
    """Encode a commit payload."""
    origin = list(rec.origin) if rec.origin is not None else None
    return bytes(
        cbor2.dumps(
            [rec.run, rec.id, rec.parent, rec.created_at, rec.meta, rec.hash, origin, rec.delta]
        )
    )


def decode_commit(payload: bytes) -> CommitRecord:
    """Decode a commit payload, checking every field's type."""
    obj = loads(payload)
    if not isinstance(obj, list) or len(obj) != 8:
        raise CodecError("commit payload is not an 8-element array")
    run, cid, parent, created, meta, hsh, origin, delta = obj
    ok = (
        isinstance(run, str)
        and isinstance(cid, int)
        and cid >= 1
        and (parent is None or isinstance(parent, int))
        and isinstance(created, (int, float))
        and isinstance(meta, dict)
        and isinstance(hsh, bytes)
        and len(hsh) == 32
        and isinstance(delta, bytes)
        and (
            origin is None
            or (isinstance(origin, list) and len(origin) == 2 and isinstance(origin[0], str)
                and isinstance(origin[1], int))
        )
    )
    if not ok:
        raise CodecError("commit payload has a field of the wrong type")
    org = (origin[0], origin[1]) if origin is not None else None
    return CommitRecord(run, cid, parent, float(created), meta, hsh, org, delta)


def checkpoint_hash(
    parent_hash: bytes,
    run: str,
    cid: int,
    parent: int | None,
    created_at: float,
    meta: dict[str, Any],
    origin: tuple[str, int] | None,
    delta_digest: bytes,
) -> bytes:
    """SHA-256 chaining a checkpoint to its parent: covers the fields and the change."""
    org = list(origin) if origin is not None else None
    body = cbor2.dumps([run, cid, parent, created_at, meta, org], canonical=True)
    return hashlib.sha256(parent_hash + body + delta_digest).digest()
