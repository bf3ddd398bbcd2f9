"""O(delta) commit records: an appended list is logged as ``[base count, base length, tail]``.

``txn.append`` and a re-put list whose first items are the very objects
``txn.get`` handed out (unchanged) make a form-2 commit record
(``FLAG_APPENDS``): the log and the checkpoint hash carry the tail only. These
tests look at the log the way an operator does (``agentwal wal --json``), and
check that every reader still gets exactly the value put: live, after replay
(base in the log or folded into LMDB), after folds, compaction, forks and
rollbacks, and through ``verify``; and that a record whose base is not there
is refused, never applied to something else.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import agentwal
from agentwal import codec
from agentwal.cli import main
from agentwal.testing import crash

MSG = "m" * 1000  # a ~1 KiB message, as in the growing-conversation benchmark


def _message(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 else "assistant", "content": f"{i}: {MSG}", "n": i}


def _wal(path: str) -> list[dict[str, Any]]:
    out = CliRunner().invoke(main, ["wal", path, "--json"])
    assert out.exit_code == 0, out.output
    return [r for r in json.loads(out.output)["records"] if r["type"] == "commit"]


def _open(path: str) -> agentwal.Store:
    return agentwal.open(path, durability="none", wal_max_bytes=64 << 20)


@pytest.fixture
def path(tmp_path: Any) -> str:
    return os.path.join(str(tmp_path), "s.awal")


def _grow(store: agentwal.Store, steps: range, *, reput: bool) -> None:
    for i in steps:
        with store.begin("chat") as txn:
            if reput:
                messages = txn.get("messages", [])
                messages.append(_message(i))
                txn["messages"] = messages
            else:
                txn.append("messages", _message(i))
            txn["step"] = i


@pytest.mark.parametrize("reput", [False, True], ids=["txn.append", "re-put"])
def test_the_record_carries_the_tail_not_the_list(path: str, reput: bool) -> None:
    store = _open(path)
    _grow(store, range(40), reput=reput)
    whole = len(codec.encode_value("m", store.get("chat", "messages")))
    records = _wal(path)  # before close folds the log
    store.close()
    assert len(records) == 40
    assert whole > 40_000
    # The first commits hold a short list (a re-put below 2 KiB is encoded whole);
    # from then on each record is one message and the small keys, whatever the list's length.
    assert all(r["size"] < 1500 for r in records[3:]), [r["size"] for r in records]
    assert records[-1]["keys"] == ["messages+1", "step"]


def test_appended_values_cost_the_store_what_was_appended(path: str) -> None:
    # The memtable keeps each appended value as the one before plus the new items
    # (codec.Joined), joined only when read: 100 appends of ~1 KiB hold ~100 KiB,
    # not the ~5 MB of 100 whole lists (one per checkpoint until the fold).
    import tracemalloc

    store = _open(path)
    _grow(store, range(2), reput=False)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _grow(store, range(2, 102), reput=False)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1_500_000, held
    assert store.get("chat", "messages") == [_message(i) for i in range(102)]
    assert store.state("chat", at=50)["messages"] == [_message(i) for i in range(50)]
    store.close()


def _expect_whole(path: str) -> list[str]:
    return _wal(path)[-1]["keys"]


@pytest.mark.parametrize("change", ["replace", "inner", "nested", "rename", "drop", "move",
                                    "reorder"])
def test_a_re_put_that_changed_an_old_item_is_a_whole_value(path: str, change: str) -> None:
    store = _open(path)
    with store.begin("chat") as txn:
        txn["messages"] = [dict(_message(i), tags=[i]) for i in range(6)]
    with store.begin("chat") as txn:
        messages = txn["messages"]
        if change == "replace":
            messages[2] = _message(99)
        elif change == "inner":
            messages[2]["content"] = "edited"
        elif change == "nested":
            messages[2]["tags"].append("x")
        elif change == "rename":
            messages[5]["body"] = messages[5].pop("tags")  # same value, same order of values
        elif change == "drop":
            messages.pop(0)
        elif change == "move":
            messages[1]["tags"].append(messages[0]["tags"].pop())
        elif change == "reorder":
            messages[0], messages[1] = messages[1], messages[0]
        messages.append(_message(6))
        want = copy.deepcopy(messages)
        txn["messages"] = messages
    assert store.get("chat", "messages") == want
    # read before close: a close that folds a grown log goes on in a new, empty segment
    assert _expect_whole(path) == ["messages"]  # a whole value, not messages+1
    store.close()
    with _open(path) as store:
        assert store.get("chat", "messages") == want


@pytest.mark.parametrize("how", ["same list", "a copy", "sliced and added"])
def test_a_re_put_that_only_grew_is_an_append(path: str, how: str) -> None:
    store = _open(path)
    with store.begin("chat") as txn:
        txn["messages"] = [_message(i) for i in range(6)]
    with store.begin("chat") as txn:
        messages = txn["messages"]
        if how == "same list":
            messages += [_message(6), _message(7)]
        elif how == "a copy":
            messages = [*list(messages), _message(6), _message(7)]
        else:
            messages = [*messages[:6], _message(6), _message(7)]
        txn["messages"] = messages
        messages.append("after the put")  # the caller's list: nothing stored changes
        messages[0]["content"] = "after the put"
    want = [_message(i) for i in range(8)]
    assert store.get("chat", "messages") == want
    assert _expect_whole(path) == ["messages+2"]  # before close (see above)
    store.close()
    with _open(path) as store:
        assert store.get("chat", "messages") == want
        assert store.verify().ok


def test_appends_in_one_transaction_join_and_a_put_after_them_wins(path: str) -> None:
    store = _open(path)
    with store.begin("r") as txn:
        txn["log"] = list(range(1000))
    with store.begin("r") as txn:
        txn.append("log", 1000)
        txn.append("log", 1001, 1002)
        sp = txn.savepoint()
        txn.append("log", "rolled back")
        txn.rollback_to(sp)
    with store.begin("r") as txn:
        txn.append("log", "gone")
        txn["log"] = ["replaced"]
    records = _wal(path)  # before close folds the log
    store.close()
    assert [r["keys"] for r in records[1:]] == [["log+3"], ["log"]]
    with _open(path) as store:
        assert store.get("r", "log") == ["replaced"]
        assert store.state("r", at=2)["log"] == [*range(1000), 1000, 1001, 1002]


def test_replay_joins_appends_to_a_base_in_the_log_or_folded(path: str) -> None:
    store = _open(path)
    _grow(store, range(10), reput=False)
    store.snapshot()  # the base of the next appends is in LMDB now
    _grow(store, range(10, 20), reput=True)
    crash(store)  # nothing folded or written at close: the appends are replayed
    store = _open(path)
    assert store.stats()["recovery"]["replayed"] == 10
    want = [_message(i) for i in range(20)]
    assert store.get("chat", "messages") == want
    assert store.state("chat", at=15)["messages"] == want[:15]
    assert store.verify().ok
    store.snapshot()  # the replayed appends fold as whole values
    assert store.get("chat", "messages") == want
    assert store.state("chat", at=12)["messages"] == want[:12]
    report = store.verify()
    assert report.ok, report.problems
    assert report.checked["hashes"] >= 20
    store.close()


def test_folded_appends_verify_after_compaction_fork_and_rollback(path: str) -> None:
    store = _open(path)
    _grow(store, range(30), reput=True)
    store.snapshot()
    store.fork("chat", 20, "branch")
    with store.begin("branch") as txn:
        txn.append("messages", "on the branch")
    store.rollback_to("chat", 25)
    _grow(store, range(30, 35), reput=False)  # appends to the rolled-back list
    store.snapshot()
    report = store.compact(keep_last=3)
    assert report.checkpoints_dropped > 0
    store.snapshot()
    assert store.verify().ok, store.verify().problems
    want = [_message(i) for i in range(25)] + [_message(i) for i in range(30, 35)]
    assert store.get("chat", "messages") == want
    assert store.get("branch", "messages") == [_message(i) for i in range(20)] + [
        "on the branch"]
    store.close()
    with _open(path) as store:
        assert store.verify().ok
        assert store.get("chat", "messages") == want


def _forge_append(store: agentwal.Store, key: str, base_count: int) -> None:
    """Commit a form-2 record whose base is not the key's value (a damaged log, made live)."""
    txn = store.begin("chat")
    stored = codec.encode_value(key, ["x"] * base_count)
    tail = codec.encode_value(key, ["forged"])
    joined = codec.append_encoded(stored, tail)
    assert joined is not None
    txn._writes[key] = joined
    txn._appends[key] = ((base_count, len(stored), tail), joined)
    txn.commit()


