"""``copy_runs`` / ``agentwal copy`` between a local store and PostgreSQL, both ways."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentwal
from agentwal import (
    EffectRecord,
    LeaseHeldError,
    RunExistsError,
    RunNotFoundError,
)
from agentwal.local.blobs import CHUNK
from agentwal.postgres import PostgresStore
from tests.postgres.test_cli import error_of
from tests.postgres.test_cli import run as cli


def fill(store: Any) -> None:
    """Three steps of run-a (one deletes a key), a fork of it, effects done, failed, deferred."""
    for i in range(3):
        with store.begin("run-a") as txn:
            txn["step"] = i
            txn["big"] = "x" * 200 + str(i)  # over the inline limit on PostgreSQL
            if i == 1:
                txn["gone"] = True
            if i == 2:
                del txn["gone"]
            txn.meta(node=f"n{i}")
            txn.effect("charge", lambda ctx, i=i: {"paid": i}, mode="exactly_once",
                       args={"i": i}, idempotent=True)
    store.fork("run-a", 2, "run-f")
    with store.begin("run-f") as txn:
        txn["f"] = [1, 2, 3]
        txn.defer("email", mode="at_least_once", args={"to": "a@example.com"})

    def boom(ctx: Any) -> None:
        raise ValueError("downstream said no")

    txn = store.begin("run-f")
    with pytest.raises(ValueError):
        txn.effect("mail", boom, mode="at_least_once")
    txn.rollback()
    with store.begin("run-b") as txn:
        txn.meta(only="meta")


def fields(c: agentwal.Checkpoint, *, times: bool) -> tuple[Any, ...]:
    return (c.run, c.id, c.parent, c.meta, c.origin) + ((c.created_at,) if times else ())


def assert_same(a: Any, b: Any, *, times: bool) -> None:
    """Runs, checkpoints, the state at every checkpoint, and the ledger are equal."""
    assert a.runs() == b.runs()
    for run in a.runs():
        ha, hb = a.history(run), b.history(run)
        assert [fields(c, times=times) for c in ha] == [fields(c, times=times) for c in hb]
        for c in ha:
            assert a.state(run, at=c.id) == b.state(run, at=c.id), (run, c.id)

    def ledger(s: Any) -> dict[str, EffectRecord]:
        return {e.key: e for e in s.effects()}

    assert ledger(a) == ledger(b)


def test_local_to_postgres_and_back(tmp_path: Path,
                                    open_pg: Callable[..., PostgresStore]) -> None:
    with agentwal.open(str(tmp_path / "src.awal"), durability="none") as src:
        fill(src)
        pg = open_pg(worker_id="copier")
        report = src.copy_runs(pg)
        assert report.runs == ["run-a", "run-b", "run-f"] and report.renumbered == {}
        assert report.checkpoints == 6 and report.effects == len(src.effects())
        assert_same(src, pg, times=True)
        assert pg.verify().ok
        assert pg.stats()["leases_held"] == []  # the copier let the runs go
        with agentwal.open(str(tmp_path / "back.awal"), durability="none") as back:
            pg.copy_runs(back)
            assert_same(src, back, times=False)
            assert back.verify().ok
            # the copies go on like the original: a step, and a dispatch of the outbox
            with back.begin("run-a") as txn:
                assert txn["step"] == 2
                txn["step"] = 3
            assert len(back.dispatch({"email": lambda ctx: "sent"}).done) == 1
    [failed] = pg.effects(status="failed")
    assert failed.name == "mail" and "downstream said no" in (failed.error or "")


def test_postgres_to_postgres_keeps_the_times(open_pg: Callable[..., PostgresStore],
                                              pg_dsn: str, pg_schema: str) -> None:
    src = open_pg(worker_id="w1")
    fill(src)
    dest = open_pg(worker_id="w2", schema=pg_schema + "_b")
    try:
        assert src.copy_runs(dest, runs=["run-a"]).runs == ["run-a"]
        assert dest.runs() == ["run-a"]
        assert [fields(c, times=True) for c in dest.history("run-a")] == \
            [fields(c, times=True) for c in src.history("run-a")]
    finally:
        dest.close()
        import psycopg

        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{pg_schema}_b" CASCADE')


def test_refusals_write_nothing(tmp_path: Path, open_pg: Callable[..., PostgresStore]) -> None:
    pg = open_pg(worker_id="w1")
    with pg.begin("run-a") as txn:
        txn["mine"] = 1
    with agentwal.open(str(tmp_path / "src.awal"), durability="none") as src:
        fill(src)
        with pytest.raises(RunExistsError):
            src.copy_runs(pg)
        with pytest.raises(RunNotFoundError):
            src.copy_runs(pg, runs=["run-b", "nope"])
        with pytest.raises(ValueError, match="destination is the source"):
            src.copy_runs(src)
        assert pg.runs() == ["run-a"] and pg.effects() == []
        other = open_pg(worker_id="w2")
        pg.lease("run-f")
        with pytest.raises(LeaseHeldError):
            src.copy_runs(other, runs=["run-f"])


def test_a_compacted_history_is_renumbered_with_its_effects(
        tmp_path: Path, open_pg: Callable[..., PostgresStore]) -> None:
    with agentwal.open(str(tmp_path / "src.awal"), durability="none") as src:
        for i in range(6):
            with src.begin("r") as txn:
                txn["i"] = i
                txn.effect("call", lambda ctx, i=i: i, mode="at_least_once")
        src.compact(keep_last=2)
        kept = [c.id for c in reversed(src.history("r"))]
        assert kept == [5, 6]
        pg = open_pg(worker_id="w1")
        report = src.copy_runs(pg)
    assert report.renumbered == {"r": {5: 1, 6: 2}}
    assert [(c.id, c.parent) for c in reversed(pg.history("r"))] == [(1, None), (2, 1)]
    assert pg.state("r", at=1) == {"i": 4} and pg.state("r") == {"i": 5}
    by_commit = {e.committed_in: e.result for e in pg.effects()}
    assert by_commit[1] == 4 and by_commit[2] == 5


values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=80)
                      | st.binary(max_size=120),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
steps = st.lists(st.tuples(st.sampled_from(["r1", "r2"]),
                           st.dictionaries(st.sampled_from(["a", "b", "c/d", "c/e"]),
                                           st.none() | values, min_size=1, max_size=3)),
                 min_size=1, max_size=8)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_any_history_round_trips(tmp_path_factory: pytest.TempPathFactory,
                                 open_pg: Callable[..., PostgresStore],
                                 steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Random steps (None deletes) on a local store, copied to PostgreSQL and back."""
    root = tmp_path_factory.mktemp("copy")
    pg = open_pg(worker_id="w")
    for run in pg.runs():
        pg.delete_run(run)
    with agentwal.open(str(root / "a.awal"), durability="none") as src, \
            agentwal.open(str(root / "b.awal"), durability="none") as back:
        for run, writes in steps:
            with src.begin(run) as txn:
                for k, v in writes.items():
                    if v is None:
                        txn.delete(k)
                    else:
                        txn[k] = v
        src.copy_runs(pg)
        assert_same(src, pg, times=True)
        pg.copy_runs(back)
        assert_same(src, back, times=False)


