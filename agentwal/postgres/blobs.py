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
import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import psycopg

from ..errors import BlobSourceError, CorruptionError
from ..local.blobs import CHUNK, _read_chunk, _source
from ..types import BlobRef

if TYPE_CHECKING:
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
        stream, owned, label = _source(source)
        try:
            sha, size = self._upload(stream, label)
        finally:
            if owned:
                with contextlib.suppress(OSError):
                    stream.close()
        return BlobRef(sha, size, media_type)

    def _upload(self, stream: Any, label: str) -> tuple[str, int]:
        h = hashlib.sha256()
        size = 0
        with self.db.connection() as conn:
            conn.execute("BEGIN")
            try:
                conn.execute(f"SET LOCAL idle_in_transaction_session_timeout = '{_UPLOAD_IDLE}'")
                row = conn.execute("INSERT INTO blobs (size) VALUES (0) RETURNING id").fetchone()
                assert row is not None
                bid, n = int(row[0]), 0
                while chunk := _read_chunk(stream, label):
                    h.update(chunk)
                    conn.execute("INSERT INTO blob_chunks (blob, n, data) VALUES (%s, %s, %s)",
                                 (bid, n, chunk))
                    size += len(chunk)
                    n += 1
                digest = h.digest()
                if conn.execute("SELECT 1 FROM blobs WHERE sha256 = %s",
                                (digest,)).fetchone() is None:
                    conn.execute("UPDATE blobs SET sha256 = %s, size = %s WHERE id = %s",
                                 (digest, size, bid))
                    conn.execute("COMMIT")
                    return digest.hex(), size
            except psycopg.errors.UniqueViolation:
                pass  # an equal upload committed first: keep that one
            except BaseException:
                _rollback(conn)
                raise
            _rollback(conn)
        self.touch(digest.hex())
        return digest.hex(), size

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

        Those of ``shas`` (a deleted run's), and up to :data:`_ORPHANS` others
        (the blobs of transactions that never committed); returns how many.
        """
        unreferenced = ("touched_at < now() - make_interval(secs => %s) AND NOT EXISTS "
                        "(SELECT 1 FROM delta_blobs d WHERE d.sha256 = b.sha256)")
        cur = conn.execute(f"DELETE FROM blobs b WHERE sha256 = ANY(%s) AND {unreferenced}",
                           (sorted(set(shas)), GRACE))
        gone = cur.rowcount
        cur = conn.execute(f"DELETE FROM blobs WHERE id IN (SELECT id FROM blobs b WHERE "
                           f"{unreferenced} LIMIT %s)", (GRACE, _ORPHANS))
        return gone + cur.rowcount


def _rollback(conn: psycopg.Connection[Any]) -> None:
    if not conn.closed:
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")


class PgBlobReader(io.RawIOBase):
    """A read-only binary stream of one blob on PostgreSQL (``store.open_blob``).

    As the local reader: reading from the start to the end checks the
    content's SHA-256, and the read that reaches the end raises
    ``CorruptionError`` on a mismatch; bytes read after a seek are not
    hashed; :meth:`verify` checks the whole blob. One chunk at a time is
    fetched (and kept), so memory stays at one chunk whatever the blob's size.

    Attributes:
        ref: the :class:`~agentwal.BlobRef` being read.
    """

    def __init__(self, blobs: PgBlobs, blob: int, ref: BlobRef, *, verify: bool = True) -> None:
        super().__init__()
        self._blobs = blobs
        self._blob = blob
        self.ref = ref
        self.name = f"{blobs.where} blob {ref.sha256}"
        self._pos = 0
        self._cached: tuple[int, bytes] | None = None
        self._hasher: Any = hashlib.sha256() if verify else None
        self._hashed = 0
        if verify and ref.size == 0:
            self._finish()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        self._check()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check()
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.ref.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def _check(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on a closed blob reader")

    def _piece(self, n: int) -> bytes:
        if self._cached is not None and self._cached[0] == n:
            return self._cached[1]
        data = self._blobs.chunk(self._blob, n)
        want = min(CHUNK, self.ref.size - n * CHUNK)
        if data is None or len(data) != want:
            raise self._damaged(f"chunk {n} holds {'no row' if data is None else len(data)} "
                                f"bytes where {want} belong")
        self._cached = (n, data)
        return data

    def read(self, size: int | None = -1, /) -> bytes:
        self._check()
        if size is None or size < 0:
            size = max(self.ref.size - self._pos, 0)
        out = bytearray()
        while len(out) < size and self._pos < self.ref.size:
            n, off = divmod(self._pos, CHUNK)
            piece = self._piece(n)[off:off + size - len(out)]
            if self._hasher is not None and self._pos == self._hashed:
                self._hasher.update(piece)
                self._hashed += len(piece)
            out += piece
            self._pos += len(piece)
        if self._hasher is not None and self._hashed == self.ref.size:
            self._finish()
        return bytes(out)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any, /) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def _finish(self) -> None:
        hasher, self._hasher = self._hasher, None
        if hasher.hexdigest() != self.ref.sha256:
            raise self._damaged(f"content SHA-256 is {hasher.hexdigest()}, its reference says "
                                f"{self.ref.sha256}")

    def verify(self) -> None:
        """Hash the whole blob now (the position does not move).

        Raises:
            CorruptionError: its content is not the reference's.
        """
        self._check()
        h = hashlib.sha256()
        for n in range(-(-self.ref.size // CHUNK)):
            h.update(self._piece(n))
        if h.hexdigest() != self.ref.sha256:
            raise self._damaged(f"content SHA-256 is {h.hexdigest()}, its reference says "
                                f"{self.ref.sha256}")

    def _damaged(self, why: str) -> CorruptionError:
        return CorruptionError(self.name, None, why, "Put the artifact again, or restore the "
                               "schema from a backup.")
