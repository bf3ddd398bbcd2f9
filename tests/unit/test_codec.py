"""Codec limits: what is refused at encode time, and what decoding refuses from disk."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import cbor2
import pytest
import zstandard

import agentwal
from agentwal import codec
from agentwal.format import FLAG_ZSTD, MAX_CBOR_DEPTH


def nested(depth: int) -> Any:
    v: Any = []
    for _ in range(depth - 1):
        v = [v]
    return v


def test_value_at_the_depth_limit_round_trips() -> None:
    v = nested(codec.MAX_VALUE_DEPTH)
    assert codec.decode_value(codec.encode_value("k", v)) == v


def test_value_nested_too_deep_is_refused_at_put(store: agentwal.Store) -> None:
    # Regression: it used to be stored, and then could never be read back.
    with store.begin("r") as txn:
        with pytest.raises(agentwal.UnencodableValueError):
            txn["k"] = nested(MAX_CBOR_DEPTH + 2)
        with pytest.raises(agentwal.UnencodableValueError):
            txn.meta(deep=nested(codec.MAX_VALUE_DEPTH))
        txn["ok"] = 1
    assert store.state("r") == {"ok": 1}


def test_wide_shallow_values_are_not_refused() -> None:
    v = {f"k{i}": [{"a": [i]}] for i in range(5000)}
    assert codec.decode_value(codec.encode_value("k", v)) == v


def test_zstd_frame_declaring_too_much_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: zstandard ignores max_output_size when the frame declares a size.
    raw = cbor2.dumps({"k": b"x" * 5000})
    packed = zstandard.ZstdCompressor().compress(raw)
    monkeypatch.setattr(codec, "MAX_DECOMPRESSED", 1000)
    with pytest.raises(codec.CodecError):
        codec.decode_delta(packed, FLAG_ZSTD)


def test_decode_stored_turns_damage_into_corruption_error() -> None:
    with pytest.raises(agentwal.CorruptionError) as ei:
        codec.decode_stored(b"\x9f\x01", "/some/store", "value of 'r'/'k'")
    assert ei.value.path == "/some/store"


def test_compression_is_skipped_for_a_while_when_it_never_helps(store: agentwal.Store) -> None:
    import random

    rng = random.Random(1)
    pipe = store._engine._pipe
    assert pipe is not None
    from agentwal.local.commit import WAL_ZSTD_MIN

    with store.begin("r") as txn:
        txn["text"] = "abc" * 1000  # compressible, but under WAL_ZSTD_MIN: never tried
    assert pipe._zstd_misses == 0
    for _ in range(8):  # incompressible deltas: every attempt is wasted
        with store.begin("r") as txn:
            txn["noise"] = rng.randbytes(WAL_ZSTD_MIN)
    assert pipe._zstd_skip == 64
    with store.begin("r") as txn:
        txn["text"] = "abc" * WAL_ZSTD_MIN  # compressible, but inside the pause: stored plain
    assert pipe._zstd_skip == 63
    assert store.get("r", "text") == "abc" * WAL_ZSTD_MIN


# -- blob references ----------------------------------------------------------------------

SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


@pytest.mark.parametrize("ref", [
    agentwal.BlobRef(SHA, 0),
    agentwal.BlobRef(SHA, 4),
    agentwal.BlobRef(SHA, 1 << 40, "application/octet-stream"),
    agentwal.BlobRef(SHA, 2**64 - 1, "é" * 127),
])
def test_blob_ref_round_trips_through_its_tag(ref: agentwal.BlobRef) -> None:
    data = codec.encode_blob_ref(ref)
    assert data.startswith(bytes.fromhex("da6177626c"))  # tag 0x6177626c, "awbl"
    assert codec.is_blob_ref(data)
    assert codec.decode_value(data) == ref
    assert codec.decode_stored(data, "/s", "v") == ref
    tag = cbor2.loads(data)  # plain CBOR: a tag around [sha, size(, media type)]
    assert tag.tag == 0x6177626C and list(tag.value[:2]) == [bytes.fromhex(SHA), ref.size]


def test_blob_ref_byte_layout() -> None:
    data = codec.encode_blob_ref(agentwal.BlobRef(SHA, 5))
    assert data == bytes.fromhex("da6177626c" "82" "5820" + SHA + "05")


def test_the_longest_blob_ref_stays_inline_in_history() -> None:
    from agentwal import history

    data = codec.encode_blob_ref(agentwal.BlobRef(SHA, 2**64 - 1, "é" * 127))
    assert len(data) < 320 < history.LARGE  # so a sweep finds every reference inline


@pytest.mark.parametrize("value", [
    agentwal.BlobRef(SHA, 1),
    [agentwal.BlobRef(SHA, 1)],
    {"w": agentwal.BlobRef(SHA, 1)},
])
def test_a_blob_ref_is_refused_as_a_put_value(value: Any) -> None:
    with pytest.raises(agentwal.UnencodableValueError, match="put_blob"):
        codec.encode_value("k", value)


@pytest.mark.parametrize("data", [
    # the tag nested in a list
    bytes.fromhex("81" "da6177626c" "82" "5820" + SHA + "05"),
    # the tag around something else
    bytes.fromhex("da6177626c" "01"),
    bytes.fromhex("da6177626c" "82" "4101" "05"),  # a 1-byte hash
    bytes.fromhex("da6177626c" "82" "5820" + SHA + "20"),  # a negative size
    bytes.fromhex("da6177626c" "83" "5820" + SHA + "05" "01"),  # media type not text
    bytes.fromhex("da6177626c" "83" "5820" + SHA + "05" "60"),  # empty media type
    bytes.fromhex("da6177626c" "82" "5820" + SHA + "1805"),  # not canonical (5 in 2 bytes)
    bytes.fromhex("da6177626c" "82" "5820" + SHA + "05" "00"),  # trailing byte
    bytes.fromhex("da6177626c"),  # nothing after the tag
])
def test_malformed_or_misplaced_blob_refs_are_refused(data: bytes) -> None:
    with pytest.raises(codec.CodecError):
        codec.decode_value(data)
    with pytest.raises(agentwal.CorruptionError):
        codec.decode_stored(data, "/s", "v")


@pytest.mark.parametrize(("args", "match"), [
    (("ab", 1), "64 lowercase hex"),
    ((SHA.upper(), 1), "64 lowercase hex"),
    ((SHA, -1), "size"),
    ((SHA, True), "size"),
    ((SHA, 1, ""), "media_type"),
    ((SHA, 1, "x" * 256), "over 255"),
    ((SHA, 1, b"image/png"), "media_type"),
])
def test_blob_ref_checks_its_fields(args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        agentwal.BlobRef(*args)


def test_blob_ref_is_frozen_and_hashable() -> None:
    ref = agentwal.BlobRef(SHA, 1)
    with pytest.raises(AttributeError):
        ref.size = 2  # type: ignore[misc]
    assert {ref, agentwal.BlobRef(SHA, 1)} == {ref}
    assert ref != agentwal.BlobRef(SHA, 1, "text/plain")


# -- check_value's fast walk (codec._plain) ------------------------------------------------

def _full_check(value: Any) -> str | None:
    """What the full walk says of ``value`` (None: accepted), with the fast walk skipped."""
    real = codec._plain
    codec._plain = lambda obj, depth: False  # type: ignore[assignment]
    try:
        codec.check_value("k", value)
        return None
    except agentwal.UnencodableValueError as exc:
        return str(exc)
    finally:
        codec._plain = real


class _Str(str):
    pass


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, None, True, b"x", "s"], "b": {"c": {"d": []}}},
    [{"role": "user", "content": "hi"}] * 50,
    nested(codec.MAX_VALUE_DEPTH),
    nested(codec.MAX_VALUE_DEPTH + 1),
    {"t": (1, 2)}, {1: "int key"}, {_Str("k"): 1}, [{1, 2}], {"d": decimal.Decimal("-0")},
    {"when": datetime.datetime(2024, 1, 1)}, [object()], {"ref": agentwal.BlobRef("0" * 64, 1)},
])
def test_the_fast_walk_accepts_and_refuses_what_the_full_walk_does(value: Any) -> None:
    full = _full_check(value)
    try:
        codec.check_value("k", value)
        fast = None
    except agentwal.UnencodableValueError as exc:
        fast = str(exc)
    assert fast == full
    if codec._plain(value, 1):
        assert full is None  # it only ever accepts what the full walk accepts
