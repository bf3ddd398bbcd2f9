"""``txn.effect(..., mode="exactly_once", transactional=True)``: business rows and the ledger
entry in one PostgreSQL transaction, so such an effect is never in doubt."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import agentwal
from agentwal import (
    BackendUnsupportedError,
    EffectContext,
    EffectNotAppliedError,
    LeaseLostError,
)
from agentwal.postgres import PostgresStore
from tests.postgres.test_failover import Worker, _rows, _wait_for_lease


@pytest.fixture
def shop(open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> PostgresStore:
    """A store whose schema also holds the business table ``orders``."""
    store = open_pg(worker_id="w1")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg_schema}".orders (key text PRIMARY KEY, who text)')
    return store


def orders(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return _rows(dsn, schema, "SELECT key, who FROM orders ORDER BY key")


def order_fn(calls: list[int], fail: bool = False) -> Callable[[EffectContext], str]:
    def order(ctx: EffectContext) -> str:
        calls.append(ctx.attempt)
        ctx.conn.execute("INSERT INTO orders (key, who) VALUES (%s, 'w1')", (ctx.key,))
        if fail:
            raise ConnectionError("the step failed after its insert")
        return f"order {len(calls)}"
    return order


def test_the_rows_and_the_outcome_commit_together(shop: PostgresStore, pg_dsn: str,
                                                  pg_schema: str) -> None:
    calls: list[int] = []
    with shop.begin("r") as txn:
        txn["receipt"] = txn.effect("order", order_fn(calls), mode="exactly_once",
                                    transactional=True, args={"n": 1})
    [entry] = shop.effects(run="r")
    assert entry.status == "done" and entry.result == "order 1" and entry.committed_in == 1
    assert orders(pg_dsn, pg_schema) == [(entry.key, "w1")]
    assert shop.get("r", "receipt") == "order 1"


def test_a_failed_call_leaves_neither_and_the_retry_calls_again(
        shop: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    calls: list[int] = []
    txn = shop.begin("r")
    with pytest.raises(ConnectionError):
        txn.effect("order", order_fn(calls, fail=True), mode="exactly_once", transactional=True)
    assert orders(pg_dsn, pg_schema) == [] and shop.effects() == []  # nothing in doubt
    txn.rollback()
    with shop.begin("r") as again:
        assert again.effect("order", order_fn(calls), mode="exactly_once",
                            transactional=True) == "order 2"
    assert len(orders(pg_dsn, pg_schema)) == 1 and calls == [1, 1]


def test_a_retried_step_meets_the_committed_effect_without_a_call(
        shop: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    calls: list[int] = []
    attempts: list[int] = []

    def step(txn: agentwal.Transaction) -> str:
        attempts.append(1)
        result: str = txn.effect("order", order_fn(calls), mode="exactly_once",
                                 transactional=True)
        txn["seen"] = txn.get("seen", 0)
        if len(attempts) == 1:  # another commit to a key this step read: it conflicts
            with shop.begin("r") as other:
                other["seen"] = 5
        return result

    assert shop.transact("r", step) == "order 1"
    assert len(attempts) == 2 and calls == [1] and len(orders(pg_dsn, pg_schema)) == 1


def test_a_taken_lease_calls_nothing(shop: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    calls: list[int] = []
    with shop.begin("r") as txn:
        txn["x"] = 1
    txn = shop.begin("r")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # another worker steals the run
        conn.execute(f'UPDATE "{pg_schema}".runs SET lease_owner = %s, '
                     "lease_epoch = lease_epoch + 1", ("thief",))
    with pytest.raises(LeaseLostError):
        txn.effect("order", order_fn(calls), mode="exactly_once", transactional=True)
    assert calls == [] and orders(pg_dsn, pg_schema) == [] and shop.effects() == []


def test_a_statement_that_failed_inside_fn_records_nothing(
        shop: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    def swallow(ctx: EffectContext) -> str:
        ctx.conn.execute("INSERT INTO orders (key, who) VALUES ('k', 'w1')")
        with contextlib.suppress(psycopg.errors.UniqueViolation):  # aborts the transaction
            ctx.conn.execute("INSERT INTO orders (key, who) VALUES ('k', 'again')")
        return "looked fine"

    with shop.begin("r") as txn:
        with pytest.raises(EffectNotAppliedError, match="aborted the transaction"):
            txn.effect("order", swallow, mode="exactly_once", transactional=True)
        txn["after"] = True
    assert orders(pg_dsn, pg_schema) == [] and shop.effects() == []
    assert shop.get("r", "after") is True


def test_bad_arguments_and_the_local_store_refuse(shop: PostgresStore, tmp_path: Path) -> None:
    calls: list[int] = []
    with shop.begin("r") as txn:
        with pytest.raises(ValueError, match="exactly_once"):
            txn.effect("order", order_fn(calls), mode="at_least_once", transactional=True)
        with pytest.raises(ValueError, match="retries"):
            txn.effect("order", order_fn(calls), mode="exactly_once", transactional=True,
                       retries=2)
    with agentwal.open(str(tmp_path / "l.awal"), durability="none") as local:
        with local.begin("r") as txn, pytest.raises(BackendUnsupportedError,
                                                    match="transactional"):
            txn.effect("order", order_fn(calls), mode="exactly_once", transactional=True)
        assert calls == [] and local.effects() == []


def test_a_worker_killed_inside_fn_leaves_neither(
        shop: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    """kill -9 after fn's insert, before COMMIT: no row, no entry; the next holder calls once."""
    a = Worker(pg_dsn, pg_schema, "A", "txeffect", "run")
    try:
        assert a.event() == {"inserted": True}
        a.kill(signal.SIGKILL)
        a.proc.wait()
    finally:
        a.stop()
    b = shop
    assert b.effects() == []  # never in doubt: the entry and the row went together
    _wait_for_lease(b, "run")
    calls: list[int] = []
    with b.begin("run") as txn:
        txn.effect("order", order_fn(calls), mode="exactly_once", transactional=True)
    rows = orders(pg_dsn, pg_schema)
    assert calls == [1] and [who for _key, who in rows] == ["w1"]
