"""Test support that ships with agentwal: failpoints and the simulated disk.

``SimulatedDisk`` implements the I/O seam in memory with power cuts
(``crash_image("strict" | "prefix" | "reorder")``) and injected faults
(``FaultPlan``: EIO/ENOSPC writes, failing fsyncs, a space budget, a crash at
operation k); ``failpoints`` arms the engine's named crash points; ``crash``
drops a store in-process as a crash would (nothing flushed, folded or written).
"""

from .. import failpoints
from .disk import SECTOR, FaultPlan, FileState, SimulatedCrash, SimulatedDisk
from .hooks import crash, fold_error

__all__ = ["SECTOR", "FaultPlan", "FileState", "SimulatedCrash", "SimulatedDisk", "crash",
           "failpoints", "fold_error"]
