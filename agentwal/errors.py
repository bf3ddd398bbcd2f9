"""The error tree of agentwal.

Theory of operation: every failure the public API reports is an instance of
:class:`Error`, the one root (like ``sqlite3.Error`` or ``lmdb.Error``). Each
class carries a stable ``code`` string that scripts may match on, and each
message ends with what to do next. Errors are built from domain facts (a
path and an offset, a run and a key), never from a raw ``OSError`` or
decoder exception: any other exception escaping the public API is a bug.

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

import datetime
import os

__all__ = [
    "CheckpointNotFoundError",
    "ConflictError",
    "CorruptionError",
    "DiskFullError",
    "DurabilityError",
    "EffectDivergenceError",
    "EffectError",
    "EffectInDoubtError",
    "EffectNotAppliedError",
    "EffectNotFoundError",
    "EffectSettledError",
    "Error",
    "InvalidKeyError",
    "MissingKeyError",
    "ReadOnlyError",
    "RunExistsError",
    "EffectNotRetirableError",
    "BackendUnsupportedError",
    "RunNotFoundError",
    "StoreClosedError",
    "StoreLockedError",
    "TooManyReadersError",
    "TransactionClosedError",
    "UnencodableValueError",
    "StoreBusyError",
    "BlobSourceError",
    "NotABlobError",
    "NotAListError",
    "PathExistsError",
    "LeaseHeldError",
    "RunParkedError",
    "LeaseLostError",
    "BackendUnavailableError",
    "SchemaVersionError",
    "NotATreeError",
    "TreePathError",
    "TreeSourceError",
    "UnsafeTreeError",
    "RestoreError",
    "StoreNotFoundError",
    "NotAStoreError",
    "StoreLimitError",
    "TransactionThreadError",
]


#: How many characters of a key or run id a message shows.
SHOWN_CHARS = 60


def _shown(value: object) -> str:
    """``repr(value)``, cut to about :data:`SHOWN_CHARS` characters, saying how long it was."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!r}... ({len(value)} characters)"
    text = repr(value)
    if len(text) > SHOWN_CHARS + 20:
        return f"{text[:SHOWN_CHARS]}... ({type(value).__name__}, {len(text)} characters as repr)"
    return text


class Error(Exception):
    """Root of every error agentwal raises.

    Attributes:
        code: a stable, machine-readable identifier such as ``"conflict"``.
    """

    code = "error"


class ConflictError(Error):
    """A concurrent commit on the same run overwrote what this transaction read or wrote.

    Nothing of the transaction was applied; begin a new one and redo the step.
    Effects the transaction called stay recorded (``effects`` names them):
    redo the step with ``store.transact`` or ``store.begin(run, retry_of=txn)``
    so it meets their recorded results instead of calling them again.

    Attributes:
        run: the run. key: the key that changed (None: a key range or a whole run).
        deleted: the run was deleted after the transaction began.
        effects: names of the effects the failed transaction had recorded.
    """

    code = "conflict"

    def __init__(self, run: str, key: str | None = None, *, deleted: bool = False,
                 reason: str | None = None, effects: tuple[str, ...] = ()) -> None:
        self.run = run
        self.key = key
        self.deleted = deleted
        self.effects = tuple(effects)
        if deleted:
            text = (f"run {_shown(run)} was deleted (store.delete_run) after this transaction "
                    "began; "
                    "nothing was applied. Begin a new transaction if the run should start "
                    "afresh.")
        elif reason is not None:
            text = f"run {_shown(run)}: {reason}"
        else:
            what = f"key {_shown(key)}" if key is not None else "a key range"
            text = (f"run {_shown(run)}: {what} was changed by a concurrent commit after this "
                    "transaction began; nothing was applied. Begin a new transaction and retry.")
        if self.effects and deleted:
            text += (f" The transaction had called {len(self.effects)} effect(s): they stay "
                     "recorded under the deleted run (store.effects(run=...)).")
        elif self.effects:
            names = ", ".join(repr(n) for n in self.effects[:5])
            more = f" and {len(self.effects) - 5} more" if len(self.effects) > 5 else ""
            text += (f" The transaction had called effects ({names}{more}): they stay "
                     "recorded. Retry with store.transact(run, step) or "
                     "store.begin(run, retry_of=txn) to reuse their results (a plain new "
                     "transaction reuses them only if it asks for the same effects first).")
        super().__init__(text)


