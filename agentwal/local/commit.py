"""The commit pipeline: validation, LSN assignment, group commit, failure rollback.

Theory of operation::

    commit ─▶ encode the delta (no lock) ─▶ [lock] validate (OCC) against
    last_write, assign LSN, checkpoint id, parent and hash; queue ─▶ [flush
    lock] take the whole queue, frame it and write it with one write ─▶ one
    committer at a time (``_syncing``): in sync mode one fdatasync of all
    that is written, then [lock] publish it (the store applies it to its
    memtable in LSN order) ─▶ every committer returns its checkpoint

*Group commit*, in two stages so the disk is kept busy: the *write stage*
(under ``flush_lock``, held only while framing and writing) takes every
queued record; the *sync stage* (one committer at a time, the others wait
on a condition) fsyncs everything written when it begins and publishes
what that fsync covered. While one committer is inside fdatasync, the
next ones write their records, so the following fsync starts as soon as
this one is published and covers all of them: N concurrent commits share
one fdatasync, and a commit never waits for a batch written after it.
The writer's own lock (``Writer.lock``) keeps rotation and close from
swapping the segment under an fsync in flight.

*Acknowledgement*: a record is published (and its committer returns) only
after an fsync that began once its write had completed, or, in async and
none modes, once written; records are published strictly in LSN order
(only the syncing committer publishes, and only a prefix of the written
records that ends on a whole batch).

*Optimistic concurrency*: ``last_write`` maps each key of each run to the LSN
of the last commit (queued or published) that wrote it. A commit whose
reads, writes or read prefixes were written after its snapshot LSN raises
:class:`ConflictError`. Entries older than every open snapshot are pruned.

*Run deletion* (:meth:`CommitPipeline.delete_run`): a ``REC_DELETE_RUN``
record, fsynced in every mode like an effect record, so it is durable when
``delete_run`` returns. Under the lock it forgets the run's head (the next
commit starts at checkpoint 1) and notes the record's LSN in ``deleted``: a
commit on the run whose snapshot is older than that LSN raises
:class:`ConflictError`, so a transaction begun before the deletion never
commits into the deleted run nor into its successor.

*Failure*: if a write fails, its batch and everything queued after it
fail; if a sync fails, every written and queued record fails. The LSN
counter, run heads and ``last_write`` are put back as they were before the
first failed record, so the next commit continues the log exactly where
the durable part ends. No room (ENOSPC, EDQUOT, EFBIG) on a write leaves
the writer usable (:class:`DiskFullError`; the writer zeroed the failed
bytes again); anything else stops it (:class:`DurabilityError`); an
exception that is not ours (a failpoint, a simulated power cut) stops it
too, since the batch's fate is unknown.

The pipeline shares the engine's lock (so publishing and reading views
agree) and never touches the memtable or LMDB itself: it reaches them through
one collaborator, :class:`Tables` (the engine): ``head_of(run)`` for a run
whose head it has not assigned yet, ``known_effect(key)`` for the outbox's
business-key dedup, ``publish(batch, pos)`` once a batch is durable, and
``oldest_snapshot()`` to prune ``last_write``. Each is called under the lock.
"""

from __future__ import annotations

import hashlib
import importlib
import signal
import threading
import time
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

from .. import failpoints
from ..codec import (
    Append,
    Value,
    checkpoint_hash,
    encode_commit_fields,
    encode_delta,
    encode_meta,
    pack_payload,
)
from ..effects import Deferred, EffectRecord, args_digest, encode_outbox
from ..errors import (
    ConflictError,
    DurabilityError,
    EffectDivergenceError,
    Error,
    RunExistsError,
    RunNotFoundError,
    StoreClosedError,
    UnencodableValueError,
)
from ..format import (
    FLAG_ZSTD,
    MAX_RECORD_PAYLOAD,
    REC_COMMIT,
    REC_DELETE_RUN,
    REC_EFFECT,
)
from ..types import Checkpoint, Durability
from .records import encode_delete_run
from .wal import PendingRecord, Writer

