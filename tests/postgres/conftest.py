"""Fixtures of the PostgreSQL backend's tests: stores (workers) on a fresh schema per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentwal.postgres import PostgresStore, open_postgres


@pytest.fixture
def open_pg(pg_dsn: str, pg_schema: str) -> Iterator[Callable[..., PostgresStore]]:
    """``open_pg(worker_id=..., **options)``: a store on this test's schema, closed after."""
    opened: list[PostgresStore] = []

    def make(**options: Any) -> PostgresStore:
        options.setdefault("schema", pg_schema)
        options.setdefault("durability", "async")
        store = open_postgres(pg_dsn, **options)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def pgstore(open_pg: Callable[..., PostgresStore]) -> PostgresStore:
    return open_pg(worker_id="w1")


@pytest.fixture
def url(pg_dsn: str, pg_schema: str) -> str:
    """The test's store as the CLI is given it: the schema in the URI's query."""
    return f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={pg_schema}"
