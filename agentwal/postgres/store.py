"""``PostgresStore``: the public store API over :class:`~agentwal.postgres.backend.PostgresBackend`.

Theory of operation: the neutral layers are reused as they are. A
transaction is ``agentwal.txn.Transaction`` (buffering, savepoints,
read-your-writes, validation inputs): it reads, scans and commits through
the backend (a ``backend.RunStore``) at its view, and reaches this class
for the rest (effects, position claims: ``txn.StepHooks``). Effects run
through ``agentwal.ledger.Ledger``; its ledger writes become the backend's
compare-and-set ``record_effect``, fenced by the lease of the transaction
that makes them, so a worker whose lease was taken can neither announce a
call (its intent is refused and ``fn`` is not called) nor record an outcome.
Past its local lease deadline a worker records no intent either.

Leases: ``begin`` (and ``delete_run``, ``rollback_to``, ``fork``) take the
run's lease for this worker when it does not hold it; ``lease``, ``release``
and ``claim_runs`` are the explicit forms (``leases.py``).

It shares with ``agentwal.Store`` what is the same for every backend:
``transact``/``atransact``/``abegin`` (``store_steps.StepsAPI``, a base
class), ``retry_of``'s checks (``txn.check_retry_of``), ``diff``'s decoding
(``history.compare_states``) and the effects listing (``effects.listing``).
The rest (reads, the history writes, the effects API under leases) is its
own, over the backend: the part of ``agentwal.Store``'s API this backend
supports (docs/postgres.md lists what is not there yet).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from psycopg import pq as psycopg_pq

from ..backend import View
from ..codec import decode_blob_ref, decode_stored, is_blob_ref, loads
from ..effects import (
    EffectContext,
    EffectMode,
    EffectRecord,
    check_listing,
    crossable,
    decode_entry,
    effect_id_for,
    effects_after,
    encode_entry,
    listing,
    same_first_effect,
)
from ..errors import (
    BackendUnsupportedError,
    CheckpointNotFoundError,
    EffectDivergenceError,
    EffectNotAppliedError,
    LeaseHeldError,
    MissingKeyError,
    NotABlobError,
    NotATreeError,
    ReadOnlyError,
    RunExistsError,
    RunNotFoundError,
    TreePathError,
)
from ..format import TREE_MEDIA_TYPE
from ..history import compare_states, rollback_delta
from ..leases import Lease, default_worker_id
from ..ledger import DispatchReport, Ledger, PositionOwners, Request, moved_on
from ..local.verify.report import VerifyReport
from ..retention import CompactReport, check_args, selected_runs
from ..store_effects import StandaloneEffects
from ..store_steps import StepsAPI
from ..transfer import CopyReport, copy_runs
from ..tree import exclude_spec, split_relpath
from ..treeio import RestoreReport
from ..txn import Transaction, check_effect_args, check_retry_of
from ..types import (
    BlobRef,
    Checkpoint,
    Diff,
    Durability,
    Progress,
    TreeDiff,
    TreeFile,
    check_checkpoint_id,
    check_key,
)
from .backend import Change, PostgresBackend
from .blobs import PgBlobReader
from .compact import compact as compact_runs
from .trees import PgTrees
from .verify import verify as verify_tables

__all__ = ["PostgresStore", "open_postgres"]

T = TypeVar("T")
_UNSET: Any = object()
#: How far back ``txn_adopt`` looks for an uncommitted attempt (as the local store).
_ADOPT_WALK = 32


def open_postgres(dsn: str, *, schema: str | None = None, worker_id: str | None = None,
                  lease_ttl: float = 30.0, durability: Durability | str = Durability.SYNC,
                  readonly: bool = False, pool_size: int = 4,
                  create: bool = True, max_steals: int | None = 5) -> PostgresStore:
    """Open (creating or migrating on first open) the store in ``schema`` of a PostgreSQL server.

    Args:
        dsn: a libpq URI (``postgresql://user@host/db``) or conninfo string.
            A URI may name the schema in its query (``...?schema=team_a``),
            which is how the CLI is given one.
        schema: the schema that holds the store (a lowercase identifier;
            default the URI's ``schema=``, else ``"agentwal"``).
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
        create: False to refuse (``CorruptionError``) a schema with no store
            in it instead of creating one (the CLI never creates a store).
        max_steals: how many times in a row a run's expired lease may be
            taken over without a commit; the next takeover parks the run (a
            poison run: ``RunParkedError`` until ``unpark``). None: never park.

    Raises:
        BackendUnavailableError: the server cannot be reached.
        SchemaVersionError: the schema is newer than this code.
        CorruptionError: ``readonly`` (or not ``create``) and there is no store in ``schema``.
        ValueError: a bad argument.
    """
    from .db import check_schema

    if not isinstance(dsn, str) or not dsn:
        raise ValueError("dsn must be a non-empty str")
    dsn, named = split_schema(dsn)
    if schema is not None and named is not None and schema != named:
        raise ValueError(f"the DSN names schema {named!r} and schema= says {schema!r}")
    schema = check_schema(schema if schema is not None else named or "agentwal")
    mode = Durability(durability)
    if not isinstance(lease_ttl, (int, float)) or isinstance(lease_ttl, bool) or lease_ttl <= 0:
        raise ValueError("lease_ttl must be a number of seconds > 0")
    if not isinstance(pool_size, int) or isinstance(pool_size, bool) or pool_size < 1:
        raise ValueError("pool_size must be an int >= 1")
    if max_steals is not None and (not isinstance(max_steals, int)
                                   or isinstance(max_steals, bool) or max_steals < 0):
        raise ValueError("max_steals must be an int >= 0 or None")
    wid = default_worker_id() if worker_id is None else check_key(worker_id, "worker id")
    backend = PostgresBackend(dsn, schema=schema, worker_id=wid, lease_ttl=float(lease_ttl),
                              synchronous=mode is Durability.SYNC, readonly=bool(readonly),
                              pool_size=pool_size, create=bool(create),
                              max_steals=max_steals)
    return PostgresStore(backend, mode)


def split_schema(dsn: str) -> tuple[str, str | None]:
    """``(dsn without a schema= query parameter, that schema or None)``.

    libpq knows no ``schema`` parameter, so a URI's is taken out before the
    DSN reaches it; the other parameters stay as they were written.
    """
    base, sep, query = dsn.partition("?")
    if not sep or "://" not in base:
        return dsn, None
    kept, schema = [], None
    for item in query.split("&"):
        name, _, value = item.partition("=")
        if name == "schema":
            schema = urllib.parse.unquote(value)
        elif item:
            kept.append(item)
    return (base + "?" + "&".join(kept) if kept else base), schema


class PostgresStore(StepsAPI, StandaloneEffects):
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
        #: the effects executor over the backend's compare-and-set ledger; each request
        #: carries its step's lease as ``Request.fence``
        self._ledger = Ledger(backend)
        self._trees = PgTrees(backend.blobs)
        self._retries = 0
        #: (run, checkpoint) -> the live transaction whose step uses the effect positions there
        self._pos_owners = PositionOwners()
        self._pos_lock = threading.Lock()

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
        the old holder's writes are fenced off from then on. An expired run
        taken over ``max_steals`` times without a commit is parked instead.
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError("limit must be an int >= 0")
        self._writable()
        return self._b.leases.claim(limit) if limit else []

    def unpark(self, run: str) -> bool:
        """Let workers take a parked run again, its takeover count reset; True if it was parked."""
        check_key(run, "run id")
        self._writable()
        return self._b.leases.unpark(run)

    def parked(self) -> dict[str, tuple[float, str]]:
        """The parked runs: ``{run: (when, seconds since the epoch; why)}``."""
        self._b._check_open()
        return self._b.leases.parked()

    # -- transactions ----------------------------------------------------------------

    def _writable(self) -> None:
        self._b._check_open()
        if self.readonly:
            raise ReadOnlyError(self.path)

    def begin(self, run: str, *, retry_of: Transaction | None = None,
              prefetch: Iterable[str] = ()) -> Transaction:
        """Begin a write transaction on ``run``, taking its lease for this worker if needed;
        the ``prefetch`` keys come with the snapshot, in one round trip.

        Raises:
            LeaseHeldError: another worker holds the run's lease.
            InvalidKeyError, ReadOnlyError, StoreClosedError, BackendUnavailableError.
            ValueError / TypeError: a bad ``retry_of`` (as ``agentwal.Store.begin``).
        """
        check_key(run, "run id")
        keys = tuple(check_key(k) for k in prefetch)
        self._writable()
        if retry_of is not None:
            check_retry_of(retry_of, self._b, run)
        return Transaction(self._b, self._b.begin(run, keys=keys), self, retry_of=retry_of)

    def _count_retry(self) -> None:
        self._retries += 1

    # Transaction's hooks (agentwal.txn.StepHooks); its reads and commit go to self._b.

    def txn_put_blob(self, source: Any, media_type: str | None) -> BlobRef:
        self._writable()
        return self._b.blobs.put(source, media_type)  # chunked rows (postgres/blobs.py)

    def txn_put_tree(self, path: Any, exclude: Any, base: bytes | None, rehash: bool = False,
                     subdir: str | None = None) -> tuple[BlobRef, list[str]]:
        self._writable()
        got = self._trees.put(path, exclude, base, rehash, subdir)  # the local tree code
        self._trees.record(got.ref)  # what it reaches, for collection (postgres/trees.py)
        return got.ref, []  # touched blobs are kept a grace hour: no pins

    def txn_unpin(self, pins: list[str]) -> None:
        """Nothing to unpin: a blob put and not yet committed is kept by its grace hour."""

    def txn_abandon_pins(self, pins: list[str]) -> None:
        """Nothing to unpin: a blob put and not yet committed is kept by its grace hour."""

    def _fenced(self, view: View, req: Request) -> Lease:
        """Fence ``req``'s ledger writes by the step's lease, and pass its epoch to ``fn``.

        Past the lease's local deadline (or once it is known lost) this raises
        LeaseLostError before anything reaches the server: a holder cut off
        from it learns nothing new there, and must start no call.
        """
        lease = view.fence
        assert isinstance(lease, Lease)  # begin takes the lease of every writing view
        lease.check()
        req.fence = lease
        req.fencing_token = lease.epoch
        return lease

    def txn_effect(self, view: View, req: Request) -> Any:
        self._fenced(view, req)
        return self._ledger.run(req)

    async def txn_aeffect(self, view: View, req: Request) -> Any:
        self._fenced(view, req)
        return await self._ledger.arun(req)

    def txn_effect_transactional(self, view: View, req: Request) -> Any:
        """``txn.effect(..., transactional=True)``: ``fn`` and its outcome in one transaction.

        One PostgreSQL transaction on one session: fence (the run's row ``FOR
        SHARE``, owner, epoch, expiry), lock the key's ledger row, then either
        return the recorded result (a retry of a step whose effect committed)
        or call ``fn(ctx)`` with ``ctx.conn`` and insert the ``done`` entry; the
        COMMIT makes ``fn``'s rows and the entry durable together. When ``fn``
        raises, everything rolls back and its exception propagates: there is
        no intent, so nothing is ever in doubt.

        Raises:
            LeaseLostError: the lease is gone (nothing called).
            EffectDivergenceError: the key or position holds another effect, or
                an entry a non-transactional call made (nothing called).
            EffectNotAppliedError: ``fn`` returned with its SQL failed (the
                transaction aborted): nothing of it was committed.
            UnencodableValueError: ``fn``'s result cannot be stored (rolled back).
            Whatever ``fn`` raised (rolled back, nothing recorded).
        """
        lease = self._fenced(view, req)
        if req.claim is not None:
            req.claim()
        self._ledger._check_position(req)
        args = loads(req.args_raw)
        try:
            with self._b._conn() as conn, conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = on")
                self._b.fenced_share(conn, lease)
                row = conn.execute("SELECT entry FROM effects WHERE key = %s FOR UPDATE",
                                   (req.key,)).fetchone()
                if row is not None:
                    return _recorded(decode_entry(bytes(row[0])), req)
                ctx = EffectContext(req.key, effect_id_for(req.key), req.run, 1, args,
                                    req.name, req.mode, lease.epoch, conn)
                try:
                    result = req.fn(ctx)
                except BaseException as exc:
                    raise _FnRaised(exc) from exc
                if conn.info.transaction_status == psycopg_pq.TransactionStatus.INERROR:
                    raise _FnRaised(EffectNotAppliedError(
                        effect_id_for(req.key), req.key,
                        f"effect {req.name!r}: a statement fn ran on ctx.conn failed, which "
                        "aborted the transaction; nothing of it was committed or recorded. "
                        "Let the error propagate (or fix the statement) and retry the step."))
                now = time.time()
                entry = EffectRecord(
                    effect_id_for(req.key), req.key, req.name, req.mode, req.run,
                    req.checkpoint, req.ordinal, False, "done", 1, args, req.digest,
                    result=result, idempotent=req.idempotent, created_at=now, updated_at=now,
                    keyed=req.keyed)
                try:
                    raw = encode_entry(entry)
                except BaseException as exc:
                    raise _FnRaised(exc) from exc
                conn.execute("INSERT INTO effects (key, run, ckpt, ordinal, entry) "
                             "VALUES (%s, %s, %s, %s, %s)",
                             (req.key, req.run, req.checkpoint, req.ordinal, raw))
        except _FnRaised as wrapped:
            raise wrapped.exc from None
        return result

    def txn_claim(self, txn: Transaction, base: int, *, chain: object,
                  inherited: bool) -> None:
        """Positions at ``base`` belong to one step: refuse a second live one, or a stale one.

        As ``EffectLog.claim`` locally: another live transaction of this worker
        begun from the same checkpoint (not a retry in the same chain) gets
        ``ConflictError``, and so does a transaction begun before the run
        moved on, unless it is a retry anchored there. Other workers cannot
        race here: the run's lease keeps them out.
        """
        run = txn.run
        with self._pos_lock:
            self._pos_owners.check(txn, base, chain)
            self._pos_owners.take(txn, base, chain)
        if inherited:
            return
        head = self._b.begin(run, lease=False).base
        if head != base:
            raise moved_on(run, base, head)

    def txn_adopt(self, run: str, base: int, name: str, digest: str, mode: EffectMode,
                  epoch: int, key: str | None = None) -> int | None:
        """The checkpoint of an uncommitted attempt of this step, whose effects to meet.

        The local store's rule (``EffectLog.adopt``): a step that died or
        conflicted after calling an effect leaves entries no commit marked; if
        the run moved on without effects meanwhile, its retry begins at a later
        head. Walking back from ``base`` (at most ``_ADOPT_WALK`` checkpoints,
        one query), the first checkpoint whose position 0 holds a live entry
        decides: committed, or ``base`` itself, means a new step (None); an
        uncommitted entry of the same effect (``effects.same_first_effect``: name,
        args, mode, and the step's business ``key`` or else the derived one) is
        the earlier attempt, whose checkpoint is returned. The walk never
        crosses a ``rollback_to`` or a fork's first checkpoint.
        """
        if base == 0 or self._b.begin(run, lease=False).base != base:
            return None  # a run's first step, or a stale one (which txn_claim refuses)
        found = None
        for e0 in self._b.position_zero(run, max(base - _ADOPT_WALK, 0), base):
            if e0.status == "retired":
                continue
            if e0.checkpoint == base or e0.committed_in is not None:
                return None  # this step's own positions, or a step that committed
            if not same_first_effect(e0, self.store_id, run, e0.checkpoint, name, digest, mode,
                                     key, epoch):
                return None
            found = e0.checkpoint
            break
        if found is None:
            return None
        if not crossable(self.history(run, limit=base - found), found, base):
            return None
        if self._b.positioned_after(run, found, base):
            return None  # a step ran in between whose position 0 holds nothing (as locally)
        return found

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
            raw = self._b.state_at(run, check_checkpoint_id(at), key=key).get(key)
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
            raw = self._b.state_at(run, check_checkpoint_id(at))
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
            if not 1 <= check_checkpoint_id(before) <= head.id:
                raise CheckpointNotFoundError(run, before)
        return self._b.checkpoints(run, limit=limit, before=before)

    def diff(self, run: str, a: int, b: int) -> Diff:
        """What changed in ``run`` from checkpoint ``a`` to checkpoint ``b``."""
        check_key(run, "run id")
        ra = self._b.state_at(run, check_checkpoint_id(a))
        rb = self._b.state_at(run, check_checkpoint_id(b))
        added, removed, changed = compare_states(ra, rb, where=self.path, run=run, a=a, b=b)
        return Diff(added, removed, changed, self._trees.key_diffs(added, removed, changed))

    def runs(self) -> list[str]:
        """Run ids with at least one checkpoint, sorted."""
        return self._b.runs()

    def copy_runs(self, dest: Any, runs: Any = None, *,
                  progress: Progress | None = None) -> CopyReport:
        """Copy ``runs`` (default all) with their history and ledger into store ``dest``.

        ``dest`` is a local or PostgreSQL store: see :func:`agentwal.transfer.copy_runs`.
        """
        return copy_runs(self, dest, runs, progress=progress)

    # -- history writes (each a fenced commit) ---------------------------------------

    def rollback_to(self, run: str, checkpoint: int) -> Checkpoint:
        """A new checkpoint (parent: the head) whose state equals the state at ``checkpoint``."""
        check_key(run, "run id")
        cid = check_checkpoint_id(checkpoint)
        self._writable()
        view = self._b.begin(run)
        target = self._b.state_at(run, cid)
        delta = rollback_delta(self._b.scan(view, ""), target)
        ckpt = self._b.commit(view, Change(run=run, writes=delta, prefixes=frozenset({""}),
                                           meta={"rollback_to": cid}))
        assert ckpt is not None
        return dataclasses.replace(ckpt, effects_after=effects_after(self.effects(run=run), cid))

    def fork(self, run: str, checkpoint: int, new_run: str) -> Checkpoint:
        """Start ``new_run`` from the state of ``run`` at ``checkpoint`` (its first checkpoint)."""
        check_key(run, "run id")
        check_key(new_run, "run id")
        cid = check_checkpoint_id(checkpoint)
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
        check_listing(run, status)
        return listing(self._b.effects(), run, status)

    def dispatch(self, handlers: dict[str, Callable[[EffectContext], Any]], *,
                 probes: dict[str, Callable[[EffectContext], Any]] | None = None,
                 run: str | None = None, limit: int | None = None) -> DispatchReport:
        """Run committed outbox entries (``txn.defer``) in commit order, under each run's lease.

        As ``Store.dispatch``; this worker takes the lease of each run with
        pending entries (and gives back those it took only for this), so the
        ledger writes of a dispatch are fenced like a step's. The entries of a
        run another worker holds are left to that owner, reported ``skipped``,
        and nothing of them is called or written. ``ctx.fencing_token`` is
        the epoch of the lease an entry is dispatched under.
        """
        self._writable()
        if run is not None:
            check_key(run, "run id")
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        pending = [e for e in self._b.outbox() if run is None or e.run == run]
        leases: dict[str, Lease] = {}
        took: list[str] = []
        for r in dict.fromkeys(e.run for e in pending):
            fresh = self._b.leases.held(r) is None
            try:
                leases[r] = self._b.leases.ensure(r)
            except LeaseHeldError as exc:
                # A lease that is not ours: the ledger's first write of such an entry
                # (its intent) is refused before the handler is called.
                leases[r] = Lease(r, 0, 0.0, lost=f"run {r!r} is leased by {exc.holder!r}; "
                                  "its owner dispatches it")
                continue
            if fresh:
                took.append(r)
        try:
            report = self._ledger.dispatch(
                dict(handlers), probes=probes, run=run, limit=limit,
                tokens={r: lease.epoch for r, lease in leases.items() if lease.lost is None},
                fences=dict(leases))
        finally:
            for r in took:
                self._b.leases.release(r)
        refused = {e.effect_id: leases[e.run].lost for e in pending
                   if leases[e.run].epoch == 0}
        report.skipped.extend((eid, str(refused[eid])) for eid, _ in report.failed
                              if eid in refused)
        report.failed[:] = [(eid, err) for eid, err in report.failed if eid not in refused]
        return report

    #: the request of a ``store.effect`` takes the run's lease (a server round trip)
    _standalone_does_io = True

    def _effect_ledger(self) -> Ledger:
        return self._ledger

    def _standalone(self, run: str, name: str, fn: Callable[[EffectContext], Any], *,
                    key: str, mode: EffectMode | str, args: Any,
                    probe: Callable[[EffectContext], Any] | None, idempotent: bool,
                    retries: int, retry_on: tuple[type[BaseException], ...], backoff: float,
                    allow_async: bool) -> Request:
        """The checked, keyed ledger request of a ``store.effect``, fenced by the run's lease.

        Takes this worker's lease on ``run`` if it does not hold it
        (``LeaseHeldError`` if another worker does).
        """
        check_key(run, "run id")
        self._writable()
        req_mode, args_raw = check_effect_args(name, fn, mode=mode, args=args, key=key,
                                               probe=probe, idempotent=idempotent,
                                               retries=retries, backoff=backoff,
                                               allow_async=allow_async, where="store")
        lease = self._b.leases.ensure(run)
        view = self._b.begin(run, lease=False)
        return Request(name, fn, req_mode, args_raw, key, run, view.base, None, probe,
                       bool(idempotent), retries, tuple(retry_on), float(backoff), True,
                       fencing_token=lease.epoch, fence=lease)

    def retire_effect(self, effect_id: str, *, by: str | None = None) -> EffectRecord:
        """Set a recorded effect aside and free its position (as ``Store.retire_effect``).

        Raises:
            EffectNotFoundError, EffectNotRetirableError, ReadOnlyError, StoreClosedError.
        """
        self._writable()
        return self._ledger.retire(effect_id, by=by)

    def resolve_effect(self, effect_id: str, *, result: Any = _UNSET, not_applied: bool = False,
                       by: str | None = None) -> EffectRecord:
        """Settle an entry in doubt, failed or pending by hand (as ``Store.resolve_effect``)."""
        self._writable()
        if (result is _UNSET) == (not not_applied):
            raise ValueError("give exactly one of result=... or not_applied=True")
        return self._ledger.resolve(effect_id, result=None if result is _UNSET else result,
                                    not_applied=not_applied, by=by)

    # -- maintenance -----------------------------------------------------------------

    def refresh(self) -> None:
        """Nothing to catch up with: every read goes to the server, so it is always current."""
        self._b._check_open()

    # What the local engine has and this backend does not yet: a typed refusal, never an
    # AttributeError (docs/postgres.md lists them).

    def snapshot(self) -> None:
        """Not on PostgreSQL: the server's own checkpointer does what a fold does locally."""
        raise _unsupported("store.snapshot", "The server makes commits durable by itself; "
                           "store.sync() waits for the ones made with durability='async'.")

    def compact(self, *, keep_last: int | None = None,
                older_than: datetime.timedelta | None = None,
                runs: list[str] | tuple[str, ...] | set[str] | None = None,
                vacuum: bool = False, keep_fork_origins: bool = True,
                progress: Progress | None = None) -> CompactReport:
        """Drop old checkpoints and the rows only they needed (as ``Store.compact``).

        The same choice of kept checkpoints as the local engine's; dropped
        ones raise ``CheckpointNotFoundError`` from then on. Each run is one
        transaction under its row lock (``agentwal/postgres/compact.py``);
        ``vacuum=True`` then runs ``VACUUM (ANALYZE)`` on the store's tables.
        ``progress`` hears ``("runs", done, total)``. The report's file sizes
        are the tables' ``pg_total_relation_size``; nothing is written for
        ``manifests_written``/``bytes_written`` (no manifest is needed).

        Raises:
            RunNotFoundError, TypeError / ValueError, ReadOnlyError, StoreClosedError.
        """
        self._writable()
        check_args(keep_last, older_than)
        return compact_runs(self._b, selected_runs(runs), keep_last, older_than, bool(vacuum),
                            bool(keep_fork_origins), progress)

    def verify(self, *, progress: Progress | None = None) -> VerifyReport:
        """Recompute every run's hash chain from the rows and check what they name.

        One repeatable-read pass (commits may go on): contiguous ids and
        parents, each checkpoint's deltas against its digest, the chain of
        hashes, the runs' heads, every content-addressed value against its
        SHA-256, every value and ledger entry decodes
        (``agentwal/postgres/verify.py``). Changes nothing. ``progress`` (see
        ``Store.verify``) hears one phase, ``tables``: 0 of 1, then 1 of 1.
        """
        self._b._check_open()
        if progress is not None:
            progress("tables", 0, 1)
        report = verify_tables(self._b, self._trees)
        if progress is not None:
            progress("tables", 1, 1)
        return report

    def backup(self, dest: Any, **_options: Any) -> Any:
        """Not on PostgreSQL: back the database up with its own tools (pg_dump, a base backup)."""
        raise _unsupported("store.backup", "Use pg_dump --schema, or `agentwal copy` to a "
                           "local store.")

    def open_blob(self, run: str, key: str, *, at: int | None = None,
                  verify: bool = True) -> PgBlobReader:
        """A read-only binary stream of the blob ``key`` holds (as ``Store.open_blob``).

        Fetched one 1 MiB chunk at a time; with ``verify``, reading to the end
        checks the SHA-256 (``CorruptionError`` on a mismatch).

        Raises:
            RunNotFoundError, CheckpointNotFoundError, MissingKeyError,
            NotABlobError (a value not put with ``put_blob``, or a tree),
            CorruptionError (the blob is missing, or of another size).
        """
        raw = self._stored(run, key, at)
        ref = decode_blob_ref(raw) if is_blob_ref(raw) else None
        if ref is None or ref.media_type == TREE_MEDIA_TYPE:
            raise NotABlobError(run, key, type(self._decode(raw, f"{run!r}/{key!r}")).__name__)
        return self._b.blobs.open(ref, verify=verify)

    def _stored(self, run: str, key: str, at: int | None) -> bytes:
        """The stored bytes of ``key`` (latest, or at checkpoint ``at``).

        Raises:
            RunNotFoundError, CheckpointNotFoundError, MissingKeyError, InvalidKeyError.
        """
        check_key(run, "run id")
        check_key(key)
        if at is None:
            view = self._b.begin(run, lease=False)
            if view.base == 0:
                raise RunNotFoundError(run)
            raw = self._b.read(view, key)
        else:
            raw = self._b.state_at(run, check_checkpoint_id(at), key=key).get(key)
        if raw is None:
            raise MissingKeyError(run, key)
        return raw

    def _tree_ref(self, run: str, key: str, at: int | None) -> BlobRef:
        """The tree reference ``key`` holds (latest, or at checkpoint ``at``)."""
        raw = self._stored(run, key, at)
        ref = decode_blob_ref(raw) if is_blob_ref(raw) else None
        if ref is None or ref.media_type != TREE_MEDIA_TYPE:
            raise NotATreeError(run, key, type(self._decode(raw, f"{run!r}/{key!r}")).__name__)
        return ref

    def restore_tree(self, run: str, key: str, dest: str | os.PathLike[str], *,
                     at: int | None = None) -> RestoreReport:
        """Make directory ``dest`` exactly the tree ``key`` holds (as ``Store.restore_tree``).

        With no stat cache on PostgreSQL, the files already in ``dest`` are
        compared by content (docs/postgres.md).
        """
        self._b._check_open()
        return self._trees.restore(self._tree_ref(run, key, at), dest)

    def open_tree_file(self, run: str, key: str, relpath: str, *,
                       at: int | None = None) -> PgBlobReader:
        """A read-only binary stream of one file of the tree ``key`` holds (as
        ``Store.open_tree_file``)."""
        self._b._check_open()
        try:
            parts = split_relpath(relpath)
        except ValueError as exc:
            raise TreePathError(str(relpath), f"is not a path inside a tree ({exc})") from None
        got = self._trees.open_file(self._tree_ref(run, key, at), parts, relpath)
        if isinstance(got, str):
            raise TreePathError(relpath, got)
        assert isinstance(got, PgBlobReader)
        return got

    def list_tree(self, run: str, key: str, *, at: int | None = None) -> list[TreeFile]:
        """Every file and link of the tree ``key`` holds (as ``Store.list_tree``)."""
        self._b._check_open()
        return self._trees.files(self._tree_ref(run, key, at))

    def _tree_status(self, run: str, key: str, path: str | os.PathLike[str],
                     exclude: Any) -> TreeDiff:
        """What differs on disk at ``path`` from the run's latest tree at ``key`` (Workspace)."""
        try:
            ref: BlobRef | None = self._tree_ref(run, key, None)
        except (MissingKeyError, RunNotFoundError):
            ref = None
        return self._trees.status(ref, path, *exclude_spec(exclude))

    def sync(self) -> None:
        """Make every acknowledged commit durable now (matters with ``durability="async"``)."""
        self._b.sync()

    def stats(self) -> dict[str, Any]:
        """Row counts and sizes of the store's tables, and this worker's leases."""
        out = self._b.stats()
        out.update(path=self.path, store_id=str(self.store_id), readonly=self.readonly,
                   retries=self._retries, durability=self.durability.value)
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


class _FnRaised(Exception):
    """Carries what a transactional effect's ``fn`` raised past the psycopg error translation."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


def _recorded(entry: EffectRecord, req: Request) -> Any:
    """The result recorded under ``req``'s key, or EffectDivergenceError."""
    if (entry.name, entry.args_digest, entry.mode) != (req.name, req.digest, req.mode):
        raise EffectDivergenceError(
            entry.effect_id, req.key, f"key {req.key!r} holds effect {entry.name!r} "
            f"({entry.effect_id}) with other arguments or mode; nothing was called")
    if entry.status not in ("done", "resolved"):
        raise EffectDivergenceError(
            entry.effect_id, req.key, f"key {req.key!r} holds a {entry.status} entry of "
            f"{entry.name!r} ({entry.effect_id}) made without transactional=True; nothing "
            "was called. Settle it (store.resolve_effect) or retire it (store.retire_effect).")
    return entry.result


def _unsupported(what: str, hint: str) -> BackendUnsupportedError:
    return BackendUnsupportedError(what, "PostgreSQL", hint)
