"""Lists read again without decoding: what a caller gets is its own, and always what is stored.

A transaction that reads a stored list of 2 KiB or more gets a structural copy
of a decoded list the process keeps (``handout.Lists``); a commit whose re-put
only grew keeps the old list plus the decoded tail for the next read. None of
that may ever change what a read returns: these tests mutate what reads
returned and what puts were given (at every level), after and before the
commit, across transactions, folds, rollbacks, conflicts and other writers,
and compare every read with a model.
"""

from __future__ import annotations

import copy
import datetime
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentwal
from agentwal import codec
from agentwal.handout import Lists, fresh, levels_of, shape_of

PAD = "p" * 400  # a few messages pass the 2 KiB a list needs to be kept


def msg(i: int, nested: bool = False) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "user" if i % 2 else "assistant", "content": f"{i} {PAD}",
                         "n": i}
    if nested:
        m["tool_calls"] = [{"name": "search", "args": {"q": f"q{i}", "k": [i, i + 1]}}]
    return m


def _open(path: str) -> agentwal.Store:
    return agentwal.open(path, durability="none", wal_max_bytes=64 << 20)


@pytest.fixture
def path(tmp_path: Any) -> str:
    return os.path.join(str(tmp_path), "s.awal")


def step(store: agentwal.Store, i: int, nested: bool = False) -> list[Any]:
    """One agent step: get the list, append a message, re-put it; returns the caller's list."""
    with store.begin("chat") as txn:
        messages = txn.get("messages", [])
        messages.append(msg(i, nested))
        txn["messages"] = messages
    return messages  # type: ignore[no-any-return]


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_mutating_what_was_got_or_put_changes_nothing(path: str, nested: bool) -> None:
    store = _open(path)
    want: list[Any] = []
    kept: list[list[Any]] = []
    for i in range(12):
        kept.append(step(store, i, nested))
        want.append(msg(i, nested))
        # Every list a step held is mutated after its commit, at every level.
        for old in kept:
            old[0]["content"] = "mutated"
            last = next(m for m in reversed(old) if type(m) is dict)
            last["n"] = -1
            old.append("extra")
            if nested:
                for call in old[0]["tool_calls"]:
                    call["args"]["k"].append(99)
                last["tool_calls"].clear()
        assert store.get("chat", "messages") == want
        with store.begin("chat") as txn:
            got = txn.get("messages")
            assert got == want
            got[0]["role"] = "changed"  # the copy is the caller's own
            assert txn.get("messages") == want
            txn.rollback()
    store.close()
    with _open(path) as store:
        assert store.get("chat", "messages") == want
        assert store.verify().ok


def test_two_readers_never_share_an_object(path: str) -> None:
    store = _open(path)
    for i in range(8):
        step(store, i, nested=True)
    a, b = store.begin("chat"), store.begin("chat")
    la, lb = a.get("messages"), b.get("messages")
    assert la == lb
    la[3]["tool_calls"][0]["args"]["q"] = "a's"
    la[4]["content"] = "a's"
    assert lb == [msg(i, True) for i in range(8)]
    # b re-puts its list grown: an append of b's message, whatever a did to its copy.
    lb.append(msg(8, True))
    b["messages"] = lb
    a.rollback()
    b.commit()
    assert store.get("chat", "messages") == [msg(i, True) for i in range(9)]
    store.close()


def test_a_rolled_back_or_conflicting_growth_is_never_read(path: str) -> None:
    store = _open(path)
    for i in range(6):
        step(store, i)
    with store.begin("chat") as txn:
        grown = txn.get("messages")
        grown.append(msg(100))
        txn["messages"] = grown
        txn.rollback()
    first, second = store.begin("chat"), store.begin("chat")
    for t, i in ((first, 200), (second, 300)):
        mine = t.get("messages")
        mine.append(msg(i))
        t["messages"] = mine
    first.commit()
    with pytest.raises(agentwal.ConflictError):
        second.commit()
    assert store.get("chat", "messages") == [*(msg(i) for i in range(6)), msg(200)]
    with store.begin("chat") as txn:
        assert txn.get("messages") == [*(msg(i) for i in range(6)), msg(200)]
    store.close()


def test_other_writes_of_the_key_are_read_not_the_kept_list(path: str) -> None:
    store = _open(path)
    for i in range(6):
        step(store, i)
    with store.begin("chat") as txn:
        txn.append("messages", msg(6))  # an explicit append
    assert step(store, 7)[-2:] == [msg(6), msg(7)]
    with store.begin("chat") as txn:
        txn["messages"] = [msg(50), msg(51), msg(52), msg(53), msg(54)]  # a new list
    with store.begin("chat") as txn:
        assert txn.get("messages") == [msg(50 + i) for i in range(5)]
        txn["messages"] = {"now": "a dict"}
    with store.begin("chat") as txn:
        assert txn.get("messages") == {"now": "a dict"}
        txn.delete("messages")
    assert step(store, 0) == [msg(0)]
    store.close()


def test_reads_after_a_fold_and_a_reopen_are_equal_bytes_not_the_same_object(path: str) -> None:
    store = _open(path)
    for i in range(6):
        step(store, i)
    store.snapshot()  # LMDB holds the list now: each read is new bytes, equal to the kept
    for i in range(6, 10):
        step(store, i)
    store.snapshot()
    with store.begin("chat") as txn:
        got = txn.get("messages")
        got[0]["content"] = "x"
        txn.rollback()
    assert store.get("chat", "messages") == [msg(i) for i in range(10)]
    store.close()
    with _open(path) as store:
        assert step(store, 10) == [msg(i) for i in range(11)]
        assert store.state("chat", at=5)["messages"] == [msg(i) for i in range(5)]
        assert store.verify().ok


