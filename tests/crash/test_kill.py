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

ROUNDS = int(os.environ.get("AGENTWAL_KILL_ROUNDS", "8"))
RUNS = ("alpha", "beta", "gamma")

# The child: resumes from the store, commits step after step, prints "ACK n" after
# each commit() returns. Steps with n % 7 == 3 first roll back a poisoned write.
CHILD = r"""
import sys, agentwal
path, mode = sys.argv[1], sys.argv[2]
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


def run_child(path: str, mode: str, kill_after: int, delay: float) -> tuple[int, int]:
    """Start a child, let it ack ``kill_after`` commits, kill it; returns (start, last ack)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, path, mode],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    start, last = -1, -1
    try:
        for line in child.stdout:
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
        child.wait()
    for line in child.stdout.read().splitlines():  # acks printed before the kill landed
        if line.startswith("ACK "):
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
