"""Leases within one test process: several stores are several workers."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from agentwal import LeaseHeldError, LeaseLostError, StoreClosedError, StoreLockedError
from agentwal.postgres import PostgresStore
from agentwal.postgres.db import app_name
from agentwal.testing import crash


def test_lease_held_names_the_holder_and_changes_nothing(
        open_pg: Callable[..., PostgresStore]) -> None:
    a, b = open_pg(worker_id="A"), open_pg(worker_id="B")
    with a.begin("r") as txn:
        txn["k"] = 1
    with pytest.raises(LeaseHeldError) as info:
        b.begin("r")
    exc = info.value
    assert isinstance(exc, StoreLockedError) and exc.code == "lease_held"
    assert exc.holder == "A" and exc.run == "r" and exc.expires is not None
    assert "'A'" in str(exc)
    assert b.get("r", "k") == 1  # reading needs no lease


def test_every_acquire_bumps_the_epoch(open_pg: Callable[..., PostgresStore]) -> None:
    a, b = open_pg(worker_id="A"), open_pg(worker_id="B")
    assert a.lease("r") == 1
    assert a.lease("r") == 1  # held and live: kept
    assert a.release("r") and not a.release("r")
    assert b.lease("r") == 2
    b.release("r")
    assert a.lease("r") == 3


def test_a_released_lease_fences_the_transactions_begun_under_it(
        open_pg: Callable[..., PostgresStore]) -> None:
    a, b = open_pg(worker_id="A"), open_pg(worker_id="B")
    txn = a.begin("r")
    txn["k"] = "a"
    a.release("r")
    with b.begin("r") as other:
        other["k"] = "b"
    with pytest.raises(LeaseLostError) as info:
        txn.commit()
    assert info.value.code == "lease_lost" and info.value.epoch == 1
    assert a.get("r", "k") == "b"


def test_close_releases_the_leases(open_pg: Callable[..., PostgresStore]) -> None:
    a, b = open_pg(worker_id="A"), open_pg(worker_id="B")
    a.lease("r1")
    a.lease("r2")
    a.close()
    assert b.lease("r1") == 2 and b.lease("r2") == 2


def test_a_crashed_worker_keeps_its_leases_until_they_expire(
        open_pg: Callable[..., PostgresStore]) -> None:
    a, b = open_pg(worker_id="A"), open_pg(worker_id="B")
    a.lease("r1")
    crash(a)  # testing.crash: the process died, nothing released
    with pytest.raises(LeaseHeldError) as held:
        b.lease("r1")
    assert held.value.holder == "A"
    with pytest.raises(StoreClosedError):
        a.lease("r1")


def test_an_expired_holder_stuck_holding_the_row_is_ended(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    """A stale holder whose session the server's idle timeout never ends (a frozen pipeline)."""
    a = open_pg(worker_id="A")
    a.lease("r")
    a._b.leases.close()  # no more renewals
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the lease runs out
        conn.execute(f'UPDATE "{pg_schema}".runs SET lease_expires = now() - interval \'1 s\' '
                     "WHERE run = %s", ("r",))
    stuck = psycopg.connect(pg_dsn, application_name=app_name("A"))
    stuck.execute("SET idle_in_transaction_session_timeout = 0")
    stuck.execute(f'SELECT 1 FROM "{pg_schema}".runs WHERE run = %s FOR UPDATE', ("r",))
    b = open_pg(worker_id="B")
    try:
        assert b.lease("r") == 2
        with pytest.raises(psycopg.OperationalError):
            stuck.execute("SELECT 1")
    finally:
        stuck.close()


def test_a_live_holder_in_a_commit_is_left_alone(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    a = open_pg(worker_id="A")
    a.lease("r")
    busy = psycopg.connect(pg_dsn, application_name=app_name("A"))
    busy.execute(f'SELECT 1 FROM "{pg_schema}".runs WHERE run = %s FOR UPDATE', ("r",))
    b = open_pg(worker_id="B")
    try:
        with pytest.raises(LeaseHeldError) as info:
            b.lease("r")
        assert info.value.holder == "A"  # a live lease: its session is not touched
        assert busy.execute("SELECT 1").fetchone() == (1,)
    finally:
        busy.close()


def test_a_late_heartbeat_renews_in_place_an_expired_lease_is_taken_anew(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    a = open_pg(worker_id="A")
    assert a.lease("r") == 1
    lease = a._b.leases.held("r")
    assert lease is not None
    lease.deadline = 0.0  # past the local deadline; the server still shows it A's
    assert not lease.live()
    assert a.lease("r") == 1 and lease.live()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # now it really expires
        conn.execute(f'UPDATE "{pg_schema}".runs SET lease_expires = now() - interval \'1 s\' '
                     "WHERE run = %s", ("r",))
    lease.deadline = 0.0
    assert a.lease("r") == 2  # taken again, with a new epoch
    assert lease.lost is not None
