"""Round trips to the server per step: counted on the wire, so a regression fails.

Every session the store opens is traced by libpq (``PQtrace``: each protocol
message, one line, F from the client, B from the server). A round trip is a
message the client sends and then waits on: a ``Sync`` (the end of an
extended-protocol batch: one statement, or a whole pipeline) or a simple
``Query``. The count is exact, whatever the machine's load: a pipeline of ten
statements is one ``Sync``. Only the pool's check of a session idle for over
a second, and the lease heartbeat, add round trips that depend on time; so
each figure is the fewest a step took over several steps.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentwal.postgres import PostgresStore


class Wire:
    """Counts the round trips of every psycopg session opened while it is installed."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.files: list[Path] = []

    def count(self) -> int:
        n = 0
        for path in self.files:
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split("\t")
                if len(parts) >= 3 and parts[0] == "F" and parts[2] in ("Sync", "Query"):
                    n += 1
        return n

    def fewest(self, step: Callable[[int], Any], times: int = 8) -> int:
        """The fewest round trips one call of ``step(i)`` took over ``times`` calls."""
        best = None
        for i in range(times):
            before = self.count()
            step(i)
            took = self.count() - before
            best = took if best is None else min(best, took)
        assert best is not None
        return best


@pytest.fixture
def wire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Wire]:
    counter = Wire(tmp_path)
    real = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
    opened: list[int] = []

    def connect(cls: Any, *args: Any, **kwargs: Any) -> Any:
        conn = real(cls, *args, **kwargs)
        path = tmp_path / f"trace-{len(counter.files)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        opened.append(fd)
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        counter.files.append(path)
        return conn

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(connect))
    monkeypatch.setattr(psycopg, "connect", psycopg.Connection.connect)  # an alias
    yield counter
    for fd in opened:
        with contextlib.suppress(OSError):
            os.close(fd)


