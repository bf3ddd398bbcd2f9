"""The hot read path: ``store.get`` without a view, the run-number cache, decoded values.

``store.get`` of the latest value reads the memtables and LMDB under the
store's lock without building a view, caches the run's number per LMDB
commit, and serves small values it decoded lately without decoding again.
None of that may ever change what a read returns: these tests change the
store under each cache (fold, delete and re-create, compaction, vacuum,
damage) and mutate what reads returned.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentwal
from agentwal import codec
from agentwal.codec import DecodedValues
from agentwal.types import check_key


def put(store: agentwal.Store, run: str, **values: Any) -> None:
    with store.begin(run) as txn:
        for k, v in values.items():
            txn.put(k, v)


@pytest.mark.parametrize("folded", [False, True])
def test_a_mutated_result_changes_nothing_stored_or_read_later(store: agentwal.Store,
                                                                folded: bool) -> None:
    put(store, "r", d={"a": 1, "b": "x"}, lst=[1, 2, 3], s="text", nested={"a": [1]})
    if folded:
        store.snapshot()
    for _ in range(3):  # the second and third reads come from the decoded values
        d, lst, nested = store.get("r", "d"), store.get("r", "lst"), store.get("r", "nested")
        assert d == {"a": 1, "b": "x"} and lst == [1, 2, 3] and nested == {"a": [1]}
        d["a"] = 99
        lst.append(4)
        nested["a"].append(2)
    with store.begin("r") as txn:
        for _ in range(2):
            got = txn.get("d")
            assert got == {"a": 1, "b": "x"}
            got.clear()
    assert store.get("r", "d") is not store.get("r", "d")
    assert store.state("r") == {"d": {"a": 1, "b": "x"}, "lst": [1, 2, 3], "s": "text",
                                "nested": {"a": [1]}}


def test_get_follows_every_commit_fold_and_deletion(store: agentwal.Store) -> None:
    put(store, "r", k=1)
    assert store.get("r", "k") == 1
    put(store, "r", k=2)
    assert store.get("r", "k") == 2  # memtable over the cached value
    store.snapshot()
    assert store.get("r", "k") == 2
    put(store, "r", k=3)
    store.snapshot()
    assert store.get("r", "k") == 3  # a new LMDB commit: the run number is read again
    store.delete_run("r")
    assert store.get("r", "k") is None  # the deletion in the memtable masks LMDB
    store.snapshot()
    assert store.get("r", "k", "gone") == "gone"
    put(store, "r", other=1)
    store.snapshot()  # the run id again, under a new run number
    assert store.get("r", "k") is None and store.get("r", "other") == 1
    put(store, "r", k=4)
    store.snapshot()
    assert store.get("r", "k") == 4


def test_get_after_compaction_and_vacuum(path: str) -> None:
    with agentwal.open(path, durability="none") as store:
        for i in range(30):
            put(store, f"run-{i % 3}", step=i, note="x" * 100)
        store.snapshot()
        assert store.get("run-1", "step") == 28
        store.compact(keep_last=2)
        assert store.get("run-1", "step") == 28
        store.compact(vacuum=True)  # a new environment: the cached run numbers are stale
        assert [store.get(f"run-{i}", "step") for i in range(3)] == [27, 28, 29]
        put(store, "run-1", step=100)
        store.snapshot()
        assert store.get("run-1", "step") == 100
    with agentwal.open(path, readonly=True) as ro:
        assert ro.get("run-1", "step") == 100


def test_a_damaged_folded_value_is_reported_by_the_hot_read(path: str) -> None:
    marker = b"find-me-in-the-lmdb-file-" * 4
    with agentwal.open(path, durability="none") as store:
        put(store, "r", k=marker, j=1)
        store.snapshot()
    data = os.path.join(path, "snapshot", "data.mdb")
    with open(data, "r+b") as f:  # every copy (the state entry, history's)
        blob = f.read()
        at = blob.find(marker)
        assert at >= 0
        while at >= 0:
            f.seek(at + 3)
            f.write(b"\x00")
            at = blob.find(marker, at + 1)
    with agentwal.open(path, durability="none") as store:
        assert store.get("r", "j") == 1
        with pytest.raises(agentwal.CorruptionError, match="checksum"):
            store.get("r", "k")


def test_a_list_held_by_reference_reads_whole_from_lmdb(path: str) -> None:
    """The rebuilt list is kept per LMDB commit: each fold, compaction and vacuum
    makes a state whose reads rebuild it again."""
    messages: list[dict[str, Any]] = []

    def grow(store: agentwal.Store, steps: int) -> None:
        for _ in range(steps):  # long enough that history keeps the list as list nodes
            messages.append({"step": len(messages), "text": "m" * 50})
            put(store, "chat", messages=messages)

    with agentwal.open(path, durability="none") as store:
        for _ in range(3):
            grow(store, 40)
            store.snapshot()
            for _ in range(2):
                assert store.get("chat", "messages") == messages
                assert store.state("chat")["messages"] == messages
                with store.begin("chat") as txn:
                    assert txn.get("messages") == messages
        store.compact(keep_last=5)
        assert store.state("chat")["messages"] == messages
        store.compact(vacuum=True)
        assert store.state("chat")["messages"] == messages
        grow(store, 3)
        store.snapshot()
        assert store.state("chat")["messages"] == messages
        head = store.head("chat")
        assert head is not None
        assert store.state("chat", at=head.id - 1)["messages"] == messages[:-1]


def test_check_key_still_refuses_what_it_refused_after_accepting_keys() -> None:
    check_key("fine")
    check_key("fine")
    with pytest.raises(agentwal.InvalidKeyError):
        check_key("")
    with pytest.raises(agentwal.InvalidKeyError):
        check_key(b"fine")

    class Weird(str):
        pass

    assert check_key(Weird("fine")) == "fine"  # a subclass takes the full check
    with pytest.raises(agentwal.InvalidKeyError):
        check_key("x" * 10_000)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                     st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=5), inner, max_size=5)),
    max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), _values), min_size=1, max_size=8))
def test_decoded_values_return_what_decoding_returns(reads: list[tuple[str, Any]]) -> None:
    cache = DecodedValues(limit=2, small=64)
    for key, value in reads:
        data = codec.encode_value(key, value)
        first = cache.decode("run", key, data, "p")
        assert first == codec.decode_stored(data, "p", "w") == value
        if isinstance(first, (list, dict)):
            first.clear() if isinstance(first, dict) else first.append("junk")
        assert cache.decode("run", key, data, "p") == value


def test_a_read_since_the_last_commit_is_served_until_the_next_one(store: agentwal.Store) -> None:
    # store.get serves a small value (or its absence) it read at the store's latest LSN
    # without reading again, until any commit moves the LSN: each step changes the state
    # under such an entry, in this run, in another, or by deleting the run.
    assert store.get("r", "k", "none") == "none"
    assert store.get("r", "k", "none") == "none"  # absent, from the entry
    put(store, "r", k={"v": 1})
    for _ in range(2):
        assert store.get("r", "k") == {"v": 1}
    got = store.get("r", "k")
    got["v"] = 99  # a copy: the entry is not the caller's
    assert store.get("r", "k") == {"v": 1}
    put(store, "other", x=1)  # another run's commit: read again, same value
    assert store.get("r", "k") == {"v": 1}
    with store.begin("r") as txn:
        txn.put("k", [1, 2])
    assert store.get("r", "k") == [1, 2]
    store.snapshot()  # a fold moves nothing a read sees
    assert store.get("r", "k") == [1, 2]
    store.delete_run("r")
    assert store.get("r", "k") is None
    put(store, "r", k="again")
    assert store.get("r", "k") == "again"
    store.close()
    with pytest.raises(agentwal.StoreClosedError):
        store.get("r", "k")


def test_reads_from_other_threads_follow_every_commit(path: str) -> None:
    import threading

    with agentwal.open(path, durability="none") as store:
        put(store, "r", n=0)
        done = threading.Event()
        seen: list[int] = []

        def reader() -> None:
            while not done.is_set():
                seen.append(store.get("r", "n"))

        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(1, 300):
                put(store, "r", n=i)
                assert store.get("r", "n") == i  # a thread reads its own commit
                if i % 100 == 0:
                    store.snapshot()
        finally:
            done.set()
            t.join()
        assert seen == sorted(seen)  # never an older value after a newer one
        assert store.get("r", "n") == 299


def test_a_folded_value_read_again_takes_no_lmdb_transaction_until_lmdb_changes(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with agentwal.open(path, durability="none") as store:
        put(store, "r", k="folded", j=0)
        store.snapshot()
        snap = store._engine._snap
        assert snap is not None and snap._shared is not None
        shared, real = snap._shared, snap._shared.env
        begun: list[int] = []

        class Counting:  # the environment, counting the read transactions begun on it
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def begin(self, *args: Any, **kwargs: Any) -> Any:
                begun.append(1)
                return real.begin(*args, **kwargs)

        monkeypatch.setattr(shared, "env", Counting())
        assert store.get("r", "k") == "folded"
        assert len(begun) == 1
        put(store, "other", x=1)  # moves the store's LSN, not LMDB
        begun.clear()
        assert store.get("r", "k") == "folded"
        assert begun == []
        monkeypatch.undo()
        put(store, "r", k="new")
        store.snapshot()  # LMDB changed: read again
        put(store, "other", x=2)
        assert store.get("r", "k") == "new"
