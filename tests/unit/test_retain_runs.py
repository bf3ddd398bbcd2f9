"""Issue #10, case 2: ``retain=`` runs in a typical agent, not only after 64 MiB of log.

Three sessions of 100 steps with ``KeepLast(5)`` used to keep 300
checkpoints: the policy ran only after background folds, and the fold at
``close()`` skipped it. It now runs at ``close()``, at ``snapshot()``, and
after ``_RETAIN_COMMITS`` commits or ``_retain_every`` seconds, whichever
comes first.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import agentwal
from agentwal import KeepFor, KeepLast
from agentwal.local.engine import _RETAIN_COMMITS


def _session(path: Path, steps: int, **kw: object) -> None:
    with agentwal.open(path, retain=KeepLast(5), **kw) as store:  # type: ignore[arg-type]
        for _ in range(steps):
            with store.begin("chat") as txn:
                txn["n"] = txn.get("n", 0) + 1


def test_three_sessions_keep_the_last_five(tmp_path: Path) -> None:
    path = tmp_path / "s"
    for _ in range(3):
        _session(path, 100)
    with agentwal.open(path, readonly=True) as store:
        assert [c.id for c in store.history("chat")] == [300, 299, 298, 297, 296]
        assert store.get("chat", "n") == 300
        assert store.state("chat", at=296) == {"n": 296}


def test_snapshot_applies_the_policy(tmp_path: Path) -> None:
    with agentwal.open(tmp_path / "s", retain=KeepLast(2)) as store:
        for i in range(10):
            with store.begin("r") as txn:
                txn["i"] = i
        store.snapshot()
        assert [c.id for c in store.history("r")] == [10, 9]
        assert store.stats()["retention_passes"] == 1


def test_a_long_session_is_trimmed_every_n_commits(tmp_path: Path) -> None:
    """No close, no snapshot, far below wal_max_bytes: the commit count alone triggers it."""
    with agentwal.open(tmp_path / "s", retain=KeepLast(3)) as store:
        for i in range(_RETAIN_COMMITS + 5):
            with store.begin("r") as txn:
                txn["i"] = i
        deadline = time.monotonic() + 60  # the fold thread runs the pass
        while store.stats()["retention_passes"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.stats()["retention_passes"] >= 1
        assert len(store.history("r")) <= 3 + 5 + 1  # trimmed at the N-th commit, some after


def test_keep_for_at_close(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with agentwal.open(path, retain=KeepFor(dt.timedelta(0))) as store:
        for i in range(4):
            with store.begin("r") as txn:
                txn["i"] = i
    with agentwal.open(path, readonly=True) as store:
        assert [c.id for c in store.history("r")] == [4]  # the head is always kept
