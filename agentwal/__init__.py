"""agentwal: an embedded, transactional store for AI-agent state.

Every step of an agent run commits atomically to a checksummed write-ahead
log; periodic folds move the state into LMDB; a crash loses nothing that was
acknowledged, and the run resumes from its last checkpoint.

Importing this package starts no threads and opens no files.

Example::

    import agentwal

    with agentwal.open("state.awal") as store:
        with store.begin("run-42") as txn:
            txn["plan"] = {"steps": ["search", "answer"]}
            txn.meta(node="planner")
        print(store.head("run-42"))
"""

import os
from typing import Any, TypeGuard, cast

from . import errors
from .effects import NOT_APPLIED, UNKNOWN, EffectContext, EffectMode, EffectRecord
from .errors import (
    BackendUnavailableError,
    BackendUnsupportedError,
    BlobSourceError,
    CheckpointNotFoundError,
    ConflictError,
    CorruptionError,
    DiskFullError,
    DurabilityError,
    EffectDivergenceError,
    EffectError,
    EffectInDoubtError,
    EffectNotAppliedError,
    EffectNotFoundError,
    EffectNotRetirableError,
    EffectSettledError,
    Error,
    InvalidKeyError,
    LeaseHeldError,
    LeaseLostError,
    MissingKeyError,
    NotABlobError,
    NotAListError,
    NotAStoreError,
    NotATreeError,
    PathExistsError,
    ReadOnlyError,
    RestoreError,
    RunExistsError,
    RunNotFoundError,
    RunParkedError,
    SchemaVersionError,
    StoreBusyError,
    StoreClosedError,
    StoreLimitError,
    StoreLockedError,
    StoreNotFoundError,
    TooManyReadersError,
    TransactionClosedError,
    TransactionThreadError,
    TreePathError,
    TreeSourceError,
    UnencodableValueError,
    UnsafeTreeError,
)
from .io import FileSystem, OsFileSystem
from .ledger import DispatchReport
from .local.backup import BackupReport
from .local.blobs import BlobReader
from .local.verify import Problem, VerifyReport
from .retention import CompactReport, KeepFor, KeepLast
from .store import Store
from .store import open as _open_local
from .transfer import CopyReport
from .tree import GITIGNORE
from .treeio import RestoreReport
from .txn import Savepoint, Transaction
from .types import BlobRef, Checkpoint, Diff, Durability, TreeDiff, TreeFile, TreeRef
from .workspace import Workspace

__version__ = "0.1.0"

#: DSN prefixes that open the PostgreSQL backend (``agentwal.postgres``).
_PG_PREFIXES = ("postgresql://", "postgres://")


def is_postgres_dsn(target: object) -> TypeGuard[str]:
    """True if ``target`` is a PostgreSQL URI (``postgresql://`` or ``postgres://``)."""
    return isinstance(target, str) and target.startswith(_PG_PREFIXES)


def open(target: str | os.PathLike[str], **options: Any) -> Store:
    """Open a store: a directory path (the local engine) or a PostgreSQL DSN.

    ``agentwal.open("state.awal", ...)`` takes the options of
    :func:`agentwal.store.open`; ``agentwal.open("postgresql://...", ...)``
    (or ``postgres://``) those of :func:`agentwal.postgres.open_postgres`
    (``schema``, ``worker_id``, ``lease_ttl``, ``durability``, ``readonly``,
    ``pool_size``), and needs the ``postgres`` extra. That returns an
    :class:`agentwal.postgres.PostgresStore`, which has the methods of
    ``Store`` that backend supports (docs/postgres.md), until one facade
    serves both backends.
    """
    if is_postgres_dsn(target):
        from .postgres import open_postgres

        return cast("Store", open_postgres(target, **options))
    return _open_local(target, **options)

__all__ = [
    "NOT_APPLIED",
    "UNKNOWN",
    "CheckpointNotFoundError",
    "Checkpoint",
    "ConflictError",
    "CorruptionError",
    "NotAStoreError",
    "StoreNotFoundError",
    "StoreLimitError",
    "Diff",
    "DiskFullError",
    "Durability",
    "DispatchReport",
    "DurabilityError",
    "EffectContext",
    "EffectDivergenceError",
    "EffectError",
    "EffectInDoubtError",
    "EffectMode",
    "EffectNotAppliedError",
    "EffectNotFoundError",
    "EffectRecord",
    "BackendUnsupportedError",
    "EffectNotRetirableError",
    "EffectSettledError",
    "Error",
    "FileSystem",
    "InvalidKeyError",
    "MissingKeyError",
    "OsFileSystem",
    "ReadOnlyError",
    "RunExistsError",
    "RunNotFoundError",
    "Savepoint",
    "Store",
    "StoreClosedError",
    "StoreLockedError",
    "TooManyReadersError",
    "Transaction",
    "TransactionClosedError",
    "TransactionThreadError",
    "UnencodableValueError",
    "errors",
    "open",
    "CompactReport",
    "KeepFor",
    "KeepLast",
    "StoreBusyError",
    "BlobRef",
    "BlobReader",
    "BlobSourceError",
    "NotABlobError",
    "NotAListError",
    "BackupReport",
    "CopyReport",
    "PathExistsError",
    "Problem",
    "VerifyReport",
    "BackendUnavailableError",
    "LeaseHeldError",
    "LeaseLostError",
    "RunParkedError",
    "SchemaVersionError",
    "GITIGNORE",
    "NotATreeError",
    "RestoreError",
    "RestoreReport",
    "TreeDiff",
    "TreeFile",
    "TreePathError",
    "TreeRef",
    "TreeSourceError",
    "UnsafeTreeError",
    "Workspace",
]