@pytest.mark.parametrize("swap", ["int to bool", "int to float", "str to equal str",
                                  "zero to minus zero", "key order"])
def test_an_equal_but_different_prefix_is_stored_as_given(path: str, swap: str) -> None:
    store = _open(path)
    with store.begin("chat") as txn:
        txn["messages"] = [dict(msg(i), flag=1, x=0.0) for i in range(6)]
    with store.begin("chat") as txn:
        messages = txn["messages"]
        if swap == "int to bool":
            messages[2]["flag"] = True
        elif swap == "int to float":
            messages[2]["flag"] = 1.0
        elif swap == "str to equal str":
            messages[2]["role"] = "".join(list(messages[2]["role"]))
        elif swap == "zero to minus zero":
            messages[2]["x"] = -0.0
        else:
            messages[2] = dict(reversed(list(messages[2].items())))
        messages.append(msg(6))
        want = copy.deepcopy(messages)
        txn["messages"] = messages
    got = store.get("chat", "messages")
    assert got == want
    assert codec.encode_value("m", got) == codec.encode_value("m", want)  # types, order too
    store.close()


def test_values_outside_plain_types_are_decoded_every_time(path: str) -> None:
    store = _open(path)
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    for i in range(6):
        step(store, i)
    with store.begin("chat") as txn:
        messages = txn.get("messages")
        messages.append({"at": when, "tags": {"a", "b"}})  # a set is mutable: never kept
        txn["messages"] = messages
    for _ in range(2):
        with store.begin("chat") as txn:
            got = txn.get("messages")
            assert got[-1] == {"at": when, "tags": {"a", "b"}}
            got[-1]["tags"].add("c")
            txn.rollback()
    assert step(store, 7)[-2]["tags"] == {"a", "b"}
    store.close()


def test_the_cache_is_bounded_and_serves_only_its_stored_value() -> None:
    lists = Lists(limit=2, max_bytes=10_000)
    raw = [codec.encode_value("k", [msg(i)]) for i in range(4)]
    for i in range(3):
        lists.keep("r", f"k{i}", raw[i], codec.loads(raw[i]))
    assert lists.handout("r", "k0", raw[0]) is None  # dropped: two entries at most
    assert lists.handout("r", "k2", raw[2]) is not None
    assert lists.handout("r", "k2", bytes(raw[2])) is not None  # equal bytes serve
    assert lists.handout("r", "k2", raw[3]) is None  # other bytes never do
    big = codec.encode_value("k", [PAD * 30])
    lists.keep("r", "big", big, codec.loads(big))  # over max_bytes: not kept
    assert lists.handout("r", "big", big) is None


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False),
                     st.text(max_size=5), st.binary(max_size=5))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(_values, min_size=1, max_size=8))
def test_fresh_copies_every_container_and_levels_see_every_change(items: list[Any]) -> None:
    stored = codec.encode_value("k", items)
    value = codec.loads(stored)
    levels = levels_of(value)
    assert levels is not None
    copied = fresh(value, shape_of(levels))
    assert copied == value
    stack: list[tuple[Any, Any]] = [(copied, value)]
    while stack:  # no container is shared, every scalar is
        a, b = stack.pop()
        if type(b) in (list, dict):
            assert a is not b
            pairs = zip(a, b, strict=True) if type(b) is list else (
                (a[k], b[k]) for k in b)
            stack.extend(pairs)
        else:
            assert a is b
    lists = Lists()
    handout = lists.keep("r", "k", stored, value)
    assert handout is not None
    mine = handout.value()
    assert handout.grown_from([*mine, "new"])
    # Any change at any level is seen: one scalar replaced (by an equal one of another type
    # where there is one).
    target = _first_scalar_holder(mine)
    if target is not None:
        holder, where = target
        holder[where] = _other(holder[where])
        assert not handout.grown_from(mine)


def _first_scalar_holder(value: Any) -> tuple[Any, Any] | None:
    stack = [value]
    while stack:
        box = stack.pop()
        for where in (range(len(box)) if type(box) is list else list(box)):
            item = box[where]
            if type(item) in (list, dict):
                stack.append(item)
            else:
                return box, where
    return None


def _other(x: Any) -> Any:
    if type(x) is bool:
        return int(x)
    if type(x) is int:
        return float(x)
    if type(x) is float:
        return str(x)
    if x is None:
        return False
    return x + ("!" if type(x) is str else b"!")


def test_the_next_step_reads_the_list_without_decoding_it(path: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from agentwal import txn as txn_module

    decoded: list[str] = []

    class Counting(codec.DecodedValues):
        def decode(self, run: str, key: str, data: bytes, path: str, label: str = "") -> Any:
            decoded.append(key)
            return super().decode(run, key, data, path, label)

    store = _open(path)
    for i in range(6):
        step(store, i)
    monkeypatch.setattr(txn_module, "_DECODED", Counting())
    for i in range(6, 10):
        assert step(store, i) == [msg(j) for j in range(i + 1)]
    assert decoded == []  # each step's read is a copy of what the last commit kept
    store.close()
