"""Supported hooks for tests that need more than the public API: a crash in-process.

Theory of operation: crash tests used to reach into the store's privates
(``store._release_all()``) to drop a store as a dying process would. This
module is the one supported way to do it, so the engine's internals can move
without breaking every crash test: :func:`crash` stops the store's threads
and closes its handles without flushing, folding or writing anything (the
writer lock is released, so the same process can reopen the path and
recover exactly what a restarted process would: the WAL's synced records
and LMDB as of its last fold). :func:`fold_error` tells whether the last
background fold failed (commits go on after a ``DiskFullError`` fold).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["crash", "fold_error"]


def crash(store: Store) -> None:
    """Drop ``store`` as a crash would: nothing is flushed, folded or written.

    What was written to the OS but not synced stays in its files (a process
    crash, not a power cut: use :class:`~agentwal.testing.SimulatedDisk` for
    that). The store is closed afterwards; open the path again to recover.

    Example::

        with store.begin("r") as txn:
            txn["k"] = 1
        crash(store)
        store = agentwal.open(path)  # recovers from the WAL
    """
    store._engine._release_all()


def fold_error(store: Store) -> BaseException | None:
    """The error of ``store``'s last failed fold, or ``None`` when it succeeded.

    A background fold that fails with ``DiskFullError`` leaves the store
    taking commits (they stay in the WAL); the next fold tries again and clears
    this once it succeeds. ``store.stats()["fold_error"]`` gives the same as text.
    """
    return store._engine._fold_error
