"""The backends the conformance suites run against, at both levels.

Each kind opens a store two ways: the facade (``agentwal.Store``, driven by the
store-against-a-dict state machines in ``tests/property/test_store_model.py``) and
the ``backend.Backend`` Protocol (``tests/conformance/test_backend.py``). A new
backend adds one entry to :data:`KINDS`; both suites then run against it. A
kind that needs pytest fixtures (``fixtures``: PostgreSQL's server and schema)
runs the state machines from its own tests (``tests/postgres/test_model.py``),
since a hypothesis TestCase takes no fixtures.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import agentwal
from agentwal.testing import backend, crash


@dataclass(frozen=True)
class Kind:
    """How to open a fresh store of one backend."""

    name: str
    #: ``open_store(path, **options)``: the facade over the store at ``path``
    open_store: Callable[..., agentwal.Store]
    #: ``open_backend(directory)``: a fresh, empty store in ``directory`` as a Backend
    open_backend: Callable[[str], Any]
    #: what ``testing.crash`` does to a store of this kind, or None (no in-process crash)
    crash: Callable[[agentwal.Store], None] | None = None
    #: pytest fixtures whose values ``open_backend`` also takes, as keywords (a server's)
    fixtures: tuple[str, ...] = ()


def _local_backend(directory: str) -> Any:
    return backend(agentwal.open(os.path.join(directory, "store.awal"), durability="none"))


def _postgres_backend(directory: str, *, pg_dsn: str, pg_schema: str) -> Any:
    """A fresh store in the test's schema of the session's server (``tests/pg.py``)."""
    from agentwal.postgres.backend import PostgresBackend

    return PostgresBackend(pg_dsn, schema=pg_schema, worker_id="conformance", lease_ttl=30.0,
                           synchronous=False, readonly=False, pool_size=2)


KINDS: dict[str, Kind] = {
    "local": Kind("local", agentwal.open, _local_backend, crash),
    # the facade's state machines run on PostgreSQL in tests/postgres/test_model.py
    "postgres": Kind("postgres", agentwal.open, _postgres_backend, crash,
                     fixtures=("pg_dsn", "pg_schema")),
}
