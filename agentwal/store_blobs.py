"""The store facade's blobs and trees: ``open_blob``, ``restore_tree``, ``list_tree``, ...

Theory of operation: one part of :class:`agentwal.Store` (a base class it
inherits), split from ``store.py`` to keep each module to one concern. Each
method checks its arguments, carries its contract in its docstring, and
delegates to the engine's ``BlobRefs`` (``local/blobrefs.py``), which
resolves a key's reference in a view and opens, restores or lists what it
names. Like ``store.py``, it imports nothing of ``agentwal.local`` at run time.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .errors import TreePathError
from .tree import split_relpath
from .types import (
    TreeDiff,
    TreeFile,
)

if TYPE_CHECKING:
    from .local.blobs import BlobReader
    from .local.engine import Engine
    from .treeio import RestoreReport

__all__ = ["BlobsAPI"]


class BlobsAPI:
    """``Store``'s reads of blobs and trees (writes are ``txn.put_blob``/``put_tree``)."""

    _engine: Engine
    path: str
    readonly: bool

    # -- blobs and trees ------------------------------------------------------------

    def open_blob(self, run: str, key: str, *, at: int | None = None,
                  verify: bool = True) -> BlobReader:
        """A read-only binary stream of the blob ``key`` holds (latest, or at checkpoint ``at``).

        The file's size is checked now; with ``verify`` (the default), reading
        it to the end also checks its SHA-256 against the reference, and the
        read that reaches the end raises ``CorruptionError`` on a mismatch
        (``reader.verify()`` checks the whole file at any time).

        Args:
            run: the run id.
            key: a key whose value was stored with ``txn.put_blob``.
            at: a checkpoint id of the run; None reads the latest commit.
            verify: check the content's SHA-256 as it is read to the end.

        Returns:
            A :class:`~agentwal.local.blobs.BlobReader` (a ``io.RawIOBase``; ``.ref``
            is the BlobRef); close it, or use it as a context manager.

        Raises:
            RunNotFoundError: the run has no checkpoint.
            CheckpointNotFoundError: the run has no checkpoint ``at``.
            MissingKeyError: the key has no value (at that checkpoint).
            NotABlobError: the value was not stored with ``put_blob`` (also a
                ``TypeError``); read it with ``get``.
            CorruptionError: the blob file is missing or has the wrong size
                (or, while reading, the wrong content), or the reference is damaged.
            InvalidKeyError, StoreClosedError.

        Example::

            with store.open_blob("train", "weights", at=12) as f:
                shutil.copyfileobj(f, out)
        """
        return self._engine.blobrefs.open_blob(run, key, at, verify)

    def restore_tree(self, run: str, key: str, dest: str | os.PathLike[str], *,
                     at: int | None = None) -> RestoreReport:
        """Make directory ``dest`` exactly the tree ``key`` holds (latest, or at checkpoint ``at``).

        Changed files are written atomically (temp file, fsync, rename) with
        their permission bits; links are recreated as links; entries the tree
        lacks are removed, except paths its exclude rules match and the
        store's own directory. No link on disk is ever followed, and a tree
        holding a name that could escape ``dest`` is refused before anything
        is written. A restore interrupted by a crash (or an error) is
        finished by running it again.

        Args:
            run: the run id.
            key: a key whose value was stored with ``txn.put_tree``.
            dest: the directory to restore into (created if missing).
            at: a checkpoint id of the run; None restores the latest commit's tree.

        Returns:
            A :class:`~agentwal.treeio.RestoreReport` (files written, removed, unchanged).

        Raises:
            RunNotFoundError, CheckpointNotFoundError, MissingKeyError.
            NotATreeError: the value was not stored with ``put_tree``.
            UnsafeTreeError: the stored tree could escape ``dest``; nothing written.
            CorruptionError: a tree object or file is missing or damaged.
            RestoreError, DiskFullError: ``dest`` cannot be written; run again once fixed.
            InvalidKeyError, StoreClosedError.

        Example::

            store.restore_tree("agent", "workspace", "repo/", at=12)
        """
        self._engine.check_open()
        return self._engine.blobrefs.restore_tree(run, key, dest, at)

    def open_tree_file(self, run: str, key: str, relpath: str, *,
                       at: int | None = None) -> BlobReader:
        """A read-only binary stream of one file of the tree ``key`` holds.

        Args:
            run: the run id.
            key: a key whose value was stored with ``txn.put_tree``.
            relpath: the file's path from the tree's root, ``/``-separated.
            at: a checkpoint id of the run; None reads the latest commit.

        Returns:
            A :class:`~agentwal.local.blobs.BlobReader`, checked against the file's
            SHA-256 as it is read to the end.

        Raises:
            TreePathError: ``relpath`` is not a regular file of the tree.
            NotATreeError, RunNotFoundError, CheckpointNotFoundError,
            MissingKeyError, CorruptionError, InvalidKeyError, StoreClosedError.

        Example::

            with store.open_tree_file("agent", "workspace", "src/app.py", at=3) as f:
                old = f.read().decode()
        """
        self._engine.check_open()
        try:
            parts = split_relpath(relpath)
        except ValueError as exc:
            raise TreePathError(str(relpath), f"is not a path inside a tree ({exc})") from None
        return self._engine.blobrefs.open_tree_file(run, key, relpath, parts, at)

    def list_tree(self, run: str, key: str, *, at: int | None = None) -> list[TreeFile]:
        """Every file and link of the tree ``key`` holds (latest, or at checkpoint ``at``).

        Returns:
            :class:`~agentwal.TreeFile` s sorted by path (directories are implied).

        Raises:
            NotATreeError, RunNotFoundError, CheckpointNotFoundError,
            MissingKeyError, CorruptionError, InvalidKeyError, StoreClosedError.

        Example::

            for f in store.list_tree("agent", "workspace"):
                print(f.path, f.size)
        """
        self._engine.check_open()
        return self._engine.blobrefs.list_tree(run, key, at)

    def _tree_status(self, run: str, key: str, path: str | os.PathLike[str],
                     exclude: Any) -> TreeDiff:
        """What differs on disk at ``path`` from the run's latest tree at ``key`` (Workspace)."""
        return self._engine.blobrefs.tree_status(run, key, path, exclude)
