"""The helper a coding agent uses: one run's state and one directory, checkpointed together.

Theory of operation: a :class:`Workspace` is a run, a directory and a key.
``checkpoint`` commits the directory's tree under the key (with any state
the caller adds in the same transaction), so one checkpoint id names both;
``rollback_to`` and ``fork`` first commit the state change (the durable
decision), then restore the directory from it. If the process dies between
the two, the store already says where the files must be: ``restore()``
(or the same call again) brings them there. It holds no state of its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from .errors import MissingKeyError, NotATreeError
from .store import Store
from .treeio import RestoreReport
from .txn import Transaction
from .types import Checkpoint, TreeDiff, TreeRef, check_key

__all__ = ["Workspace"]


class Workspace:
    """A run and a directory whose files roll back with the run's state.

    Args:
        store: an open, writable store.
        run: the run id.
        path: the directory (created by the first restore if missing).
        key: the key the tree is stored under (``"workspace"``).
        exclude: as for ``txn.put_tree`` (patterns, :data:`agentwal.GITIGNORE`).

    Example::

        ws = agentwal.Workspace(store, "agent", "repo/", exclude=agentwal.GITIGNORE)
        before = ws.checkpoint(step="plan")
        with ws.modifying(tool="apply_patch"):
            apply_patch("repo/")                 # the agent's tool edits files
        ws.rollback_to(before.id)                # files and state as they were
    """

    def __init__(self, store: Store, run: str, path: str | os.PathLike[str], *,
                 key: str = "workspace", exclude: Any = None) -> None:
        self.store = store
        self.run = check_key(run, "run id")
        self.path = os.fspath(path)
        self.key = check_key(key)
        self.exclude = exclude

    def checkpoint(self, **meta: Any) -> Checkpoint:
        """Snapshot the directory now and commit it, with ``meta`` on the checkpoint.

        To commit the files together with other state, call :meth:`put` in
        your own transaction instead.

        Returns:
            The new checkpoint (the head, if nothing changed and no meta was given).

        Raises:
            TreeSourceError, ConflictError, and what ``put_tree`` and a commit raise.
        """
        with self.store.begin(self.run) as txn:
            self.put(txn)
            if meta:
                txn.meta(**meta)
        if txn.checkpoint is not None:
            return txn.checkpoint
        head = self.store.head(self.run)  # an unchanged tree and no meta: no new checkpoint
        assert head is not None
        return head

    def put(self, txn: Transaction) -> TreeRef:
        """Add the directory's tree to ``txn`` (a transaction of this run); returns its ref."""
        if txn.run != self.run:
            raise ValueError(f"the transaction is of run {txn.run!r}, this workspace's is "
                             f"{self.run!r}")
        return txn.put_tree(self.key, self.path, exclude=self.exclude)

    @contextlib.contextmanager
    def modifying(self, **meta: Any) -> Iterator[Checkpoint]:
        """Checkpoint before the block (yielded) and, if it ends normally, after it.

        The "after" checkpoint's metadata is ``meta`` plus ``{"after": before.id}``.
        When the block raises, nothing more is committed: roll back with
        ``ws.rollback_to(before.id)`` to undo what it did to the files.
        """
        before = self.checkpoint(**meta, phase="before")
        yield before
        self.checkpoint(**meta, phase="after", after=before.id)

    def rollback_to(self, checkpoint: int) -> Checkpoint:
        """Bring the run's state and the directory back to ``checkpoint``.

        Commits the rollback first, then restores the files; after a crash
        in between, :meth:`restore` finishes it. A checkpoint whose state has
        no tree at the key is refused first (``MissingKeyError``,
        ``NotATreeError``), changing nothing.

        Returns:
            The new checkpoint (``{"rollback_to": checkpoint}``).

        Raises:
            What ``store.rollback_to`` and ``store.restore_tree`` raise.
        """
        self._check_tree(checkpoint)
        ckpt = self.store.rollback_to(self.run, checkpoint)
        self.restore()
        return ckpt

    def fork(self, checkpoint: int, new_run: str, new_path: str | os.PathLike[str]
             ) -> Workspace:
        """A new run from ``checkpoint``, its files restored into ``new_path``.

        Returns:
            The new run's Workspace (same key and exclude rules).

        Raises:
            What ``store.fork`` and ``store.restore_tree`` raise.
        """
        self._check_tree(checkpoint)
        self.store.fork(self.run, checkpoint, new_run)
        other = Workspace(self.store, new_run, new_path, key=self.key, exclude=self.exclude)
        other.restore()
        return other

    def _check_tree(self, checkpoint: int) -> None:
        """Refuse, before anything changes, a checkpoint that holds no tree at the key."""
        value = self.store.state(self.run, at=checkpoint).get(self.key)
        if value is None:
            raise MissingKeyError(self.run, self.key)
        if not isinstance(value, TreeRef):
            raise NotATreeError(self.run, self.key, type(value).__name__)

    def restore(self, at: int | None = None) -> RestoreReport:
        """Make the directory the tree of the head (or of checkpoint ``at``)."""
        return self.store.restore_tree(self.run, self.key, self.path, at=at)

    def status(self) -> TreeDiff:
        """What changed on disk since the head checkpoint's tree (nothing is stored).

        Before the first checkpoint every file is ``added``.
        """
        return self.store._tree_status(self.run, self.key, self.path, self.exclude)

    def __repr__(self) -> str:
        return f"<agentwal.Workspace {self.run!r} {self.path!r} key={self.key!r}>"

