"""The store-vs-dict-model state machines (tests/property/test_store_model.py) on PostgreSQL.

The machines are the local engine's, unchanged where the backends agree: the
same rules (puts, deletes, reads, prefix scans, meta, savepoints, commits,
rollbacks, ``rollback_to``, ``fork``, racing transactions on one run) and the
same invariant (state, head, history and hashes equal the model's after
every step). What differs: there is no fold (``snapshot`` is not a rule),
no ``verify`` yet, and a "crash" drops the store without closing it (its
leases stay behind, held by the same worker id, which takes them again on
the next open with a new epoch).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from agentwal.postgres import PostgresStore, open_postgres
from agentwal.testing import crash as crash_store
from tests.property import test_store_model as model

_server: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _dsn(pg_dsn: str) -> Iterator[None]:
    _server["dsn"] = pg_dsn
    yield


class _OnPostgres:
    """Mixed into a machine: a fresh schema per example instead of a directory."""

    store: Any
    counts: dict[str, int]

    def __init__(self) -> None:
        self.schema = f"m_{uuid.uuid4().hex[:12]}"
        super().__init__()
        self.store.close()  # the base opened a local store: this machine runs on PostgreSQL
        self.store = self._open_pg()

    def teardown(self) -> None:
        try:
            super().teardown()  # type: ignore[misc]
        finally:
            self._drop()

    def _open_pg(self) -> PostgresStore:
        return open_postgres(_server["dsn"], schema=self.schema, worker_id="model",
                             durability="async", pool_size=2)

    def _crash_or_close(self, crash: bool) -> None:
        if crash:  # the process died: nothing released, sessions just gone
            crash_store(self.store)
            self.counts["crashes"] += 1
        else:
            self.store.close()
            self.counts["closes"] += 1

    def _drop(self) -> None:
        with psycopg.connect(_server["dsn"], autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


class StoreMachinePg(_OnPostgres, model.StoreMachine):
    snapshot = None  # type: ignore[assignment]  # no fold on PostgreSQL
    verify = None  # type: ignore[assignment]  # store.verify() is not there yet

    @rule(crash=st.booleans())
    def reopen(self, crash: bool) -> None:
        self._crash_or_close(crash)
        self._kill(list(self.txns.values()))
        self.txns.clear()
        self.store = self._open_pg()


class ConcurrencyMachinePg(_OnPostgres, model.ConcurrencyMachine):
    snapshot_or_reopen = None  # type: ignore[assignment]

    @rule(crash=st.booleans())
    def reopen(self, crash: bool) -> None:
        self._crash_or_close(crash)
        self._kill(list(self.slots.values()))
        self.slots.clear()
        self.store = self._open_pg()


StoreMachinePg.TestCase.settings = settings(max_examples=25, stateful_step_count=30,
                                            deadline=None)
ConcurrencyMachinePg.TestCase.settings = settings(max_examples=25, stateful_step_count=30,
                                                  deadline=None)
TestStoreModelPg = StoreMachinePg.TestCase
TestConcurrencyPg = ConcurrencyMachinePg.TestCase
