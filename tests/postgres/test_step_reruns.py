"""``tests/effects/test_step_reruns.py`` (every way a step can be re-run) on PostgreSQL.

The same test functions, given a PostgreSQL store as ``store``; the few
that need what only a local store has are left out by name below.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentwal.postgres import PostgresStore
from tests.effects import test_step_reruns as local
from tests.effects.test_step_reruns import *  # noqa: F403  (the tests, collected here)
from tests.effects.test_step_reruns import shop  # noqa: F401  (its fixture)


@pytest.fixture
def store(open_pg: Callable[..., PostgresStore]) -> PostgresStore:
    return open_pg(worker_id="w1")


#: reopens ``store.path`` read-only (a PostgreSQL store's path names it, without credentials;
#: test_effects.py checks the read-only refusal there)
LOCAL_ONLY = {"test_store_aeffect_awaits_an_async_fn_and_a_read_only_store_refuses",
              # these open local stores of their own (folds, reopening, refresh)
              "test_commit_marks_survive_a_fold_and_a_reopen",
              "test_a_read_only_store_sees_commit_marks_after_refresh"}
for _name in LOCAL_ONLY:
    globals().pop(_name, None)
assert all(hasattr(local, n) for n in LOCAL_ONLY)