class StoreLockedError(Error):
    """Another process holds the store's writer lock."""

    code = "store_locked"

    def __init__(self, path: str, pid: int | None, *, advice: str | None = None) -> None:
        self.path = path
        self.pid = pid
        if pid is not None and pid == os.getpid():
            holder = (f"this process (pid {pid}, another Store object, or a transaction of "
                      "one that the program still holds)")
        else:
            holder = f"process {pid}" if pid else "another process"
        super().__init__(
            f"store {path!r} is open for writing by {holder}. "
            + (advice or "Close it there, or open this one with readonly=True.")
        )


class ReadOnlyError(Error):
    """A write was attempted on a store opened with ``readonly=True``."""

    code = "read_only"

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"store {path!r} was opened read-only. Open it without readonly=True to write."
        )


class StoreClosedError(Error):
    """The store was closed (or never finished opening)."""

    code = "store_closed"

    def __init__(self, path: str, why: str | None = None) -> None:
        self.path = path
        super().__init__(f"store {path!r} is closed. Open it again with agentwal.open()."
                         if why is None else f"store {path!r} is closed in this process: {why}")


class TransactionClosedError(Error):
    """The transaction already committed or rolled back; it cannot be used again."""

    code = "transaction_closed"

    def __init__(self, run: str, state: str) -> None:
        self.run = run
        self.state = state
        super().__init__(
            f"the transaction on run {_shown(run)} is already {state}. Begin a new one "
            "with store.begin(run)."
        )


class TransactionThreadError(Error):
    """A transaction was used from a thread other than the one that began it.

    A transaction is one thread's (one asyncio task's): its buffered writes,
    read set and effect positions are not guarded for concurrent use. Begin
    a transaction in each thread instead. In asyncio code use ``acommit``,
    ``aeffect``, ``aput_blob`` and ``aput_tree``, which run their I/O off the
    loop on the transaction's behalf. The call did nothing; the transaction
    stays usable from its own thread.

    Attributes:
        run: the transaction's run. thread: the name of the refused thread.
    """

    code = "transaction_thread"

    def __init__(self, run: str, thread: str) -> None:
        self.run = run
        self.thread = thread
        super().__init__(
            f"the transaction on run {_shown(run)} belongs to the thread that began it, not "
            f"to thread {thread!r}; nothing was done. Begin a transaction in this thread "
            "(asyncio code: use acommit, aeffect, aput_blob, aput_tree).")


class MissingKeyError(Error, KeyError):
    """``txn[key]`` on a key that has no value (a ``KeyError`` too)."""

    code = "missing_key"

    def __init__(self, run: str, key: str) -> None:
        self.run = run
        self.key = key
        Exception.__init__(
            self,
            f"run {_shown(run)} has no key {_shown(key)}. Use txn.get(key, default) to supply "
            "a default.",
        )

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class InvalidKeyError(Error, ValueError):
    """A key or run id is not a ``str`` of 1..400 UTF-8 bytes."""

    code = "invalid_key"

    def __init__(self, key: object, reason: str) -> None:
        self.key = key
        super().__init__(f"invalid key {_shown(key)}: {reason}. Keys are str of 1..400 "
                         "UTF-8 bytes.")


class UnencodableValueError(Error, TypeError):
    """A value cannot be encoded as CBOR (a custom object, a cycle, a naive datetime...)."""

    code = "unencodable_value"

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        super().__init__(
            f"value for key {_shown(key)} cannot be stored: {reason}. Store None, bool, int, "
            "float, str, bytes, list, tuple, dict, set, Decimal, UUID or an aware datetime."
        )


class CorruptionError(Error):
    """A file of the store is damaged or is not what it should be.

    Attributes:
        path: the damaged file.
        offset: the byte offset of the damage, when known.
        reason: what is wrong.
    """

    code = "corruption"

    def __init__(self, path: str, offset: int | None, reason: str,
                 hint: str | None = None) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        where = f"{path} at offset {offset}" if offset is not None else path
        super().__init__(
            f"{where}: {reason}. " + (hint or "The store was not changed; move the damaged "
                                      "file aside or restore the store from a backup.")
        )


class DiskFullError(Error):
    """No room for a write: the disk is full (or a quota or file-size limit is hit).

    Raised from a commit, nothing of it was acknowledged or made durable;
    raised from a fold, LMDB is unchanged and the WAL still holds everything.
    Either way the store stays usable: try again once there is room.
    """

    code = "disk_full"

    def __init__(self, path: str, reason: str | None = None) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            reason if reason is not None else
            f"no space left on the device holding {path!r}; the commit was not "
            "acknowledged. Free some space and commit again."
        )


class DurabilityError(Error):
    """An fsync or write failed: the writer is stopped and accepts no further commits.

    The outcome of the commits in flight is unknown until the store is reopened.
    Never retry: fix the disk, then reopen the store, which recovers from the log.
    """

    code = "durability"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"{path}: {reason}; the store accepts no more commits. Check the disk, "
            "then close and reopen the store (recovery decides what was kept)."
        )


