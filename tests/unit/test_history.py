"""history.py, the pure history encoding: refs, list chains, counts, deltas and manifests.

The storage is a dict (:class:`DictObjects`), so every test here runs the
same logic the snapshot runs over LMDB, without LMDB.
"""

from __future__ import annotations

import random
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentwal import history
from agentwal.codec import CodecError, encode_value
from agentwal.history import LARGE, LIST, MANIFEST_EVERY, MAX_CHAIN, VALUE, Ref


class DictObjects:
    """``history.Objects`` over dicts, with the same address allocation as the snapshot."""

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.counts: dict[int, int] = {}
        self.ids: dict[bytes, int] = {}
        self.next = 1

    def find(self, oid: bytes) -> int | None:
        return self.ids.get(oid)

    def get(self, addr: int) -> bytes | None:
        return self.records.get(addr)

    def add(self, oid: bytes | None, record: bytes) -> int:
        assert oid is None or (oid not in self.ids and oid == history.object_id(record))
        assert (oid is not None) == history.indexed(record)  # only kind-0 leaves are found
        addr, self.next = self.next, self.next + 1
        self.records[addr], self.counts[addr] = record, 0
        if oid is not None:
            self.ids[oid] = addr
        return addr

    def delete(self, addr: int, oid: bytes) -> None:
        del self.records[addr], self.counts[addr]
        if self.ids.get(oid) == addr:
            del self.ids[oid]

    def count(self, addr: int) -> int:
        return self.counts.get(addr, 0)

    def set_count(self, addr: int, n: int) -> None:
        assert addr in self.records
        self.counts[addr] = n

    def stored_bytes(self) -> int:
        return sum(len(r) for r in self.records.values())


def msg(i: int, size: int = 1000) -> dict[str, Any]:
    return {"role": "user", "i": i, "content": random.Random(i).randbytes(size).hex()[:size]}


def enc(value: Any) -> bytes:
    return encode_value("k", value)


# -- single values -------------------------------------------------------------------

def test_small_values_are_inline_and_cost_no_object() -> None:
    objs = DictObjects()
    value = enc({"a": 1})
    assert history.store_value(objs, value, None) == value
    assert objs.records == {}


def test_a_large_value_is_stored_once_and_counted_per_reference() -> None:
    objs = DictObjects()
    value = enc(b"x" * 5000)
    r1 = history.store_value(objs, value, None)
    r2 = history.store_value(objs, value, None)
    assert r1 == r2 and isinstance(r1, tuple) and r1[0] == VALUE
    assert len(objs.records) == 1 and objs.counts[r1[1]] == 2
    assert history.resolve(objs, r1) == value
    history.release(objs, r1)
    assert objs.counts[r1[1]] == 1
    history.release(objs, r2)
    assert objs.records == {} and objs.counts == {} and objs.ids == {}


def test_releasing_an_object_twice_too_many_is_an_error() -> None:
    objs = DictObjects()
    ref = history.store_value(objs, enc(b"y" * 3000), None)
    history.release(objs, ref)
    with pytest.raises(CodecError):
        history.release(objs, ref)


# -- lists ---------------------------------------------------------------------------

def test_an_appended_list_shares_its_elements() -> None:
    objs = DictObjects()
    messages: list[Any] = []
    prev: Ref | None = None
    for i in range(100):
        messages.append(msg(i))
        before = objs.stored_bytes()
        prev = history.store_value(objs, enc(messages), prev)
        assert isinstance(prev, tuple) and prev[0] == LIST
        assert history.resolve(objs, prev) == enc(messages)
        grew = objs.stored_bytes() - before
        # one message (~1 KiB) plus a node; a re-base lists every leaf (~9 bytes each)
        assert grew < 1300 + 12 * len(messages), (i, grew)
    whole = len(enc(messages))
    assert objs.stored_bytes() < 1.3 * whole  # versions share: not 100 copies


