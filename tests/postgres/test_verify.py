"""``verify`` on PostgreSQL: the chain recomputed from the rows; damage found and named."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
import pytest

from agentwal.postgres import PostgresStore
from tests.postgres.test_cli import run


@pytest.fixture
def filled(open_pg: Callable[..., PostgresStore]) -> PostgresStore:
    store = open_pg(worker_id="w1")
    for i in range(4):
        with store.begin("r") as txn:
            txn["step"] = i
            txn["big"] = {"text": "x" * 300, "i": i}  # in vals, by digest
            txn.meta(i=i)
            if i == 2:
                txn.defer("mail", mode="at_least_once", args={"i": i})
    store.fork("r", 2, "f")
    return store


def damage(dsn: str, schema: str, sql: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        conn.execute(sql)


def test_a_sound_store_verifies(filled: PostgresStore) -> None:
    report = filled.verify()
    assert report.ok and report.problems == []
    assert report.checked["checkpoints"] == 5 and report.checked["hashes"] == 5
    assert report.checked["runs"] == 2 and report.checked["vals"] >= 4


@pytest.mark.parametrize(("sql", "table", "what"), [
    ("UPDATE vals SET data = data || '\\x00'::bytea WHERE digest = (SELECT digest "
     "FROM vals ORDER BY digest LIMIT 1)", "vals", "does not hash"),
    ("DELETE FROM deltas WHERE run = 'r' AND ckpt = 2 AND key = 'step'", "checkpoints",
     "not the delta"),
    ("UPDATE checkpoints SET meta = '\\xa0'::bytea WHERE run = 'r' AND id = 3",
     "checkpoints", "hash chain broken"),
    ("UPDATE runs SET head_hash = '\\x00'::bytea WHERE run = 'r'", "runs", "the head"),
    ("UPDATE deltas SET inline = '\\xff'::bytea WHERE run = 'r' AND ckpt = 1 AND key = 'step'",
     "deltas", "does not decode"),
])
def test_damage_is_found_and_named(filled: PostgresStore, pg_dsn: str, pg_schema: str,
                                   sql: str, table: str, what: str) -> None:
    damage(pg_dsn, pg_schema, sql)
    report = filled.verify()
    assert not report.ok
    assert any(p.db == table and what in p.what for p in report.problems), report.problems


def test_the_cli_verifies_a_url(filled: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    url = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={pg_schema}"
    code, out = run("verify", url, "--json")
    assert code == 0 and json.loads(out)["ok"] is True, out
    damage(pg_dsn, pg_schema, "UPDATE checkpoints SET created_at = 0 WHERE id = 1")
    code, out = run("verify", url, "--json")
    assert code == 1 and json.loads(out)["ok"] is False, out
