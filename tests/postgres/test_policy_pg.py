"""``tests/effects/test_policy.py`` (the mode rules per crash window) on PostgreSQL.

The same test functions, given a PostgreSQL store as ``store``; those that
need what only a local store has are left out by name below, and those that
take no ``store`` (they open local stores of their own) are not collected twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from agentwal.postgres import PostgresStore
from tests.effects import test_policy as local
from tests.effects.conftest import _disarm, down  # noqa: F401  (their fixtures)
from tests.effects.test_policy import *  # noqa: F403  (the tests, collected here)


@pytest.fixture
def store(open_pg: Callable[..., PostgresStore]) -> PostgresStore:
    return open_pg(worker_id="w1")


LOCAL_ONLY: set[str] = set()
for _name in LOCAL_ONLY:
    globals().pop(_name, None)
assert all(hasattr(local, n) for n in LOCAL_ONLY)
for _name, _fn in list(globals().items()):  # those that open local stores of their own
    if _name.startswith("test_") and "store" not in inspect.signature(_fn).parameters:
        del globals()[_name]
