"""Values a worker holds (``agentwal/postgres/held.py``): not fetched again, never stale."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentwal.postgres import PostgresStore
from agentwal.postgres import backend as backend_mod
from agentwal.postgres.held import Held


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
