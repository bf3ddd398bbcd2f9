"""``txn.append(key, *items)``: a list grown without decoding or encoding what it holds.

The bytes it makes are exactly the encoding of the joined list, so everything
downstream (the log, history's list nodes, replay, verify) sees an ordinary
put; these tests compare it with ``put(key, old + items)`` and with what
reads return, folded or not, and check that bad input changes nothing.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentwal
from agentwal import codec


def test_append_grows_a_list_and_starts_one(store: agentwal.Store) -> None:
    with store.begin("chat") as txn:
        assert txn.append("messages", {"role": "user", "content": "hi"}) == 1
        assert txn.append("messages") == 1  # nothing to add: still a list
        assert txn.get("messages") == [{"role": "user", "content": "hi"}]
    for step in range(60):  # long enough for history to hold it as list nodes
        with store.begin("chat") as txn:  # the length returned is the list's after it
            assert txn.append("messages", {"role": "assistant", "step": step}, step) == \
                3 + 2 * step
        if step % 20 == 0:
            store.snapshot()
    expected: list[Any] = [{"role": "user", "content": "hi"}]
    for step in range(60):
        expected += [{"role": "assistant", "step": step}, step]
    assert store.get("chat", "messages") == expected
    store.snapshot()
    assert store.get("chat", "messages") == expected
    assert store.state("chat", at=2)["messages"] == expected[:3]
    assert store.verify().ok


def test_append_conflicts_like_a_read_then_a_put(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.put("log", [1])
    a, b = store.begin("r"), store.begin("r")
    a.append("log", 2)
    b.append("log", 3)
    a.commit()
    with pytest.raises(agentwal.ConflictError):
        b.commit()
    assert store.get("r", "log") == [1, 2]


def test_bad_input_changes_nothing(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.put("n", 5)
        txn.put("log", ["a"])
        txn.put_blob("blob", __import__("io").BytesIO(b"data"))
    with store.begin("r") as txn:
        with pytest.raises(agentwal.NotAListError) as ei:
            txn.append("n", 1)
        assert (ei.value.code, ei.value.kind) == ("not_a_list", "int")
        assert isinstance(ei.value, TypeError)
        with pytest.raises(agentwal.NotAListError, match="BlobRef"):
            txn.append("blob", 1)
        with pytest.raises(agentwal.UnencodableValueError):
            txn.append("log", "b", object())
        with pytest.raises(agentwal.InvalidKeyError):
            txn.append("", 1)
        assert txn.get("log") == ["a"] and txn.get("n") == 5
        txn.rollback()
    txn = store.begin("r")
    txn.rollback()
    with pytest.raises(agentwal.TransactionClosedError):
        txn.append("log", 1)


def test_a_savepoint_undoes_an_append(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.append("log", 1)
        sp = txn.savepoint()
        txn.append("log", 2)
        txn.rollback_to(sp)
        txn.append("log", 3)
    assert store.get("r", "log") == [1, 3]


_items = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**64, 2**64), st.text(max_size=8),
              st.binary(max_size=8), st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(_items, max_size=30), st.lists(_items, max_size=300))
def test_the_joined_bytes_are_the_encoding_of_the_joined_list(old: list[Any],
                                                             new: list[Any]) -> None:
    joined = codec.append_encoded(codec.encode_value("k", old), codec.encode_value("k", new))
    assert joined == codec.encode_value("k", old + new)


def test_only_definite_arrays_are_joined() -> None:
    tail = codec.encode_value("k", [1])
    for stored in (b"", codec.encode_value("k", {"a": 1}), b"\x9f\x01\xff", b"\x98"):
        assert codec.append_encoded(stored, tail) is None


def test_a_list_grown_by_appends_is_folded_before_its_versions_fill_memory(path: str) -> None:
    """The log holds only appended items, the memtable every version whole: a fold starts
    once the memtable holds 4 x wal_max_bytes, long before the log reaches its limit."""
    with agentwal.open(path, durability="none", wal_max_bytes=64 << 10) as store:
        for _ in range(40):  # ~40 KiB of log, ~800 KiB of versions
            with store.begin("chat") as txn:
                txn.append("messages", os.urandom(512).hex())
        deadline = time.monotonic() + 30
        while store.stats()["folds"] == 0:  # the fold thread takes it
            assert time.monotonic() < deadline, "no fold"
            time.sleep(0.02)
        assert len(store.get("chat", "messages")) == 40
