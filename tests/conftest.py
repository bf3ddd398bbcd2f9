"""Shared fixtures: a fresh store directory per test, failpoints always disarmed, and a
real PostgreSQL server (``pg_server``/``pg_dsn``/``pg_schema``, see tests/pg.py)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal import failpoints, tree_scan


@pytest.fixture(autouse=True)
def _disarm_failpoints() -> Iterator[None]:
    failpoints.disarm()
    yield
    failpoints.disarm()


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "store.awal")


@pytest.fixture
def store(path: str) -> Iterator[agentwal.Store]:
    s = agentwal.open(path, durability="none", segment_bytes=65536, wal_max_bytes=1 << 20)
    yield s
    s.close()


# -- the tree walks: the C listing and its pure-Python twin ------------------------------


def ext_required() -> bool:
    """True where a C walk that did not build is a failure, not a skip (CI)."""
    return (os.environ.get("AGENTWAL_REQUIRE_EXT") == "1"
            or os.environ.get("CI", "").lower() in ("1", "true", "yes"))


@pytest.fixture(params=["c", "python"])
def walker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs the test once with each implementation of ``tree_scan.scan`` (child processes
    too: ``AGENTWAL_NO_EXT`` is set for the Python one). Modules of tree tests use it
    with ``pytestmark = pytest.mark.usefixtures("walker")``."""
    impl = request.param
    if impl == "c" and not tree_scan.HAVE_EXTENSION:
        if ext_required():
            pytest.fail(f"the C walk is required here: {tree_scan.WHY_NOT}")
        pytest.skip(f"the C walk: {tree_scan.WHY_NOT}")
    before = tree_scan.implementation()
    if impl == "python":
        monkeypatch.setenv("AGENTWAL_NO_EXT", "1")
    else:
        monkeypatch.delenv("AGENTWAL_NO_EXT", raising=False)
    tree_scan.use(impl)
    yield impl
    tree_scan.use(before)


# -- PostgreSQL (tests/pg.py): one real server per session, started on first use ----------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    from tests import pg

    why_not: list[str] = []
    srv = pg.start(why_not)
    if srv is None:
        reason = "no PostgreSQL server: " + "; ".join(why_not)
        if pg.required():
            pytest.fail(reason + " (required here: CI or AGENTWAL_REQUIRE_PG=1)")
        pytest.skip(reason)
    yield srv
    srv.stop()


@pytest.fixture
def pg_dsn(pg_server: Any) -> str:
    """The session server's DSN."""
    return str(pg_server.dsn)


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema name for this test (created by the store's first open), dropped after."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
