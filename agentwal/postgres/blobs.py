"""Blobs on PostgreSQL: content-addressed rows of 1 MiB ``bytea`` chunks, streamed both ways.

Theory of operation: a blob is one ``blobs`` row (``sha256`` unique, ``size``,
``touched_at``) and its ``blob_chunks`` rows ``(blob, n, data)``, each at most
:data:`~agentwal.local.blobs.CHUNK` bytes, stored ``EXTERNAL`` (out of line,
not compressed again: artifacts are compressed already, and a chunk reads
without decompressing anything).

*Why table rows, not large objects:* large objects live in the database's
``pg_largeobject``, outside the store's schema, so ``pg_dump --schema`` leaves
them out, deleting a run would need ``lo_unlink`` for each (an orphan is
never reclaimed by itself), and they need their own privileges. Rows are in
the schema: dumped, copied and dropped with it, deleted by a plain
``DELETE`` (the chunks cascade), and read one chunk per round trip.

*Put* (:meth:`PgBlobs.put`) is one PostgreSQL transaction: insert a
``blobs`` row with no hash yet, then each chunk as it is read from the source
(hashing as it goes), then set the hash. Content already stored (the unique
hash) rolls the transaction back and touches the stored row instead, so a
blob is kept once whoever puts it. A crash or an error before COMMIT leaves
nothing. The transaction may outlast the sessions' idle timeout (a slow
source), so it sets its own.

*References:* the commit that writes a blob reference as a value also inserts
``delta_blobs (run, ckpt, sha256)``, whose foreign keys tie it to the
checkpoint (cascading when the run is deleted) and to the blob (a blob
referenced by any checkpoint cannot be deleted; a commit naming a blob that
is gone fails). *Collection* (:meth:`PgBlobs.collect`, in ``delete_run``'s
transaction): a blob no ``delta_blobs`` row names and untouched for
:data:`GRACE` seconds is deleted: the deleted run's, and a few that no commit
ever referenced (their transaction rolled back). The grace keeps the blob of
a transaction that put it but has not committed yet (put again, it is
touched again).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import psycopg

from ..errors import BlobSourceError, CorruptionError
from ..local.blobs import CHUNK, BlobReader, source_chunks
from ..types import BlobRef

if TYPE_CHECKING:
    from ..io import FileSystem
    from .db import Db

__all__ = ["GRACE", "PgBlobReader", "PgBlobs"]

#: Seconds an unreferenced blob is kept after it was last put (an uncommitted
#: transaction's blob must survive a collection).
GRACE = 3600.0
#: The upload transaction's own idle timeout (a source may be slow between chunks).
_UPLOAD_IDLE = "10min"
#: Blobs no commit ever referenced that one collection deletes at most.
_ORPHANS = 100


class PgBlobs:
    """The blobs of one store, through the backend's sessions."""

    def __init__(self, db: Db, where: str) -> None:
        self.db = db
        self.where = where

    def put(self, source: object, media_type: str | None) -> BlobRef:
        """Store ``source`` (a path, a binary stream, or a BlobRef here) once; its reference.

        Raises:
            BlobSourceError: the source cannot be read, or a BlobRef names no blob here.
            TypeError: ``source`` is of no accepted kind.
            BackendUnavailableError, DiskFullError.
        """
        if isinstance(source, BlobRef):
            if not self.touch(source.sha256):
                raise BlobSourceError(repr(source), "this store holds no blob with that hash")
            return BlobRef(source.sha256, source.size,
                           source.media_type if media_type is None else media_type)
        with source_chunks(source) as chunks:
            sha, size = self._upload(chunks)
        return BlobRef(sha, size, media_type)

    def _upload(self, chunks: Iterator[bytes]) -> tuple[str, int]:
        h = hashlib.sha256()
        size = 0
        with self.db.connection() as conn:
            conn.execute("BEGIN")
            try:
                conn.execute(f"SET LOCAL idle_in_transaction_session_timeout = '{_UPLOAD_IDLE}'")
                row = conn.execute("INSERT INTO blobs (size) VALUES (0) RETURNING id").fetchone()
                assert row is not None
                bid = int(row[0])
                for n, chunk in enumerate(chunks):
                    h.update(chunk)
                    conn.execute("INSERT INTO blob_chunks (blob, n, data) VALUES (%s, %s, %s)",
                                 (bid, n, chunk))
                    size += len(chunk)
                digest = h.digest()
                if conn.execute("SELECT 1 FROM blobs WHERE sha256 = %s",
                                (digest,)).fetchone() is None:
                    conn.execute("UPDATE blobs SET sha256 = %s, size = %s WHERE id = %s",
                                 (digest, size, bid))
                    conn.execute("COMMIT")
                    return digest.hex(), size
            except psycopg.errors.UniqueViolation:
                _rollback(conn)  # an equal upload committed first: that one is kept (below)
            except BaseException:
                _rollback(conn)
                raise
            else:
                _rollback(conn)  # an equal blob was stored already: this upload goes
        self.touch(digest.hex())
        return digest.hex(), size

    def put_small(self, items: Iterable[bytes]) -> None:
        """Store small blobs (each at most ``CHUNK`` bytes: one chunk row) in one transaction
        per batch of about :data:`_BATCH` bytes, its statements pipelined: each blob row and
        its chunk inserted unless its hash is stored (``ON CONFLICT DO NOTHING``: an equal
        blob stored meanwhile, by anyone, is kept instead), then every blob of the batch
        touched (collection keeps it the grace period, as :meth:`put` does). Rows go in
        hash order, so two writers of overlapping batches wait for each other, never
        deadlock. A failure leaves the batch out whole (its transaction rolls back)."""
        rows = sorted({hashlib.sha256(data).digest(): data for data in items}.items())
        at = 0
        while at < len(rows):
            end, size = at, 0
            while end < len(rows) and (end == at or size + len(rows[end][1]) <= _BATCH):
                size += len(rows[end][1])
                end += 1
            batch = rows[at:end]
            with self.db.connection() as conn, conn.transaction(), conn.cursor() as cur:
                cur.executemany(_PUT_SMALL, [(d, len(data), data, len(data)) for d, data in batch])
                cur.execute("UPDATE blobs SET touched_at = now() WHERE sha256 = ANY(%s)",
                            ([d for d, _data in batch],))
            at = end

    def touch(self, sha: str) -> bool:
        """Mark the blob ``sha`` as just put (collection keeps it); True if it is stored."""
        with self.db.connection() as conn:
            cur = conn.execute("UPDATE blobs SET touched_at = now() WHERE sha256 = %s",
                               (bytes.fromhex(sha),))
        return cur.rowcount == 1

    def open(self, ref: BlobRef, *, verify: bool = True) -> PgBlobReader:
        """A reader of the blob ``ref`` names.

        Raises:
            CorruptionError: the store has no such blob, or one of another size.
        """
        with self.db.connection() as conn:
            row = conn.execute("SELECT id, size FROM blobs WHERE sha256 = %s",
                               (bytes.fromhex(ref.sha256),)).fetchone()
        if row is None:
            raise CorruptionError(self.where, None, f"blob {ref.sha256} is missing",
                                  "Put the artifact again, or restore the schema from a backup.")
        if int(row[1]) != ref.size:
            raise CorruptionError(self.where, None, f"blob {ref.sha256} holds {row[1]} bytes; "
                                  f"its reference says {ref.size}", "Put the artifact again.")
        return PgBlobReader(self, int(row[0]), ref, verify=verify)

    def chunk(self, blob: int, n: int) -> bytes | None:
        """Chunk ``n`` of blob row ``blob`` (None: there is none)."""
        with self.db.connection() as conn:
            row = conn.execute("SELECT data FROM blob_chunks WHERE blob = %s AND n = %s",
                               (blob, n)).fetchone()
        return None if row is None else bytes(row[0])

    @staticmethod
    def collect(conn: psycopg.Connection[Any], shas: Iterable[bytes]) -> int:
        """In ``conn``'s transaction: delete the blobs nothing references (module doc).

        Those of ``shas`` (a deleted run's) and every blob their trees reach,
        and up to :data:`_ORPHANS` others (the blobs of transactions that
        never committed); returns how many. A blob a tree object names
        (``tree_edges``) is never deleted while that object is stored, so a
        stored tree always has all its objects and files: a tree is deleted
        from the top, one level per pass (the objects' edges cascade).
        """
        below = [bytes(r[0]) for r in conn.execute(
            "WITH RECURSIVE down(s) AS (SELECT unnest(%s::bytea[]) UNION "
            "SELECT e.child FROM tree_edges e JOIN down ON e.parent = down.s) "
            "SELECT s FROM down", (sorted(set(shas)),))]
        gone = 0
        while below:
            cur = conn.execute(f"DELETE FROM blobs b WHERE sha256 = ANY(%s) AND {_UNREFERENCED}",
                               (below, GRACE))
            if not cur.rowcount:
                break
            gone += cur.rowcount
        cur = conn.execute(f"DELETE FROM blobs WHERE id IN (SELECT id FROM blobs b WHERE "
                           f"{_UNREFERENCED} LIMIT %s)", (GRACE, _ORPHANS))
        return gone + cur.rowcount


