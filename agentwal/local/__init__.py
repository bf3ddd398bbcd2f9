"""The embedded engine: the first (and, today, only) storage backend.

Theory of operation: everything that knows how agentwal keeps state on the
local disk lives under this package: the WAL (``wal/``), the memtable, the
LMDB snapshot (``snapshot/``), recovery, the commit pipeline, blobs, backup
and verify, and the engine that runs them (``engine.py``, with its parts:
``fold``, ``maintenance``, ``blobrefs``, ``effectlog``, ``audit``, ``runs``).
``agentwal.backend`` names what the backend-neutral layers (``txn``,
``ledger``, ``store``) need from storage; they import nothing from this
package at module level (``store.open`` loads the engine when it opens one).
"""
