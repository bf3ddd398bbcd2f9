"""Blobs and trees as the engine's state names them: put, open, restore, references, sweep.

Theory of operation: ``blobs.py`` owns the files (streaming put, the
verifying reader, pins, the sweep gate) and ``treeio.py`` the user's
directories; this module ties them to the engine's views. A value that is a
blob or tree reference is read in one view (:meth:`BlobRefs.stored_ref`);
``open_blob`` opens the file it names, looking once more if a sweep removed
it since the view was taken. :meth:`BlobRefs.refs` is every reference any
retained state or history holds: the memtables' unfolded versions and
deltas plus LMDB's state, delta and manifest databases, each tree expanded
into its objects and files; the sweep, verify and backup all use it.

*The sweep* (:meth:`BlobRefs.sweep`, after a compaction drops history):
under the blob gate it reads the pins of unfinished transactions, then the
references, and removes only files in neither. A superset of references is
harmless (a file stays until the next sweep); missing one is not, so any
damage raises instead and nothing is removed. A failed write or removal
stops the writer, as a failed WAL write does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..codec import CodecError, decode_blob_ref, decode_stored, is_blob_ref
from ..errors import (
    CorruptionError,
    DurabilityError,
    MissingKeyError,
    NotABlobError,
    NotATreeError,
    RunNotFoundError,
    TreePathError,
)
from ..format import BLOB_REF_PREFIX, TREE_MEDIA_TYPE
from ..tree import exclude_spec
from ..treeio import RestoreReport
from ..types import BlobRef, TreeDiff, TreeFile, check_checkpoint_id, check_key
from .blobs import BlobMissing, BlobReader

if TYPE_CHECKING:
    from .engine import Engine
    from .reads import View

__all__ = ["BlobRefs"]


class BlobRefs:
    """The engine's blobs and trees, as its views see them (one per engine: ``engine.blobrefs``)."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    def put_blob(self, source: Any, media_type: str | None) -> BlobRef:
        e = self._e
        pipe = e._writable()
        if pipe.writer.broken is not None:  # the commit would fail: do not stream first
            raise pipe.writer.stopped()
        try:
            return e._blobs.put(source, media_type)
        except DurabilityError as exc:
            pipe.writer.broken = exc  # as for the WAL: after a failed write, no more commits
            raise

    def put_tree(self, path: Any, exclude: Any, base: bytes | None, rehash: bool = False,
                 subdir: str | None = None) -> tuple[BlobRef, list[str]]:
        """Snapshot a directory, or put a TreeRef of this store (``subdir``: one of its
        directories as a tree of its own); returns the reference and its pins."""
        e = self._e
        pipe = e._writable()
        if pipe.writer.broken is not None:
            raise pipe.writer.stopped()
        try:
            got = e._trees.put(path, exclude, base, rehash, subdir)
        except DurabilityError as exc:
            pipe.writer.broken = exc
            raise
        return got.ref, got.pins

    def open_blob(self, run: str, key: str, at: int | None, verify: bool) -> BlobReader:
        """The blob ``key`` holds, opened; one retry after a sweep (``Store.open_blob``)."""
        e = self._e
        where = f"{run!r}/{key!r}" + ("" if at is None else f" at {at}")
        missing: BlobMissing | None = None
        for _attempt in range(2):
            raw, ref = self.stored_ref(run, key, at, where)
            if ref is None or ref.media_type == TREE_MEDIA_TYPE:
                kind = type(decode_stored(raw, e.path, where)).__name__
                raise NotABlobError(run, key, kind)
            try:
                return e._blobs.open(ref, verify=verify)
            except BlobMissing as exc:
                # A sweep may have removed it since the view was taken (its key was
                # overwritten, or its checkpoint dropped): look once more.
                missing = exc
        assert missing is not None
        hint = ("Its file was removed: if the writer compacted the store since this read-only "
                "store's last refresh(), refresh() and read again; otherwise restore the file "
                "from a backup (its name is its SHA-256)." if e.readonly else
                "Restore the file from a backup (its name is its SHA-256), or put the "
                "artifact again.")
        raise CorruptionError(missing.path, None, f"the blob file of {where} is missing", hint)

    def stored_raw(self, run: str, key: str, at: int | None) -> bytes:
        """The stored bytes of ``key`` (latest, or at checkpoint ``at``), in one view.

        Raises:
            RunNotFoundError, CheckpointNotFoundError, MissingKeyError, InvalidKeyError.
        """
        e = self._e
        check_key(run, "run id")
        check_key(key)
        cid = None if at is None else check_checkpoint_id(at)

        def read(v: View) -> bytes | None:
            if cid is None:
                if e._head(v, run) is None:
                    raise RunNotFoundError(run)
                return e._read(v, run, key)
            e._check_at(v, run, cid)
            return e._raw_at(v, run, cid, key).get(key)

        raw = e._with_view(read)
        if raw is None:
            raise MissingKeyError(run, key)
        return raw

    def stored_ref(self, run: str, key: str, at: int | None, where: str
                    ) -> tuple[bytes, BlobRef | None]:
        """The stored bytes of ``key`` and the blob reference they are (trees too), if one."""
        e = self._e
        raw = self.stored_raw(run, key, at)
        if not is_blob_ref(raw):
            return raw, None
        try:
            return raw, decode_blob_ref(raw)
        except CodecError as exc:
            raise CorruptionError(e.path, None, f"blob reference of {where}: {exc}"
                                  ) from None

    def tree_ref(self, run: str, key: str, at: int | None) -> BlobRef:
        e = self._e
        where = f"{run!r}/{key!r}" + ("" if at is None else f" at {at}")
        raw, ref = self.stored_ref(run, key, at, where)
        if ref is None or ref.media_type != TREE_MEDIA_TYPE:
            raise NotATreeError(run, key, type(decode_stored(raw, e.path, where)).__name__)
        return ref

    def restore_tree(self, run: str, key: str, dest: str | os.PathLike[str],
                     at: int | None) -> RestoreReport:
        """Make ``dest`` the tree ``key`` holds (``Store.restore_tree``)."""
        e = self._e
        with e._blobs.gate.shared():  # no sweep between reading the ref and the files
            return e._trees.restore(self.tree_ref(run, key, at), dest)

    def open_tree_file(self, run: str, key: str, relpath: str, parts: list[str],
                       at: int | None) -> BlobReader:
        """One file of the tree ``key`` holds, opened (``Store.open_tree_file``)."""
        e = self._e
        with e._blobs.gate.shared():  # no sweep between reading the ref and the file
            got = e._trees.open_file(self.tree_ref(run, key, at), parts, relpath)
        if isinstance(got, str):
            raise TreePathError(relpath, got)
        assert isinstance(got, BlobReader)
        return got

    def list_tree(self, run: str, key: str, at: int | None) -> list[TreeFile]:
        """Every file and link of the tree ``key`` holds (``Store.list_tree``)."""
        e = self._e
        with e._blobs.gate.shared():  # no sweep between reading the ref and the objects
            return e._trees.files(self.tree_ref(run, key, at))

    def tree_status(self, run: str, key: str, path: str | os.PathLike[str],
                     exclude: Any) -> TreeDiff:
        """What differs on disk at ``path`` from the run's latest tree at ``key`` (Workspace)."""
        e = self._e
        try:
            ref: BlobRef | None = self.tree_ref(run, key, None)
        except (MissingKeyError, RunNotFoundError):
            ref = None
        return e._trees.status(ref, path, *exclude_spec(exclude))

    def references(self) -> set[str]:
        """The SHA-256 of every blob any retained state or checkpoint references.

        A superset is harmless (a blob stays until the next sweep); missing
        one is not, so any damage raises instead. See :meth:`_blob_refs`.

        Raises:
            CorruptionError: a record or a blob reference is damaged.
        """
        return {ref.sha256 for ref in self.refs()}

    def refs(self, problems: list[tuple[str, str]] | None = None,
                   damaged: list[str] | None = None) -> set[BlobRef]:
        """Every blob reference any retained state or checkpoint holds (for verify and backup).

        One view: the memtables' unfolded versions and deltas, and LMDB's
        ``state``, ``delta`` and ``manifest`` databases (whatever retention
        keeps there), each tree expanded into its objects and files. The
        same hash may come with several media types.

        Args:
            problems: None raises at a damaged tree object; a list collects
                ``(path, reason)`` of each one and goes on (verify).
            damaged: if given, a damaged LMDB record is described there and
                skipped (see ``SnapshotReader.inline_values``; verify).

        Raises:
            CorruptionError: a record, a blob reference or a tree object is damaged.
        """
        e = self._e
        snap = e._snap
        assert snap is not None

        def read(v: View) -> set[bytes]:
            found = e._lmdb(v, lambda t: snap.reader(t).inline_values(BLOB_REF_PREFIX,
                                                                          damaged=damaged))
            with e._lock:  # the active table changes under publish
                for layer in v.layers:
                    for rm in layer.runs.values():
                        for delta in rm.deltas:
                            found.update(b for b in delta.values() if is_blob_ref(b))
                        for chain in rm.versions.values():
                            found.update(b for _lsn, b in chain if is_blob_ref(b))
            return found

        out: set[BlobRef] = set()
        for raw in e._with_view(read):
            try:
                out.add(decode_blob_ref(raw))
            except CodecError as exc:
                raise CorruptionError(e.path, None, f"a blob reference: {exc}") from None
        return e._trees.expand(out, problems)

    def sweep(self, keep: set[str] | frozenset[str] = frozenset()) -> tuple[int, int]:
        """Remove every blob file no retained state or history references.

        The hook ``compact()`` calls after dropping history. Safe while
        transactions run: under the blob gate it reads the pins of
        unfinished transactions, then computes :meth:`_blob_references`, and
        removes only files in neither (nor in ``keep``), plus temp files of
        writes no longer in progress (left by a crash or a failed put).

        Args:
            keep: more hashes to keep.

        Returns:
            ``(files removed, bytes freed)``.

        Raises:
            ReadOnlyError, StoreClosedError.
            DurabilityError: the writer is stopped, or a removal failed (it
                stops the writer).
            CorruptionError: state or history is damaged; nothing was removed.
        """
        e = self._e
        pipe = e._writable()
        if pipe.writer.broken is not None:
            raise pipe.writer.stopped()
        try:
            return e._blobs.sweep(self.references, keep)
        except DurabilityError as exc:
            pipe.writer.broken = exc
            raise