def test_a_record_whose_base_is_missing_is_refused_and_reported(path: str) -> None:
    store = _open(path)
    _grow(store, range(3), reput=False)
    store.snapshot()
    _forge_append(store, "messages", 7)  # the key holds 3 items, not 7
    _forge_append(store, "nothing", 2)  # the key holds nothing at all
    report = store.verify()
    assert not report.ok
    found = [p.what for p in report.problems]
    assert any("appends to key 'messages', whose base of 7 items" in w
               and "holds 3 items" in w for w in found), found
    assert any("appends to key 'nothing'" in w and "holds no list" in w for w in found), found
    crash(store)
    with pytest.raises(agentwal.CorruptionError, match="base of 7 items"):
        _open(path)
    # recover="prefix" reads up to the first record it cannot apply and says what follows.
    with agentwal.open(path, recover="prefix") as ro:
        assert ro.get("chat", "messages") == [_message(i) for i in range(3)]
        assert ro.get("chat", "nothing") is None
        assert ro.lost is not None
        assert ro.lost.first_lsn == 4 and ro.lost.last_lsn == 5
        assert ro.lost.checkpoints == {"chat": [4, 5]}
        assert "base of 7 items" in ro.lost.reason
        assert [c.id for c in ro.history("chat")] == [3, 2, 1]


