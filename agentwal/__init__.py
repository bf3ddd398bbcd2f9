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

from . import errors
from .effects import NOT_APPLIED, UNKNOWN, EffectContext, EffectMode, EffectRecord
from .errors import (
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
    MissingKeyError,
    NotABlobError,
    NotATreeError,
    PathExistsError,
    ReadOnlyError,
    RestoreError,
    RunExistsError,
    RunNotFoundError,
    StoreBusyError,
    StoreClosedError,
    StoreLockedError,
    TooManyReadersError,
    TransactionClosedError,
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
from .store import Store, open
from .tree import GITIGNORE
from .treeio import RestoreReport
from .txn import Savepoint, Transaction
from .types import BlobRef, Checkpoint, Diff, Durability, TreeDiff, TreeFile, TreeRef
from .workspace import Workspace

__version__ = "0.1.0"

__all__ = [
    "NOT_APPLIED",
    "UNKNOWN",
    "CheckpointNotFoundError",
    "Checkpoint",
    "ConflictError",
    "CorruptionError",
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
    "BackupReport",
    "PathExistsError",
    "Problem",
    "VerifyReport",
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
