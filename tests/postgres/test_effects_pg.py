"""``tests/effects/test_effects.py`` (the ledger: modes, in doubt, divergence) on PostgreSQL.

The same test functions, given a PostgreSQL store as ``store``; those that
need what only a local store has are left out by name below, and those that
take no ``store`` (they open local stores of their own) are not collected twice.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentwal.postgres import PostgresStore
from tests.effects import test_effects as local
from tests.effects.conftest import _disarm, down  # noqa: F401  (their fixtures)
from tests.effects.test_effects import *  # noqa: F403  (the tests, collected here)
from tests.postgres.rerun import keep_store_tests


@pytest.fixture
def store(open_pg: Callable[..., PostgresStore]) -> PostgresStore:
    return open_pg(worker_id="w1")


#: they need the local stats' record counters or its WAL record size limit
LOCAL_ONLY = {
    "test_stats_count_effect_records_apart_from_commits",
    "test_oversized_entries_are_refused_not_logged",
}
keep_store_tests(globals(), local, LOCAL_ONLY)
