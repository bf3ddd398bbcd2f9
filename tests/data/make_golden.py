"""Write the golden files that pin the on-disk format (``tests/data/*-v<format version>.bin``).

Usage: ``.venv/bin/python tests/data/make_golden.py`` (from the repository root).

Everything is fixed: the store id, the segment salt, the clock and the
payloads, so running this twice gives the same bytes, except for the zstd
frame of record 2, whose compressed bytes may differ between zstandard
versions (``tests/unit/test_golden.py`` compares that frame by content).

A format change must regenerate these files *and* bump ``FORMAT_VERSION``
(the files are named after the version they are written in). ``test_golden.py``
imports the functions below to regenerate the images in memory and compare
them with the committed files. Version 1 is what a store is written in until
its log holds a form-2 record; version 2 (``APPENDS_VERSION``) after.

The segment (``segment-v1.bin``, 4096 bytes like a preallocated segment):

- header: segment 0 of store ``STORE_ID``, first LSN 1, salt ``SALT``;
- LSN 1 (synced LSN 0), run ``run-1`` checkpoint 1, a small plain delta;
- LSN 2 (synced LSN 1), run ``run-1`` checkpoint 2, a delta over
  ``COMPRESS_THRESHOLD`` bytes, zstd-compressed (``FLAG_ZSTD``);
- LSN 3 (synced LSN 1, same batch as 2), run ``run-1-b`` checkpoint 1,
  forked from ``("run-1", 2)``, a delta with a deletion;
- zeros up to 4096 bytes (the clean end).

The control file (``control-v1.bin``): what ``create_control`` writes for
``STORE_ID`` at ``CREATED_AT``.

The effects segment (``effects-v1.bin``, 4096 bytes; record type 2 and the
commit's outbox field came after the first segment was pinned):

- header: segment 0 of store ``STORE_ID``, first LSN 1, salt ``SALT``;
- LSN 1 (``REC_EFFECT``): the intent of effect ``charge-card``
  (exactly_once, idempotent) of run ``run-1`` at checkpoint 0, ``in_doubt``,
  attempt 1;
- LSN 2 (``REC_EFFECT``): its outcome, ``done`` with a result;
- LSN 3 (``REC_COMMIT``): run ``run-1`` checkpoint 1 with a small delta and
  an outbox of one ``send-email`` entry (the optional 9th field), which the
  checkpoint hash covers;
- zeros up to 4096 bytes.

The appends segment (``appends-v2.bin``, 4096 bytes; form-2 commit records,
``FLAG_APPENDS``, came after the others were pinned), with ``control-v2.bin``
(the control file at format 2, as ``control.raise_format`` rewrites it):

- header: segment 0 of store ``STORE_ID``, first LSN 1, salt ``SALT``,
  format version 2;
- LSN 1: run ``chat`` checkpoint 1, ``messages`` as a whole two-item list;
- LSN 2 (``FLAG_APPENDS``): checkpoint 2, ``messages`` as the append entry
  ``[2, base length, tail of one item]`` and ``step`` as a whole value; the
  checkpoint hash covers the entry, not the joined list;
- LSN 3 (``FLAG_APPENDS``): checkpoint 3, two more items appended;
- zeros up to 4096 bytes.

``appends-v1.bin`` is the same segment with a version-1 header: what the
agentwal of session 5 wrote (form-2 records before the version was raised).
It is kept to prove such a log is still read (and that a writer opening it
raises its CONTROL to format 2).
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import cbor2

from agentwal.codec import (
    CommitRecord,
    append_encoded,
    checkpoint_hash,
    encode_commit,
    encode_delta,
    encode_meta,
    encode_value,
)
from agentwal.effects import (
    EffectMode,
    EffectRecord,
    args_digest,
    derive_key,
    effect_id_for,
    encode_entry,
    encode_outbox,
)
from agentwal.format import (
    APPENDS_VERSION,
    COMPRESS_THRESHOLD,
    CONTROL_FILE,
    FLAG_APPENDS,
    FLAG_ZSTD,
    PLAIN_VERSION,
    REC_COMMIT,
    REC_EFFECT,
)
from agentwal.io import OsFileSystem
from agentwal.local.control import create_control, raise_format
from agentwal.local.wal.frame import SegmentHeader, encode_frame, encode_header

HERE = Path(__file__).resolve().parent
SEGMENT_FILE = HERE / f"segment-v{PLAIN_VERSION}.bin"
CONTROL_FILE_GOLDEN = HERE / f"control-v{PLAIN_VERSION}.bin"
EFFECTS_FILE = HERE / f"effects-v{PLAIN_VERSION}.bin"
APPENDS_FILE = HERE / f"appends-v{APPENDS_VERSION}.bin"
CONTROL2_FILE = HERE / f"control-v{APPENDS_VERSION}.bin"
#: Session 5's appends segment (form-2 records in a version-1 segment): read, not written.
LEGACY_APPENDS_FILE = HERE / f"appends-v{PLAIN_VERSION}.bin"

STORE_ID = uuid.UUID("a9e1c0de-0000-4000-8000-00000000a11e")
SALT = 0x5EED5A17
CREATED_AT = 1767225600.0  # 2026-01-01T00:00:00Z
SEGMENT_SIZE = 4096
HEADER = SegmentHeader(STORE_ID, 0, 1, SALT)

#: A message long and repetitive enough to cross COMPRESS_THRESHOLD and shrink.
LONG_TEXT = "Summarise the quarterly report, then draft the e-mail to finance. " * 12


@dataclass(frozen=True)
class GoldenRecord:
    """One record of the golden segment, before and after encoding."""

    lsn: int
    synced_lsn: int
    run: str
    id: int
    parent: int | None
    created_at: float
    meta: dict[str, Any]
    origin: tuple[str, int] | None
    values: dict[str, Any]  # key -> value (None: a deletion)
    flags: int  # FLAG_ZSTD when the encoded delta is compressed
    hash: bytes
    payload: bytes


def _record(lsn: int, synced: int, run: str, cid: int, parent: int | None, meta: dict[str, Any],
            origin: tuple[str, int] | None, values: dict[str, Any],
            parent_hash: bytes) -> GoldenRecord:
    delta = {k: (None if v is None else encode_value(k, v)) for k, v in values.items()}
    packed, flags, digest = encode_delta(delta)
    created = CREATED_AT + lsn
    meta_raw = encode_meta(meta)
    h = checkpoint_hash(parent_hash, run, cid, parent, created, meta_raw, origin, digest)
    payload = encode_commit(CommitRecord(run, cid, parent, created, meta_raw, h, origin, packed))
    return GoldenRecord(lsn, synced, run, cid, parent, created, meta, origin, values, flags, h,
                        payload)


def records() -> list[GoldenRecord]:
    """The three golden records, encoded with the current codec."""
    genesis = bytes(32)
    r1 = _record(1, 0, "run-1", 1, None, {"node": "planner", "step": 1}, None,
                 {"plan": {"steps": ["search", "answer"]}, "step": 1}, genesis)
    r2 = _record(2, 1, "run-1", 2, 1, {"node": "tool", "step": 2}, None,
                 {"messages/0": {"role": "user", "content": LONG_TEXT}, "step": 2}, r1.hash)
    r3 = _record(3, 1, "run-1-b", 1, None, {"forked": True}, ("run-1", 2),
                 {"step": 3, "scratch": None}, genesis)
    assert (r1.flags, r2.flags, r3.flags) == (0, FLAG_ZSTD, 0), "record 2 must be compressed"
    return [r1, r2, r3]


def raw_delta_size(rec: GoldenRecord) -> int:
    """Length of the uncompressed CBOR delta (to show it crosses COMPRESS_THRESHOLD)."""
    delta = {k: (None if v is None else encode_value(k, v)) for k, v in rec.values.items()}
    return len(cbor2.dumps(delta))


def segment_image(payloads: dict[int, bytes] | None = None) -> bytes:
    """The golden segment; ``payloads`` overrides the payload of some LSNs."""
    payloads = payloads or {}
    out = bytearray(encode_header(HEADER))
    for r in records():
        payload = payloads.get(r.lsn, r.payload)
        out += encode_frame(SALT, r.lsn, r.synced_lsn, REC_COMMIT, r.flags, payload)
    assert len(out) <= SEGMENT_SIZE
    return bytes(out) + bytes(SEGMENT_SIZE - len(out))


def effect_entries() -> list[EffectRecord]:
    """The intent and the outcome of the golden effect (LSN 1 and 2)."""
    args = {"amount": 4900, "currency": "EUR"}
    key = derive_key(STORE_ID, "run-1", 0, "charge-card", 0)
    intent = EffectRecord(effect_id_for(key), key, "charge-card", EffectMode.EXACTLY_ONCE,
                          "run-1", 0, 0, False, "in_doubt", 1, args,
                          args_digest(encode_value("args", args)), idempotent=True,
                          created_at=CREATED_AT + 1, updated_at=CREATED_AT + 1)
    outcome = EffectRecord(intent.effect_id, key, "charge-card", EffectMode.EXACTLY_ONCE,
                           "run-1", 0, 0, False, "done", 1, args, intent.args_digest,
                           result={"charge": "ch_1"}, idempotent=True,
                           created_at=CREATED_AT + 1, updated_at=CREATED_AT + 2)
    return [intent, outcome]


def outbox_commit() -> tuple[bytes, bytes, bytes]:
    """LSN 3: ``(payload, outbox bytes, checkpoint hash)``."""
    delta = {"receipt": encode_value("receipt", {"charge": "ch_1"})}
    packed, flags, digest = encode_delta(delta)
    assert flags == 0
    outbox = encode_outbox([("send-email", "at_least_once",
                             encode_value("args", {"to": "ada@example.com"}), None, False)])
    created = CREATED_AT + 3
    meta_raw = encode_meta({"node": "pay"})
    h = checkpoint_hash(bytes(32), "run-1", 1, None, created, meta_raw, None, digest, outbox)
    payload = encode_commit(CommitRecord("run-1", 1, None, created, meta_raw, h, None, packed,
                                         outbox))
    return payload, outbox, h


def effects_image() -> bytes:
    """The golden effects segment."""
    out = bytearray(encode_header(HEADER))
    for lsn, e in enumerate(effect_entries(), start=1):
        out += encode_frame(SALT, lsn, lsn - 1, REC_EFFECT, 0, encode_entry(e))
    out += encode_frame(SALT, 3, 2, REC_COMMIT, 0, outbox_commit()[0])
    assert len(out) <= SEGMENT_SIZE
    return bytes(out) + bytes(SEGMENT_SIZE - len(out))


#: The three states of ``chat``'s ``messages`` in the appends segment.
APPEND_STATES = [
    [{"role": "user", "content": "Plan the trip."}, {"role": "assistant", "content": "Where?"}],
    [{"role": "user", "content": "Lisbon, in May."}],
    [{"role": "assistant", "content": "Booked."}, {"role": "user", "content": "Thanks!"}],
]


def append_commits() -> list[tuple[int, bytes, bytes]]:
    """The appends segment's records: ``(flags, payload, checkpoint hash)`` per LSN."""
    out = []
    parent_hash = bytes(32)
    stored = b""
    for cid, items in enumerate(APPEND_STATES, start=1):
        tail = encode_value("messages", items)
        if cid == 1:
            delta = {"messages": tail}
            appends = None
            stored = tail
        else:
            joined = append_encoded(stored, tail)
            assert joined is not None
            delta = {"messages": joined, "step": encode_value("step", cid)}
            appends = {"messages": (sum(len(s) for s in APPEND_STATES[:cid - 1]), len(stored),
                                    tail)}
            stored = joined
        packed, flags, digest = encode_delta(delta, appends=appends)
        created = CREATED_AT + cid
        meta_raw = encode_meta({"step": cid})
        parent = cid - 1 or None
        h = checkpoint_hash(parent_hash, "chat", cid, parent, created, meta_raw, None, digest)
        out.append((flags, encode_commit(CommitRecord("chat", cid, parent, created, meta_raw, h,
                                                      None, packed)), h))
        parent_hash = h
    assert [f for f, _p, _h in out] == [0, FLAG_APPENDS, FLAG_APPENDS]
    return out