# A blob ``b`` no checkpoint references, no stored tree object names, and not put or
# pinned within the grace period.
_UNREFERENCED = """
b.touched_at < now() - make_interval(secs => %s)
AND NOT EXISTS (SELECT 1 FROM delta_blobs d WHERE d.sha256 = b.sha256)
AND NOT EXISTS (SELECT 1 FROM tree_edges e WHERE e.child = b.sha256)
"""


# One small blob: its row and its one chunk (none when empty), unless the hash is stored.
_PUT_SMALL = """
WITH b AS (INSERT INTO blobs (sha256, size) VALUES (%s, %s) ON CONFLICT (sha256) DO NOTHING
           RETURNING id)
INSERT INTO blob_chunks (blob, n, data) SELECT id, 0, %s FROM b WHERE %s > 0
"""
#: bytes of small blobs stored per transaction by ``put_small``
_BATCH = 8 << 20


def _rollback(conn: psycopg.Connection[Any]) -> None:
    if not conn.closed:
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")


class _Chunks:
    """The ``read``/``close`` of a file system over one blob's chunk rows (for ``BlobReader``).

    ``read(_fd, offset, n)`` returns the bytes the chunks hold there, short
    where a chunk is missing or short (the reader calls that damage); the
    last chunk fetched is kept, so sequential reads cost one round trip per
    chunk.
    """

    def __init__(self, blobs: PgBlobs, blob: int) -> None:
        self._blobs = blobs
        self._blob = blob
        self._cached: tuple[int, bytes] | None = None

    def _chunk(self, n: int) -> bytes:
        if self._cached is None or self._cached[0] != n:
            self._cached = (n, self._blobs.chunk(self._blob, n) or b"")
        return self._cached[1]

    def read(self, _fd: int, offset: int = 0, n: int | None = None) -> bytes:
        out = bytearray()
        while n is None or len(out) < n:
            index, at = divmod(offset + len(out), CHUNK)
            piece = self._chunk(index)[at:]
            if n is not None:
                piece = piece[:n - len(out)]
            out += piece
            if len(piece) < CHUNK - at and (n is None or len(out) < n):
                break  # the end of the blob (or a short, damaged chunk)
        return bytes(out)

    def close(self, _fd: int) -> None:
        self._cached = None


class PgBlobReader(BlobReader):
    """A read-only binary stream of one blob on PostgreSQL (``store.open_blob``).

    The local reader's contract (``agentwal.local.blobs.BlobReader``: reading
    from the start to the end checks the SHA-256, :meth:`verify` checks the
    whole blob, seeking is allowed) over the blob's chunk rows, fetched one
    at a time: memory stays at a chunk or two whatever the blob's size.

    Attributes:
        ref: the :class:`~agentwal.BlobRef` being read.
    """

    def __init__(self, blobs: PgBlobs, blob: int, ref: BlobRef, *, verify: bool = True) -> None:
        super().__init__(cast("FileSystem", _Chunks(blobs, blob)), 0,
                         f"{blobs.where} blob {ref.sha256}", ref, verify=verify)

    def _damaged(self, reason: str) -> CorruptionError:
        self._damage = CorruptionError(
            self.name, None, reason.replace("blob file", "blob"),
            "The blob's chunk rows are damaged; the rest of the store is not affected. Put "
            "the artifact again, or restore the schema from a backup.")
        return self._damage