def test_old_form_records_still_replay(path: str) -> None:
    """A form-1 log (every value whole, as before this format) replays unchanged."""
    store = _open(path)
    with store.begin("chat") as txn:
        txn["messages"] = [1, 2]  # short: a re-put of it is encoded whole anyway
    with store.begin("chat") as txn:
        txn["messages"] = txn["messages"] + [3]
    crash(store)
    assert [r["keys"] for r in _wal(path)] == [["messages"], ["messages"]]
    with _open(path) as store:
        assert store.get("chat", "messages") == [1, 2, 3]
        assert store.verify().ok


def test_append_tail_rebuilds_what_an_entry_carried() -> None:
    for old, new in (([], [1]), (list(range(30)), ["a"] * 300), ([{"a": 1}], [])):
        stored = codec.encode_value("k", old)
        tail = codec.encode_value("k", new)
        joined = codec.append_encoded(stored, tail)
        assert joined is not None
        made = codec.join_append(stored, (len(old), len(stored), tail))
        assert made is not None and made.whole() == joined
        assert codec.append_tail(joined, len(old), len(stored)) == tail
        assert codec.join_append(stored + b"", (len(old) + 1, len(stored), tail)) is None
        assert codec.join_append(stored, (len(old), len(stored) + 1, tail)) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 300) | st.text(max_size=3), max_size=30), min_size=1,
                max_size=12),
       st.lists(st.booleans(), min_size=12, max_size=12))
def test_a_chain_of_joined_reads_as_the_lists_joined(parts: list[list[Any]],
                                                    read: list[bool]) -> None:
    # Appends kept as Joined over Joined, some read (joined) on the way and some
    # not: each reads back as the joined list, byte for byte what encoding writes.
    value: codec.Value = codec.encode_value("k", parts[0])
    items = list(parts[0])
    for more, now in zip(parts[1:], read, strict=False):
        entry = (len(items), len(value), codec.encode_value("k", more))
        made = codec.join_append(value, entry)
        assert made is not None
        assert codec.join_append(value, (len(items) + 1, *entry[1:])) is None
        items += more
        assert (made.count, len(made)) == (len(items), len(codec.encode_value("k", items)))
        if now:
            assert made.whole() == codec.encode_value("k", items)
        value = made
    assert codec.whole(value) == codec.encode_value("k", items)
    assert codec.whole(value) is codec.whole(value)  # joined once, then kept


def test_a_deleted_run_s_successor_appends_to_its_own_values(path: str) -> None:
    store = _open(path)
    _grow(store, range(5), reput=False)
    store.snapshot()  # LMDB holds the first run's list
    _grow(store, range(5, 8), reput=True)
    store.delete_run("chat")
    _grow(store, range(100, 104), reput=False)  # a new run under the same id
    report = store.verify()  # the log checks bases against the new run, not LMDB's old one
    assert report.ok, report.problems
    crash(store)
    with _open(path) as store:
        assert store.get("chat", "messages") == [_message(i) for i in range(100, 104)]
        assert store.verify().ok
        store.snapshot()
        assert store.verify().ok
