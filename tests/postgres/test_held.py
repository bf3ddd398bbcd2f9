"""What a worker holds (``agentwal/postgres/held.py``): values not fetched again, heads
begun at without a round trip; never stale."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentwal import ConflictError
from agentwal.postgres import PostgresStore
from agentwal.postgres import backend as backend_mod
from agentwal.postgres.held import Heads, Held, Known


def _msg(i: int, who: str = "a") -> dict[str, Any]:
    return {"from": who, "i": i, "text": "m" * 100}


def _grow(store: PostgresStore, run: str, n: int, who: str = "a") -> None:
    for i in range(n):
        with store.begin(run) as txn:
            txn.append("messages", _msg(i, who))


@pytest.fixture
def rebuilt(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[tuple[str, int]]]]:
    """The append chains each ``begin`` rebuilt from fetched rows."""
    calls: list[list[tuple[str, int]]] = []
    real = backend_mod.rebuild

    def spy(run: str, rows: Any, starts: list[tuple[str, int]], where: str) -> Any:
        calls.append(list(starts))
        return real(run, rows, starts, where)

    monkeypatch.setattr(backend_mod, "rebuild", spy)
    yield calls


def _read(store: PostgresStore, run: str) -> Any:
    """``messages`` read by a begin that asks the server (the head is not known)."""
    store._b.heads.forget(run)
    with store.begin(run, prefetch=["messages"]) as txn:
        return txn.get("messages")


def test_a_list_this_worker_appended_to_is_not_fetched_again(
        pgstore: PostgresStore, rebuilt: list[list[tuple[str, int]]]) -> None:
    _grow(pgstore, "r", 4)
    rebuilt.clear()
    assert _read(pgstore, "r") == [_msg(i) for i in range(4)]
    assert rebuilt == [[]]  # held: no chain fetched


def test_a_list_another_worker_appended_to_is_fetched(
        open_pg: Callable[..., PostgresStore], rebuilt: list[list[tuple[str, int]]]) -> None:
    a, b = open_pg(worker_id="A"), open_pg(worker_id="B")
    _grow(a, "r", 3)
    a.release("r")
    with b.begin("r") as txn:
        txn.append("messages", _msg(9, "b"))
    b.release("r")
    rebuilt.clear()
    assert _read(a, "r") == [*(_msg(i) for i in range(3)), _msg(9, "b")]
    assert rebuilt == [[("messages", 4)]]


def test_a_run_deleted_and_made_again_is_not_read_from_what_was_held(
        pgstore: PostgresStore) -> None:
    _grow(pgstore, "r", 3, who="first")
    pgstore.delete_run("r")
    with pgstore.begin("r") as txn:  # the same checkpoints again, with other values
        txn["messages"] = [_msg(0, "second")]
    for i in (1, 2):
        with pgstore.begin("r") as txn:
            txn["messages"] = [*txn["messages"], _msg(i, "second")]
    assert pgstore.head("r").id == 3  # type: ignore[union-attr]
    assert _read(pgstore, "r") == [_msg(i, "second") for i in range(3)]


def test_a_compacted_run_reads_the_same(pgstore: PostgresStore) -> None:
    _grow(pgstore, "r", 6)
    pgstore.compact(keep_last=2)
    assert _read(pgstore, "r") == [_msg(i) for i in range(6)]
    _grow(pgstore, "r", 1, who="after")
    assert _read(pgstore, "r") == [*(_msg(i) for i in range(6)), _msg(0, "after")]


def test_held_keeps_values_of_its_size_range_and_drops_the_least_recent() -> None:
    held = Held(1600, min_bytes=64)
    held.put("r", 0, 1, {"small": b"x" * 64, "big": b"y" * 100, "huge": b"z" * 101})
    assert held.get("r", ["small", "big", "huge"]) == {"big": (0, 1, b"y" * 100)}
    held.put("r", 0, 2, {"a": b"a" * 100})
    held.get("r", ["big"])  # "big" is now more recent than "a"
    held.put("s", 3, 5, {f"k{i}": b"k" * 100 for i in range(15)})
    assert held.get("r", ["big", "a"]) == {"big": (0, 1, b"y" * 100)}
    assert len(held.get("s", [f"k{i}" for i in range(15)])) == 15


def test_a_deleted_or_small_value_drops_what_was_held() -> None:
    held = Held(1 << 20, min_bytes=64)
    held.put("r", 0, 1, {"a": b"a" * 100, "b": b"b" * 100})
    held.put("r", 0, 2, {"a": None, "b": b"b"})
    assert held.get("r", ["a", "b"]) == {}


# -- known heads: a begin without a round trip -------------------------------------------


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The runs whose ``begin`` asked the server."""
    calls: list[str] = []
    real = backend_mod.PostgresBackend._begin

    def spy(self: Any, run: str, fence: Any, wanted: list[str]) -> Any:
        calls.append(run)
        return real(self, run, fence, wanted)

    monkeypatch.setattr(backend_mod.PostgresBackend, "_begin", spy)
    yield calls


