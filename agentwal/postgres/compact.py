"""``compact`` on PostgreSQL: drop old checkpoints, and the rows only they needed.

Theory of operation: the kept checkpoints of a run are chosen as the local
engine chooses them (``retention.choose``: the head, the last ``keep_last``,
those younger than ``older_than``, fork origins). A dropped checkpoint keeps
its ``checkpoints`` row, marked ``dropped`` (its id, parent and hash stay, so
the chain of the kept ones still verifies and ids are never reused), and
every read refuses it as ``CheckpointNotFoundError``.

Its delta rows go unless a kept checkpoint still reads them: a row written at
checkpoint ``c`` and superseded at ``until`` is live at every ``K`` with
``c <= K < until`` (``backend``'s intervals), so it stays if some kept ``K``
falls there, and no manifest is needed for the kept ones to read as before.
A kept append row (an append-shared list's tail) whose base row goes is
first stored as the whole list it makes, so its chain starts there. Then
the values only those rows named go: ``vals`` rows no delta row names,
and the run's ``delta_blobs`` entries whose row went, with the blobs no one
references any more (``blobs.PgBlobs.collect``).

Each run is one transaction holding the run's row lock, so its commits wait
a moment and never interleave; the lease is not needed (a commit only adds
rows after the head, which is kept). ``vacuum=True`` then runs ``VACUUM
(ANALYZE)`` on the store's tables, in autocommit. Backup stays the
database's job (``pg_dump --schema``) or ``agentwal copy`` to another store.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from typing import Any

from ..codec import CodecError, decode_blob_ref, is_blob_ref
from ..errors import RunNotFoundError
from ..retention import CompactReport, choose
from ..types import Progress
from .backend import chain_values
from .blobs import PgBlobs
from .schema import INLINE_MAX

__all__ = ["compact"]

_TABLES = ("runs", "checkpoints", "deltas", "vals", "effects", "blobs", "blob_chunks",
           "delta_blobs", "tree_edges")


def _size(conn: Any) -> int:
    total = 0
    for table in _TABLES:
        row = conn.execute(f"SELECT pg_total_relation_size('{table}')").fetchone()
        total += int(row[0]) if row else 0
    return total


def compact(backend: Any, runs: list[str] | None, keep_last: int | None,
            older_than: datetime.timedelta | None, vacuum: bool, keep_fork_origins: bool,
            progress: Progress | None) -> CompactReport:
    """Compact ``runs`` (default every run) of ``backend``'s store (module doc).

    Raises:
        RunNotFoundError: a run in ``runs`` has no checkpoint.
    """
    names = backend.runs()
    if runs is not None:
        for run in runs:
            if run not in names:
                raise RunNotFoundError(run)
        names = runs
    cutoff = None if older_than is None else time.time() - older_than.total_seconds()
    dropped: dict[str, int] = {}
    freed = objects = 0
    with backend._conn() as conn:
        before = _size(conn)
    for i, run in enumerate(names):
        if progress is not None:
            progress("runs", i, len(names))
        n, nbytes, nobjects = _compact_run(backend, run, keep_last, cutoff, keep_fork_origins)
        if n:
            dropped[run] = n
        freed += nbytes
        objects += nobjects
    if progress is not None:
        progress("runs", len(names), len(names))
    if vacuum:
        with backend._conn() as conn:
            for table in _TABLES:
                conn.execute(f"VACUUM (ANALYZE) {table}")
    with backend._conn() as conn:
        after = _size(conn)
    return CompactReport(sum(dropped.values()), freed, dropped, objects_freed=objects,
                         file_bytes_before=before, file_bytes_after=after, vacuumed=vacuum)


def _compact_run(backend: Any, run: str, keep_last: int | None, cutoff: float | None,
                 keep_fork_origins: bool) -> tuple[int, int, int]:
    """One run in one transaction: (checkpoints dropped, bytes of rows deleted, values freed)."""
    with backend._conn() as conn, conn.transaction():
        conn.execute("SELECT 1 FROM runs WHERE run = %s FOR UPDATE", (run,))
        ckpts = [(int(c), float(t)) for c, t in conn.execute(
            "SELECT id, created_at FROM checkpoints WHERE run = %s AND NOT dropped ORDER BY id",
            (run,))]
        protected: set[int] = set()
        if keep_fork_origins:
            protected = {int(r[0]) for r in conn.execute(
                "SELECT origin_id FROM checkpoints WHERE origin_run = %s", (run,))}
        keep = choose(ckpts, keep_last=keep_last, cutoff=cutoff, protected=protected)
        drop = sorted(c for c, _t in ckpts if c not in keep)
        if not drop:
            return 0, 0, 0
        conn.execute("UPDATE checkpoints SET dropped = true WHERE run = %s AND id = ANY(%s)",
                     (run, drop))
        all_dropped = [int(r[0]) for r in conn.execute(
            "SELECT id FROM checkpoints WHERE run = %s AND dropped", (run,))]
        kept = sorted(keep)
        rebased = _rebase_kept_appends(backend, conn, run, all_dropped, kept)
        gone = conn.execute(
            "DELETE FROM deltas d WHERE (d.key, d.ckpt) IN (" + _DOOMED + ") AND d.run = %(run)s "
            "RETURNING d.digest, octet_length(d.key) + coalesce(octet_length(d.inline), 0)",
            {"run": run, "dropped": all_dropped, "kept": kept}).fetchall()
        digests = sorted({bytes(d) for d, _n in gone if d is not None} | rebased)
        nbytes = sum(int(n) for _d, n in gone)
        objects = 0
        if digests:
            freed = conn.execute(
                "DELETE FROM vals v WHERE digest = ANY(%s) AND NOT EXISTS "
                "(SELECT 1 FROM deltas d WHERE d.digest = v.digest) RETURNING octet_length(data)",
                (digests,)).fetchall()
            objects += len(freed)
            nbytes += sum(int(r[0]) for r in freed)
        objects += _drop_blob_refs(conn, run, all_dropped)
    return len(drop), nbytes, objects


# The delta rows of ``run`` at the dropped checkpoints ``%(dropped)s`` that no kept
# checkpoint ``%(kept)s`` reads: the rows a compaction deletes.
_DOOMED = """
SELECT d.key, d.ckpt FROM deltas d WHERE d.run = %(run)s AND d.ckpt = ANY(%(dropped)s)
   AND NOT EXISTS (SELECT 1 FROM unnest(%(kept)s::bigint[]) k WHERE k >= d.ckpt
                   AND (d.until IS NULL OR k < d.until))
