"""Codec limits: what is refused at encode time, and what decoding refuses from disk."""

from __future__ import annotations

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
    pipe = store._pipe
    assert pipe is not None
    for _ in range(8):  # incompressible deltas: every attempt is wasted
        with store.begin("r") as txn:
            txn["noise"] = rng.randbytes(2000)
    assert pipe._zstd_skip == 64
    with store.begin("r") as txn:
        txn["text"] = "abc" * 1000  # compressible, but inside the pause: stored plain
    assert pipe._zstd_skip == 63
    assert store.get("r", "text") == "abc" * 1000