class EffectError(Error):
    """Base of the effect errors: carries the entry's ``effect_id`` and ``key``.

    The message says what happened and what to do (check the downstream,
    then ``store.resolve_effect``); nothing was called when one is raised.
    """

    code = "effect"

    def __init__(self, effect_id: str | None, key: str | None, message: str) -> None:
        self.effect_id = effect_id
        self.key = key
        super().__init__(message)


class EffectInDoubtError(EffectError):
    """An effect's outcome is unknown after a crash and its mode forbids calling it again."""

    code = "effect_in_doubt"


class EffectNotAppliedError(EffectError):
    """An at-most-once effect was not applied (a probe or an operator said so); never retried."""

    code = "effect_not_applied"


class EffectDivergenceError(EffectError):
    """A different effect (name, args or mode) was requested where one is recorded."""

    code = "effect_divergence"


class EffectNotFoundError(Error, LookupError):
    """No effects-ledger entry has that id (never recorded, or expired by retention)."""

    code = "effect_not_found"

    def __init__(self, effect_id: str) -> None:
        self.effect_id = effect_id
        super().__init__(f"no effect {effect_id!r} in the ledger. List the entries with "
                         "store.effects() or `agentwal effects`.")


class EffectSettledError(Error):
    """``resolve_effect`` on an entry that is already settled: nothing was changed."""

    code = "effect_settled"

    def __init__(self, effect_id: str, status: str) -> None:
        self.effect_id = effect_id
        self.status = status
        super().__init__(f"effect {effect_id} is already {status}; nothing was changed. Only "
                         "pending, in_doubt and failed entries can be resolved, and "
                         "not_applied ones with result=.")


class BackendUnsupportedError(Error):
    """The store's backend does not provide this operation; nothing was changed."""

    code = "backend_unsupported"

    def __init__(self, what: str, backend: str, hint: str) -> None:
        self.what = what
        self.backend = backend
        super().__init__(f"{what} is not supported by the {backend} backend; nothing was "
                         f"changed. {hint}")


class EffectNotRetirableError(Error, ValueError):
    """``retire_effect`` on an entry that cannot be retired: nothing was changed."""

    code = "effect_not_retirable"

    def __init__(self, effect_id: str, reason: str) -> None:
        self.effect_id = effect_id
        super().__init__(f"effect {effect_id} cannot be retired: {reason}; nothing was changed.")


class TooManyReadersError(Error):
    """Every LMDB reader slot is taken: too many transactions or reads are open at once."""

    code = "too_many_readers"

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path}: every reader slot is in use. Finish (commit or roll back) "
            "transactions you no longer need, or use fewer threads at once."
        )


class CheckpointNotFoundError(Error, LookupError):
    """The run has no checkpoint with that id (never made, or dropped by compaction)."""

    code = "checkpoint_not_found"

    def __init__(self, run: str, checkpoint: int) -> None:
        self.run = run
        self.checkpoint = checkpoint
        super().__init__(
            f"run {_shown(run)} has no checkpoint {checkpoint}. List the retained ones with "
            "store.history(run)."
        )


class RunNotFoundError(Error, LookupError):
    """No run with that id exists in the store."""

    code = "run_not_found"

    def __init__(self, run: str) -> None:
        self.run = run
        super().__init__(f"no run {_shown(run)} in this store. List the runs with store.runs().")


class RunExistsError(Error, ValueError):
    """A fork names a new run that already exists."""

    code = "run_exists"

    def __init__(self, run: str) -> None:
        self.run = run
        super().__init__(f"run {_shown(run)} already exists; nothing was changed. Fork into a run "
                         "id that has no checkpoint.")


class StoreBusyError(Error):
    """An operation needed the store to itself for a moment and could not get it.

    ``compact(vacuum=True)`` swaps the LMDB file, which needs every read of
    it in this process finished. Nothing was lost; the store is usable.
    """

    code = "store_busy"

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        super().__init__(f"{path}: {why}")

class BlobSourceError(Error):
    """``txn.put_blob`` could not read its source: nothing was stored or committed.

    The source file is missing or unreadable, the stream raised, or it
    returned text instead of bytes. The transaction is still active.

    Attributes:
        source: what was given (a path, or the stream's ``repr``).
        reason: what went wrong.
    """

    code = "blob_source"

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"cannot read blob source {source}: {reason}; nothing was stored. "
                         "Give a readable file path or a stream opened in binary mode "
                         "('rb'), then call put_blob again.")