def test_a_list_chain_is_re_based_at_max_chain() -> None:
    objs = DictObjects()
    items: list[Any] = []
    prev: Ref | None = None
    depths = []
    for i in range(3 * MAX_CHAIN):
        items.append(msg(i, 300))
        prev = history.store_value(objs, enc(items), prev)
        if isinstance(prev, tuple):  # the first few lists are short: inline
            depths.append(cbor2.loads(objs.records[prev[1]][1:])[3])
    assert max(depths) == MAX_CHAIN - 1
    assert depths.count(0) >= 3  # re-based (the first list is a root too)


def test_small_appended_items_are_merged_into_leaves_on_re_base() -> None:
    objs = DictObjects()
    items: list[Any] = list(range(300))  # > LARGE bytes of small ints
    prev = history.store_value(objs, enc(items), None)
    for i in range(2 * MAX_CHAIN):
        items.append(f"item {i}")
        prev = history.store_value(objs, enc(items), prev)
        assert history.resolve(objs, prev) == enc(items)
    assert isinstance(prev, tuple)
    node = cbor2.loads(objs.records[prev[1]][1:])
    inline = [s for s in node[5] if isinstance(s, bytes)]
    assert sum(len(s) for s in inline) < history.SEGMENT_LEAF * 2


def test_the_same_list_again_is_the_same_ref() -> None:
    objs = DictObjects()
    value = enc([msg(1), msg(2)])
    r1 = history.store_value(objs, value, None)
    r2 = history.store_value(objs, value, r1)
    assert r1 == r2
    assert isinstance(r1, tuple) and objs.counts[r1[1]] == 2


def test_a_list_that_is_not_an_append_is_a_new_root() -> None:
    objs = DictObjects()
    r1 = history.store_value(objs, enc([msg(1), msg(2)]), None)
    r2 = history.store_value(objs, enc([msg(2), msg(1)]), r1)
    assert isinstance(r2, tuple)
    assert cbor2.loads(objs.records[r2[1]][1:])[4] is None  # no prev
    assert history.resolve(objs, r2) == enc([msg(2), msg(1)])


def test_a_shorter_list_is_a_new_root_too() -> None:
    objs = DictObjects()
    r1 = history.store_value(objs, enc([msg(1), msg(2), msg(3)]), None)
    r2 = history.store_value(objs, enc([msg(1), msg(2)]), r1)
    assert history.resolve(objs, r2) == enc([msg(1), msg(2)])


def test_releasing_every_version_of_a_chain_frees_everything() -> None:
    objs = DictObjects()
    items: list[Any] = []
    refs: list[Ref] = []
    prev: Ref | None = None
    for i in range(2 * MAX_CHAIN + 5):
        items.append(msg(i, 400))
        prev = history.store_value(objs, enc(items), prev)
        refs.append(prev)
    random.Random(1).shuffle(refs)
    for r in refs[:-1]:
        history.release(objs, r)
    assert history.resolve(objs, refs[-1])  # what is left still reads
    history.release(objs, refs[-1])
    assert objs.records == {} and objs.ids == {}


def test_a_missing_object_is_a_codec_error() -> None:
    objs = DictObjects()
    ref = history.store_value(objs, enc([msg(1), msg(2)]), None)
    assert isinstance(ref, tuple)
    leaf = next(a for a, r in objs.records.items() if r[0] in (0, 2))
    saved = objs.records.pop(leaf)
    with pytest.raises(CodecError):
        history.resolve(objs, ref)
    objs.records[leaf] = saved
    del objs.records[ref[1]]  # the node an append would extend
    with pytest.raises(CodecError):
        history.store_value(objs, enc([msg(1), msg(2), msg(3)]), ref)


