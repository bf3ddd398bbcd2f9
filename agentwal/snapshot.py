"""Moved to :mod:`agentwal.local.snapshot`; this module re-exports its names for old imports."""

from .local.snapshot import (
    DB_NAMES,
    FoldRun,
    MapFull,
    RawEntries,
    RunInfo,
    Snapshot,
    check_lmdb_file,
    unseal,
)

__all__ = ["DB_NAMES", "FoldRun", "MapFull", "RawEntries", "RunInfo", "Snapshot",
           "check_lmdb_file", "unseal"]
