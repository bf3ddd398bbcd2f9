"""Verifying a store: every checksum, every hash chain, every cross-reference.

Theory of operation: :func:`verify` is a pure function from what the store
holds (the raw, sealed entries of the snapshot's databases through the small
:class:`Source` protocol, the WAL segments as bytes, the store id) to a
:class:`VerifyReport`. It trusts no checked accessor: it reads every entry
of every database itself, so one damaged entry is reported with its place
(database and key, or file and offset) and the rest is still checked. It
raises nothing for damage; every finding is a :class:`Problem`.

What is checked, database by database (``docs/history.md`` has the table):

- every LMDB value's seal (CRC-32 of key and value), and that it decodes to
  the documented shape;
- ``meta``: sizes, the store id against ``CONTROL``;
- ``runs`` against ``ckpt``/``state``: head exists, head hash, checkpoint
  count, the state entries' count and CRC digest;
- each run's **hash chain**: for every checkpoint, ``chain_hash(parent's
  hash, its fields, sha256(raw delta), outbox digest)`` equals its stored
  hash. The raw delta is rebuilt from the history delta (``{key: ref}``):
  each ref resolves to the exact value bytes committed, in the order
  committed, and ``cbor2`` re-encodes a ``{str: bytes | None}`` map to the
  very bytes the committer hashed (``codec.encode_delta`` is that same
  ``cbor2.dumps``), so a delta that rebuilds to other keys, values or order
  breaks the chain. The outbox's digest is kept in the checkpoint record;
- each manifest equals the replay of the deltas before it, and the head
  state (the ``state`` fast path) equals the replay of the head checkpoint;
- every object: its id in ``oids`` is the SHA-256 of its record, its
  children exist, a list node rebuilds to its length and SHA-256; every
  reference count equals the references found (delta entries, manifest
  entries, node children); no entry of ``delta``, ``manifest``, ``state``,
  ``ckpt``, ``refs`` or ``oids`` belongs to nothing;
- the effects ledger's entries decode, and its index rows name entries;
- the WAL: every segment's header, every frame's CRC, LSNs continuous across
  segments from the snapshot's ``applied_lsn`` on, every record decodes, and
  every commit record's hash is recomputed from its own bytes (folded ones
  must equal the snapshot's checkpoint).

A torn tail of the last segment after ``limit`` (the last LSN published
when the view was taken) is not a problem: a write in progress, or the end
of a write a crash interrupted, which a writer's open zeroes. Anything
before it is.

The parts: ``report.py`` (what a report holds, the shared plumbing, the
reads of ``CONTROL`` and the WAL through the I/O seam), ``snapshot_checks.py``
(LMDB: meta, runs, state, the ledger, and the order of the passes), with
``snapshot_base.py`` (the checker's shared state and sealed reads),
``chain_checks.py`` (each run's checkpoints: hash chains, manifests, head
state) and ``object_checks.py`` (deltas, manifests, objects, reference
counts, object ids), and ``wal_checks.py`` (the log). Nothing here touches a file but
:func:`read_wal` and :func:`check_control`; the store hands over an LMDB
read transaction.
"""

from __future__ import annotations

import uuid

from ...types import Progress
from .report import (
    LMDB_FILE,
    Problem,
    Source,
    VerifyReport,
    WalFile,
    check_control,
    check_mark,
    load_mark,
    read_wal,
)
from .snapshot_checks import CACHE_BYTES, SnapshotChecker
from .wal_checks import check_wal

__all__ = ["CACHE_BYTES", "LMDB_FILE", "Problem", "Source", "VerifyReport", "WalFile",
           "check_control", "check_mark", "load_mark", "read_wal", "verify"]


def verify(src: Source | None, wal: list[WalFile], *, store_id: uuid.UUID, limit: int,
           problems: list[Problem] | None = None,
           progress: Progress | None = None) -> VerifyReport:
    """Check a store's snapshot and log; returns every problem found.

    Args:
        src: the snapshot's raw entries (None: the snapshot could not be
            read at all; ``problems`` should say why).
        wal: the WAL segments (:func:`read_wal`).
        store_id: the store's id (from ``CONTROL``).
        limit: an LSN acknowledged before ``wal`` was read (the last one,
            for the writer): damage at or before it is a problem even at the
            tail of the log; after it, a torn tail is a write in progress.
        problems: problems already found by the caller (``CONTROL``).
        progress: called with ``("snapshot: PART", parts checked, 10)`` and
            ``("log", segments checked, segments)`` as the checks go.

    Returns:
        A :class:`VerifyReport`.
    """
    v = SnapshotChecker(src, store_id)
    v.problems.extend(problems or [])
    if src is not None:
        v.check_snapshot(progress)
    check_wal(v, wal, limit, progress)
    return v.report()