def appends_image(version: int = APPENDS_VERSION) -> bytes:
    """The golden appends segment (``version`` 1: session 5's, ``appends-v1.bin``)."""
    out = bytearray(encode_header(SegmentHeader(STORE_ID, 0, 1, SALT, version)))
    for lsn, (flags, payload, _h) in enumerate(append_commits(), start=1):
        out += encode_frame(SALT, lsn, lsn - 1, REC_COMMIT, flags, payload)
    assert len(out) <= SEGMENT_SIZE
    return bytes(out) + bytes(SEGMENT_SIZE - len(out))


def control_image(version: int = PLAIN_VERSION) -> bytes:
    """What ``create_control`` writes for ``STORE_ID`` at ``CREATED_AT`` (and, for
    ``version`` 2, what ``raise_format`` then makes of it)."""
    with tempfile.TemporaryDirectory() as tmp, \
            mock.patch("agentwal.local.control.uuid.uuid4", return_value=STORE_ID), \
            mock.patch("agentwal.local.control.time.time", return_value=CREATED_AT):
        ctl = create_control(OsFileSystem(), tmp)
        if version != ctl.format:
            raise_format(OsFileSystem(), tmp, ctl, version)
        return (Path(tmp) / CONTROL_FILE).read_bytes()


def main() -> int:
    r2 = records()[1]
    assert raw_delta_size(r2) >= COMPRESS_THRESHOLD
    SEGMENT_FILE.write_bytes(segment_image())
    CONTROL_FILE_GOLDEN.write_bytes(control_image())
    EFFECTS_FILE.write_bytes(effects_image())
    APPENDS_FILE.write_bytes(appends_image())
    CONTROL2_FILE.write_bytes(control_image(APPENDS_VERSION))
    LEGACY_APPENDS_FILE.write_bytes(appends_image(PLAIN_VERSION))
    print(f"wrote {SEGMENT_FILE}, {CONTROL_FILE_GOLDEN}, {EFFECTS_FILE}, {APPENDS_FILE}, "
          f"{CONTROL2_FILE} and {LEGACY_APPENDS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
