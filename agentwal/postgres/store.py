"""``PostgresStore``: the public store API over :class:`~agentwal.postgres.backend.PostgresBackend`.

Theory of operation: the neutral layers are reused as they are. A
transaction is ``agentwal.txn.Transaction`` (buffering, savepoints,
read-your-writes, validation inputs), driven through the engine hooks it
calls (``_txn_read``, ``_txn_commit``, ...), which go to the backend at the
transaction's view. Effects run through ``agentwal.ledger.Ledger``; its
ledger writes become the backend's compare-and-set ``record_effect``, fenced
by the lease of the transaction that makes them, so a worker whose lease
was taken can neither announce a call (its intent is refused and ``fn`` is
not called) nor record an outcome. Past its local lease deadline a worker
records no intent either.

Leases: ``begin`` (and ``delete_run``, ``rollback_to``, ``fork``) take the
run's lease for this worker when it does not hold it; ``lease``, ``release``
and ``claim_runs`` are the explicit forms (``leases.py``).

When the backend seam's facade lands on main, this class is meant to shrink
to what is PostgreSQL-specific (the lease calls); until then it implements
the part of ``agentwal.Store``'s API this backend supports (docs/postgres.md
lists what is not there yet).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from ..codec import decode_stored
from ..effects import STATUSES, EffectContext, EffectMode, EffectRecord, effects_after
from ..errors import (
    BackendUnsupportedError,
    CheckpointNotFoundError,
    ConflictError,
    LeaseLostError,
    ReadOnlyError,
    RunExistsError,
    RunNotFoundError,
)
from ..ledger import DispatchReport, Ledger, Request
from ..store import _checkpoint_id
from ..txn import Transaction
from ..types import BlobRef, Checkpoint, Diff, Durability, check_key
from .backend import Change, EffectRace, PgView, PostgresBackend
from .leases import Lease

__all__ = ["PostgresStore", "open_postgres"]

T = TypeVar("T")
_UNSET: Any = object()


def default_worker_id() -> str:
    """``host/pid/random``: unique per process, readable in ``LeaseHeldError``."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def open_postgres(dsn: str, *, schema: str = "agentwal", worker_id: str | None = None,
                  lease_ttl: float = 30.0, durability: Durability | str = Durability.SYNC,
                  readonly: bool = False, pool_size: int = 4) -> PostgresStore:
    """Open (creating or migrating on first open) the store in ``schema`` of a PostgreSQL server.

    Args:
        dsn: a libpq URI (``postgresql://user@host/db``) or conninfo string.
        schema: the schema that holds the store (a lowercase identifier).
        worker_id: this worker's name in leases (default ``host/pid/random``);
            unique per live process.
        lease_ttl: seconds a lease lasts unless renewed (renewed every ttl/3
            in the background while held).
        durability: ``"sync"`` (commits wait for the server's WAL flush) or
            ``"async"``/``"none"`` (``synchronous_commit = off``: survives a
            client crash; a server crash may lose the last few hundred ms).
            Lease, effect and deletion writes are synchronous in every mode.
        readonly: never migrates or writes; refuses a schema older or newer
            than this code.
        pool_size: connections in this process's pool (plus one for the heartbeat).

    Raises:
        BackendUnavailableError: the server cannot be reached.
        SchemaVersionError: the schema is newer than this code.
        CorruptionError: ``readonly`` and there is no store in ``schema``.
        ValueError: a bad argument.
    """
    from .db import check_schema

    if not isinstance(dsn, str) or not dsn:
        raise ValueError("dsn must be a non-empty str")
    check_schema(schema)
    mode = Durability(durability)
    if not isinstance(lease_ttl, (int, float)) or isinstance(lease_ttl, bool) or lease_ttl <= 0:
        raise ValueError("lease_ttl must be a number of seconds > 0")
    if not isinstance(pool_size, int) or isinstance(pool_size, bool) or pool_size < 1:
        raise ValueError("pool_size must be an int >= 1")
    wid = default_worker_id() if worker_id is None else check_key(worker_id, "worker id")
    backend = PostgresBackend(dsn, schema=schema, worker_id=wid, lease_ttl=float(lease_ttl),
                              synchronous=mode is Durability.SYNC, readonly=bool(readonly),
                              pool_size=pool_size)
    return PostgresStore(backend, mode)


