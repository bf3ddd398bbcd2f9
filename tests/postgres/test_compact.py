"""``compact`` on PostgreSQL: the same kept checkpoints as the local engine, reading as before."""

from __future__ import annotations

import datetime
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentwal
from agentwal.postgres import PostgresStore
from agentwal.postgres import blobs as pg_blobs
from agentwal.testing import backend as backend_of
from tests.postgres.test_cli import run as cli


def _count(dsn: str, schema: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".{table}').fetchone()
    assert row is not None
    return int(row[0])


def _states(store: Any, run: str) -> dict[int, dict[str, Any]]:
    return {c.id: store.state(run, at=c.id) for c in store.history(run)}


def test_keep_last_drops_the_rest_and_the_kept_read_as_before(
        pgstore: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    for i in range(10):
        with pgstore.begin("r") as txn:
            txn["n"] = i
            txn["big"] = "x" * 100 + str(i)  # a vals row per step
            txn[f"once/{i}"] = i
            if i == 7:
                del txn["once/2"]
    before = _states(pgstore, "r")
    vals = _count(pg_dsn, pg_schema, "vals")
    report = pgstore.compact(keep_last=3)
    assert report.checkpoints_dropped == 7 and report.runs == {"r": 7}
    assert report.objects_freed == 7 and vals - _count(pg_dsn, pg_schema, "vals") == 7
    assert [c.id for c in pgstore.history("r")] == [10, 9, 8]
    assert _states(pgstore, "r") == {k: v for k, v in before.items() if k >= 8}
    for gone in (1, 7):
        with pytest.raises(agentwal.CheckpointNotFoundError):
            pgstore.state("r", at=gone)
        with pytest.raises(agentwal.CheckpointNotFoundError):
            pgstore.fork("r", gone, "f")
    assert pgstore.verify().ok
    with pgstore.begin("r") as txn:  # the run goes on
        txn["n"] = 10
    assert pgstore.head("r").id == 11  # type: ignore[union-attr]
    assert pgstore.compact(keep_last=3).checkpoints_dropped == 1
    assert pgstore.verify().ok


def test_a_transaction_at_a_dropped_checkpoint_conflicts_at_its_next_read(
        open_pg: Callable[..., PostgresStore]) -> None:
    a = open_pg(worker_id="a")
    with a.begin("r") as txn:
        txn["k"] = 0
        txn["p/x"] = 0
    stale = a.begin("r")  # at checkpoint 1
    assert stale.get("k") == 0
    for i in (1, 2):
        with a.begin("r") as txn:
            txn["k"] = i
    a.compact(keep_last=1)  # drops 1 and 2
    with pytest.raises(agentwal.ConflictError, match="compaction dropped checkpoint 1"):
        stale.get("p/x")
    with pytest.raises(agentwal.ConflictError):
        list(stale.items("p/"))
    stale.rollback()
    calls: list[int] = []

    def step(txn: agentwal.Transaction) -> None:
        calls.append(txn.get("k"))
        txn["k"] = 9

    a.transact("r", step)
    assert calls == [2] and a.get("r", "k") == 9


def test_fork_origins_and_gaps_stay_readable(pgstore: PostgresStore) -> None:
    for i in range(6):
        with pgstore.begin("r") as txn:
            txn["n"] = i
            txn[f"k/{i % 2}"] = i
    pgstore.fork("r", 3, "f")
    before = _states(pgstore, "r")
    report = pgstore.compact(keep_last=1)
    assert [c.id for c in pgstore.history("r")] == [6, 3]  # 3 is a fork's origin
    assert report.runs == {"r": 4}
    assert _states(pgstore, "r") == {3: before[3], 6: before[6]}
    assert pgstore.verify().ok  # the kept rows of 3 skip over dropped 4 and 5
    assert pgstore.compact(keep_last=1, keep_fork_origins=False).runs == {"r": 1}
    assert pgstore.state("f") == before[3]


def test_arguments_runs_and_older_than(pgstore: PostgresStore) -> None:
    for run in ("a", "b"):
        for i in range(3):
            with pgstore.begin(run) as txn:
                txn["i"] = i
    with pytest.raises(agentwal.RunNotFoundError):
        pgstore.compact(keep_last=1, runs=["nope"])
    with pytest.raises(TypeError):
        pgstore.compact(keep_last=1, runs="a")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        pgstore.compact(keep_last=0)
    assert pgstore.compact().checkpoints_dropped == 0  # neither option: nothing dropped
    assert pgstore.compact(older_than=datetime.timedelta(days=1)).checkpoints_dropped == 0
    assert pgstore.compact(older_than=datetime.timedelta(0), runs=["a"]).runs == {"a": 2}
    assert len(pgstore.history("b")) == 3
    seen: list[tuple[str, int, int]] = []
    report = pgstore.compact(keep_last=1, vacuum=True,
                             progress=lambda *p: seen.append(p))  # type: ignore[arg-type]
    assert report.vacuumed and report.runs == {"b": 2}
    assert seen[0] == ("runs", 0, 2) and seen[-1] == ("runs", 2, 2)


def test_blobs_only_dropped_checkpoints_named_are_collected(
        pgstore: PostgresStore, pg_dsn: str, pg_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_blobs, "GRACE", 0.0)
    with pgstore.begin("r") as txn:
        txn.put_blob("old", io.BytesIO(b"only in checkpoint 1"))
        txn.put_blob("kept", io.BytesIO(b"read at the head"))
    with pgstore.begin("r") as txn:
        del txn["old"]
    with pgstore.begin("r") as txn:
        txn["n"] = 1
    pgstore.compact(keep_last=1)
    assert _count(pg_dsn, pg_schema, "blobs") == 1
    with pgstore.open_blob("r", "kept") as f:
        assert f.read() == b"read at the head"
    assert pgstore.verify().ok


def test_the_cli_compacts_a_uri(pgstore: PostgresStore, url: str) -> None:
    for i in range(4):
        with pgstore.begin("r") as txn:
            txn["i"] = i
    pgstore.release("r")
    code, out = cli("compact", url, "--keep-last", "2", "--json")
    assert code == 0, out
    assert [c.id for c in pgstore.history("r")] == [4, 3]
    code, out = cli("compact", url, "--keep-last", "1")
    assert code == 0 and "1 checkpoint(s) dropped" in out and "of rows freed" in out


keys = st.sampled_from(["a", "b", "c/d", "c/e"])
histories = st.lists(st.dictionaries(keys, st.none() | st.integers(0, 3) | st.text(max_size=90),
                                     min_size=1, max_size=3), min_size=1, max_size=12)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=histories, keep_last=st.integers(1, 4), fork_at=st.integers(1, 12))
def test_the_same_checkpoints_as_the_local_engine(
        open_pg: Callable[..., PostgresStore], tmp_path: Path, steps: list[dict[str, Any]],
        keep_last: int, fork_at: int) -> None:
    import uuid

    run = f"r{uuid.uuid4().hex[:8]}"
    pg = open_pg(worker_id="w")
    with agentwal.open(str(tmp_path / f"{run}.awal"), durability="none") as local:
        for store in (local, pg):
            for step in steps:
                with store.begin(run) as txn:
                    for k, v in step.items():
                        if v is None:
                            txn.delete(k)
                        else:
                            txn[k] = v
            if fork_at <= len(steps):
                store.fork(run, fork_at, run + "-f")
            store.compact(keep_last=keep_last, runs=[run])
        assert [c.id for c in pg.history(run)] == [c.id for c in local.history(run)]
        assert _states(pg, run) == _states(local, run)
    assert pg.verify().ok


def test_a_compaction_while_a_fork_reads_cannot_drop_its_origin(
        pgstore: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: the fork read the origin's state, a compaction (another worker's)
    # then dropped the origin checkpoint, and the fork still committed its first
    # checkpoint naming it: an origin that compaction promises to keep was gone.
    for i in range(3):
        with pgstore.begin("a") as txn:
            txn["i"] = i
    seam = backend_of(pgstore)
    begin = seam.begin

    def compact_in_between(run: str, **kw: Any) -> Any:
        if run == "f":  # the fork has read the state at a/1 and begins its commit
            pgstore.compact(keep_last=1)
        return begin(run, **kw)

    monkeypatch.setattr(seam, "begin", compact_in_between)
    with pytest.raises(agentwal.CheckpointNotFoundError):
        pgstore.fork("a", 1, "f")
    assert pgstore.head("f") is None and pgstore.runs() == ["a"]
    assert [c.id for c in pgstore.history("a")] == [3]
    monkeypatch.undo()
    pgstore.fork("a", 3, "f")  # a kept checkpoint forks as before
    assert pgstore.history("f")[0].origin == ("a", 3)
