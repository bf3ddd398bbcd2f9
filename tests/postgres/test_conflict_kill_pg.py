"""``tests/crash/test_conflict_kill.py`` on PostgreSQL: the worker dies, another resumes the run.

The same child (the tutorial's step: read the inbox, charge, and once let a
"web handler" commit to the inbox so the step's commit conflicts) runs as a
worker with a short lease and is killed in a window where its charge is
recorded and uncommitted while the run moved on: just after the web
handler's commit landed (before the step's own commit), or between the
conflicted attempt and its retry. Once its lease has expired, a second
worker (another process) resumes the agent from the head it finds. The
charge is ``at_most_once``, the mode that shows a second call under a new
key at once: the resumed step must find the dead worker's entry (the
plain re-begin through the adoption walk) and call nothing.

The workers hold their leases with a long TTL, and the test ends the dead
worker's lease on the server once it was killed (as the TTL running out
would). With a short TTL the test depended on time: a worker paused for more
than its TTL in the middle of its step (a loaded machine: the heartbeat
thread not scheduled in time) rightly stops acting on the run
(``LeaseLostError``), which is not the window under test; at the stop of
session 6 one whole-suite run failed that way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from agentwal import LeaseHeldError
from agentwal.postgres import PostgresStore
from tests.crash.test_conflict_kill import child, counts

#: long enough that no pause of a loaded machine outlasts it (nothing here waits for it)
TTL = 600.0
CASES = [("pg_commit_after_commit:1", "plain"), ("pg_commit_after_commit:1", "transact"),
         ("step_before_retry:1", "transact")]


@pytest.mark.parametrize(("window", "flavor"), CASES)
def test_a_worker_killed_after_its_charge_and_the_conflicting_commit_charges_once(
        tmp_path: Path, url: str, open_pg: Callable[..., PostgresStore], pg_dsn: str,
        pg_schema: str, window: str, flavor: str) -> None:
    spec = {"mode": "at_most_once", "down": {}, "flavor": flavor,
            "open": {"lease_ttl": TTL, "durability": "sync"},
            "flag": str(tmp_path / "web-done")}
    first = child(tmp_path, spec, window, store=url)
    assert first.returncode == 137, (first.returncode, first.stdout, first.stderr)
    assert counts(tmp_path) == (1, 1)
    watcher = open_pg(worker_id="watcher", lease_ttl=TTL)
    with pytest.raises(LeaseHeldError):  # the dead worker still holds the run
        watcher.lease("run")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # its lease runs out
        conn.execute(f'UPDATE "{pg_schema}".runs SET lease_expires = clock_timestamp() '
                     "- interval '1 s' WHERE run = %s", ("run",))
    resumed = child(tmp_path, spec, store=url)  # takes the expired lease over
    assert resumed.returncode == 0, resumed.stderr
    out = resumed.stdout.strip().splitlines()[-1]
    assert out.startswith("RESULT"), out
    assert counts(tmp_path) == (1, 1), out
    (e,) = watcher.effects()
    head = watcher.head("run")
    assert head is not None and e.status == "done" and e.committed_in == head.id
    assert watcher.get("run", "inbox") == ["a user message"]
