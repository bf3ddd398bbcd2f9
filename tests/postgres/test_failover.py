"""Leases and fencing with real worker processes (tests/postgres/worker.py) and a short TTL.

No timed assertions: the tests wait for events (with generous bounds, so a
broken build fails instead of hanging) and check what the database holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentwal import LeaseHeldError, LeaseLostError
from agentwal.postgres import PostgresStore

TTL = 2.0
ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """A worker process and its event lines."""

    def __init__(self, dsn: str, schema: str, name: str, *args: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.postgres.worker", dsn, schema, name, str(TTL), *args],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"})

    def event(self, timeout: float = 60.0) -> dict[str, Any]:
        """The next event line (fails the test if none comes within ``timeout``)."""
        import selectors

        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"worker {self.name}: no event within {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"worker {self.name} exited ({self.proc.wait()})")
        event: dict[str, Any] = json.loads(line)
        return event

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        self.kill(signal.SIGCONT)
        self.kill(signal.SIGKILL)
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def spawn(pg_dsn: str, pg_schema: str,
          open_pg: Callable[..., PostgresStore]) -> Iterator[Callable[..., Worker]]:
    open_pg(worker_id="setup").close()  # create the schema once, before the workers race
    workers: list[Worker] = []

    def make(name: str, *args: str) -> Worker:
        w = Worker(pg_dsn, pg_schema, name, *args)
        workers.append(w)
        return w

    yield make
    for w in workers:
        w.stop()


def _wait_for_lease(store: PostgresStore, run: str, bound: float = 30 * TTL) -> int:
    """Poll ``store.lease(run)`` until it is granted; its epoch."""
    end = time.monotonic() + bound
    while True:
        try:
            return store.lease(run)
        except LeaseHeldError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def _rows(dsn: str, schema: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        return conn.execute(sql, args).fetchall()


def test_kill9_of_the_holder_hands_over_with_contiguous_history(
        spawn: Callable[..., Worker], open_pg: Callable[..., PostgresStore],
        pg_dsn: str, pg_schema: str) -> None:
    a = spawn("A", "loop", "run")
    assert a.event() == {"leased": True}
    for _ in range(3):
        assert "commit" in a.event()
    b = open_pg(worker_id="B", lease_ttl=TTL)
    with pytest.raises(LeaseHeldError) as info:
        b.lease("run")
    assert info.value.holder == "A" and info.value.code == "lease_held"
    a.kill()
    epoch_b = _wait_for_lease(b, "run")
    with b.begin("run") as txn:
        n = txn.get("n")
        txn["n"] = n + 1
        txn["last"] = "B"
    assert txn.checkpoint is not None
    rows = _rows(pg_dsn, pg_schema, "SELECT id, parent, lease_epoch FROM checkpoints "
                 "WHERE run = %s ORDER BY id", "run")
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    assert [r[1] for r in rows] == [None, *range(1, len(rows))]
    epochs = [r[2] for r in rows]
    assert epochs == sorted(epochs) and set(epochs) == {epoch_b - 1, epoch_b}
    assert epochs[-1] == epoch_b and b.get("run", "n") == len(rows) == txn.checkpoint.id


def test_a_stopped_holder_resumed_after_takeover_is_fenced(
        spawn: Callable[..., Worker], open_pg: Callable[..., PostgresStore]) -> None:
    b = open_pg(worker_id="B", lease_ttl=TTL)
    with b.begin("run") as txn:
        txn["who"] = "B0"
    b.release("run")
    a = spawn("A", "step", "run")
    epoch_a = a.event()["ready"]
    a.kill(signal.SIGSTOP)
    epoch_b = _wait_for_lease(b, "run")  # after A's lease expired
    assert epoch_b == epoch_a + 1
    with b.begin("run") as txn:
        txn["who"] = "B"
    a.kill(signal.SIGCONT)
    a.send("commit")
    assert a.event() == {"error": "lease_lost"}
    assert b.get("run", "who") == "B"
    head = b.head("run")
    assert head is not None and head.id == 2  # B0, B: A's write is absent
    with b.begin("run") as txn:  # B still holds the run
        txn["who"] = "B2"


def test_a_holder_frozen_inside_its_commit_does_not_block_the_takeover(
        spawn: Callable[..., Worker], open_pg: Callable[..., PostgresStore]) -> None:
    a = spawn("A", "frozen", "run")
    assert a.event() == {"frozen": True}  # stopped holding the run's row lock
    b = open_pg(worker_id="B", lease_ttl=TTL)
    _wait_for_lease(b, "run")
    with b.begin("run") as txn:
        txn["who"] = "B"
    a.kill(signal.SIGCONT)
    assert a.event()["error"] in ("backend_unavailable", "lease_lost")
    assert b.get("run", "who") == "B" and b.head("run").id == 1  # type: ignore[union-attr]


def test_an_effect_of_a_stopped_holder_is_in_doubt_and_its_outcome_refused(
        spawn: Callable[..., Worker], open_pg: Callable[..., PostgresStore]) -> None:
    a = spawn("A", "effect", "run")
    assert a.event() == {"calling": 1}  # the intent is recorded, the call under way
    a.kill(signal.SIGSTOP)
    b = open_pg(worker_id="B", lease_ttl=TTL)
    _wait_for_lease(b, "run")
    [entry] = b.effects(run="run")
    assert entry.status == "in_doubt" and entry.attempts == 1
    a.kill(signal.SIGCONT)
    a.send("returned")
    assert a.event() == {"error": "lease_lost"}  # the outcome write was fenced
    [entry] = b.effects(run="run")
    assert entry.status == "in_doubt"
    assert b.head("run") is None


def test_racing_acquirers_exactly_one_wins(spawn: Callable[..., Worker]) -> None:
    workers = [spawn(f"R{i}", "race", "run") for i in range(8)]
    for w in workers:
        assert w.event() == {"ready": True}
    for w in workers:
        w.send("go")
    results = [w.event() for w in workers]
    winners = [r for r in results if "won" in r]
    assert len(winners) == 1 and winners[0]["won"] == 1
    winner = workers[results.index(winners[0])].name
    assert all(r == {"held": winner} for r in results if "held" in r)


def test_claim_runs_adopts_each_orphaned_run_exactly_once(
        spawn: Callable[..., Worker], open_pg: Callable[..., PostgresStore],
        pg_dsn: str, pg_schema: str) -> None:
    runs = [f"run-{i:03d}" for i in range(60)]
    dead = open_pg(worker_id="dead", lease_ttl=TTL)
    for run in runs:
        with dead.begin(run) as txn:
            txn["owner"] = "dead"
    stale = dead.begin(runs[0])
    stale["owner"] = "late"
    dead._b.leases.close()  # it stops renewing: a crashed worker, as far as the fleet can tell
    before = dict(_rows(pg_dsn, pg_schema, "SELECT run, lease_epoch FROM runs"))
    end = time.monotonic() + 30 * TTL
    while _rows(pg_dsn, pg_schema, "SELECT count(*) FROM runs WHERE lease_expires > now()")[0][0]:
        assert time.monotonic() < end
        time.sleep(0.2)
    claimers = [spawn(f"C{i}", "claim", "7") for i in range(4)]
    claimed: dict[str, list[str]] = {}
    for c in claimers:
        while "done" not in (event := c.event()):
            for run in event["claimed"]:
                claimed.setdefault(run, []).append(c.name)
                assert event["epochs"][run] == before[run] + 1
    assert sorted(claimed) == runs
    assert all(len(who) == 1 for who in claimed.values())
    with pytest.raises(LeaseLostError):
        stale.commit()  # begun under the old epoch: fenced
    assert dead.get(runs[0], "owner") == "dead"


def test_acknowledged_sync_commits_survive_a_server_crash(tmp_path: Path) -> None:
    """``pg_ctl stop -m immediate`` and a restart while a worker commits (a dedicated server)."""
    from tests import pg

    why: list[str] = []
    if pg._system_bindir() is None:
        if pg.required():
            pytest.fail("no system initdb/pg_ctl (.ci/run installs Debian's postgresql)")
        pytest.skip("no system initdb/pg_ctl to restart a server with")
    server = pg._via_system(why)
    assert server is not None, why
    worker = Worker(server.dsn, "crash", "A", "durable", "run")
    try:
        acked: list[int] = []
        while len(acked) < 5:
            event = worker.event()
            assert "commit" in event, event
            acked.append(event["commit"])
        server.crash_restart()
        after = 0
        while after < 5:  # the worker reconnects (seeing typed errors, if any) and carries on
            event = worker.event()
            if "error" in event:
                assert event["error"] == "backend_unavailable"
            else:
                acked.append(event["commit"])
                after += 1
        worker.kill()
        worker.proc.wait()
        assert worker.proc.stdout is not None
        for line in worker.proc.stdout:  # acknowledged before the kill, not yet read
            event = json.loads(line)
            if "commit" in event:
                acked.append(event["commit"])
        with psycopg.connect(server.dsn) as conn:
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM crash.checkpoints WHERE run = 'run' ORDER BY id").fetchall()]
        assert ids == list(range(1, len(ids) + 1))
        assert set(acked) <= set(ids)  # every acknowledged commit is there
        assert acked == sorted(acked) and len(set(acked)) == len(acked)
    finally:
        worker.stop()
        server.stop()
