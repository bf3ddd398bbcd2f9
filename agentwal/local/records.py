"""WAL records by type: the one decoder of a frame's payload, and the delete-run codec.

Theory of operation: a WAL frame (``wal/frame.py``) carries a record type,
flags and a payload; this module turns those into typed records and back
for the one record type it owns, and is the only place that knows which
decoder each type takes:

- ``REC_COMMIT`` (:class:`Replayed`): ``codec.encode_commit`` fields, the
  commit metadata, the delta (zstd-compressed when the frame's flags say
  so; with ``FLAG_APPENDS``, a form-2 delta whose entries may be appends to
  the key's previous value, which replay joins: ``apply.replay``) and the
  outbox (``effects.encode_outbox``), if any;
- ``REC_EFFECT`` (:class:`ReplayedEffect`): an effects-ledger entry
  (``effects.encode_entry``), zstd-compressed when the flags say so;
- ``REC_DELETE_RUN`` (:class:`ReplayedDelete`): CBOR ``[run, head id]``
  (:func:`encode_delete_run`).

Recovery replays what :func:`decode_record` returns, ``verify`` checks it and
``agentwal wal`` prints it, so the three cannot disagree on what a record
says. Any malformed payload, and an unknown type, is a ``CodecError``
(``unknown record type N``); callers add the file and offset. Pure: bytes in,
values out.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeAlias

import cbor2

from ..codec import (
    Append,
    CodecError,
    CommitRecord,
    decode_commit,
    decode_delta_entries,
    decode_meta,
    loads,
    unpack_payload,
)
from ..effects import Deferred, EffectRecord, decode_entry, decode_outbox
from ..format import FLAG_ZSTD, REC_COMMIT, REC_DELETE_RUN, REC_EFFECT

__all__ = ["Record", "Replayed", "ReplayedDelete", "ReplayedEffect", "decode_delete_run",
           "decode_record", "encode_delete_run"]


class Replayed(NamedTuple):
    """One commit read back from the log."""

    lsn: int
    record: CommitRecord
    meta: dict[str, Any]
    #: whole values (None: deleted) and, in a form-2 record, append entries
    delta: dict[str, bytes | Append | None]
    deferred: list[Deferred] | None = None
    #: the delta's encoded bytes, uncompressed (only when asked for: ``verify`` hashes them)
    raw_delta: bytes | None = None


class ReplayedEffect(NamedTuple):
    """One effects-ledger entry read back from the log."""

    lsn: int
    entry: EffectRecord
    raw: bytes  # the entry's CBOR map, uncompressed


class ReplayedDelete(NamedTuple):
    """One run deletion (``store.delete_run``) read back from the log."""

    lsn: int
    run: str
    head: int  # the run's head id when it was deleted


Record: TypeAlias = Replayed | ReplayedEffect | ReplayedDelete


def decode_record(lsn: int, rtype: int, flags: int, payload: bytes, *,
                  keep_raw: bool = False) -> Record:
    """The typed record of one frame.

    Args:
        lsn, rtype, flags, payload: the frame's fields.
        keep_raw: also keep a commit's uncompressed delta bytes (``raw_delta``).

    Raises:
        CodecError: the payload is malformed, or the type is unknown.
    """
    if rtype == REC_DELETE_RUN:
        run, head = decode_delete_run(payload)
        return ReplayedDelete(lsn, run, head)
    if rtype == REC_EFFECT:
        raw = unpack_payload(payload, flags)
        return ReplayedEffect(lsn, decode_entry(raw), raw)
    if rtype != REC_COMMIT:
        raise CodecError(f"unknown record type {rtype}")
    rec = decode_commit(payload)
    meta = decode_meta(rec.meta)
    raw_delta = unpack_payload(rec.delta, flags) if keep_raw else None
    delta = (decode_delta_entries(rec.delta, flags) if raw_delta is None
             else decode_delta_entries(raw_delta, flags & ~FLAG_ZSTD))
    deferred = decode_outbox(rec.deferred) if rec.deferred is not None else None
    return Replayed(lsn, rec, meta, delta, deferred, raw_delta)


def encode_delete_run(run: str, head: int) -> bytes:
    """The payload of a ``REC_DELETE_RUN`` record: CBOR ``[run, head id]``."""
    return bytes(cbor2.dumps([run, head]))


def decode_delete_run(payload: bytes) -> tuple[str, int]:
    """``(run, head id)`` of a ``REC_DELETE_RUN`` payload; :class:`CodecError` if malformed."""
    obj = loads(payload)
    if not (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[0], str) and obj[0]
            and isinstance(obj[1], int) and not isinstance(obj[1], bool) and obj[1] >= 1):
        raise CodecError("delete-run payload is not [run, head id]")
    return obj[0], obj[1]