def test_a_worker_begins_at_its_own_last_commit_without_asking(
        pgstore: PostgresStore, asked: list[str]) -> None:
    with pgstore.begin("r", prefetch=["n", "log", "gone"]) as txn:
        txn["n"], txn["log"], txn["gone"] = 0, [], "soon"
    for i in range(1, 4):
        with pgstore.begin("r", prefetch=["n", "log", "gone"]) as txn:
            txn["n"] = txn["n"] + 1
            txn.append("log", _msg(i))
            if i == 1:
                del txn["gone"]
    assert asked == ["r", "r"]  # a new run's begin, then the first at checkpoint 1
    with pgstore.begin("r", prefetch=["n", "log", "gone"]) as txn:
        assert (txn["n"], txn["log"], "gone" in txn) == (3, [_msg(i) for i in (1, 2, 3)], False)
    assert asked == ["r", "r"]
    assert pgstore.verify().ok  # the append rows' bases and depths came from what was known


def test_views_from_a_known_head_that_moved_rebase_or_conflict(pgstore: PostgresStore) -> None:
    """Two transactions of one worker on one run (as two threads would): the second to
    commit began at a head that moved; its commit rebases, or conflicts, as any view
    behind the head."""
    with pgstore.begin("r") as txn:
        txn["a"], txn["b"] = 0, 0
    first = pgstore.begin("r", prefetch=["a", "b"])
    second = pgstore.begin("r", prefetch=["a", "b"])
    first["a"] = first["a"] + 1
    first.commit()
    second["b"] = second["b"] + 1  # a disjoint key: rebased
    assert second.commit().id == 3  # type: ignore[union-attr]
    assert pgstore.state("r") == {"a": 1, "b": 1}
    first = pgstore.begin("r", prefetch=["a"])
    second = pgstore.begin("r", prefetch=["a"])
    first["a"] = 10
    first.commit()
    second["a"] = second["a"] + 1  # read 1, now 10
    with pytest.raises(ConflictError):
        second.commit()
    with pgstore.begin("r", prefetch=["a", "b"]) as txn:
        assert (txn["a"], txn["b"]) == (10, 1)
    assert pgstore.verify().ok


def test_a_lease_taken_over_meanwhile_is_not_begun_from_what_was_known(
        open_pg: Callable[..., PostgresStore], asked: list[str]) -> None:
    a, b = open_pg(worker_id="A"), open_pg(worker_id="B")
    with a.begin("r", prefetch=["n"]) as txn:
        txn["n"] = "a"
    a.release("r")
    with b.begin("r", prefetch=["n"]) as txn:
        txn["n"] = "b"
    b.release("r")
    asked.clear()
    with a.begin("r", prefetch=["n"]) as txn:
        assert txn["n"] == "b"
    assert asked == ["r"]


def test_a_deleted_run_is_not_begun_from_what_was_known(pgstore: PostgresStore) -> None:
    with pgstore.begin("r", prefetch=["n"]) as txn:
        txn["n"] = 1
    pgstore.delete_run("r")
    with pgstore.begin("r", prefetch=["n"]) as txn:
        assert "n" not in txn
        txn["n"] = 2
    assert pgstore.head("r").id == 1  # type: ignore[union-attr]


def test_a_failed_commit_forgets_the_head(pgstore: PostgresStore, asked: list[str]) -> None:
    with pgstore.begin("r", prefetch=["a"]) as txn:
        txn["a"] = 0
    first = pgstore.begin("r", prefetch=["a"])
    second = pgstore.begin("r", prefetch=["a"])
    first["a"] = 1
    first.commit()
    second["a"] = 2
    with pytest.raises(ConflictError):
        second.commit()
    asked.clear()
    with pgstore.begin("r", prefetch=["a"]) as txn:
        assert txn["a"] == 1
    assert asked == ["r"]


def _row(c: int) -> tuple[int, int, int | None]:
    return (c, 0, 1)


def test_heads_know_a_run_under_one_lease_epoch_with_every_key_asked() -> None:
    heads = Heads()
    heads.learn("r", 7, 0, 5, b"h5", {"a": (b"1", _row(5)), "b": (None, None)},
                heads.stamp())
    got = heads.view("r", 7, ["a", "b"])
    assert got == Known(0, 5, b"h5", {"a": (b"1", _row(5)), "b": (None, None)})
    assert heads.view("r", 7, ["a", "c"]) is None  # "c" is not known
    assert heads.view("r", 8, ["a"]) is None  # another lease epoch
    heads.advance("r", 7, 0, 6, b"h6", {"b": (b"2", _row(6))})
    assert heads.view("r", 7, ["a", "b"]) == Known(0, 6, b"h6", {"a": (b"1", _row(5)),
                                                                 "b": (b"2", _row(6))})
    heads.advance("r", 7, 0, 8, b"h8", {"a": (b"3", _row(8))})  # 7 was not this worker's
    assert heads.view("r", 7, ["a"]) is None
    heads.learn("r", 7, 0, 9, b"h9", {"a": (b"4", _row(9))}, heads.stamp())
    # a new head: "a" unknown
    heads.learn("r", 7, 0, 10, b"h10", {"b": (b"5", _row(10))}, heads.stamp())
    assert heads.view("r", 7, ["a"]) is None
    # read before 10 committed
    heads.learn("r", 7, 0, 9, b"h9", {"a": (b"4", _row(9))}, heads.stamp())
    assert heads.view("r", 7, ["b"]) == Known(0, 10, b"h10", {"b": (b"5", _row(10))})
    heads.forget("r")
    assert heads.view("r", 7, []) is None


