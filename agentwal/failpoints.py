"""Named failpoints on the commit, group-commit, fold, rotation and recovery paths.

Theory of operation: production code calls :func:`hit` with a name from
:data:`POINTS` at each step where a crash matters ("if we die here, recovery
sees X"). Disarmed, ``hit`` is one global truth test and a return. Tests arm a
point (``agentwal.testing.failpoints.arm``) to raise an exception, to call a
function, or to end the process with ``os._exit`` on its n-th hit, which
proves what recovery does for that exact window.

Arming is process-global and thread-safe; an armed point fires once per
matching hit for ``times`` hits, then disarms itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["POINTS", "FailpointFired", "arm", "count_hits", "disarm", "hit", "hits", "names"]

#: Every failpoint the engine defines, with the crash window it marks.
POINTS: dict[str, str] = {
    # commit path (one per committer)
    "commit_before_validate": "a commit is about to take the commit lock and validate",
    "commit_after_encode": "the commit is encoded, not yet validated nor queued",
    # group commit (the leader that writes a batch)
    "before_wal_append": "a batch is about to be written to the segment",
    "wal_append_partial": "half of a batch's bytes are written, the rest not",
    "after_wal_append": "a batch is in the OS, not yet synced",
    "before_fsync": "a batch is written, its fsync not started",
    "after_fsync": "a batch is durable, not yet visible nor acknowledged",
    "after_publish": "a batch is visible in the memtable, committers not yet woken",
    # segment rotation and removal
    "before_segment_create": "the next segment is about to be created",
    "segment_preallocated": "the next segment is zero-filled and synced, its name not yet",
    "after_segment_create": "the next segment and its name are durable, no record in it",
    "before_segment_remove": "a fold is durable, old segments not yet removed",
    "after_segment_remove": "old segments unlinked, the directory not yet synced",
    # fold
    "fold_after_freeze": "the memtable is frozen, LMDB not yet written",
    "fold_before_commit": "the LMDB write transaction is built, not committed",
    "fold_after_commit": "LMDB holds the fold, the frozen memtable still in use",
    # PostgreSQL backend (agentwal/postgres): one commit transaction
    "pg_commit_before_commit": "a commit's run row is locked and checked; writes and COMMIT unsent",
    "pg_commit_after_commit": "COMMIT returned, the committer has not yet seen its reply",
    # recovery
    "recovery_before_replay": "LMDB base loaded, WAL not yet read",
    "recovery_after_replay": "WAL replayed into the memtable, torn tail not yet repaired",
    "recovery_after_repair": "torn tail zeroed and synced, store not yet ready",
    # effects (txn.effect and store.dispatch, one attempt)
    "effect_before_intent": "an effect is about to record its intent; nothing called",
    "effect_after_intent": "the intent is durable, the effect not yet called",
    "after_effect_call": "the effect returned or raised, its outcome not yet recorded",
    "effect_after_outcome": "the outcome is durable, the transaction not yet committed",
    "effect_before_retry": "an attempt failed and was recorded; the retry not yet begun",
    # store.transact (a step redone after ConflictError)
    "step_before_retry": "a step's attempt conflicted and rolled back; the next not begun",
    # delete_run (the record goes through the group-commit points above too)
    "delete_run_after_record": "a delete record is durable and visible, LMDB still has the run",
    "delete_run_fold_before_commit": "a fold that removes a deleted run is about to be written",
    "delete_run_fold_after_commit": "LMDB no longer has the deleted run, its WAL record remains",
    # compact and vacuum
    "compact_after_fold": "compact() folded the WAL, its LMDB transaction not begun",
    "compact_before_commit": "compaction's LMDB transaction is built, not committed",
    "compact_after_commit": "compaction is durable in LMDB, no vacuum begun",
    "vacuum_after_copy": "the compacted copy is written and fsynced beside data.mdb, not renamed",
    "vacuum_after_rename": "the copy replaced data.mdb, the directory not yet fsynced",
    "vacuum_after_swap": "the environment is reopened on the compacted file",
    # blobs (txn.put_blob: temp file -> fsync -> rename to its hash -> directory fsync)
    "blob_after_write": "a blob's bytes are in its temp file, not yet synced",
    "blob_after_fsync": "a blob's temp file is durable, not yet named by its hash",
    "blob_after_rename": "a blob has its hash name, the name not yet durable",
    "blob_after_sync": "a blob is durable under its hash name, no commit references it yet",
    "blob_sweep_before_unlink": "a sweep is about to remove an unreferenced blob file",
    # trees (txn.put_tree, store.restore_tree)
    "tree_after_read": "put_tree read one file (a small one into memory), not yet checked",
    "tree_after_file": "put_tree has one file (stored, or queued with the objects); tree not done",
    "tree_after_dirs": "put_tree stored every object of the tree, nothing committed",
    "restore_after_write": "a restored file (or link) is whole in its temp name, not renamed",
    "restore_after_rename": "a restored file has its name, its directory not yet fsynced",
    "restore_after_remove": "restore removed an entry the tree lacks, the directory not synced",
}


class FailpointFired(Exception):
    """Raised by a failpoint armed with ``action="raise"`` and no exception given."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"failpoint {name!r} fired")


