"""The storage-backend seam: what the neutral layers need from storage, and nothing more.

Theory of operation: ``txn`` (buffering a step's change), ``ledger`` (the
effects executor) and the history reads of ``store`` (``get``/``state`` at a
checkpoint, ``history``, ``diff``, ``rollback_to``, ``fork``) need a small
set of operations from whatever keeps the state. This module names them as
typing Protocols with their contracts written on them, so a second backend
(PostgreSQL) can be written against the contracts and checked by the same
conformance suite (``tests/conformance/``). The embedded engine is the first
implementation (``agentwal.local.backend.LocalBackend``). Maintenance
(``sync``, ``compact``, ``verify``, ``backup``, ``stats``, ``close``) is a
separate Protocol: a backend may implement some of it as no-ops.

*Views.* A view is a consistent read of one run as of :meth:`RunStore.begin`:
its head checkpoint id (``base``), the run id's epoch (the sequence number
of its last deletion; 0: never deleted) and an optional fencing token. Runs
are single-writer per commit and their commits are totally ordered, so
"the snapshot at begin" is "the run at checkpoint ``base``": a backend may
serve reads of a view from history at ``base`` once the run moved on.

*The commit rule* (optimistic): a commit of a view conflicts iff a checkpoint
of the run newer than the view (in the same epoch) wrote a key the change
read or wrote, or a key under a prefix it scanned, or the run was deleted
after the view began. Conflicts raise ``ConflictError``; the errors in
:data:`NOT_APPLIED` mean nothing was applied; any other error means the
outcome is unknown.

*Sequence numbers.* ``Checkpoint.lsn``, an effect's ``order`` and a run's
epoch are one store-wide, increasing commit sequence: the WAL's LSN
locally, a database sequence elsewhere.

This module imports only ``types``, ``effects`` and ``errors``; nothing here
knows a file, a lock or LMDB.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from .effects import Deferred, EffectRecord
from .errors import (
    ConflictError,
    DiskFullError,
    RunExistsError,
    StoreClosedError,
    UnencodableValueError,
)
from .types import Checkpoint

__all__ = ["NOT_APPLIED", "Backend", "Change", "EffectRace", "HistoryStore", "LedgerStore",
           "Maintenance", "RunStore", "View"]

#: What a commit raises when it certainly applied nothing (a backend obligation).
NOT_APPLIED = (ConflictError, DiskFullError, UnencodableValueError, RunExistsError,
               StoreClosedError)


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One step's change to one run, as a transaction built it; backends only read it.

    Attributes:
        run: the run the change is to.
        writes: ``{key: encoded value}`` (``codec.encode_value`` bytes); None deletes.
        reads: the keys the step read (for the commit rule).
        prefixes: the prefixes the step scanned (``""``: the whole run).
        meta: the checkpoint's metadata.
        deferred: outbox entries to log with the commit.
        origin: a fork's ``(run, checkpoint)``: the commit must be the run's first.
        effects: keys of the ledger entries the step recorded (marked committed
            with the commit, atomically).
        appends: keys of ``writes`` whose value is an append to the list the
            step read there (``codec.Append``: base count, base length, tail);
            a backend may log the entry instead of the whole value, or ignore it
            (``writes`` always holds the whole value).
    """

    run: str
    writes: Mapping[str, bytes | None]
    reads: frozenset[str] = frozenset()
    prefixes: frozenset[str] = frozenset()
    meta: Mapping[str, Any] = field(default_factory=dict)
    deferred: tuple[Deferred, ...] = ()
    origin: tuple[str, int] | None = None
    effects: tuple[str, ...] = ()
    appends: Mapping[str, tuple[int, int, bytes]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """True if committing it changes nothing (no writes, metadata, outbox or effects)."""
        return not (self.writes or self.meta or self.deferred or self.effects
                    or self.origin is not None)


class EffectRace(Exception):
    """``record_effect`` found another entry than the one expected: re-read and decide again.

    Internal (the ledger retries on it); it never reaches a user.
    """

    def __init__(self, key: str, found: EffectRecord | None) -> None:
        self.key = key
        self.found = found
        super().__init__(f"the ledger entry {key!r} changed under its writer")


@runtime_checkable
class View(Protocol):
    """A consistent read of one run; opaque to callers beyond these four."""

    @property
    def run(self) -> str:
        """The run the view reads."""
        ...

    @property
    def base(self) -> int:
        """The run's head checkpoint id at :meth:`RunStore.begin` (0: no checkpoint)."""
        ...

    @property
    def epoch(self) -> int:
        """Sequence number of the run id's last deletion as of the view (0: never)."""
        ...

    @property
    def fence(self) -> object | None:
        """A lease token where runs are leased; None where a store lock fences writers."""
        ...


#: A backend's own view type (each backend reads only the views it began).
V = TypeVar("V", bound=View)


@runtime_checkable
class RunStore(Protocol[V]):
    """What a transaction needs: a view, reads at it, and one commit.

    ``agentwal.txn.Transaction`` calls these and nothing else of storage.
    """

    def begin(self, run: str) -> V:
        """A view of ``run`` as of now (the run need not exist yet).

        Raises:
            StoreClosedError: the backend is closed.
        """
        ...

    def read(self, view: V, key: str) -> bytes | None:
        """The stored bytes of ``key`` in the view (None: absent). Never blocks on writers."""
        ...

    def scan(self, view: V, prefix: str) -> dict[str, bytes]:
        """``{key: stored bytes}`` of every key under ``prefix`` in the view (a new dict)."""
        ...

    def commit(self, view: V, change: Change) -> Checkpoint | None:
        """Apply ``change`` atomically as the run's next checkpoint, by the commit rule.

        An empty change (:attr:`Change.empty`) applies nothing and returns the
        head as of the view (None: the run has none). Returns once the commit
        is as durable as the backend's durability setting promises.

        Raises:
            ConflictError: the commit rule refused it (nothing applied).
            RunExistsError: ``change.origin`` is set and the run has a checkpoint.
            ReadOnlyError, StoreClosedError, DiskFullError: nothing applied.
            DurabilityError: the outcome is unknown (see :data:`NOT_APPLIED`).
        """
        ...

    def end(self, view: V) -> None:
        """Release the view (idempotent)."""
        ...

    def abandon(self, view: V) -> None:
        """Release the view later: called from a finalizer, so it takes no lock and no I/O."""
        ...


@runtime_checkable
class HistoryStore(Protocol):
    """What the history reads and ``delete_run`` need."""

    def head(self, run: str) -> Checkpoint | None:
        """The run's newest checkpoint, or None."""
        ...

    def checkpoints(self, run: str, *, limit: int | None = None,
                    before: int | None = None) -> list[Checkpoint]:
        """The run's retained checkpoints, newest first (ids below ``before`` if given)."""
        ...

    def state_at(self, run: str, checkpoint: int, *, key: str | None = None
                 ) -> dict[str, bytes]:
        """``{key: stored bytes}`` of the run at ``checkpoint`` (only ``key`` if given).

        Raises:
            RunNotFoundError: the run has no checkpoint.
            CheckpointNotFoundError: no such checkpoint, or retention dropped it.
        """
        ...

    def runs(self) -> list[str]:
        """Every run id with at least one checkpoint, sorted."""
        ...

    def delete_run(self, run: str) -> None:
        """Delete the run durably (its ledger entries stay); the id may be used again.

        Raises:
            RunNotFoundError: the run has no checkpoint.
        """
        ...


@runtime_checkable
class LedgerStore(Protocol):
    """What the effects executor (``ledger.Ledger``) needs."""

    def effect(self, key: str) -> EffectRecord | None:
        """The ledger entry with idempotency key ``key``, or None."""
        ...

    def effect_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        """The key of the ``txn.effect`` entry at this position, or None."""
        ...

    def record_effect(self, entry: EffectRecord, *, expect: EffectRecord | None,
                      fence: object | None = None) -> EffectRecord:
        """Store ``entry`` durably if the stored one is still ``expect``; returns it as stored.

        Compare-and-set: ``expect=None`` inserts only if no entry has the key;
        otherwise the stored entry must be ``expect`` but for a
        ``committed_in`` mark a commit added since
        (``effects.still_expected``), and the written entry keeps that mark
        (``effects.carry_mark``). ``fence`` is what the write is fenced by
        (``View.fence`` of the step, or None): a backend with leases refuses
        the write of a lost lease. Returns once the entry is durable,
        whatever the durability setting (an intent must be on disk before the
        call it announces).

        Raises:
            EffectRace: another writer changed the entry (nothing written).
            LeaseLostError: ``fence`` is lost (nothing written).
            ReadOnlyError, StoreClosedError, DiskFullError, DurabilityError.
        """
        ...

    def effects(self) -> list[EffectRecord]:
        """Every ledger entry, in key order."""
        ...

    def outbox(self) -> list[EffectRecord]:
        """The outbox entries not yet settled, in commit order."""
        ...


@runtime_checkable
class Backend(RunStore[V], HistoryStore, LedgerStore, Protocol[V]):
    """A whole storage backend for ``Transaction``, ``Ledger`` and the history reads."""

    @property
    def store_id(self) -> uuid.UUID:
        """The store's identity (effect keys derive from it)."""
        ...

    @property
    def name(self) -> str:
        """Where the store is, for messages: a path or a DSN."""
        ...


@runtime_checkable
class Maintenance(Protocol):
    """Store-level upkeep the facade delegates to (no-ops where a backend needs none)."""

    def sync(self) -> None:
        """Make every acknowledged commit durable."""
        ...

    def stats(self) -> dict[str, Any]:
        """Sizes and counters (a new dict)."""
        ...

    def close(self) -> None:
        """Release the backend (idempotent)."""
        ...