def test_the_copy_command(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    src = str(tmp_path / "src.awal")
    with agentwal.open(src, durability="none") as s:
        fill(s)
    url = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={pg_schema}"
    code, out = cli("copy", src, url, "--run", "run-a", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["runs"] == ["run-a"] and doc["checkpoints"] == 3
    back = str(tmp_path / "back.awal")
    code, out = cli("copy", url, back)
    assert code == 0 and "copied 1 run(s) (run-a)" in out, out
    with agentwal.open(back, readonly=True) as b:
        assert b.runs() == ["run-a"] and b.state("run-a")["step"] == 2
    code, out = cli("copy", src, url, "--run", "run-a", "--json")
    assert code == 1 and error_of(out)["code"] == "run_exists"
    code, out = cli("copy", src, src + "/CONTROL", "--json")
    assert code == 2 and error_of(out)["code"] == "usage"


def test_blob_values_are_carried_both_ways(tmp_path: Path,
                                           open_pg: Callable[..., PostgresStore]) -> None:
    big = os.urandom(CHUNK + 17)
    pg = open_pg(worker_id="w1")
    with agentwal.open(str(tmp_path / "src.awal"), durability="none") as src:
        with src.begin("r") as txn:
            txn.put_blob("weights", io.BytesIO(big), media_type="application/x-bin")
            txn.put_blob("same", io.BytesIO(big))
        with src.begin("r") as txn:
            txn.put_blob("weights", io.BytesIO(b"v2"))
        assert src.copy_runs(pg).checkpoints == 2
    with pg.open_blob("r", "weights", at=1) as f:
        assert f.read() == big and f.ref.media_type == "application/x-bin"
    with pg.open_blob("r", "weights") as f:
        assert f.read() == b"v2"
    assert pg.stats()["blobs_rows"] == 2  # "same" shares its content with "weights" at 1
    assert pg.verify().ok
    with agentwal.open(str(tmp_path / "back.awal"), durability="none") as back:
        pg.copy_runs(back)
        with back.open_blob("r", "weights", at=1) as f:
            assert f.read() == big
        with back.open_blob("r", "same") as f:
            assert f.read() == big
        assert back.verify().ok
