"""Opening a PostgreSQL store: creation, concurrent first opens, versions, errors."""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import pytest

import agentwal
from agentwal import (
    BackendUnavailableError,
    ReadOnlyError,
    SchemaVersionError,
    StoreNotFoundError,
)
from agentwal.postgres import PostgresStore, open_postgres
from agentwal.postgres.schema import VERSION
from agentwal.postgres.store import split_schema


def _tables(dsn: str, schema: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT table_name FROM information_schema.tables "
                            "WHERE table_schema = %s", (schema,)).fetchall()
    return {r[0] for r in rows}


def test_first_open_creates_the_schema(pg_dsn: str, pg_schema: str,
                                       open_pg: Callable[..., PostgresStore]) -> None:
    assert _tables(pg_dsn, pg_schema) == set()
    store = open_pg(worker_id="w1")
    assert {"meta", "runs", "checkpoints", "deltas", "vals", "effects"} <= _tables(pg_dsn,
                                                                                pg_schema)
    again = open_pg(worker_id="w2")
    assert again.store_id == store.store_id


def test_agentwal_open_dispatches_on_the_dsn(pg_dsn: str, pg_schema: str) -> None:
    assert pg_dsn.startswith("postgresql://")
    with agentwal.open(pg_dsn, schema=pg_schema, worker_id="w1") as store:
        assert isinstance(store, PostgresStore)
        with store.begin("r") as txn:
            txn["k"] = 1
        assert store.get("r", "k") == 1


def test_concurrent_first_opens_never_race(pg_dsn: str, pg_schema: str) -> None:
    n = 6
    barrier = threading.Barrier(n)
    ids: list[object] = []
    errors: list[BaseException] = []

    def opener(i: int) -> None:
        barrier.wait()
        try:
            with open_postgres(pg_dsn, schema=pg_schema, worker_id=f"w{i}", pool_size=1) as s:
                ids.append(s.store_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=opener, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(ids)) == 1 and len(ids) == n
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{pg_schema}".meta').fetchone() == (1,)


def test_a_newer_schema_is_refused_and_left_alone(pg_dsn: str, pg_schema: str,
                                                  open_pg: Callable[..., PostgresStore]) -> None:
    open_pg(worker_id="w1").close()
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f'UPDATE "{pg_schema}".meta SET schema_version = %s', (VERSION + 1,))
    for readonly in (False, True):
        with pytest.raises(SchemaVersionError) as info:
            open_pg(worker_id="w2", readonly=readonly)
        assert info.value.code == "schema_version"
        assert info.value.found == VERSION + 1 and info.value.supported == VERSION
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f'SELECT schema_version FROM "{pg_schema}".meta').fetchone()
    assert row == (VERSION + 1,)


def test_readonly_never_creates_or_writes(pg_dsn: str, pg_schema: str,
                                          open_pg: Callable[..., PostgresStore]) -> None:
    with pytest.raises(StoreNotFoundError, match="no store here"):
        open_pg(worker_id="r", readonly=True)
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM information_schema.schemata "
                           "WHERE schema_name = %s", (pg_schema,)).fetchone()
    assert row == (0,)
    writer = open_pg(worker_id="w")
    with writer.begin("r") as txn:
        txn["k"] = "v"
    reader = open_pg(worker_id="r", readonly=True)
    assert reader.get("r", "k") == "v" and reader.runs() == ["r"]
    for write in (lambda: reader.begin("r"), lambda: reader.lease("r"),
                  lambda: reader.delete_run("r"), lambda: reader.claim_runs()):
        with pytest.raises(ReadOnlyError):
            write()


def test_an_unreachable_server_is_a_typed_error(tmp_path: object) -> None:
    dsn = f"postgresql://nobody@/postgres?host={tmp_path}&port=1"
    with pytest.raises(BackendUnavailableError) as info:
        open_postgres(dsn, worker_id="w")
    assert info.value.code == "backend_unavailable"
    assert "password" not in str(info.value)


def test_server_gone_while_open_is_a_typed_error(pg_dsn: str,
                                                 open_pg: Callable[..., PostgresStore]) -> None:
    store = open_pg(worker_id="w1", pool_size=1)
    with store.begin("r") as txn:
        txn["k"] = 1
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name LIKE 'agentwal:%%' AND pid <> pg_backend_pid()")
    # A session used within the last second is lent unchecked: the first call may meet the
    # dead session and say so with a typed error; the pool drops it, and the next call has a
    # new session (one idle for longer is checked on lending, and replaced at once).
    try:
        value = store.get("r", "k")
    except BackendUnavailableError:
        value = store.get("r", "k")
    assert value == 1


@pytest.mark.parametrize("bad", [{"schema": "Bad-Name"}, {"lease_ttl": 0}, {"pool_size": 0},
                                 {"durability": "sometimes"}, {"worker_id": ""}])
def test_bad_options_are_refused(pg_dsn: str, bad: dict[str, object]) -> None:
    with pytest.raises((ValueError, agentwal.InvalidKeyError)):
        open_postgres(pg_dsn, **bad)  # type: ignore[arg-type]


def test_the_uri_can_name_the_schema(pg_dsn: str, pg_schema: str) -> None:
    url = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={pg_schema}"
    with agentwal.open(url, worker_id="w1") as store, store.begin("r") as txn:
        txn["k"] = 1
    with open_postgres(pg_dsn, schema=pg_schema, worker_id="w2", readonly=True) as store:
        assert store.get("r", "k") == 1
    with pytest.raises(ValueError, match="names schema"):
        open_postgres(url, schema="other", worker_id="w3")


@pytest.mark.parametrize(("dsn", "split"), [
    ("postgresql://u@h/db?schema=a", ("postgresql://u@h/db", "a")),
    ("postgresql://u@h/db?host=%2Ftmp&schema=a&port=5", ("postgresql://u@h/db?host=%2Ftmp&port=5",
                                                        "a")),
    ("postgresql://u@h/db?sslmode=off", ("postgresql://u@h/db?sslmode=off", None)),
    ("host=h dbname=db", ("host=h dbname=db", None)),
])
def test_split_schema_keeps_the_other_parameters_as_written(
        dsn: str, split: tuple[str, str | None]) -> None:
    assert split_schema(dsn) == split


def test_create_false_refuses_a_missing_store(pg_dsn: str, pg_schema: str,
                                              open_pg: Callable[..., PostgresStore]) -> None:
    with pytest.raises(StoreNotFoundError, match="no store here"):
        open_pg(worker_id="w", create=False)
    assert _tables(pg_dsn, pg_schema) == set()
    open_pg(worker_id="w")
    assert open_pg(worker_id="w2", create=False).runs() == []
