"""Directory trees on PostgreSQL: the local engine's tree code over the blob rows.

Theory of operation: a tree is what it is on a local store (``tree.py``,
``treeio.py``): a root object naming the top directory's object, directory
objects naming their files' and subdirectories' blobs, every object and
file content-addressed, and the key's value a ``BlobRef`` of the root with
the tree media type. :class:`PgTreeBlobs` gives ``treeio.TreeStore`` what it
needs of a blob store over :class:`~agentwal.postgres.blobs.PgBlobs`, so the
snapshot, restore, listing, diff and status code is the local engine's own.

Differences from a local store:

- *Pins* are the blobs' ``touched_at``: ``pin_present`` touches what it
  finds, so a collection keeps it for :data:`~agentwal.postgres.blobs.GRACE`
  (an hour) while the transaction has not committed; ``unpin`` has nothing
  to do. After the commit the tree is referenced (``delta_blobs`` names its
  root, like any blob value).
- *Edges*: collection must also know what a tree reaches, or it would
  delete a committed tree's files. After a tree is put, :meth:`PgTrees.record`
  inserts ``tree_edges (parent, child)`` for each entry of each object not
  recorded yet (a directory unchanged since an earlier snapshot is already
  recorded, with everything below it), so a snapshot costs rows in
  proportion to the directories it changed. A blob some stored object names
  is never collected (``blobs.PgBlobs.collect``).
- *No stat cache*: there is no store directory to keep one in, so every
  snapshot reads and hashes every file (files already stored are not sent
  again) and a restore compares the files on disk by content.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg

from ..errors import TreeSourceError
from ..format import TREE_DIR, TREE_LINK
from ..local.blobs import CHUNK
from ..tree import join
from ..treeio import TreeStore
from ..types import BlobRef
from .blobs import PgBlobReader, PgBlobs

__all__ = ["PgTreeBlobs", "PgTrees"]


class PgTreeBlobs:
    """``treeio.TreeBlobs`` over the blob rows (module doc)."""

    def __init__(self, blobs: PgBlobs) -> None:
        self._b = blobs

    def put(self, source: object, media_type: str | None = None) -> BlobRef:
        return self._b.put(source, media_type)

    def put_bytes(self, data: bytes) -> BlobRef:
        sha = hashlib.sha256(data).hexdigest()
        if self.pin_present([(sha, len(data))]) == [True]:
            return BlobRef(sha, len(data))
        return self.put(io.BytesIO(data))

    def put_many(self, items: list[tuple[str, bytes]],
                 map_: Callable[..., Iterator[Any]] = map) -> None:
        """The blobs of one chunk or less in batched transactions (``PgBlobs.put_small``:
        a few round trips for a whole snapshot's small files), any larger one through
        :meth:`put_bytes`; ``map_`` is not used (the pool's sessions are few)."""
        self._b.put_small(data for _sha, data in items if len(data) <= CHUNK)
        for _sha, data in items:
            if len(data) > CHUNK:
                self.put_bytes(data)

    def pin_present(self, refs: Iterable[tuple[str, int]]) -> list[bool]:
        """Touch each stored blob of ``refs`` (kept a grace hour); which ones are stored."""
        refs = list(refs)
        if not refs:
            return []
        with self._b.db.connection() as conn:
            rows = conn.execute("UPDATE blobs SET touched_at = now() WHERE sha256 = ANY(%s) "
                                "RETURNING sha256",
                                ([bytes.fromhex(sha) for sha, _n in refs],)).fetchall()
        have = {bytes(r[0]).hex() for r in rows}
        return [sha in have for sha, _n in refs]

    def unpin(self, hashes: Iterable[str]) -> None:
        """Nothing to do: a touched blob is kept for the grace period, then by references."""

    def open(self, ref: BlobRef, *, verify: bool = True) -> PgBlobReader:
        return self._b.open(ref, verify=verify)

    def where(self, sha: str) -> str:
        return f"{self._b.where} (blob {sha})"

    def exists(self, sha: str) -> bool:
        return self.pin_present([(sha, 0)]) == [True]


class PgTrees(TreeStore):
    """The trees of one PostgreSQL store: ``treeio.TreeStore``, plus their edges."""

    def __init__(self, blobs: PgBlobs) -> None:
        # No store directory (os.devnull stands for one: nothing is ever snapshotted
        # or removed there) and no stat cache (readonly: the cache is never written).
        super().__init__(PgTreeBlobs(blobs), os.devnull, readonly=True)
        self._db = blobs.db

    def edges(self, ref: BlobRef, seen: set[str]) -> Iterator[tuple[str, str]]:
        """``(parent, child)`` of every entry of tree ``ref``'s objects (verify), skipping
        the objects in ``seen`` (and adding those it walks).

        Raises:
            CorruptionError: an object is missing or damaged.
        """
        root = self._root(ref)
        yield ref.sha256, root.sha256
        todo = [(root.sha256, root.size, "")]
        while todo:
            sha, size, where = todo.pop()
            if sha in seen:
                continue
            seen.add(sha)
            for e in self._dir(sha, size, where):
                if e.kind != TREE_LINK:
                    yield sha, e.sha256
                if e.kind == TREE_DIR:
                    todo.append((e.sha256, e.size, join(where, e.name)))

    def record(self, ref: BlobRef) -> None:
        """Insert the ``tree_edges`` of tree ``ref`` that are not recorded yet (module doc).

        Raises:
            TreeSourceError: a blob of the tree was collected meanwhile (put it again).
            CorruptionError: an object of the tree is missing or damaged.
        """
        root = self._root(ref)
        edges = [(ref.sha256, root.sha256)]
        level = [(root.sha256, root.size, "")]
        with self._db.connection() as conn:
            while level:
                known = {bytes(r[0]).hex() for r in conn.execute(
                    "SELECT DISTINCT parent FROM tree_edges WHERE parent = ANY(%s)",
                    ([bytes.fromhex(sha) for sha, _n, _w in level],))}
                below = []
                for sha, size, where in level:
                    if sha in known:
                        continue
                    known.add(sha)
                    for e in self._dir(sha, size, where):
                        if e.kind == TREE_LINK:
                            continue
                        edges.append((sha, e.sha256))
                        if e.kind == TREE_DIR:
                            below.append((e.sha256, e.size, join(where, e.name)))
                level = below
            _insert_edges(conn, edges)


def _insert_edges(conn: psycopg.Connection[Any], edges: list[tuple[str, str]]) -> None:
    parents = [bytes.fromhex(p) for p, _c in edges]
    children = [bytes.fromhex(c) for _p, c in edges]
    try:
        conn.execute("INSERT INTO tree_edges (parent, child) SELECT * FROM "
                     "unnest(%s::bytea[], %s::bytea[]) ON CONFLICT DO NOTHING",
                     (parents, children))
    except psycopg.errors.ForeignKeyViolation:
        raise TreeSourceError(f"TreeRef {edges[0][0]}", "a blob of the tree was collected "
                              "while it was put (its last reference went); put it again"
                              ) from None