def test_the_counter_sees_one_round_trip_per_statement_and_per_pipeline(
        wire: Wire, pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        before = wire.count()
        conn.execute("SELECT 1").fetchone()
        assert wire.count() - before == 1
        with conn.pipeline():
            for i in range(5):
                conn.execute("SELECT %s", (i,))
        assert wire.count() - before == 2


def test_a_step_takes_one_round_trip_or_two(wire: Wire,
                                            open_pg: Callable[..., PostgresStore]) -> None:
    """The commit (fence, head check and writes in one statement) is one round trip; the
    begin (the snapshot and its prefetched keys) is one more, or none when the worker
    knows the head and those keys (``held.py``: it holds the lease, and the head is its
    own last commit)."""
    store = open_pg(worker_id="w1", durability="sync")
    with store.begin("run") as txn:
        txn["n"] = 0
        txn["log"] = []

    def step(i: int) -> None:
        with store.begin("run", prefetch=["n", "log"]) as txn:
            txn["n"] = txn["n"] + 1
            txn.append("log", {"i": i, "text": "x" * 300})

    def step_not_knowing(i: int) -> None:
        store._b.heads.forget("run")  # as a worker that just took the lease over
        step(i)

    assert wire.fewest(step) == 1
    assert wire.fewest(step_not_knowing) == 2
    assert store.get("run", "n") == 16
    assert [e["i"] for e in store.get("run", "log")] == [*range(8), *range(8)]
    assert store.verify().ok


def test_an_unprefetched_read_costs_one_more(wire: Wire,
                                             open_pg: Callable[..., PostgresStore]) -> None:
    store = open_pg(worker_id="w1")
    with store.begin("run") as txn:
        txn["n"] = 0

    def step(_i: int) -> None:
        with store.begin("run") as txn:
            txn["n"] = txn["n"] + 1

    assert wire.fewest(step) == 2  # the begin knows the head, not "n"


def test_the_langgraph_saver_puts_in_few_round_trips(
        wire: Wire, open_pg: Callable[..., PostgresStore]) -> None:
    """The Pregel loop's calls for a chat graph (``bench/langgraph_compare.py``'s drive):
    ``put_writes`` of the node's new message, then ``put`` of the next checkpoint; each
    is one begin with its keys prefetched and one commit, once the saver's caches know
    the thread (the pool, its last version), and ``put``'s begin takes none: the worker
    knows the head and every key it reads there (``put_writes`` reads its new write's
    key, which the worker cannot know to be absent)."""
    pytest.importorskip("langgraph.checkpoint.base")
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.base.id import uuid6

    from agentwal.integrations.langgraph import AgentWALSaver

    store = open_pg(worker_id="w1", durability="sync")
    saver = AgentWALSaver(store)
    messages: list[Any] = []
    state: dict[str, Any] = {"config": {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}}

    def put_writes(step: int) -> None:
        msg = AIMessage(content=f"step {step} " + "y" * 1000, id=str(uuid.uuid4()))
        messages.append(msg)
        saver.put_writes(state["config"], [("messages", [msg])], str(uuid.uuid4()), "~agent")

    def put(step: int) -> None:
        version = saver.get_next_version(state.get("version"), None)
        state["version"] = version
        checkpoint = {"v": 4, "id": str(uuid6(clock_seq=step)),
                      "ts": datetime.now(timezone.utc).isoformat(),
                      "channel_values": {"messages": list(messages)},
                      "channel_versions": {"messages": version},
                      "versions_seen": {"agent": {"messages": version}},
                      "updated_channels": ["messages"]}
        state["config"] = saver.put(state["config"], checkpoint,  # type: ignore[arg-type]
                                    {"source": "loop", "step": step, "parents": {}},
                                    {"messages": version})

    put(0)
    for step in range(1, 4):
        put_writes(step)
        put(step)
    assert wire.fewest(lambda i: put_writes(10 + i)) == 2
    assert wire.fewest(lambda i: put(10 + i)) == 1
    got = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    assert got is not None
    assert [m.id for m in got.checkpoint["channel_values"]["messages"]] == [
        m.id for m in messages]
    assert store.verify().ok


def test_a_tree_of_small_files_is_stored_in_a_few_round_trips(
        wire: Wire, open_pg: Callable[..., PostgresStore], tmp_path: Path) -> None:
    """A snapshot's small files and directory objects go in batched transactions
    (``PgTreeBlobs.put_many``), not one upload transaction each."""
    src = tmp_path / "src"
    for d in range(4):
        (src / f"d{d}").mkdir(parents=True)
        for f in range(25):
            (src / f"d{d}" / f"f{f}.txt").write_text(f"file {d}/{f}\n" * (f + 1))
    (src / "empty").write_bytes(b"")
    store = open_pg(worker_id="w1")
    before = wire.count()
    with store.begin("run") as txn:
        txn.put_tree("tree", src)
    took = wire.count() - before
    assert took <= 30, took  # 106 blobs, one upload transaction each: 878 round trips
    out = tmp_path / "out"
    store.restore_tree("run", "tree", out)
    for path in src.rglob("*"):
        if path.is_file():
            assert (out / path.relative_to(src)).read_bytes() == path.read_bytes()
    assert store.verify().ok


def test_a_commit_behind_the_head_is_refused_by_the_guard_then_rebased(
        wire: Wire, open_pg: Callable[..., PostgresStore]) -> None:
    """The one-round-trip commit assumes the head did not move; when it did, its guard
    aborts it before any write and the checked path rebases it: the refused pipeline and
    its ROLLBACK, then the lock, the commit rule's query, and the writes with COMMIT."""
    store = open_pg(worker_id="w1")
    with store.begin("run") as txn:
        txn["a"], txn["b"] = 0, 0
    late = store.begin("run", prefetch=["a"])
    with store.begin("run") as txn:  # the head moves under `late`
        txn["b"] = 1
    late["a"] = late["a"] + 1
    before = wire.count()
    late.commit()
    assert wire.count() - before >= 5  # (one more if the pool checks an idle session)
    assert store.state("run") == {"a": 1, "b": 1}
    assert [c.id for c in store.history("run")][:1] == [3]
    assert store.verify().ok


def test_a_refused_guard_applies_nothing_on_a_conflict_or_a_lost_lease(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    from agentwal import ConflictError, LeaseLostError

    store = open_pg(worker_id="w1")
    with store.begin("run") as txn:
        txn["a"] = 0
    late = store.begin("run", prefetch=["a"])
    with store.begin("run") as txn:
        txn["a"] = 1
    late["a"] = late["a"] + 10
    with pytest.raises(ConflictError):
        late.commit()
    stale = store.begin("run", prefetch=["a"])
    stale["a"] = 99
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # another worker takes the run
        conn.execute(f'UPDATE "{pg_schema}".runs SET lease_owner = %s, '
                     "lease_epoch = lease_epoch + 1 WHERE run = %s", ("w2", "run"))
    with pytest.raises(LeaseLostError):
        stale.commit()
    assert store.get("run", "a") == 1
    assert store.head("run").id == 2  # type: ignore[union-attr]
    assert store.verify().ok