def test_heads_are_bounded() -> None:
    heads = Heads(max_runs=2, max_keys=3, max_bytes=10)
    heads.learn("r", 1, 0, 1, b"", {k: (b"x", _row(1)) for k in "abcd"}, heads.stamp())
    assert heads.view("r", 1, ["a"]) is None and heads.view("r", 1, ["bcd"[i] for i in
                                                                     range(3)]) is not None
    heads.advance("r", 1, 0, 2, b"", {"big": (b"y" * 9, _row(2))})  # 3 + 9 bytes > 10
    assert heads.view("r", 1, ["big"]) is not None and heads.view("r", 1, ["c"]) is None
    heads.learn("s", 1, 0, 1, b"", {}, heads.stamp())
    heads.learn("t", 1, 0, 1, b"", {}, heads.stamp())
    assert heads.view("r", 1, []) is None and heads.view("t", 1, []) is not None


def test_a_read_that_started_before_a_commit_is_not_learned() -> None:
    # Review of session 11: a failed commit forgot the head; thread T2's begin read head 4
    # from the server; another thread committed 5 (nothing known to advance); T2's learn
    # then set the known head back to 4, and every later begin started there (after a
    # compaction dropped 4, every one of them conflicted, for ever).
    heads = Heads()
    heads.learn("r", 7, 0, 4, b"h4", {"a": (b"1", _row(4))}, heads.stamp())
    heads.forget("r")  # a failed commit
    since = heads.stamp()  # T2 starts its server read: head 4
    heads.advance("r", 7, 0, 5, b"h5", {"a": (b"2", _row(5))})  # another thread's commit
    heads.learn("r", 7, 0, 4, b"h4", {"a": (b"1", _row(4))}, since)
    assert heads.view("r", 7, ["a"]) is None  # ask the server: the head is 5
    heads.learn("r", 7, 0, 5, b"h5", {"a": (b"2", _row(5))}, heads.stamp())
    assert heads.view("r", 7, ["a"]) == Known(0, 5, b"h5", {"a": (b"2", _row(5))})


def test_a_read_that_started_before_a_deletion_is_not_learned() -> None:
    heads = Heads()
    since = heads.stamp()  # a begin reads head 3 of the run
    heads.forget("r")  # the same worker's delete_run, done meanwhile
    heads.learn("r", 7, 0, 3, b"h3", {"a": (b"2", _row(3))}, since)
    assert heads.view("r", 7, ["a"]) is None


def test_a_stamp_dropped_from_the_bounded_table_still_refuses_older_reads() -> None:
    heads = Heads(max_runs=1)  # stamps of 4 runs are kept
    since = heads.stamp()
    for run in "rstuvw":
        heads.forget(run)
    heads.learn("r", 7, 0, 3, b"h3", {"a": (b"2", _row(3))}, since)
    assert heads.view("r", 7, ["a"]) is None
    heads.learn("r", 7, 0, 3, b"h3", {"a": (b"2", _row(3))}, heads.stamp())
    assert heads.view("r", 7, ["a"]) is not None


def test_a_begin_racing_a_delete_run_of_the_same_worker_does_not_see_the_deleted_run(
        pgstore: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # The begin's server read lands before delete_run and its learn after: the next
    # begin saw the deleted run's "a" beside "b" read as missing (no checkpoint at all).
    backend = pgstore._b
    for i in range(3):
        with pgstore.begin("r") as txn:
            txn["a"] = i
            txn["b"] = i
    backend.heads.forget("r")
    real = backend._begin
    read, go = threading.Event(), threading.Event()

    def slow(run: str, fence: Any, wanted: list[str]) -> Any:
        view = real(run, fence, wanted)
        if threading.current_thread().name == "racing":
            read.set()
            go.wait(30)
        return view

    monkeypatch.setattr(backend, "_begin", slow)
    racing = threading.Thread(target=lambda: backend.begin("r", keys=("a",)), name="racing")
    racing.start()
    assert read.wait(30)
    pgstore.delete_run("r")
    go.set()
    racing.join(30)
    view = backend.begin("r", keys=("a",))
    assert view.base == 0 and view.known.get("a") is None