try:  # the C functions under the signal module's enum wrappers (see _hold_sigint)
    _sig: Any = importlib.import_module("_signal")
except ImportError:  # pragma: no cover - another Python
    _sig = signal
_SIGINT = int(signal.SIGINT)

__all__ = ["WAL_ZSTD_MIN", "CommitPipeline", "Pending", "Tables"]

#: The smallest commit delta the pipeline tries to compress. zstd costs about 6 µs per
#: KiB on the commit path, more than the bytes it saves cost to write and fsync; the
#: WAL is folded and dropped, so only large deltas are worth it. (Any delta of at least
#: ``format.COMPRESS_THRESHOLD`` bytes may be compressed: readers take either.)
WAL_ZSTD_MIN = 64 << 10
_ZERO_HASH = bytes(32)
_ABSENT: Any = object()


@dataclass(slots=True)
class Pending:
    """A commit (or an effect entry) between validation and publication."""

    lsn: int
    ckpt: Checkpoint | None  # None for an effect entry
    hsh: bytes
    meta_raw: bytes
    delta: Mapping[str, Value | None]
    record: PendingRecord
    prev_head: Any
    prev_writes: dict[str, Any]
    state: str = "queued"  # queued | written | done | failed
    error: BaseException | None = None
    #: outbox entries of a commit: ``(name, mode, args bytes, key | None, idempotent)``
    deferred: list[Deferred] | None = None
    #: the ledger entry an effect record carries and its (uncompressed) encoding
    effect: tuple[Any, bytes] | None = None
    #: the run a delete record deletes (``ckpt`` and ``effect`` are None)
    drop: str | None = None
    #: for a delete record: ``deleted[drop]`` before it (to put back on failure)
    prev_deleted: Any = None
    #: SHA-256 of the commit's outbox field as hashed (None: no outbox); the
    #: snapshot keeps it so ``verify`` can recompute the checkpoint hash
    outbox_digest: bytes | None = None
    #: keys of the effects the committing transaction recorded (``txn.effect``):
    #: publishing marks their ledger entries ``committed_in`` this checkpoint
    effect_keys: tuple[str, ...] = ()
    #: keys of ``delta`` the record logs as append entries: key -> (base count, base
    #: length); the fold keeps them with the checkpoint, so ``verify`` can rebuild
    #: the hashed delta from the folded values
    appends: dict[str, tuple[int, int]] | None = None


class Tables(Protocol):
    """What the pipeline needs from the tables it publishes into; called under the lock."""

    def head_of(self, run: str) -> tuple[int, bytes] | None:
        """``(id, hash)`` of the run's latest published checkpoint (None: no checkpoint)."""
        ...

    def known_effect(self, key: str) -> EffectRecord | None:
        """The published ledger entry with key ``key``, or None."""
        ...

    def publish(self, batch: list[Pending], pos: tuple[int, int] | None) -> None:
        """Make the durable ``batch`` visible, in LSN order; ``pos``: the log's end after it."""
        ...

    def oldest_snapshot(self) -> int:
        """The oldest snapshot LSN an open view still reads at."""
        ...


#: The main thread's id: only it gets Python's signal handlers (so a KeyboardInterrupt).
_MAIN_THREAD = threading.main_thread().ident


def _hold_sigint() -> list[int] | None:
    """Hold a Ctrl-C (SIGINT) that arrives from now until :func:`_release_sigint`.

    The write and sync stages keep the log, the writer's offsets and the records'
    states in step; an exception between two of their statements leaves the log's
    contents unknown, and the writer stops (:meth:`CommitPipeline._io_failed`). A
    ``KeyboardInterrupt`` is raised between any two statements of the main thread,
    so a notebook's "interrupt" or a Ctrl-C during a commit stopped the store. In the
    main thread, while Python's default SIGINT handler is installed (a program that
    installed its own keeps it), the signal is noted instead (in the list returned;
    None: not held) and raised as ``KeyboardInterrupt`` by :func:`_release_sigint`
    once the commit has finished one way or the other (at most one fsync later).
    ``_signal``'s functions, not ``signal``'s enum wrappers: ~2 us per commit, not ~25.
    """
    if (threading.get_ident() != _MAIN_THREAD
            or _sig.getsignal(_SIGINT) is not signal.default_int_handler):
        return None
    noted: list[int] = []
    _sig.signal(_SIGINT, lambda signum, _frame: noted.append(signum))
    return noted


