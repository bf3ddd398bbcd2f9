"""Test support that ships with agentwal: failpoints and the simulated disk.

``SimulatedDisk`` implements the I/O seam in memory with power cuts
(``crash_image("strict" | "prefix" | "reorder")``) and injected faults
(``FaultPlan``: EIO/ENOSPC writes, failing fsyncs, a space budget, a crash at
operation k); ``failpoints`` arms the engine's named crash points; ``hooks``
(re-exported here) are the supported ways for a test to reach past the public
API: ``crash`` drops a store in-process as a crash would (nothing flushed,
folded or written), ``fold_lock`` holds folds off, ``intercept_effect_writes``
fails or races the ledger's writes, and the rest (blob sweeps, the raw LMDB
entries, a deliberately non-atomic engine for the harness's self-test).
"""

from .. import failpoints
from .disk import SECTOR, FaultPlan, FileState, SimulatedCrash, SimulatedDisk
from .hooks import (
    backend,
    blob_files,
    blob_references,
    crash,
    effect_locks,
    expire_effects_on_next_fold,
    fold_error,
    fold_lock,
    intercept_effect_writes,
    raw_snapshot,
    run_origin,
    split_commits,
    sweep_blobs,
)

__all__ = ["SECTOR", "FaultPlan", "FileState", "SimulatedCrash", "SimulatedDisk",
           "backend", "blob_files", "blob_references", "crash", "effect_locks",
           "expire_effects_on_next_fold", "failpoints", "fold_error", "fold_lock",
           "intercept_effect_writes", "raw_snapshot", "run_origin", "split_commits",
           "sweep_blobs"]
