"""delete_run and compact under process kills: the store opens to before or after, never between.

The parent builds a store (runs ``victim``, ``keep`` and a fork ``f`` of
``victim``; some checkpoints folded into LMDB, the last ones only in the
WAL), and remembers every checkpoint's state. A child opens it, arms one
failpoint with ``kill`` and deletes ``victim`` (then folds) or compacts
(``keep_last=5`` on ``victim``, optionally with ``vacuum``). After the kill the parent
opens the store and requires exactly one of:

- *before*: every checkpoint of every run reads as it was;
- *after*: the deletion or compaction took effect in full (the deleted run
  is gone; only the last 5 checkpoints and the fork origin of a compacted
  run are left, each reading as it was);

plus, always: the other runs are intact, the history reference counts in
LMDB equal a recount, and a fold and a second reopen change nothing. Windows
after the deletion's WAL record is durable (or after compaction's LMDB
commit) must be *after*.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal import CheckpointNotFoundError
from agentwal.testing import crash as crash_store
from tests.helpers import check_history_counts

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
import agentwal
from agentwal import failpoints
path, action, point, nth = sys.argv[2:6]
if point.startswith("recovery"):
    failpoints.arm(point, "kill", nth=int(nth))
store = agentwal.open(path, durability="sync")
failpoints.arm(point, "kill", nth=int(nth))
if action == "delete":
    if store.head("victim") is not None:  # a second child finishes what a killed one began
        store.delete_run("victim")
    store.snapshot()
else:
    store.compact(keep_last=5, runs=["victim"], vacuum=action == "vacuum")
print("DONE", flush=True)
store.close()
"""

States = dict[str, dict[int, dict[str, Any]]]


def build(path: str) -> States:
    """The store the child works on, and every checkpoint's state per run."""
    states: States = {"victim": {}, "keep": {}, "f": {}}
    store = agentwal.open(path, durability="sync", wal_max_bytes=1 << 22)
    for i in range(1, 41):
        for run in ("victim", "keep") if i <= 30 else ("victim",):
            log = [f"{run}-{j}-{'m' * 300}" for j in range(i)]
            state = {"step": i, "log": log, "shared": "s" * 2000}
            if i % 4:
                state["own"] = f"{run}{i}" * 200
            with store.begin(run) as txn:
                txn.delete("own")
                for k, v in state.items():
                    txn[k] = v
            states[run][i] = state
        if i == 6:
            store.fork("victim", 3, "f")
            states["f"][1] = states["victim"][3]
        if i == 25:
            store.snapshot()  # the rest stays in the WAL (the crash below skips the fold)
    crash_store(store)
    return states


def observe(path: str, states: States, action: str) -> str:
    """Open the store; return "before" or "after", failing on anything else."""
    with agentwal.open(path) as store:
        check_history_counts(store)
        for run in ("keep", "f"):
            assert [c.id for c in store.history(run)] == sorted(states[run], reverse=True)
            for cid, want in states[run].items():
                assert store.state(run, at=cid) == want
        victim = states["victim"]
        if action == "delete":
            if store.head("victim") is None:
                assert store.runs() == ["f", "keep"]
                return "after"
            kept = set(victim)
        else:
            kept = {c.id for c in store.history("victim")}
            assert kept in (set(victim), {3, 36, 37, 38, 39, 40}), sorted(kept)
        for cid, want in victim.items():
            if cid in kept:
                assert store.state("victim", at=cid) == want, cid
            else:
                with pytest.raises(CheckpointNotFoundError):
                    store.state("victim", at=cid)
        return "before" if kept == set(victim) else "after"


def run_child(path: str, action: str, point: str, nth: int) -> int:
    child = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), path, action, point,
                            str(nth)], capture_output=True, text=True, timeout=120)
    assert child.returncode in (0, 137), child.stderr[-2000:]
    assert (child.returncode == 0) == ("DONE" in child.stdout), child.stdout
    return child.returncode


# (action, failpoint, n-th hit, what the store must open to: "before", "after" or "either")
CASES = [
    ("delete", "before_wal_append", 1, "before"),
    ("delete", "after_wal_append", 1, "either"),  # in the OS: a process kill keeps it
    ("delete", "before_fsync", 1, "either"),
    ("delete", "after_fsync", 1, "after"),
    ("delete", "delete_run_after_record", 1, "after"),
    ("delete", "fold_after_freeze", 1, "after"),
    ("delete", "delete_run_fold_before_commit", 1, "after"),
    ("delete", "delete_run_fold_after_commit", 1, "after"),
    ("compact", "fold_before_commit", 1, "before"),
    ("compact", "compact_after_fold", 1, "before"),
    ("compact", "compact_before_commit", 1, "before"),
    ("compact", "compact_after_commit", 1, "after"),
    ("vacuum", "compact_after_commit", 1, "after"),
    ("vacuum", "vacuum_after_copy", 1, "after"),
    ("vacuum", "vacuum_after_rename", 1, "after"),
    ("vacuum", "vacuum_after_swap", 1, "after"),
]


@pytest.mark.parametrize(("action", "point", "nth", "expect"), CASES,
                         ids=[f"{a}-{p}" for a, p, _n, _e in CASES])
def test_kill_in_each_window(tmp_path: Path, action: str, point: str, nth: int,
                             expect: str) -> None:
    path = str(tmp_path / "store")
    states = build(path)
    code = run_child(path, action, point, nth)
    assert code == 137, f"{point} was never reached"
    got = observe(path, states, action)
    assert expect in (got, "either"), (point, got)
    assert not (tmp_path / "store" / "snapshot" / "data.mdb.vacuum").exists()
    # Recovery finishes the job: a fold, then the same answer after another reopen.
    with agentwal.open(path) as store:
        store.snapshot()
        if got == "after" and action == "delete":
            assert store.stats()["folded_runs"] == 2
    assert observe(path, states, action) == got
    # And the store works on: the deletion or compaction can be (re)done.
    code = run_child(path, action, "after_publish", 10**6)
    assert code == 0
    assert observe(path, states, action) == "after"


def test_kill_during_recovery_of_a_deletion(tmp_path: Path) -> None:
    """Killed again while replaying the delete record: still deleted."""
    path = str(tmp_path / "store")
    states = build(path)
    assert run_child(path, "delete", "delete_run_after_record", 1) == 137
    assert run_child(path, "delete", "recovery_after_replay", 1) == 137
    assert observe(path, states, "delete") == "after"