class NotABlobError(Error, TypeError):
    """``store.open_blob`` on a key whose value was not stored with ``txn.put_blob``."""

    code = "not_a_blob"

    def __init__(self, run: str, key: str, kind: str) -> None:
        self.run = run
        self.key = key
        self.kind = kind
        super().__init__(f"{_shown(run)}/{_shown(key)} holds a {kind}, not a blob. Read it with "
                         "store.get(); open_blob opens only values stored with txn.put_blob.")


class StoreNotFoundError(Error):
    """There is no store at the path, and this open may not create one.

    Raised by a read-only open (and by CLI commands that never create a
    store) of a path that holds no store, and by any open whose parent
    directory does not exist (agentwal creates only the store's own
    directory). Nothing was created.

    Attributes:
        path: the path given. reason: what is missing.
    """

    code = "store_not_found"

    def __init__(self, path: str, reason: str, hint: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path!r}: {reason}. {hint}")


class NotAStoreError(Error):
    """The path is something other than a store: a regular file, or a directory of other files.

    agentwal never turns a directory that holds other files into a store,
    nor writes over a file. Nothing was created or changed.

    Attributes:
        path: the path given. reason: what is there instead.
    """

    code = "not_a_store"

    def __init__(self, path: str, reason: str, hint: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path!r}: {reason}. {hint}")


class StoreLimitError(Error):
    """A limit of the process or the system, not of the disk or the store, was reached.

    The process has no address space left to map another LMDB snapshot, or
    no file descriptor left (``ulimit -n``). Nothing was changed; the
    message names the limit and how to raise it.

    Attributes:
        path: the file being opened or mapped. limit: the limit, in words.
    """

    code = "store_limit"

    def __init__(self, path: str, limit: str, hint: str) -> None:
        self.path = path
        self.limit = limit
        super().__init__(f"{path!r}: {limit}. {hint}")


class NotAListError(Error, TypeError):
    """``txn.append`` on a key whose value is not a list."""

    code = "not_a_list"

    def __init__(self, run: str, key: str, kind: str) -> None:
        self.run = run
        self.key = key
        self.kind = kind
        super().__init__(f"{run!r}/{key!r} holds a {kind}, not a list: txn.append adds items "
                         "to a list only. Put the new value with txn.put.")


class PathExistsError(Error):
    """A path the operation must create exists already (a backup's destination)."""

    code = "path_exists"

    def __init__(self, path: str, reason: str | None = None) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path!r} " + (
            reason or "already exists; nothing was written. Choose a path that does not exist "
            "(or remove it first)."))


class LeaseHeldError(StoreLockedError):
    """Another worker holds the run's lease (the PostgreSQL backend: one writer per run).

    Nothing was changed. A ``StoreLockedError`` too, so code written for one
    writer process per store handles it the same way.

    Attributes:
        run: the run. holder: the holding worker's id. expires: when its lease
        ends unless renewed (seconds since the epoch, the server's clock), or
        None when a commit of the holder is in flight.
    """

    code = "lease_held"

    def __init__(self, run: str, holder: str | None, expires: float | None) -> None:
        Error.__init__(self)  # StoreLockedError's message is about a path; this one is a run's
        self.path = run
        self.pid = None
        self.run = run
        self.holder = holder
        self.expires = expires
        if expires is None:
            when = "a commit of the holder is in flight"
        else:
            stamp = datetime.datetime.fromtimestamp(expires, datetime.timezone.utc).isoformat()
            when = f"its lease ends at {stamp} unless the holder renews it"
        self.args = (f"run {_shown(run)} is leased by worker {holder!r} ({when}); nothing was "
                     "changed. Work on another run (store.claim_runs() adopts runs whose "
                     "holder died), or try again after the lease ends.",)


class RunParkedError(LeaseHeldError):
    """The run is parked: its lease was taken over too often without a commit (a poison run).

    A run whose holders keep dying before they commit (a step that crashes
    every worker that runs it) is set aside instead of being handed around
    the fleet; no worker takes its lease until an operator unparks it
    (``store.unpark(run)``, ``agentwal unpark STORE RUN``). Nothing was
    changed; its state, history and effects stay readable. A
    ``LeaseHeldError`` too (held by nobody), so code that waits for a lease
    handles it the same way.

    Attributes:
        run: the run. steals: how many takeovers without a commit parked it.
        why: what the parking recorded (the last holder).
    """

    code = "run_parked"

    def __init__(self, run: str, steals: int, why: str) -> None:
        super().__init__(run, None, None)
        self.steals = steals
        self.why = why
        self.args = (f"run {_shown(run)} is parked: {why}; nothing was changed. Find out "
                     "why its step kills its workers (its last checkpoint and effects), then "
                     "store.unpark(run) (or `agentwal unpark STORE RUN`) to let a worker "
                     "take it again.",)


