"""Poison runs: a run whose holders keep dying before they commit is parked, then unparked.

A worker "dies" here by stopping its heartbeat and having its lease run
out on the server (an UPDATE of the expiry), which is what the next worker
sees after a kill -9; the failover tests do the same with real processes.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
import pytest

from agentwal import LeaseHeldError, LeaseLostError, RunParkedError
from agentwal.postgres import PostgresStore
from agentwal.postgres.schema import MIGRATIONS, VERSION, install
from tests.postgres.test_cli import run


def _dies(store: PostgresStore, dsn: str, schema: str) -> None:
    """``store``'s worker stops renewing, and its leases run out."""
    store._b.leases.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".runs SET lease_expires = now() - interval \'1 s\' '
                     "WHERE lease_owner = %s", (store.worker_id,))


def test_a_run_whose_holders_keep_dying_is_parked_until_unparked(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    first = open_pg(worker_id="w0", max_steals=2)
    with first.begin("r") as txn:
        txn["step"] = 1
    zombie = first.begin("r")  # the step that kills its worker
    zombie["step"] = 2
    _dies(first, pg_dsn, pg_schema)
    for n in (1, 2):  # two takeovers are allowed; each new holder dies in the step too
        w = open_pg(worker_id=f"w{n}", max_steals=2)
        assert w.lease("r") == n + 1
        _dies(w, pg_dsn, pg_schema)
    last = open_pg(worker_id="w3", max_steals=2)
    with pytest.raises(RunParkedError) as info:
        last.begin("r")  # the third takeover parks the run instead
    exc = info.value
    assert exc.code == "run_parked" and isinstance(exc, LeaseHeldError)
    assert exc.steals == 2 and "3 holders" in exc.why and "w2" in exc.why
    assert last.claim_runs() == []  # nobody adopts it
    with pytest.raises(RunParkedError):
        open_pg(worker_id="w4", max_steals=2).lease("r")  # not even a fresh worker
    with pytest.raises(LeaseLostError):
        zombie.commit()  # the first holder, come back, is fenced as before
    assert last.state("r") == {"step": 1}  # reading needs no lease
    assert list(last.parked()) == ["r"] and last.stats()["runs_parked"] == 1
    assert last.unpark("r") and not last.unpark("r")
    with last.begin("r") as txn:  # a worker may take it again, with a new epoch
        txn["step"] = 2
    assert last.parked() == {} and last.state("r") == {"step": 2}


def test_a_commit_starts_the_count_over(open_pg: Callable[..., PostgresStore], pg_dsn: str,
                                        pg_schema: str) -> None:
    a = open_pg(worker_id="a", max_steals=1)
    a.lease("r")
    _dies(a, pg_dsn, pg_schema)
    b = open_pg(worker_id="b", max_steals=1)
    with b.begin("r") as txn:  # one takeover, then progress
        txn["k"] = 1
    _dies(b, pg_dsn, pg_schema)
    c = open_pg(worker_id="c", max_steals=1)
    assert c.lease("r") == 3  # the count started over at b's commit
    c.release("r")
    d = open_pg(worker_id="d", max_steals=1)
    assert d.lease("r") == 4  # a released lease is no takeover either


def test_claim_runs_parks_the_poison_runs_and_adopts_the_others(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    a = open_pg(worker_id="a", max_steals=1)
    for r in ("p", "q", "s"):
        a.lease(r)
    _dies(a, pg_dsn, pg_schema)
    b = open_pg(worker_id="b", max_steals=1)
    assert b.lease("p") == 2  # p's one takeover
    _dies(b, pg_dsn, pg_schema)
    c = open_pg(worker_id="c", max_steals=1)
    assert c.claim_runs() == ["q", "s"]
    assert list(c.parked()) == ["p"]


def test_max_steals_none_never_parks_and_bad_values_are_refused(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    for n in range(4):
        w = open_pg(worker_id=f"w{n}", max_steals=None)
        assert w.lease("r") == n + 1
        _dies(w, pg_dsn, pg_schema)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError):
            open_pg(worker_id="x", max_steals=bad)


def test_the_cli_shows_parked_runs_and_unparks_them(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str, url: str,
        tmp_path: object) -> None:
    a = open_pg(worker_id="a", max_steals=0)
    with a.begin("r") as txn:
        txn["k"] = 1
    with a.begin("ok") as txn:
        txn["k"] = 1
    a.lease("r")
    _dies(a, pg_dsn, pg_schema)
    with pytest.raises(RunParkedError):
        open_pg(worker_id="b", max_steals=0).lease("r")
    code, out = run("runs", url, "--json")
    assert code == 0
    rows = {r["run"]: r["parked"] for r in json.loads(out)}
    assert rows["ok"] is None and "worker a" in rows["r"]
    code, out = run("runs", url)
    assert code == 0 and "parked" in out and "worker a" in out
    code, out = run("unpark", url, "r")
    assert code == 0 and "unparked r" in out
    code, out = run("unpark", url, "r", "--json")
    assert code == 1 and "not_parked" in out
    assert open_pg(worker_id="c").lease("r") == 3
    code, _ = run("unpark", str(tmp_path), "r")
    assert code == 2  # a local store parks nothing


def test_a_version_1_store_is_migrated(pg_dsn: str, pg_schema: str,
                                       open_pg: Callable[..., PostgresStore]) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        conn.execute(f'SET search_path = "{pg_schema}"')
        conn.execute(MIGRATIONS[0])
        conn.execute("INSERT INTO meta (store_id, schema_version) "
                     "VALUES (gen_random_uuid(), 1)")
        conn.execute("INSERT INTO runs (run, steals) VALUES ('old', 7)")
        assert install(conn, pg_schema, "test") is not None
        assert conn.execute("SELECT schema_version FROM meta").fetchone() == (VERSION,)
    store = open_pg(worker_id="w", max_steals=1)
    assert store.parked() == {} and store.lease("old") == 1
