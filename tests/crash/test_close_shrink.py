"""A clean close leaves a first-size segment, not a grown one's preallocated zeros.

A busy store's segments double up to ``segment_bytes``; before, the current one
stayed that big at rest (disk held by an idle store, read whole by every open to
check where the log ends). ``close()`` now folds, then continues the log in a
new first-size segment and removes the old one (``Writer.restart_small``). These
tests check the result and that a process killed in each window of that step
loses nothing: the reopened store holds every commit, verifies, and the next
clean close finishes the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentwal
from agentwal.format import FIRST_SEGMENT_BYTES, SEGMENT_SUFFIX

STEPS = 400


def _segments(path: Path) -> list[tuple[str, int]]:
    wal = path / "wal"
    return sorted((n, (wal / n).stat().st_size) for n in os.listdir(wal)
                  if n.endswith(SEGMENT_SUFFIX))


def _fill(store: agentwal.Store, start: int, steps: int) -> None:
    for i in range(start, start + steps):
        with store.begin("agent") as txn:
            txn["step"] = i
            txn[f"note{i}"] = "x" * 1500


def _check(store: agentwal.Store, steps: int) -> None:
    assert store.get("agent", "step") == steps - 1
    assert len(store.history("agent")) == steps
    assert store.get("agent", f"note{steps - 1}") == "x" * 1500


def test_a_clean_close_leaves_one_first_size_segment(tmp_path: Path) -> None:
    path = tmp_path / "s.awal"
    store = agentwal.open(path)
    _fill(store, 0, STEPS)
    grown = _segments(path)
    assert max(size for _n, size in grown) > FIRST_SEGMENT_BYTES  # the log grew
    store.close()
    assert [size for _n, size in _segments(path)] == [FIRST_SEGMENT_BYTES]
    with agentwal.open(path) as again:
        assert again.stats()["recovery"]["replayed"] == 0
        _check(again, STEPS)
        _fill(again, STEPS, 3)  # the log goes on in the small segment
    assert [size for _n, size in _segments(path)] == [FIRST_SEGMENT_BYTES]
    with agentwal.open(path) as third:
        _check(third, STEPS + 3)
        assert third.verify().ok


def test_a_close_with_a_small_segment_changes_no_file(tmp_path: Path) -> None:
    path = tmp_path / "s.awal"
    with agentwal.open(path) as store:
        _fill(store, 0, 3)
    before = _segments(path)
    with agentwal.open(path) as store:
        _check(store, 3)
    assert _segments(path) == before  # the same segment, not a new one per close


# The child: grows the log, folds it (so close() folds nothing more and each armed
# point's first hit is in the shrink), prints DONE, then dies at the armed point.
CHILD = r"""
import sys
import agentwal
from agentwal import failpoints
sys.path.insert(0, sys.argv[3])
from test_close_shrink import STEPS, _fill
store = agentwal.open(sys.argv[1])
_fill(store, 0, STEPS)
store.snapshot()
print("DONE", flush=True)
failpoints.arm(sys.argv[2], "kill", exit_code=137)
store.close()
print("CLOSED", flush=True)
"""


@pytest.mark.parametrize("point", ["before_segment_create", "segment_preallocated",
                                   "after_segment_create", "before_segment_remove",
                                   "after_segment_remove"])
def test_a_kill_in_each_window_of_the_shrink_loses_nothing(tmp_path: Path, point: str) -> None:
    path = tmp_path / "s.awal"
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), point,
                           str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert "DONE" in done.stdout, done.stderr[-2000:]
    assert done.returncode == 137 and "CLOSED" not in done.stdout, (done.returncode,
                                                                    done.stderr[-2000:])
    with agentwal.open(path) as store:
        _check(store, STEPS)
        assert store.verify().ok
    # the next clean close finishes what the killed one began
    assert [size for _n, size in _segments(path)] == [FIRST_SEGMENT_BYTES]
    with agentwal.open(path) as store:
        _check(store, STEPS)