"""


def _rebase_kept_appends(backend: Any, conn: Any, run: str, dropped: list[int],
                         kept: list[int]) -> set[bytes]:
    """Store as whole values the kept append rows whose base row the compaction deletes
    (the rest of their chain goes with it); the digests of the tails they held."""
    args = {"run": run, "dropped": dropped, "kept": kept}
    victims = [(str(k), int(c), d) for k, c, d in conn.execute(
        "WITH doomed AS (" + _DOOMED + ") SELECT a.key, a.ckpt, a.digest FROM deltas a "
        "JOIN doomed b ON b.key = a.key AND b.ckpt = a.base WHERE a.run = %(run)s "
        "AND NOT EXISTS (SELECT 1 FROM doomed x WHERE x.key = a.key AND x.ckpt = a.ckpt)",
        args).fetchall()]
    tails: set[bytes] = set()
    for key, cid, digest in victims:
        value = chain_values(conn, run, [(key, cid)], backend.name)[key]
        inline, vdigest = (value, None) if len(value) <= INLINE_MAX else (
            None, hashlib.sha256(value).digest())
        if vdigest is not None:
            conn.execute("INSERT INTO vals (digest, data) VALUES (%s, %s) "
                         "ON CONFLICT (digest) DO NOTHING", (vdigest, value))
        conn.execute("UPDATE deltas SET inline = %s, digest = %s, base = NULL, "
                     "base_count = NULL, base_len = NULL, depth = 0 "
                     "WHERE run = %s AND key = %s AND ckpt = %s",
                     (inline, vdigest, run, key, cid))
        if digest is not None:
            tails.add(bytes(digest))
    return tails


def _drop_blob_refs(conn: Any, run: str, dropped: list[int]) -> int:
    """Forget the blob references of deleted rows at ``dropped``; collect those blobs."""
    listed = [(int(c), bytes(s)) for c, s in conn.execute(
        "SELECT ckpt, sha256 FROM delta_blobs WHERE run = %s AND ckpt = ANY(%s)", (run, dropped))]
    if not listed:
        return 0
    still: set[tuple[int, bytes]] = set()
    for cid, inline, data in conn.execute(
            "SELECT d.ckpt, d.inline, v.data FROM deltas d LEFT JOIN vals v "
            "ON v.digest = d.digest WHERE d.run = %s AND d.ckpt = ANY(%s)", (run, dropped)):
        value = bytes(inline) if inline is not None else (None if data is None else bytes(data))
        if is_blob_ref(value):
            try:
                still.add((int(cid), bytes.fromhex(decode_blob_ref(value).sha256)))
            except CodecError:
                continue  # verify reports it
    stale = [(c, s) for c, s in listed if (c, s) not in still]
    for cid, sha in stale:
        conn.execute("DELETE FROM delta_blobs WHERE run = %s AND ckpt = %s AND sha256 = %s",
                     (run, cid, sha))
    return PgBlobs.collect(conn, [s for _c, s in stale]) if stale else 0