class LeaseLostError(ConflictError):
    """This worker's lease on the run expired or was taken: its write was fenced off.

    Nothing of the write was applied (the lease epoch is checked in the same
    database transaction). A ``ConflictError`` too: the step must be redone,
    by whichever worker holds the run now.

    Attributes:
        run: the run. epoch: the fencing token this worker held.
    """

    code = "lease_lost"

    def __init__(self, run: str, epoch: int | None, reason: str) -> None:
        super().__init__(run, reason=(
            f"{reason}; this worker's lease (epoch {epoch}) is gone and nothing was "
            "applied. Another worker may own the run now: leave it, or take it again with "
            "store.lease(run) and redo the step from the run's head."))
        self.epoch = epoch


class BackendUnavailableError(Error):
    """The storage server cannot be reached (refused, timed out, or the session ended).

    Raised by an open or any later call. A call that was committing when the
    connection failed reports this only when its outcome is known to be "not
    applied"; the store resolves the others itself (a commit token).

    Attributes:
        where: the server (the DSN without its password). reason: what failed.
    """

    code = "backend_unavailable"

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"cannot reach the store's server {where}: {reason}. Check that the "
                         "server runs and is reachable, then retry.")


class SchemaVersionError(Error):
    """The store's schema is newer than this agentwal (or older, on a read-only open).

    Nothing was opened or changed.

    Attributes:
        where: the store. found: the schema version stored. supported: the
        newest version this code knows.
    """

    code = "schema_version"

    def __init__(self, where: str, found: int, supported: int) -> None:
        self.where = where
        self.found = found
        self.supported = supported
        if found > supported:
            text = (f"store {where} has schema version {found}, newer than the {supported} "
                    "this agentwal knows; nothing was changed. Upgrade agentwal to open it.")
        else:
            text = (f"store {where} has schema version {found}, older than the {supported} "
                    "this agentwal needs, and a read-only open does not upgrade it; open it "
                    "once without readonly=True.")
        super().__init__(text)

class TreeSourceError(Error):
    """``txn.put_tree`` could not read the directory: nothing was committed.

    The directory is missing or is not one, a file cannot be read, or a file
    kept changing while it was read. The transaction is still active and the
    key keeps its value.

    Attributes:
        path: the directory or file.
        reason: what went wrong.
    """

    code = "tree_source"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot snapshot {path!r}: {reason}; nothing was committed. "
                         "Fix the file (or exclude it) and call put_tree again.")


class UnsafeTreeError(CorruptionError):
    """A stored tree holds an entry that could escape its destination: nothing is written for it.

    A name that is empty, ``.``, ``..``, absolute, or holds ``/`` or NUL, or
    a name listed twice in one directory. Trees ``put_tree`` writes never
    have one: the tree object was damaged or forged.

    Attributes:
        path: the entry's path inside the tree, as far as it is known.
        reason: what is wrong with it.
    """

    code = "unsafe_tree"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, None, f"unsafe tree entry: {reason}",
                         "Nothing was written for it. The stored tree was damaged or forged; "
                         "restore another checkpoint, or the store from a backup.")


class NotATreeError(Error, TypeError):
    """A tree operation on a key whose value was not stored with ``txn.put_tree``."""

    code = "not_a_tree"

    def __init__(self, run: str, key: str, kind: str) -> None:
        self.run = run
        self.key = key
        self.kind = kind
        super().__init__(f"{_shown(run)}/{_shown(key)} holds a {kind}, not a tree. Tree operations "
                         "(restore_tree, open_tree_file) read only values stored with "
                         "txn.put_tree.")


class TreePathError(Error, LookupError):
    """``store.open_tree_file``: the path is not a regular file of the stored tree.

    Attributes:
        path: the relative path asked for.
        reason: what it is instead (missing, a directory, a link, malformed).
    """

    code = "tree_path"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path!r} {reason}. Give the path of a regular file of the tree, "
                         "relative to its root, with '/' between names.")


class RestoreError(Error):
    """``store.restore_tree`` could not write the destination directory.

    A file or directory could not be created, written, renamed or removed
    (permissions, a path that is not a directory). Every file already
    written is whole (old or new content, never a mix); running the restore
    again, once the cause is fixed, finishes it.

    Attributes:
        path: the file or directory.
        reason: what went wrong.
    """

    code = "restore"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot restore {path!r}: {reason}. The files written so far are "
                         "whole; fix the cause and run restore_tree again to finish.")
