"""Supported hooks for tests that need more than the public API.

Theory of operation: crash, property and effects tests sometimes have to do
what no user should: drop a store as a dying process would, hold off the
background fold, look at the LMDB file or the blob directory directly, make
a ledger write fail or race. They used to reach into the engine's privates
(``store._engine._fold_lock``, ``store._engine._pipe``, ...), so every move
inside the engine broke tests that were not about it. This module is the one
supported way to do each of those things: a test names what it needs, and
only this module knows where the engine keeps it (the layout test keeps the
other test files off ``store._engine``).

Hooks that only make sense for the embedded engine (blobs, LMDB, the
fold) raise ``BackendUnsupportedError`` on another store, except
:func:`fold_lock`, which is a no-op where nothing folds; :func:`crash`
works on both (a PostgreSQL worker dies without releasing its leases). The effect hooks
(:func:`intercept_effect_writes`, :func:`effect_locks`) work on any store:
they sit on the seam between the effects executor and its
``backend.LedgerStore``.

None of these change what a store does unless called, and none is meant
for production code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import BackendUnsupportedError

if TYPE_CHECKING:
    from ..backend import Backend, LedgerStore
    from ..effects import EffectRecord
    from ..ledger import Ledger
    from ..local.engine import Engine
    from ..local.snapshot.reader import RawEntries
    from ..store import Store

__all__ = ["EffectWrite", "backend", "blob_files", "blob_references", "crash", "effect_locks",
           "expire_effects_on_next_fold", "fold_error", "fold_lock", "intercept_effect_writes",
           "raw_snapshot", "run_origin", "split_commits", "sweep_blobs"]

#: ``write(entry, expect)``: the ledger's real compare-and-set, as a hook sees it.
EffectWrite = Callable[["EffectRecord", "EffectRecord | None"], "EffectRecord"]


def _engine(store: Any, hook: str) -> Engine:
    """The local engine under ``store``; ``BackendUnsupportedError`` for another store."""
    engine = getattr(store, "_engine", None)
    if engine is None:
        raise BackendUnsupportedError(f"testing.{hook}", type(store).__name__,
                                      "It is a hook of the embedded (local) engine.")
    return engine  # type: ignore[no-any-return]


def crash(store: Any) -> None:
    """Drop ``store`` as a crash would: nothing is flushed, folded, written or released.

    A local store: what was written to the OS but not synced stays in its
    files (a process crash, not a power cut: use
    :class:`~agentwal.testing.SimulatedDisk` for that); open the path again
    to recover. A PostgreSQL store: the lease heartbeat stops and the
    sessions close without releasing a lease, as when a worker's process
    dies (its runs stay leased until the leases expire). The store is closed
    afterwards.

    Example::

        with store.begin("r") as txn:
            txn["k"] = 1
        crash(store)
        store = agentwal.open(path)  # recovers from the WAL
    """
    if getattr(store, "_engine", None) is None and hasattr(store, "_b"):
        backend = store._b  # PostgresStore's PostgresBackend
        backend.leases.close()
        backend.db.close()
        backend.closed = True
        return
    _engine(store, "crash")._release_all()


def fold_error(store: Store) -> BaseException | None:
    """The error of ``store``'s last failed fold, or ``None`` when it succeeded.

    A background fold that fails with ``DiskFullError`` leaves the store
    taking commits (they stay in the WAL); the next fold tries again and clears
    this once it succeeds. ``store.stats()["fold_error"]`` gives the same as text.
    """
    return _engine(store, "fold_error")._fold_error


def fold_lock(store: Any) -> contextlib.AbstractContextManager[Any]:
    """A context manager that keeps folds, compactions and vacuums out while it is held.

    A model test uses it to read in a quiet moment: a fold waiting on it
    runs once the block ends (do not commit enough inside the block to need
    one, or call ``snapshot``/``compact`` there: they would wait for
    the block). A store with no fold (PostgreSQL) gets a context manager
    that does nothing.
    """
    engine = getattr(store, "_engine", None)
    if engine is None:
        return contextlib.nullcontext()
    lock: contextlib.AbstractContextManager[Any] = engine._fold_lock
    return lock


def split_commits(store: Store, enabled: bool = True) -> None:
    """Break ``store``'s atomicity on purpose: a transaction of several keys
    becomes two commits (for the crash harness's own test, which must see a
    power cut between them as a half-applied transaction).
    """
    _engine(store, "split_commits")._split_commits_for_test = enabled


def expire_effects_on_next_fold(store: Store) -> None:
    """Let the next fold run the ledger's expiry (``effect_retention=``) now.

    Expiry scans the whole ledger, so a fold runs it at most hourly; after
    this the next fold (``store.snapshot()``) runs it whatever the clock says.
    """
    _engine(store, "expire_effects_on_next_fold")._next_expiry = 0.0


def sweep_blobs(store: Store) -> tuple[int, int]:
    """Remove the blob files no retained state, checkpoint or live transaction needs.

    What ``compact()`` does after it drops history, without dropping any.
    Returns ``(files removed, bytes freed)``.
    """
    return _engine(store, "sweep_blobs").blobrefs.sweep()


def blob_files(store: Store) -> set[str]:
    """The SHA-256 of every blob file in the store's ``blobs/`` (temp files aside)."""
    return set(_engine(store, "blob_files")._blobs.files())