class PostgresStore:
    """An open store on PostgreSQL; get one from ``agentwal.open("postgresql://...")``.

    Shared by the threads of one process; every process (every worker) opens
    its own. Example::

        store = agentwal.open("postgresql://app@db/agents", worker_id="worker-7")
        with store.begin("run-42") as txn:      # takes the run's lease
            txn["step"] = txn.get("step", 0) + 1
        store.release("run-42")
    """

    def __init__(self, backend: PostgresBackend, durability: Durability) -> None:
        self._b = backend
        self.durability = durability
        self.readonly = backend.readonly
        self.path = backend.name  # what messages name (a path for the local backend)
        self.store_id = backend.store_id
        self.worker_id = backend.worker_id
        self._ledger = Ledger(self)
        #: effect key -> the lease of the step running it (its ledger writes are fenced by it)
        self._fences: dict[str, Lease | None] = {}
        self._retries = 0

    # -- leases ----------------------------------------------------------------------

    def lease(self, run: str) -> int:
        """Take (or keep) this worker's lease on ``run``; returns its epoch (fencing token).

        Raises:
            LeaseHeldError: another worker holds it. ReadOnlyError, BackendUnavailableError.
        """
        check_key(run, "run id")
        self._writable()
        return self._b.leases.ensure(run).epoch

    def release(self, run: str) -> bool:
        """Give up this worker's lease on ``run``; True if it held one."""
        check_key(run, "run id")
        self._b._check_open()
        return self._b.leases.release(run)

    def claim_runs(self, limit: int = 10) -> list[str]:
        """Adopt up to ``limit`` runs whose holder's lease expired; returns their ids, sorted.

        Each run is adopted by exactly one claiming worker, with a new epoch:
        the old holder's writes are fenced off from then on.
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError("limit must be an int >= 0")
        self._writable()
        return self._b.leases.claim(limit) if limit else []

    # -- transactions ----------------------------------------------------------------

    def _writable(self) -> None:
        self._b._check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)

    def begin(self, run: str, *, retry_of: Transaction | None = None) -> Transaction:
        """Begin a write transaction on ``run``, taking its lease for this worker if needed.

        Raises:
            LeaseHeldError: another worker holds the run's lease.
            InvalidKeyError, ReadOnlyError, StoreClosedError, BackendUnavailableError.
            ValueError / TypeError: a bad ``retry_of`` (as ``agentwal.Store.begin``).
        """
        check_key(run, "run id")
        self._writable()
        if retry_of is not None:
            _check_retry_of(self, run, retry_of)
        return Transaction(self, run, self._b.begin(run), retry_of=retry_of)

    def transact(self, run: str, fn: Callable[[Transaction], T], *, retries: int = 10) -> T:
        """Run ``fn(txn)`` and commit it, redoing it on ``ConflictError`` (not on a lost lease)."""
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError("retries must be an int >= 0")
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise TypeError("fn must be a synchronous callable fn(txn)")
        prev: Transaction | None = None
        for attempt in range(retries + 1):
            txn = self.begin(run, retry_of=prev)
            try:
                result = fn(txn)
                if txn.state == "active":
                    txn.commit()
                return result
            except LeaseLostError:
                if txn.state == "active":
                    txn.rollback()
                raise  # another worker owns the run now: redoing the step here is wrong
            except ConflictError:
                if txn.state == "active":
                    txn.rollback()
                if txn.state == "committed" or attempt == retries:
                    raise
                self._retries += 1
                prev = txn
                time.sleep(random.random() * min(0.001 * 2 ** attempt, 0.05))
            except BaseException:
                if txn.state == "active":
                    txn.rollback()
                raise
        raise AssertionError("unreachable")  # the loop returns or raises

    # Transaction's engine hooks (agentwal.txn._Engine).

    def _txn_read(self, txn: Transaction, key: str) -> bytes | None:
        return self._b.read(txn._view, key)

    def _txn_items(self, txn: Transaction, prefix: str) -> dict[str, bytes | None]:
        return dict(self._b.scan(txn._view, prefix))

    def _txn_commit(self, txn: Transaction) -> Checkpoint | None:
        view: PgView = txn._view
        change = Change(run=txn.run, writes=dict(txn._writes), reads=frozenset(txn._reads),
                        prefixes=frozenset(txn._prefixes), meta=dict(txn._meta),
                        deferred=tuple(txn._deferred), effects=tuple(txn._effect_keys))
        return self._b.commit(view, change)

    def _txn_release(self, txn: Transaction) -> None:
        self._b.end(txn._view)

    def _txn_abandon(self, txn: Transaction) -> None:
        self._b.abandon(txn._view)

    def _txn_base(self, txn: Transaction) -> int:
        return int(txn._view.base)

    def _txn_epoch(self, txn: Transaction) -> int:
        return int(txn._view.epoch)

    def _txn_put_blob(self, txn: Transaction, source: Any, media_type: str | None) -> BlobRef:
        raise BackendUnsupportedError(
            "txn.put_blob", "PostgreSQL", "Keep large artifacts in a local store (or in "
            "object storage, with their reference as a value) until it stores blobs; "
            "docs/postgres.md lists what it does today.")

    def _txn_put_tree(self, txn: Transaction, path: Any, exclude: Any, base: bytes | None,
                      rehash: bool = False, subdir: str | None = None
                      ) -> tuple[BlobRef, list[str]]:
        raise BackendUnsupportedError(
            "txn.put_tree", "PostgreSQL", "Trees are made of blobs, which it does not store "
            "yet; use a local store for workspaces (docs/postgres.md).")

    def _txn_effect(self, txn: Transaction, req: Request) -> Any:
        self._fences[req.key] = txn._view.fence
        try:
            return self._ledger.run(req)
        finally:
            self._fences.pop(req.key, None)

    async def _txn_aeffect(self, txn: Transaction, req: Request) -> Any:
        self._fences[req.key] = txn._view.fence
        try:
            return await self._ledger.arun(req)
        finally:
            self._fences.pop(req.key, None)

    def _effect_claim(self, txn: Transaction, base: int) -> None:
        """Positions at ``base`` belong to the step that begins there: refuse a stale step."""
        if txn._inherited:
            return
        head = self._b.begin(txn.run, lease=False).base
        if head != base:
            raise ConflictError(txn.run, reason=(
                f"the run moved on from checkpoint {base} (where this transaction began) to "
                f"{head}; its effect positions there belong to the step that committed. "
                "Nothing was called or recorded; retry the step from the new head "
                "(store.transact does)."))

    def _effect_adopt(self, txn: Transaction, base: int, name: str, digest: str,
                      mode: EffectMode, epoch: int) -> int | None:
        return None  # finding an uncommitted attempt from an older checkpoint: not yet here

    # Ledger's engine hooks (agentwal.ledger._Engine).

    def _effect_get(self, key: str) -> EffectRecord | None:
        return self._b.effect(key)

    def _effect_key_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        return self._b.effect_at(run, checkpoint, ordinal)

    def _effect_write(self, entry: EffectRecord) -> EffectRecord:
        """One ledger write: compare-and-set on what is stored, fenced by the step's lease."""
        lease = self._fences.get(entry.key)
        if lease is not None and entry.status == "in_doubt":
            lease.check()  # an intent: past the local deadline, announce (and call) nothing
        while True:
            expect = self._b.effect(entry.key)
            try:
                return self._b.record_effect(entry, expect=expect, fence=lease)
            except EffectRace:
                continue  # the stored entry changed between the read and the write

    def _effect_all(self) -> list[EffectRecord]:
        return self._b.effects()

    def _effect_outbox(self) -> list[EffectRecord]:
        return self._b.outbox()

    # -- reading ---------------------------------------------------------------------

    def _decode(self, raw: bytes, what: str) -> Any:
        return decode_stored(raw, self.path, what)

    def get(self, run: str, key: str, default: Any = None, *, at: int | None = None) -> Any:
        """The value of ``key`` (latest, or at checkpoint ``at``), or ``default``."""
        check_key(run, "run id")
        check_key(key)
        if at is None:
            raw = self._b.read(self._b.begin(run, lease=False), key)
        else:
            raw = self._b.state_at(run, _checkpoint_id(at), key=key).get(key)
        return default if raw is None else self._decode(raw, f"{run!r}/{key!r}")

    def state(self, run: str, *, at: int | None = None) -> dict[str, Any]:
        """The run's state as a new dict (latest, or at checkpoint ``at``).

        Raises:
            RunNotFoundError, CheckpointNotFoundError.
        """
        check_key(run, "run id")
        if at is None:
            view = self._b.begin(run, lease=False)
            if view.base == 0:
                raise RunNotFoundError(run)
            raw = self._b.scan(view, "")
        else:
            raw = self._b.state_at(run, _checkpoint_id(at))
        return {k: self._decode(v, f"{run!r}/{k!r}") for k, v in sorted(raw.items())}

    def head(self, run: str) -> Checkpoint | None:
        """The run's latest checkpoint, or None."""
        check_key(run, "run id")
        return self._b.head(run)

    def history(self, run: str, *, limit: int | None = None,
                before: int | None = None) -> list[Checkpoint]:
        """The run's checkpoints, newest first (at most ``limit``; ids below ``before``)."""
        check_key(run, "run id")
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        if before is not None:
            head = self._b.head(run)
            if head is None:
                raise RunNotFoundError(run)
            if not 1 <= _checkpoint_id(before) <= head.id:
                raise CheckpointNotFoundError(run, before)
        return self._b.checkpoints(run, limit=limit, before=before)

    def diff(self, run: str, a: int, b: int) -> Diff:
        """What changed in ``run`` from checkpoint ``a`` to checkpoint ``b``."""
        check_key(run, "run id")
        ra = self._b.state_at(run, _checkpoint_id(a))
        rb = self._b.state_at(run, _checkpoint_id(b))

        def dec(raw: bytes, k: str, cid: int) -> Any:
            return self._decode(raw, f"{run!r}/{k!r} at {cid}")

        added = {k: dec(rb[k], k, b) for k in sorted(rb.keys() - ra.keys())}
        removed = {k: dec(ra[k], k, a) for k in sorted(ra.keys() - rb.keys())}
        changed: dict[str, tuple[Any, Any]] = {}
        for k in sorted(ra.keys() & rb.keys()):
            if ra[k] != rb[k]:
                old, new = dec(ra[k], k, a), dec(rb[k], k, b)
                if old != new:
                    changed[k] = (old, new)
        return Diff(added, removed, changed)

    def runs(self) -> list[str]:
        """Run ids with at least one checkpoint, sorted."""
        return self._b.runs()

    # -- history writes (each a fenced commit) ---------------------------------------

    def rollback_to(self, run: str, checkpoint: int) -> Checkpoint:
        """A new checkpoint (parent: the head) whose state equals the state at ``checkpoint``."""
        check_key(run, "run id")
        cid = _checkpoint_id(checkpoint)
        self._writable()
        view = self._b.begin(run)
        target = self._b.state_at(run, cid)
        current = self._b.scan(view, "")
        delta: dict[str, bytes | None] = {k: v for k, v in target.items()
                                          if current.get(k) != v}
        delta.update((k, None) for k in current.keys() - target.keys())
        ckpt = self._b.commit(view, Change(run=run, writes=delta, prefixes=frozenset({""}),
                                           meta={"rollback_to": cid}))
        assert ckpt is not None
        return dataclasses.replace(ckpt, effects_after=effects_after(self.effects(run=run), cid))

    def fork(self, run: str, checkpoint: int, new_run: str) -> Checkpoint:
        """Start ``new_run`` from the state of ``run`` at ``checkpoint`` (its first checkpoint)."""
        check_key(run, "run id")
        check_key(new_run, "run id")
        cid = _checkpoint_id(checkpoint)
        self._writable()
        target: dict[str, bytes | None] = dict(self._b.state_at(run, cid))
        if self._b.head(new_run) is not None:
            raise RunExistsError(new_run)
        view = self._b.begin(new_run)
        ckpt = self._b.commit(view, Change(run=new_run, writes=target, prefixes=frozenset({""}),
                                           origin=(run, cid)))
        assert ckpt is not None
        return dataclasses.replace(ckpt, effects_after=effects_after(self.effects(run=run), cid))

    def delete_run(self, run: str) -> None:
        """Delete ``run``'s state and history durably, under this worker's lease."""
        check_key(run, "run id")
        self._writable()
        self._b.delete_run(run)

    # -- effects ---------------------------------------------------------------------

    def effects(self, run: str | None = None, status: str | None = None) -> list[EffectRecord]:
        """Entries of the effects ledger, oldest first, optionally of one run or status."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {list(STATUSES)}, not {status!r}")
        if run is not None:
            check_key(run, "run id")
        return [e for e in sorted(self._b.effects(),
                                  key=lambda e: (e.created_at, e.order or (0, 0), e.key))
                if (run is None or e.run == run) and (status is None or e.status == status)]

    def dispatch(self, handlers: dict[str, Callable[[EffectContext], Any]], *,
                 probes: dict[str, Callable[[EffectContext], Any]] | None = None,
                 run: str | None = None, limit: int | None = None) -> DispatchReport:
        """Run committed outbox entries (``txn.defer``) in commit order (as ``Store.dispatch``)."""
        self._writable()
        if run is not None:
            check_key(run, "run id")
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        return self._ledger.dispatch(dict(handlers), probes=probes, run=run, limit=limit)

    def resolve_effect(self, effect_id: str, *, result: Any = _UNSET, not_applied: bool = False,
                       by: str | None = None) -> EffectRecord:
        """Settle an entry in doubt, failed or pending by hand (as ``Store.resolve_effect``)."""
        self._writable()
        if (result is _UNSET) == (not not_applied):
            raise ValueError("give exactly one of result=... or not_applied=True")
        return self._ledger.resolve(effect_id, result=None if result is _UNSET else result,
                                    not_applied=not_applied, by=by)

    # -- maintenance -----------------------------------------------------------------

    def sync(self) -> None:
        """Make every acknowledged commit durable now (matters with ``durability="async"``)."""
        self._b.sync()

    def stats(self) -> dict[str, Any]:
        """Row counts and sizes of the store's tables, and this worker's leases."""
        out = self._b.stats()
        out["retries"] = self._retries
        out["durability"] = self.durability.value
        return out

    def close(self) -> None:
        """Release this worker's leases and close its sessions (idempotent)."""
        self._b.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<agentwal.PostgresStore {self.path} worker={self.worker_id!r}>"


def _check_retry_of(store: PostgresStore, run: str, prev: object) -> None:
    if not isinstance(prev, Transaction):
        raise TypeError(f"retry_of must be the Transaction of an earlier attempt, "
                        f"not {type(prev).__name__}")
    if prev._engine is not store:
        raise ValueError("retry_of is a transaction of another store")
    if prev.run != run:
        raise ValueError(f"retry_of is a transaction of run {prev.run!r}, not {run!r}")
    if prev.state == "active":
        raise ValueError("retry_of is still active: roll it back first")
    if prev.state == "committed":
        raise ValueError("retry_of committed: its step is done")