def _release_sigint(noted: list[int]) -> None:
    """Put Python's SIGINT handler back; raise the Ctrl-C that :func:`_hold_sigint` held."""
    _sig.signal(_SIGINT, signal.default_int_handler)
    if noted:
        raise KeyboardInterrupt


class CommitPipeline:
    """Turns validated deltas into durable, published commits."""

    def __init__(self, path: str, writer: Writer, durability: Durability, lock: threading.Lock,
                 next_lsn: int, heads: dict[str, tuple[int, bytes]], tables: Tables) -> None:
        self.path = path
        self.writer = writer
        self.durability = durability
        self.lock = lock  # the store's lock
        self.flush_lock = threading.Lock()  # one writer of the log at a time
        self._done = threading.Condition(lock)  # a batch was published or failed
        #: records written to the log, not yet published or failed, in LSN order
        self._inflight: list[Pending] = []
        self._syncing = False  # a committer is syncing and publishing written records
        self._zstd_misses = 0  # recent compression attempts that did not help
        self._zstd_skip = 0  # commits left before compression is tried again
        self.next_lsn = next_lsn
        self.heads = heads  # run -> (id, hash) of its latest assigned checkpoint
        self.last_write: dict[str, dict[str, int]] = {}
        #: run -> LSN of its latest delete record (pruned like ``last_write``)
        self.deleted: dict[str, int] = {}
        self.pending: list[Pending] = []
        self.closed = False  # set by the store, under the lock, when it closes
        self._since_prune = 0  # commits published since last_write was last pruned
        self.settled_lsn = next_lsn - 1  # every LSN up to here is published or failed
        self.counters = {"commits": 0, "effect_records": 0, "conflicts": 0, "batches": 0,
                         "syncs": 0}
        self.tables = tables

    # -- committing -----------------------------------------------------------------

    def commit(self, run: str, snap: int, reads: AbstractSet[str], prefixes: AbstractSet[str],
               delta: Mapping[str, Value | None], meta: dict[str, Any],
               deferred: list[Deferred] | None = None, *,
               origin: tuple[str, int] | None = None,
               effects: tuple[str, ...] = (),
               appends: Mapping[str, Append] | None = None) -> Checkpoint:
        """Validate, assign, queue and drive one commit; returns its checkpoint.

        ``deferred`` outbox entries are logged (and hashed) with the commit.
        ``origin`` (a fork's ``(run, id)``) makes the commit the first
        checkpoint of ``run``: it is refused if ``run`` has one already.
        ``effects`` are the keys of the ledger entries the transaction
        recorded; the commit record carries them, so the commit and the
        entries' ``committed_in`` mark are one atomic fact. ``appends`` are
        keys of ``delta`` whose change is an append to the value the commit
        read (``codec.Append``): the record logs and hashes the entry, the
        memtable gets the whole value from ``delta``.

        Raises:
            ConflictError, UnencodableValueError, DiskFullError, DurabilityError,
            RunExistsError (with ``origin``).
        """
        try_zstd = self._zstd_skip <= 0
        logged = {k: a for k, a in appends.items() if k in delta} if appends else None
        blob, flags, digest = encode_delta(delta, compress=try_zstd, threshold=WAL_ZSTD_MIN,
                                           appends=logged)
        self._learn_compression(
            try_zstd and (bool(flags & FLAG_ZSTD) or len(blob) >= WAL_ZSTD_MIN), flags)
        meta_raw = encode_meta(meta)
        size = len(blob) + len(meta_raw) + sum(len(d[2]) for d in deferred or ())
        if size > MAX_RECORD_PAYLOAD - 65536:
            raise UnencodableValueError("<commit>", f"the commit is {size} bytes encoded, "
                                        f"over the {MAX_RECORD_PAYLOAD} byte record limit; "
                                        "split it across several commits")
        created = time.time()
        failpoints.hit("commit_after_encode")
        with self.lock:
            if self.closed:
                raise StoreClosedError(self.path)
            if self.writer.broken is not None:
                raise self.writer.stopped()
            self._validate(run, snap, delta.keys() | reads, prefixes)
            if deferred:
                deferred = self._dedup_outbox(deferred)
            outbox = encode_outbox(deferred) if deferred else None
            head = self.heads.get(run) or self.tables.head_of(run)
            if origin is not None and head is not None:
                raise RunExistsError(run)
            parent, parent_hash = (head[0], head[1]) if head else (None, _ZERO_HASH)
            cid = (parent or 0) + 1
            hsh = checkpoint_hash(parent_hash, run, cid, parent, created, meta_raw, origin,
                                  digest, outbox)
            lsn = self.next_lsn
            payload = encode_commit_fields(run, cid, parent, created, meta_raw, hsh, origin,
                                           blob, outbox, effects)
            ckpt = Checkpoint(run, cid, parent, lsn, created, meta, hsh.hex(), origin)
            writes = self.last_write.setdefault(run, {})
            pc = Pending(lsn, ckpt, hsh, meta_raw, delta,
                         PendingRecord(lsn, REC_COMMIT, flags, payload),
                         self.heads.get(run, _ABSENT), {k: writes.get(k, _ABSENT) for k in delta},
                         deferred=deferred or None,
                         outbox_digest=hashlib.sha256(outbox).digest() if outbox else None,
                         effect_keys=effects,
                         appends={k: (a[0], a[1]) for k, a in logged.items()} if logged
                         else None)
            for k in delta:
                writes[k] = lsn
            self.heads[run] = (cid, hsh)
            self.next_lsn = lsn + 1
            self.pending.append(pc)
        try:
            self._drive(pc)
        except KeyboardInterrupt as exc:  # held until the commit ended (_hold_sigint)
            if pc.state == "done":
                exc.agentwal_checkpoint = ckpt  # type: ignore[attr-defined]
            raise
        return ckpt

    def record_effect(self, entry: Any, raw: bytes) -> int:
        """Log one effects-ledger entry and return once it is durable and published.

        Effect records are always fsynced, whatever the durability mode: an
        intent must be on disk before the call it announces. Returns the LSN.

        Raises:
            UnencodableValueError, DiskFullError, DurabilityError, StoreClosedError.
        """
        payload, flags = pack_payload(raw, f"effect {entry.name!r}")
        if len(payload) > MAX_RECORD_PAYLOAD - 65536:
            raise UnencodableValueError(f"effect {entry.name!r}",
                                        f"its ledger entry is {len(payload)} bytes encoded, "
                                        f"over the {MAX_RECORD_PAYLOAD} byte record limit; "
                                        "keep large results out of effects (store a blob)")
        with self.lock:
            if self.closed:
                raise StoreClosedError(self.path)
            if self.writer.broken is not None:
                raise self.writer.stopped()
            lsn = self.next_lsn
            pc = Pending(lsn, None, b"", b"", {}, PendingRecord(lsn, REC_EFFECT, flags, payload),
                         _ABSENT, {}, effect=(entry, raw))
            self.next_lsn = lsn + 1
            self.pending.append(pc)
        self._drive(pc)
        return lsn

    def delete_run(self, run: str) -> int:
        """Log the deletion of ``run``; returns its LSN once durable and published.

        Raises:
            RunNotFoundError: the run has no checkpoint.
            DiskFullError, DurabilityError, StoreClosedError.
        """
        with self.lock:
            if self.closed:
                raise StoreClosedError(self.path)
            if self.writer.broken is not None:
                raise self.writer.stopped()
            head = self.heads.get(run) or self.tables.head_of(run)
            if head is None:
                raise RunNotFoundError(run)
            lsn = self.next_lsn
            pc = Pending(lsn, None, b"", b"", {},
                         PendingRecord(lsn, REC_DELETE_RUN, 0, encode_delete_run(run, head[0])),
                         self.heads.get(run, _ABSENT), {}, drop=run,
                         prev_deleted=self.deleted.get(run, _ABSENT))
            self.heads.pop(run, None)
            self.deleted[run] = lsn
            self.next_lsn = lsn + 1
            self.pending.append(pc)
        self._drive(pc)
        return lsn

    def _dedup_outbox(self, deferred: list[Deferred]) -> list[Deferred]:
        """Drop outbox entries whose business key the ledger already has; under the lock.

        The decision is made here, before the record is written, and the log
        carries only the entries kept, so replay creates exactly what the live
        store did and publishing never has to look anything up. The ledger is
        every published entry plus what is queued ahead of this commit.

        Raises:
            EffectDivergenceError: the key is recorded with another name, mode or args.
        """
        queued: dict[str, tuple[str, str, str]] = {}
        for p in self.pending:
            if p.effect is not None:
                e = p.effect[0]
                queued[e.key] = (e.name, e.mode.value, e.args_digest)
            for d in p.deferred or ():
                if d[3] is not None:
                    queued.setdefault(d[3], (d[0], d[1], args_digest(d[2])))
        kept = []
        for d in deferred:
            name, mode, args_raw, key, _idem = d
            if key is None:
                kept.append(d)
                continue
            found = queued.get(key)
            if found is None:
                e = self.tables.known_effect(key)
                found = (e.name, e.mode.value, e.args_digest) if e is not None else None
            if found is None:
                queued[key] = (name, mode, args_digest(args_raw))
                kept.append(d)
            elif found != (name, mode, args_digest(args_raw)):
                raise EffectDivergenceError(
                    None, key, f"outbox entry {name!r} has business key {key!r}, which the "
                    f"ledger holds for {found[0]!r} ({found[1]}) with other inputs; nothing "
                    "was committed. Use a key that names one request.")
        return kept

    def _learn_compression(self, tried: bool, flags: int) -> None:
        """Stop trying zstd for a while when it keeps not helping (random or packed data).

        Unsynchronised on purpose: a lost update only changes how soon the next
        attempt happens, never what is written.
        """
        if not tried:
            self._zstd_skip -= 1
        elif flags & FLAG_ZSTD:
            self._zstd_misses = 0
        else:
            self._zstd_misses += 1
            if self._zstd_misses >= 8:
                self._zstd_misses, self._zstd_skip = 0, 64

    def _validate(self, run: str, snap: int, keys: Any, prefixes: AbstractSet[str]) -> None:
        """Raise :class:`ConflictError` if a key read or written changed after ``snap``.

        Before raising, wait (briefly) until the conflicting commit is settled:
        it may still be on its way to disk, and a retry begun before it is
        visible would conflict again, in a spin.
        """
        writes = self.last_write.get(run)
        gone = self.deleted.get(run, 0)
        if not writes and gone <= snap:
            return
        conflict: tuple[str | None, int] | None = (None, gone) if gone > snap else None
        writes = writes or {}
        for k in keys if conflict is None else ():
            lsn = writes.get(k, 0)
            if lsn > snap:
                conflict = (k, lsn)
                break
        if conflict is None and prefixes:
            for k, lsn in writes.items():
                if lsn > snap and any(k.startswith(p) for p in prefixes):
                    conflict = (None, lsn)
                    break
        if conflict is not None:
            self.counters["conflicts"] += 1
            self._done.wait_for(lambda: self.settled_lsn >= conflict[1], timeout=5.0)
            raise ConflictError(run, conflict[0], deleted=gone > snap)

    # -- group commit ---------------------------------------------------------------

    def _drive(self, pc: Pending) -> None:
        """:meth:`_drive_stages` with Ctrl-C held off until it ends (:func:`_hold_sigint`);
        a commit that landed names its checkpoint on that ``KeyboardInterrupt``
        (``agentwal_checkpoint``, set by :meth:`commit`), so the transaction says so."""
        noted = _hold_sigint()
        try:
            self._drive_stages(pc)
        finally:
            if noted is not None:
                _release_sigint(noted)

    def _drive_stages(self, pc: Pending) -> None:
        """Make ``pc`` durable and visible: write what is queued, then sync or wait.

        Two stages (see the module docstring): :meth:`_write_queued` (under
        ``flush_lock``) frames and writes every queued record, ``pc``'s among
        them unless another committer already did; then one committer at a
        time (``_syncing``) fsyncs what is written and publishes it. The
        others wait on a condition, not a lock, and return as soon as a sync
        covered their record; the one whose record was written after the last
        fsync began runs the next one. So the next batch is written while an
        fsync is in flight, and no committer waits for a later batch's fsync.
        """
        while True:
            self._write_queued()
            with self.lock:
                while pc.state == "written" and self._syncing:
                    self._done.wait()
                if pc.state != "written":
                    if pc.state == "queued":  # not possible after _write_queued; be safe
                        continue
                    break
                self._syncing = True
            self._sync_stage()
        if pc.state == "failed":
            assert pc.error is not None
            raise pc.error

    def _write_queued(self) -> None:
        """Frame and write every queued record in one write (the group commit's write stage)."""
        with self.flush_lock:
            with self.lock:
                batch, self.pending = self.pending, []
                if not batch:
                    return
                for p in batch:
                    p.state = "written"
                self._inflight.extend(batch)
            try:
                self.writer.append([p.record for p in batch])
            except BaseException as exc:
                self._io_failed(batch[0], exc)  # re-raises an exception that is not ours

    def _sync_stage(self) -> None:
        """Run the sync stage; the caller set ``_syncing`` (under the lock) to own it."""
        try:
            self._sync_written_batches()
        finally:
            with self.lock:
                self._syncing = False
                self._done.notify_all()

    def _sync_written_batches(self) -> None:
        """Fsync (when the mode or a record asks for it) and publish the written batches.

        Runs in one thread at a time (``_syncing``). Publishes, in LSN order,
        every written record the fsync covered (all written ones when none
        was needed); records written meanwhile wait for the next one.
        """
        # The log's end first, then the written records: every record up to that end
        # is among them (a batch is listed before its write, the end moves after), so
        # an effect or delete record up to it is seen and gets its fsync.
        end = self.writer.end
        with self.lock:
            written = list(self._inflight)
        if not written:
            return
        synced = False
        try:
            if self.durability is Durability.SYNC or any(p.ckpt is None for p in written):
                self.writer.sync()  # may find it all durable already (a rotation synced it)
                synced = True
                covered, pos = self.writer.synced_end
            else:
                covered, pos = end
        except BaseException as exc:
            self._io_failed(written[0], exc)  # re-raises an exception that is not ours
            return
        with self.lock:
            # ``covered`` ends a whole batch (the writer's end moves once per write)
            n = 0
            for p in self._inflight:
                if p.lsn > covered:
                    break
                n += 1
            self.counters["syncs"] += synced
            if not n:
                return
            batch, self._inflight = self._inflight[:n], self._inflight[n:]
            for p in batch:
                p.state = "done"
            self.tables.publish(batch, pos)
            self.settled_lsn = max(self.settled_lsn, batch[-1].lsn)
            effects = sum(1 for p in batch if p.ckpt is None and p.drop is None)
            drops = sum(1 for p in batch if p.drop is not None)
            self.counters["commits"] += len(batch) - effects - drops
            self.counters["effect_records"] += effects
            self.counters["batches"] += 1
            self._since_prune += len(batch)
            if self._since_prune >= 512:  # batches step over multiples: count instead
                self._since_prune = 0
                self._prune_last_write()
            self._done.notify_all()
        failpoints.hit("after_publish")

    def drain(self, timeout: float | None = None) -> bool:
        """Settle every written record (published or failed); call under ``flush_lock``.

        With ``flush_lock`` held nothing new is written. A written record
        need not have a committer on its way to sync it (``sync()`` writes
        other committers' queued records, which may then wait for the very
        ``flush_lock`` held here; an interrupted committer leaves its record
        written), so when no one is syncing, this thread runs the sync stage
        itself instead of waiting for one. Returns False if ``timeout``
        passed while another thread's sync stage was still running.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.lock:
                if not self._inflight:
                    return True
                if self._syncing:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._done.wait(left)
                    continue
                self._syncing = True
                first = self._inflight[0]
            self._sync_stage()
            with self.lock:
                if self._inflight and self._inflight[0] is first:
                    return False  # a sync stage settled nothing: never spin

    def _io_failed(self, first: Pending, exc: BaseException) -> None:
        """A write or sync failed: fail ``first`` and every record after it.

        Our own error (:class:`Error`: no room, a failed fsync) is the
        records' error. Anything else (a failpoint, a simulated power cut)
        leaves the batch's fate unknown: the writer stops with a
        :class:`DurabilityError`, the records get it, and ``exc`` is raised
        again.
        """
        if isinstance(exc, Error):
            self._fail_from(first, exc)
            return
        err = DurabilityError(self.path, f"commit interrupted by {type(exc).__name__}")
        self.writer.broken = err
        self._fail_from(first, err)
        raise exc

    def _fail_from(self, first: Pending, exc: BaseException) -> None:
        """Fail ``first`` and every record after it, written or queued; put LSNs back.

        Nothing to do when ``first`` was settled already (an earlier failure
        took it along).
        """
        with self.lock:
            at = next((i for i, p in enumerate(self._inflight) if p is first), None)
            if at is None:
                return
            doomed = self._inflight[at:] + self.pending
            self._inflight, self.pending = self._inflight[:at], []
            self._fail_queued(doomed, exc)

    def _fail_queued(self, doomed: list[Pending], exc: BaseException) -> None:
        """Fail ``doomed`` (the last records assigned, in LSN order); put LSNs and heads back.

        Call under the lock.
        """
        for p in reversed(doomed):
            p.state, p.error = "failed", exc
            if p.drop is not None:  # a deletion: its run's head comes back
                if p.prev_head is not _ABSENT:
                    self.heads[p.drop] = p.prev_head
                if p.prev_deleted is _ABSENT:
                    self.deleted.pop(p.drop, None)
                else:
                    self.deleted[p.drop] = p.prev_deleted
                continue
            if p.ckpt is None:  # an effect entry: no head or write to put back
                continue
            run = p.ckpt.run
            if p.prev_head is _ABSENT:
                self.heads.pop(run, None)
            else:
                self.heads[run] = p.prev_head
            writes = self.last_write.setdefault(run, {})
            for k, old in p.prev_writes.items():
                if old is _ABSENT:
                    writes.pop(k, None)
                else:
                    writes[k] = old
        self.settled_lsn = max(self.settled_lsn, doomed[-1].lsn)
        self.next_lsn = doomed[0].lsn
        self._done.notify_all()

    def _prune_last_write(self) -> None:
        oldest = self.tables.oldest_snapshot()
        for run in [r for r, lsn in self.deleted.items() if lsn <= oldest]:
            del self.deleted[run]
        for run in list(self.last_write):
            w = self.last_write[run]
            for k in [k for k, lsn in w.items() if lsn <= oldest]:
                del w[k]
            if not w:
                del self.last_write[run]

    # -- syncing --------------------------------------------------------------------

    def sync(self) -> None:
        """Write anything queued and fsync everything written."""
        self._write_queued()
        self.sync_written()

    def sync_written(self) -> None:
        """Fsync what was written but not yet synced.

        Needs no ``flush_lock``: the writer syncs while commits go on writing
        (``Writer.lock`` keeps the segment in place), so async mode's
        background flush never stalls a committer for an fsync.
        """
        if self.writer.written_lsn > self.writer.synced_lsn and self.writer.sync():
            with self.lock:
                self.counters["syncs"] += 1

    def sync_through(self, lsn: int) -> None:
        """Make the log durable at least through ``lsn`` (before LMDB may pass it)."""
        if self.writer.synced_lsn < lsn and self.writer.sync():
            with self.lock:
                self.counters["syncs"] += 1