def test_array_headers_of_every_size_rebuild() -> None:
    objs = DictObjects()
    for n in (0, 23, 24, 255, 256, 70000):
        value = enc([b"x" * max(1, LARGE // max(n, 1))] * n if n else [b"y" * LARGE])
        ref = history.store_value(objs, value, None)
        assert history.resolve(objs, ref) == value


# -- head entries --------------------------------------------------------------------

def test_head_entries_keep_small_values_and_name_objects_by_ref() -> None:
    objs = DictObjects()
    small, blob, lst = enc(1), enc(b"z" * 3000), enc([msg(1), msg(2)])
    for value in (small, blob, lst):
        ref = history.store_value(objs, value, None)
        entry = history.head_entry(value, ref)
        assert history.head_value(objs, entry) == value
        assert (entry[0] == history.HEAD_REF) == isinstance(ref, tuple)  # objects by ref


# -- deltas and manifests ------------------------------------------------------------

def test_refs_round_trip_and_malformed_records_are_refused() -> None:
    refs: dict[str, Ref | None] = {"a": b"\x01", "b": (VALUE, 7), "c": (LIST, 9), "d": None}
    assert history.decode_refs(history.encode_refs(refs), manifest=False) == refs
    with pytest.raises(CodecError):
        history.decode_refs(history.encode_refs(refs), manifest=True)  # None in a manifest
    for bad in ([1], {"a": [3, 1]}, {"a": [1, -1]}, {"a": [1, b"x"]}, {1: b"x"}, {"a": 5}):
        with pytest.raises(CodecError):
            history.decode_refs(cbor2.dumps(bad), manifest=False)


def test_manifest_base_bounds_the_deltas_replayed() -> None:
    assert history.manifest_base(0) == 0
    assert history.manifest_base(MANIFEST_EVERY - 1) == 0
    assert history.manifest_base(MANIFEST_EVERY) == MANIFEST_EVERY
    for cid in range(1, 5 * MANIFEST_EVERY):
        assert 0 <= cid - history.manifest_base(cid) < MANIFEST_EVERY
        assert history.is_manifest(cid) == (history.manifest_base(cid) == cid)


# -- the property: any sequence of deltas replays to the model -----------------------

KEYS = ("messages", "blob", "a", "b")
small = st.one_of(st.integers(), st.text(max_size=20), st.binary(max_size=30))
big = st.builds(lambda seed, n: random.Random(seed).randbytes(n), st.integers(0, 2**16),
                st.sampled_from([1024, 3000]))
# what a step does to a key: set a small or large value, delete it, append
# items to its list (or start one), or replace the list's front
ops = st.one_of(
    st.tuples(st.just("set"), st.one_of(small, big)),
    st.tuples(st.just("del"), st.none()),
    st.tuples(st.just("append"), st.lists(st.one_of(small, big), min_size=0, max_size=3)),
    st.tuples(st.just("edit"), small),
)
steps = st.lists(st.dictionaries(st.sampled_from(KEYS), ops, max_size=3), min_size=1,
                 max_size=3 * MANIFEST_EVERY + 5)


class MiniStore:
    """The fold's bookkeeping (deltas, manifests, the running ref map) over DictObjects."""

    def __init__(self) -> None:
        self.objs = DictObjects()
        self.deltas: dict[int, bytes] = {}
        self.manifests: dict[int, bytes] = {}
        self.refs: dict[str, Ref] = {}

    def commit(self, cid: int, delta: dict[str, bytes | None]) -> None:
        dref: dict[str, Ref | None] = {}
        for k, v in delta.items():
            dref[k] = None if v is None else history.store_value(self.objs, v, self.refs.get(k))
        self.deltas[cid] = history.encode_refs(dref)
        history.apply_delta(self.refs, dref)
        if history.is_manifest(cid):
            for r in self.refs.values():
                history.retain(self.objs, r)
            self.manifests[cid] = history.encode_refs(self.refs)

    def state_at(self, cid: int) -> dict[str, bytes]:
        base = history.manifest_base(cid)
        refs: dict[str, Ref] = {}
        if base:
            got = history.decode_refs(self.manifests[base], manifest=True)
            refs = {k: v for k, v in got.items() if v is not None}
        assert cid - base < MANIFEST_EVERY
        for i in range(base + 1, cid + 1):
            history.apply_delta(refs, history.decode_refs(self.deltas[i], manifest=False))
        return {k: history.resolve(self.objs, r) for k, r in refs.items()}

    def drop_all(self) -> None:
        for raw in [*self.deltas.values(), *self.manifests.values()]:
            for r in history.decode_refs(raw, manifest=False).values():
                history.release(self.objs, r)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_any_sequence_of_deltas_replays_to_the_model(program: list[dict[str, Any]]) -> None:
    mini = MiniStore()
    model: dict[str, Any] = {}
    expected: list[dict[str, bytes]] = []
    for step in program:
        delta: dict[str, bytes | None] = {}
        for key, (op, arg) in step.items():
            if op == "set":
                model[key] = arg
            elif op == "del":
                model.pop(key, None)
            elif op == "append":
                old = model.get(key)
                model[key] = ([*old] if isinstance(old, list) else []) + arg
            else:
                old = model.get(key)
                model[key] = [arg, *(old[1:] if isinstance(old, list) else [])]
            delta[key] = enc(model[key]) if key in model else None
        mini.commit(len(expected) + 1, delta)
        expected.append({k: enc(v) for k, v in model.items()})
    for cid, want in enumerate(expected, 1):
        assert mini.state_at(cid) == want, cid
    mini.drop_all()  # every count returns to zero: nothing leaks, nothing is freed early
    assert mini.objs.records == {} and mini.objs.ids == {}


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=90))
def test_a_growing_list_costs_its_tail_not_its_size(sizes: list[int]) -> None:
    """Appending ``n`` items of ~100 bytes stores about their bytes, at any step count."""
    mini = MiniStore()
    items: list[Any] = []
    appended = 0
    for cid, n in enumerate(sizes, 1):
        new = [random.Random(cid * 100 + j).randbytes(90) for j in range(n)]
        items.extend(new)
        appended += sum(len(enc(x)) for x in new)
        mini.commit(cid, {"messages": enc(items)})
    assert mini.state_at(len(sizes))["messages"] == enc(items)
    # each item at most twice (once inline, once merged into a leaf by a re-base),
    # plus nodes and re-base listings
    assert mini.objs.stored_bytes() <= 2 * appended + 200 * len(sizes) + 4096


_STATES = st.dictionaries(st.sampled_from("abcdef"), st.binary(max_size=3), max_size=6)


@given(_STATES, _STATES)
@settings(max_examples=200, deadline=None)
def test_rollback_delta_turns_one_state_into_the_other(current: dict[str, bytes],
                                                       target: dict[str, bytes]) -> None:
    delta = history.rollback_delta(current, target)
    after = {**current, **delta}
    assert {k: v for k, v in after.items() if v is not None} == target
    assert all(current.get(k) != v for k, v in delta.items())  # only what changes


def test_layout_4_finds_only_large_values_by_content() -> None:
    """A large value is found by content (stored once for every key); list nodes and
    segments are not (a list's versions share them through ``prev``); a mid-size map is a
    plain leaf, one per version, while short values and short arrays stay inline."""
    objs = DictObjects()
    big = cbor2.dumps({"blob": "x" * 2000})
    a, b = history.store_value(objs, big, None), history.store_value(objs, big, None)
    assert a == b and isinstance(a, tuple) and objs.counts[a[1]] == 2
    mid = cbor2.dumps({"note": "y" * 300})
    m1, m2 = history.store_value(objs, mid, None), history.store_value(objs, mid, None)
    assert isinstance(m1, tuple) and isinstance(m2, tuple) and m1[0] == history.VALUE
    assert m1 != m2 and objs.records[m1[1]][:1] == b"\x02"
    assert history.resolve(objs, m1) == mid
    assert history.store_value(objs, cbor2.dumps({"s": "z" * 100}), None) == cbor2.dumps(
        {"s": "z" * 100})
    assert history.store_value(objs, enc(["w" * 200, "v" * 200]), None) == enc(
        ["w" * 200, "v" * 200])
    first = history.store_value(objs, enc([msg(1), msg(2)]), None)
    second = history.store_value(objs, enc([msg(1), msg(2), msg(3)]), first)
    assert history.resolve(objs, second) == enc([msg(1), msg(2), msg(3)])
    assert set(objs.ids.values()) == {a[1]}  # only the large value is indexed
    for ref in (a, b, m1, m2, first, second):
        history.release(objs, ref)
    assert not objs.records and not objs.ids