@dataclass
class _Arm:
    action: Callable[[str], None]
    nth: int
    times: int
    seen: int = 0


_lock = threading.Lock()
_armed: dict[str, _Arm] = {}
_hits: dict[str, int] = {}
_counting = False


def hit(name: str) -> None:
    """Mark that execution reached failpoint ``name``; fires it if armed."""
    if not _armed and not _counting:
        return
    _fire(name)


def _fire(name: str) -> None:
    action: Callable[[str], None] | None = None
    with _lock:
        if _counting:
            _hits[name] = _hits.get(name, 0) + 1
        spec = _armed.get(name)
        if spec is not None:
            spec.seen += 1
            if spec.seen >= spec.nth:
                action = spec.action
                spec.times -= 1
                if spec.times <= 0:
                    del _armed[name]
    if action is not None:
        action(name)


def _kill(code: int) -> Callable[[str], None]:
    def die(_name: str) -> None:
        os._exit(code)

    return die


def _raiser(exc: BaseException | type[BaseException] | None) -> Callable[[str], None]:
    def throw(name: str) -> None:
        if exc is None:
            raise FailpointFired(name)
        raise exc() if isinstance(exc, type) else exc

    return throw


def arm(
    name: str,
    action: str = "raise",
    *,
    exc: BaseException | type[BaseException] | None = None,
    fn: Callable[[str], None] | None = None,
    exit_code: int = 137,
    nth: int = 1,
    times: int = 1,
) -> None:
    """Arm failpoint ``name``.

    Args:
        name: one of :data:`POINTS`.
        action: ``"raise"`` (``exc``, default :class:`FailpointFired`),
            ``"call"`` (``fn(name)``) or ``"kill"`` (``os._exit(exit_code)``).
        nth: fire on the n-th hit from now (1 = the next one).
        times: how many hits fire, starting at the n-th.

    Raises:
        ValueError: unknown point or action, or a missing ``fn``.
    """
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}; see agentwal.failpoints.names()")
    if action == "raise":
        callback = _raiser(exc)
    elif action == "kill":
        callback = _kill(exit_code)
    elif action == "call":
        if fn is None:
            raise ValueError("action='call' needs fn=")
        callback = fn
    else:
        raise ValueError(f"unknown failpoint action {action!r}: use raise, call or kill")
    if nth < 1 or times < 1:
        raise ValueError("nth and times count from 1")
    with _lock:
        _armed[name] = _Arm(callback, nth, times)


def armed(name: str) -> bool:
    """True if failpoint ``name`` is armed (code whose window exists only on a slower path
    takes that path while it is)."""
    return name in _armed


def disarm(name: str | None = None) -> None:
    """Disarm one failpoint, or all of them (and stop counting hits)."""
    global _counting
    with _lock:
        if name is None:
            _armed.clear()
            _hits.clear()
            _counting = False
        else:
            _armed.pop(name, None)


def count_hits(enabled: bool = True) -> None:
    """Start (or stop) counting hits of every point; read them with :func:`hits`."""
    global _counting
    with _lock:
        _counting = enabled
        _hits.clear()


def hits() -> dict[str, int]:
    """How many times each point was reached since :func:`count_hits`."""
    with _lock:
        return dict(_hits)


def names() -> list[str]:
    """The names of every failpoint, sorted."""
    return sorted(POINTS)
