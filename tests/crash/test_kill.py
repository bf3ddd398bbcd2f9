"""Process kills: a child commits and reports every acknowledgement; the parent SIGKILLs it.

After each kill the store is reopened (by the next child, or by the parent) and
must hold exactly the commits up to the last acknowledged one, or those plus
the one in flight: never fewer, never a partial or rolled-back transaction.
Seeded and bounded; ``AGENTWAL_KILL_ROUNDS`` raises the count for long runs.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

import agentwal
from agentwal import failpoints
from agentwal.testing.proc import KILL_POINTS

ROUNDS = int(os.environ.get("AGENTWAL_KILL_ROUNDS", "8"))
FAILPOINT_ROUNDS = int(os.environ.get("AGENTWAL_FAILPOINT_ROUNDS", "2"))
RUNS = ("alpha", "beta", "gamma")

# The child: resumes from the store, commits step after step, prints "ACK n" after
# each commit() returns. Steps with n % 7 == 3 first roll back a poisoned write.
CHILD = r"""
import sys, agentwal
from agentwal import failpoints
path, mode = sys.argv[1], sys.argv[2]
if len(sys.argv) > 3:  # die at the n-th hit of a failpoint
    failpoints.arm(sys.argv[3], "kill", nth=int(sys.argv[4]))
store = agentwal.open(path, durability=mode, wal_max_bytes=48 << 10, segment_bytes=16 << 10)
n = sum(store.get(r, "count", 0) for r in ("alpha", "beta", "gamma"))
print("START", n, flush=True)
while True:
    run = ("alpha", "beta", "gamma")[n % 3]
    if n % 7 == 3:
        with store.begin(run) as bad:
            bad["poison"] = n
            bad.rollback()
    with store.begin(run) as txn:
        count = txn.get("count", 0)
        txn["count"] = count + 1
        txn[f"k{n}"] = {"n": n, "pad": "x" * (n * 37 % 900)}
        if n % 5 == 0 and n >= 3:
            txn.delete(f"k{n - 3}")
        txn.meta(step=n)
    print("ACK", n, flush=True)
    n += 1
"""


def model(upto: int) -> dict[str, dict[str, Any]]:
    """State of every run after steps 0..upto-1."""
    state: dict[str, dict[str, Any]] = {r: {} for r in RUNS}
    for n in range(upto):
        s = state[RUNS[n % 3]]
        s["count"] = s.get("count", 0) + 1
        s[f"k{n}"] = {"n": n, "pad": "x" * (n * 37 % 900)}
        if n % 5 == 0 and n >= 3:
            s.pop(f"k{n - 3}", None)
    return state


def observed(path: str) -> tuple[int, dict[str, dict[str, Any]]]:
    with agentwal.open(path) as s:
        states = {r: (s.state(r) if s.head(r) else {}) for r in RUNS}
        for r in RUNS:
            hist = s.history(r)
            assert [c.id for c in hist] == list(range(len(hist), 0, -1))
            assert len(hist) == states[r].get("count", 0)
            assert "poison" not in states[r]
    return sum(st.get("count", 0) for st in states.values()), states


def run_child(path: str, mode: str, kill_after: int, delay: float,
              failpoint: tuple[str, int] | None = None) -> tuple[int, int]:
    """Start a child, let it ack ``kill_after`` commits, kill it; returns (start, last ack).

    With ``failpoint``, the child arms it to kill the process on its n-th hit,
    and must die there (exit status 137) before it acks ``kill_after`` commits.
    """
    extra = [failpoint[0], str(failpoint[1])] if failpoint else []
    child = subprocess.Popen([sys.executable, "-c", CHILD, path, mode, *extra],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    start, last = -1, -1
    try:
        for line in child.stdout:
            if not line.endswith("\n") or len(line.split()) != 2:
                continue  # cut short by the kill
            word, num = line.split()
            if word == "START":
                start = int(num)
                last = start - 1
            else:
                last = int(num)
                if last - start + 1 >= kill_after:
                    break
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        code = child.wait()
    if failpoint is not None:  # not killed by us: the failpoint fired
        assert code == 137, f"the child never reached {failpoint[0]} (hit #{failpoint[1]})"
    for line in child.stdout.read().splitlines(keepends=True):  # printed before the kill
        if line.startswith("ACK ") and line.endswith("\n"):  # a cut line is no ack
            last = int(line.split()[1])
    return start, last


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_loop_loses_no_acknowledged_commit(tmp_path: Any, mode: str) -> None:
    rng = random.Random(f"kill-{mode}")
    path = str(tmp_path / "store")
    acked = 0
    for _ in range(ROUNDS):
        start, last = run_child(path, mode, rng.randint(1, 40), rng.choice([0, 0.001, 0.01]))
        assert start >= acked  # the child resumed with everything acknowledged so far
        acked = last + 1
        total, states = observed(path)
        assert total in (acked, acked + 1), (total, acked)
        assert states == model(total)
        acked = total


# Points hit while committing, rotating, folding (the kill tier's); recovery points are
# hit by the next open. run_child asserts the child died at its point.
WORK_POINTS = list(KILL_POINTS)
RECOVERY_POINTS = sorted(p for p in failpoints.POINTS if p.startswith("recovery"))


@pytest.mark.parametrize("point", WORK_POINTS)
def test_kill_at_failpoint(tmp_path: Any, point: str) -> None:
    """Die exactly at ``point`` (on a seeded n-th hit); recovery keeps every ack."""
    rng = random.Random(point)
    path = str(tmp_path / "store")
    acked = 0
    rare = "segment" in point or "fold" in point  # once per rotation or fold
    for _ in range(FAILPOINT_ROUNDS):
        nth = rng.randint(1, 2 if rare else 25)
        start, last = run_child(path, "sync", 10_000, 0.0, (point, nth))
        assert start == -1 or start >= acked  # -1: it died inside open()
        acked = max(acked, last + 1)
        total, states = observed(path)
        assert total in (acked, acked + 1), (point, total, acked)
        assert states == model(total)
        acked = total


@pytest.mark.parametrize("point", RECOVERY_POINTS)
def test_kill_during_recovery(tmp_path: Any, point: str) -> None:
    """A crash while recovering leaves a store that recovers to the same state."""
    path = str(tmp_path / "store")
    _, last = run_child(path, "async", 25, 0.0)
    start, _ = run_child(path, "sync", 10_000, 0.0, (point, 1))
    assert start == -1  # it died inside open(), before printing START
    total, states = observed(path)
    assert total in (last + 1, last + 2)
    assert states == model(total)
