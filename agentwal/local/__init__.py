"""The embedded engine: the first (and, today, only) storage backend.

Theory of operation: everything that knows how agentwal keeps state on the
local disk lives under this package: the LMDB snapshot (``snapshot/``),
and, as they move here, the WAL, the memtable, recovery, the commit
pipeline, blobs, backup and verify. ``agentwal.backend`` names what the
backend-neutral layers (``txn``, ``ledger``, ``store``) need from storage;
they import nothing from this package at module level.
"""