def blob_references(store: Store) -> set[str]:
    """The SHA-256 of every blob a retained state or checkpoint references."""
    return _engine(store, "blob_references").blobrefs.references()


def run_origin(store: Store, run: str) -> tuple[str, int] | None:
    """The fork origin ``(run, checkpoint)`` that ``run``'s own record keeps (None: none).

    ``history`` shows a fork's origin on its first checkpoint; once
    compaction drops that checkpoint, the run's record keeps the origin
    instead (it still protects the origin checkpoint from compaction). This
    reads that record, so it is None until then.
    """
    e = _engine(store, "run_origin")
    info = e._with_view(lambda v: e._reads(v).info(run))
    return info.origin if info is not None else None


@contextlib.contextmanager
def raw_snapshot(store: Store) -> Iterator[RawEntries]:
    """The sealed entries of every LMDB database of ``store`` as of now (what verify reads).

    Only what folds wrote (``store.snapshot()`` first, for everything). The
    read transaction ends with the block; do not keep the entries past it.
    """
    snap = _engine(store, "raw_snapshot")._snap
    if snap is None:
        raise BackendUnsupportedError("testing.raw_snapshot", "local",
                                      "The store is closed or read-only without LMDB.")
    txn = snap.begin_read()
    try:
        yield snap.raw(txn)
    finally:
        snap.end_read(txn)


def backend(store: Any) -> Backend[Any]:
    """The store's ``backend.Backend``: the seam its transactions and ledger run on.

    For tests that drive the seam directly (the conformance suite, a
    compare-and-set played by hand).
    """
    engine = getattr(store, "_engine", None)
    found: Backend[Any] = engine.backend if engine is not None else store._b
    return found


def _ledger(store: Any) -> Ledger:
    engine = getattr(store, "_engine", None)
    ledger: Ledger = engine.ledger if engine is not None else store._ledger
    return ledger


def effect_locks(store: Any) -> int:
    """How many per-key and per-position locks the effects executor holds or waits on now.

    0 once no effect is running: a test that cancels or fails effects checks
    that none was left behind.
    """
    return _ledger(store).lock_count()


class _Intercepted:
    """A ``backend.LedgerStore`` whose ``record_effect`` goes through a test's function."""

    def __init__(self, inner: LedgerStore,
                 fn: Callable[[EffectWrite, EffectRecord, EffectRecord | None], EffectRecord]
                 ) -> None:
        self.inner = inner
        self._fn = fn

    def effect(self, key: str) -> EffectRecord | None:
        return self.inner.effect(key)

    def effect_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        return self.inner.effect_at(run, checkpoint, ordinal)

    def record_effect(self, entry: EffectRecord, *, expect: EffectRecord | None,
                      fence: object | None = None) -> EffectRecord:
        def write(e: EffectRecord, x: EffectRecord | None) -> EffectRecord:
            return self.inner.record_effect(e, expect=x, fence=fence)

        return self._fn(write, entry, expect)

    def effects(self) -> list[EffectRecord]:
        return self.inner.effects()

    def outbox(self) -> list[EffectRecord]:
        return self.inner.outbox()


@contextlib.contextmanager
def intercept_effect_writes(
        store: Any,
        fn: Callable[[EffectWrite, EffectRecord, EffectRecord | None], EffectRecord],
) -> Iterator[None]:
    """Route every ledger write of ``store``'s effects executor through ``fn`` in the block.

    ``fn(write, entry, expect)`` stands in for the backend's compare-and-set
    ``record_effect(entry, expect=expect)``: it may call ``write(entry,
    expect)`` (the real one; also with other arguments, to play a second
    writer of the ledger), raise what a backend may raise
    (``DiskFullError``, ``backend.EffectRace``, ...) or both. Reads are not
    intercepted. The executor's own store is back when the block ends.

    Example::

        def full(write, entry, expect):
            raise agentwal.DiskFullError("wal", "simulated")

        with intercept_effect_writes(store, full), store.begin("r") as txn:
            txn.effect("op", call, mode="at_least_once")   # raises DiskFullError
    """
    ledger = _ledger(store)
    inner = ledger.store
    ledger.store = _Intercepted(inner, fn)
    try:
        yield
    finally:
        ledger.store = inner
