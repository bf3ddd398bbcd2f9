"""Snapshotting and restoring directory trees on top of the blob store.

Theory of operation: :class:`TreeStore` is the I/O half of ``tree.py`` and
the one entry point of the engines (``local/engine.py``,
``postgres/trees.py``) into trees. With its parts it is the only code that
touches the *user's* directories (``io.py`` owns the store's own files);
every file it stores or reads goes through the blob store
(:class:`TreeBlobs`: :class:`~agentwal.local.blobs.BlobStore`, or
PostgreSQL's), so trees share the blobs' durability, pins, sweeps,
verification and backups. The work is split by concern:

- ``tree_cache.py``: the stat cache (entry signatures, directory digests,
  one record set per tree, the racy-clean rule :data:`RACY_NS`);
- ``tree_snapshot.py``: a snapshot's walk, reads and stores (``status``
  runs it without storing);
- ``tree_restore.py``: a restore's writes into ``dest``;
- here: what ties them to a store and a key, and the reads of stored trees.

*Snapshot* (``txn.put_tree``, :meth:`TreeStore.snapshot`): open the stat
cache of the directory with the record set of the key's current tree
(``base``) if it has one; the walk may then take a directory whose entries
are as recorded for that tree's object. Everything the new tree holds is
pinned for the transaction, except what the key's current tree (as the
transaction sees it) already reaches: that stays referenced by the run's
state, and a commit that replaced it would make this transaction's commit
conflict, so no sweep can leave the new tree dangling. If the walk fails,
the pins are dropped and nothing is committed; else the cache is saved as
the new tree's set. ``put_tree`` of a :class:`~agentwal.types.TreeRef`
(:meth:`TreeStore.copy`) pins what that tree reaches instead of walking.

Crash windows of a snapshot (failpoints in brackets): before the commit is
durable, every blob it wrote is garbage (``blobs.py``) and the store is at
its *before* [``tree_after_file``, ``tree_after_dirs``]; the cache file is
replaced by rename and is only a hint (a torn or stale one costs reads).

*Restore* (``store.restore_tree``, :meth:`TreeStore.restore`), its caller
holding the blob gate shared from reading the key's reference on (no sweep
removes a blob of the tree meanwhile): load and check every directory
object first (an unsafe name raises ``UnsafeTreeError`` before anything is
written), then let the restorer make ``dest`` equal to it, with the newest
record set of ``dest`` (what the last snapshot or restore left there). A
crash leaves every file whole: running the restore again finishes it.

*Reads* of stored trees (``load``, ``listing``, ``files``, ``diff``,
``reachable``, ``expand``, ``open_file``): directory objects are
hash-checked when first read and kept decoded (:data:`_OBJECT_CACHE` of
them; they are immutable). Diffs look only into directories whose objects
differ.

Snapshots read files, and restores write them,
:data:`~agentwal.tree_snapshot.THREADS` at a time: concurrent fsyncs share
the file system's journal commits, which is what makes a durable snapshot
of thousands of small files as fast as git's unsynced one
(``docs/benchmarks.md``).

It must not decide what is committed, nor touch LMDB or the WAL.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from . import failpoints
from .codec import CodecError, decode_blob_ref, is_blob_ref
from .errors import (
    CorruptionError,
    RestoreError,
    TreePathError,
    TreeSourceError,
)
from .format import CACHE_DIR, TREE_DIR, TREE_FILE, TREE_LINK, TREE_MEDIA_TYPE
from .local.blobs import BlobMissing, BlobReader
from .tree import (
    Entry,
    IgnoreRules,
    Leaf,
    Root,
    decode_dir,
    decode_root,
    diff_listings,
    encode_root,
    exclude_spec,
    join,
    leaf,
    split_relpath,
    walk_entries,
)
from .tree_cache import (
    RACY_NS,
    StatCache,
    _SetMemo,
)
from .tree_restore import TMP_PREFIX, _Counts, _restore_error, _Restorer
from .tree_snapshot import (
    READ_ATTEMPTS,
    THREADS,
    _Snapper,
)
from .types import BlobRef, TreeDiff, TreeFile, TreeRef

__all__ = ["READ_ATTEMPTS", "RACY_NS", "THREADS", "TMP_PREFIX", "RestoreReport", "SnapshotResult",
           "TreeBlobs", "TreeStore"]

#: Decoded directory objects a store keeps in memory (a few hundred bytes each).
_OBJECT_CACHE = 8192


# -- results ---------------------------------------------------------------------------


@dataclass(slots=True)
class SnapshotResult:
    """What a snapshot stored: the root's reference, the pins to drop after the commit."""

    ref: BlobRef
    root: Root
    pins: list[str]
    files_read: int = 0
    bytes_read: int = 0


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What ``store.restore_tree`` did.

    Attributes:
        written: files and links written (new or changed content).
        removed: entries removed (files, links, directories).
        unchanged: files and links already right (a mode may have been fixed).
        files: files and links in the tree.
    """

    written: int
    removed: int
    unchanged: int
    files: int


# -- the engine ------------------------------------------------------------------------


class TreeBlobs(Protocol):
    """What a tree store needs of a blob store (``local.blobs.BlobStore``; PostgreSQL's
    ``postgres.trees.PgTreeBlobs``): content-addressed puts, pins and verified reads."""

    def put(self, source: object, media_type: str | None = None) -> BlobRef:
        """Store a stream's content once, pinned; its reference."""
        ...

    def put_bytes(self, data: bytes) -> BlobRef:
        """Store small ``data``, pinned; nothing is written if it is present."""
        ...

    def put_many(self, items: list[tuple[str, bytes]],
                 map_: Callable[..., Iterator[Any]] = map) -> None:
        """Store small in-memory blobs ``(sha256, data)``, each pinned, durable on return
        (``map_`` may run their writes at once, e.g. a thread pool's)."""
        ...

    def pin_present(self, refs: Iterable[tuple[str, int]]) -> list[bool]:
        """Pin each ``(sha256, size)`` that is stored; which ones were."""
        ...

    def unpin(self, hashes: Iterable[str]) -> None:
        """Drop one pin of each hash."""
        ...

    def open(self, ref: BlobRef, *, verify: bool = True) -> BlobReader:
        """A reader of the blob, its size checked (its hash as it is read to the end)."""
        ...

    def where(self, sha: str) -> str:
        """Where the blob ``sha`` is (a path, or a row), for messages."""
        ...

    def exists(self, sha: str) -> bool:
        """True if the blob ``sha`` is stored."""
        ...


class TreeStore:
    """Trees of one store: snapshot, load, restore, expand (for sweeps and verify), diff.

    Args:
        blobs: the store's blob store.
        store_dir: the store directory (never snapshotted, never removed by a restore).
        readonly: a read-only store writes no cache.
    """

    def __init__(self, blobs: TreeBlobs, store_dir: str, *, readonly: bool = False) -> None:
        self.blobs = blobs
        self.store_dir = os.path.realpath(store_dir)
        self.store_dir_b = os.fsencode(self.store_dir)
        self.readonly = readonly
        # Decoded directory objects by hash: immutable, checked when first read.
        self._objects: dict[str, list[Entry]] = {}
        self._subdirs: dict[str, list[Entry]] = {}  # the directory entries of each of them
        self._gitignores: dict[str, Entry | None] = {}  # the .gitignore file of each of them
        self._objects_lock = threading.Lock()
        self._set_memo = _SetMemo()  # decoded stat-cache record sets, by file

    def _cache(self, top: str, prefer: BlobRef | None, *, rehash: bool = False
               ) -> StatCache:
        """The stat cache of directory ``top``, with the record set of tree ``prefer``
        loaded if it has one (``rehash``: empty, replacing the file)."""
        want = prefer.sha256 if prefer is not None and prefer.media_type == TREE_MEDIA_TYPE \
            else None
        if self.readonly:
            return StatCache(None, top)
        name = "stat-" + hashlib.sha256(os.fsencode(top)).hexdigest()[:32]
        return StatCache(os.path.join(self.store_dir, CACHE_DIR, name), top, load=not rehash,
                         prefer=want, memo=self._set_memo)

    # -- snapshot --------------------------------------------------------------------

    def snapshot(self, path: str | os.PathLike[str], patterns: tuple[str, ...],
                 gitignore: bool, *, base: BlobRef | None = None, rehash: bool = False
                 ) -> SnapshotResult:
        """Store the tree at ``path`` and pin all of it; see the module's theory.

        ``base`` is the key's value as the transaction sees it: what its tree
        reaches needs no pin (it stays referenced, or a commit that replaced
        it makes this transaction's commit conflict). ``rehash`` ignores the
        stat cache (every file is read and hashed) and replaces it.

        Raises:
            TreeSourceError: ``path`` is not a readable directory, a file
                cannot be read or kept changing.
            DiskFullError, DurabilityError: from the blob store.
        """
        top = _top(path, self.store_dir)
        cache = self._cache(top, base, rehash=rehash)
        # The cache's directory records may stand for directories only if the tree
        # they belong to is the key's current one (it keeps their objects and files
        # referenced): then nothing below an unchanged directory needs a pin.
        reuse = (base is not None and base.media_type == TREE_MEDIA_TYPE
                 and cache.root == base.sha256)
        known = {base.sha256} if reuse and base is not None else set(self.reachable(base))
        snap = _Snapper(self, top, cache, IgnoreRules.of(patterns), gitignore, known=known,
                        reuse=reuse)
        try:
            root = snap.snapshot(top, patterns)
            data = encode_root(root)
            ref = BlobRef(hashlib.sha256(data).hexdigest(), len(data))
            failpoints.hit("tree_after_dirs")
        except BaseException:
            self.blobs.unpin(snap.pins)
            raise
        cache.save(ref.sha256)
        return SnapshotResult(BlobRef(ref.sha256, ref.size, TREE_MEDIA_TYPE), root, snap.pins,
                              snap.files_read, snap.bytes_read)

    def put(self, path: Any, exclude: Any, base: bytes | None, rehash: bool = False,
            subdir: str | None = None) -> SnapshotResult:
        """``txn.put_tree``'s work: snapshot directory ``path``, or put a TreeRef of this
        store (``subdir``: one of its directories as a tree of its own).

        ``base`` is the key's stored bytes as the transaction sees them.

        Raises:
            TypeError: ``exclude`` with a TreeRef, or ``subdir`` with a directory.
            TreePathError: a bad ``subdir``. And what :meth:`snapshot` and :meth:`copy` raise.
        """
        old = None
        if is_blob_ref(base):
            with contextlib.suppress(CodecError):
                old = decode_blob_ref(base)
        if isinstance(path, TreeRef):
            if exclude is not None:
                raise TypeError("exclude applies to a directory, not to a TreeRef")
            try:
                parts = [] if subdir is None else split_relpath(subdir)
            except ValueError as exc:
                raise TreePathError(str(subdir), str(exc)) from None
            return self.copy(BlobRef(path.sha256, path.size, TREE_MEDIA_TYPE), parts,
                             subdir or "", base=old)
        if subdir is not None:
            raise TypeError("subdir applies to a TreeRef source; pass the "
                            "subdirectory's path instead")
        patterns, gitignore = exclude_spec(exclude)
        return self.snapshot(path, patterns, gitignore, base=old, rehash=rehash)

    def copy(self, ref: BlobRef, parts: list[str], subdir: str, *,
             base: BlobRef | None = None) -> SnapshotResult:
        """A tree already in this store, or its directory at ``parts`` as a tree of its
        own, pinned like a snapshot's; no file is read or written.

        A re-rooted tree keeps the source's gitignore flag; its exclude patterns
        (relative to the source's top) are dropped.

        Raises:
            TreeSourceError: the store holds no such tree (never stored here, or
                swept), or a file of it is gone.
            TreePathError: ``subdir`` is not a directory of it.
            CorruptionError: an object of the tree is damaged.
        """
        if not self.blobs.exists(ref.sha256):
            raise TreeSourceError(f"TreeRef {ref.sha256}", "this store has no tree with that "
                                  "hash (it was never stored here, or was swept)")
        root = self._root(ref)
        sha, size, where = root.sha256, root.size, ""
        for name in parts:
            want = os.fsencode(name)
            e = next((e for e in self._dir(sha, size, where) if e.name == want), None)
            if e is None or e.kind != TREE_DIR:
                raise TreePathError(subdir, "is not a directory of the tree")
            sha, size, where = e.sha256, e.size, join(where, name)
        need: dict[str, int] = {ref.sha256: ref.size}
        files = nbytes = 0
        todo = [(sha, size, where)]
        while todo:
            dsha, dsize, dwhere = todo.pop()
            need[dsha] = dsize
            for e in self._dir(dsha, dsize, dwhere):
                if e.kind == TREE_DIR:
                    todo.append((e.sha256, e.size, join(dwhere, e.name)))
                    continue
                files += 1
                if e.kind == TREE_FILE:
                    need[e.sha256] = e.size
                    nbytes += e.size
        new_root = root
        if parts:
            new_root = Root(sha, size, files, nbytes, (), root.gitignore)
            data = encode_root(new_root)
            need.pop(ref.sha256)
        known = self.reachable(base)
        ask = [(h, n) for h, n in need.items() if h not in known]
        got = self.blobs.pin_present(ask)
        pins = [h for (h, _n), ok in zip(ask, got, strict=True) if ok]
        try:
            if not all(got):
                raise TreeSourceError(f"TreeRef {ref.sha256}", "a file or object of the tree "
                                      "is no longer in this store")
            if parts:
                out = self.blobs.put_bytes(data)
                pins.append(out.sha256)
                ref = BlobRef(out.sha256, out.size, TREE_MEDIA_TYPE)
        except BaseException:
            self.blobs.unpin(pins)
            raise
        return SnapshotResult(BlobRef(ref.sha256, ref.size, TREE_MEDIA_TYPE), new_root, pins)

    # -- loading ---------------------------------------------------------------------

    def read_object(self, sha: str, size: int) -> bytes:
        """The bytes of one tree object, hash-checked.

        Raises:
            CorruptionError: missing, damaged, or unreadable.
        """
        try:
            with self.blobs.open(BlobRef(sha, size)) as r:
                return r.readall()
        except BlobMissing as exc:
            raise CorruptionError(exc.path, None, f"the tree object {sha} is missing",
                                  "Restore the blob file from a backup (its name is its "
                                  "SHA-256).") from None

    def load(self, ref: BlobRef) -> tuple[Root, dict[str, list[Entry]]]:
        """The root and every directory object of the tree ``ref`` names, all checked.

        Raises:
            UnsafeTreeError: an entry could escape its directory.
            CorruptionError: an object is missing, damaged or malformed.
        """
        root = self._root(ref)
        dirs: dict[str, list[Entry]] = {}
        todo = [(root.sha256, root.size, "")]
        while todo:
            sha, size, where = todo.pop()
            if sha in dirs:
                continue
            dirs[sha] = entries = self._dir(sha, size, where)
            subs = self._subdirs.get(sha)
            if subs is None:
                subs = [e for e in entries if e.kind == TREE_DIR]
            todo.extend((e.sha256, e.size, join(where, e.name)) for e in subs)
        return root, dirs

    def _root(self, ref: BlobRef) -> Root:
        data = self.read_object(ref.sha256, ref.size)
        try:
            return decode_root(data)
        except CodecError as exc:
            raise CorruptionError(self._path(ref.sha256), None, str(exc)) from None

    def _dir(self, sha: str, size: int, where: str) -> list[Entry]:
        got = self._objects.get(sha)
        if got is not None:
            return got
        data = self.read_object(sha, size)
        try:
            entries = decode_dir(data, where)
        except CodecError as exc:
            raise CorruptionError(self._path(sha), None, str(exc)) from None
        self.remember(sha, entries)
        return entries

    def remember(self, sha: str, entries: list[Entry]) -> None:
        """Keep a directory object's entries (read and checked, or just encoded)."""
        subs = [e for e in entries if e.kind == TREE_DIR]
        with self._objects_lock:
            if len(self._objects) >= _OBJECT_CACHE:
                oldest = next(iter(self._objects))
                del self._objects[oldest]
                self._subdirs.pop(oldest, None)
            self._objects[sha] = entries
            self._subdirs[sha] = subs

    def subdirs(self, sha: str, entries: list[Entry]) -> list[Entry]:
        """The directory entries of directory object ``sha`` (its ``entries``), as kept."""
        got = self._subdirs.get(sha)
        return [e for e in entries if e.kind == TREE_DIR] if got is None else got

    def gitignore_entry(self, sha: str, entries: list[Entry]) -> Entry | None:
        """The ``.gitignore`` file of directory object ``sha`` (its ``entries``), if it
        has one (looked for once per object: a restore asks in every directory)."""
        try:
            return self._gitignores[sha]
        except KeyError:
            pass
        got = next((e for e in entries if e.name == b".gitignore" and e.kind == TREE_FILE),
                   None)
        if len(self._gitignores) >= _OBJECT_CACHE:
            self._gitignores.clear()
        self._gitignores[sha] = got
        return got

    def _path(self, sha: str) -> str:
        return self.blobs.where(sha)

    def listing(self, ref: BlobRef) -> dict[str, Leaf]:
        """``{path: (kind, perm, sha256 or target, size)}`` of every file and link of a tree."""
        root, dirs = self.load(ref)
        return {p: leaf(e) for p, e in walk_entries(dirs, root.sha256)}

    def files(self, ref: BlobRef) -> list[TreeFile]:
        """Every file and link of a tree, sorted by path."""
        root, dirs = self.load(ref)
        return sorted((TreeFile(p, "link", 0, e.size, target=os.fsdecode(e.target))
                       if e.kind == TREE_LINK else TreeFile(p, "file", e.perm, e.size, e.sha256)
                       for p, e in walk_entries(dirs, root.sha256)), key=lambda f: f.path)

    def diff(self, old: BlobRef | None, new: BlobRef | None) -> TreeDiff:
        """File-level changes from tree ``old`` (None: empty) to tree ``new``."""
        a, b = (None if ref is None else self._root(ref) for ref in (old, new))
        return self._diff_dirs(None if a is None else (a.sha256, a.size),
                               None if b is None else (b.sha256, b.size))

    def key_diffs(self, added: dict[str, Any], removed: dict[str, Any],
                  changed: dict[str, tuple[Any, Any]]) -> dict[str, TreeDiff]:
        """The file-level diff of each key of a ``store.diff`` whose old or new value is a
        tree (the decoded values ``history.compare_states`` gives)."""
        pairs = {**{k: (None, v) for k, v in added.items()},
                 **{k: (v, None) for k, v in removed.items()}, **changed}
        return {k: self.diff(_tree_blob(old), _tree_blob(new))
                for k, (old, new) in sorted(pairs.items())
                if isinstance(old, TreeRef) or isinstance(new, TreeRef)}

    def _diff_dirs(self, old: tuple[str, int] | None, new: tuple[str, int] | None,
                   extra: dict[str, list[Entry]] | None = None) -> TreeDiff:
        """File-level changes from directory object ``old`` to ``new`` (None: empty),
        looking only into the directories whose objects differ; ``extra`` holds
        objects not stored (a status's)."""
        extra = extra or {}

        def entries(sha: str, size: int, where: str) -> list[Entry]:
            got = extra.get(sha)
            return self._dir(sha, size, where) if got is None else got

        sides: tuple[dict[str, Leaf], dict[str, Leaf]] = ({}, {})
        todo: list[tuple[str, tuple[str, int] | None, tuple[str, int] | None]] = [
            ("", old, new)]
        while todo:
            where, a, b = todo.pop()
            if a is not None and b is not None and a[0] == b[0]:
                continue  # the same object: the same files below it
            names: list[dict[bytes, Entry]] = [
                {} if d is None else {e.name: e for e in entries(d[0], d[1], where)}
                for d in (a, b)]
            for name in names[0].keys() | names[1].keys():
                pair = [side.get(name) for side in names]
                path = join(where, name)
                sub = [(e.sha256, e.size) if e is not None and e.kind == TREE_DIR else None
                       for e in pair]
                if sub[0] is not None or sub[1] is not None:
                    todo.append((path, sub[0], sub[1]))
                for side, e, s in zip(sides, pair, sub, strict=True):
                    if e is not None and s is None:
                        side[path] = leaf(e)
        return diff_listings(*sides)

    def reachable(self, ref: BlobRef | None) -> frozenset[str]:
        """The hashes a tree reference reaches (its objects and files); empty for
        anything else, or if the tree cannot be read."""
        if ref is None or ref.media_type != TREE_MEDIA_TYPE:
            return frozenset()
        try:
            root = self._root(ref)
            out = {ref.sha256, root.sha256}
            todo = [(root.sha256, root.size)]
            while todo:
                sha, size = todo.pop()
                for e in self._dir(sha, size, ""):
                    if e.kind == TREE_LINK:
                        continue
                    if e.kind == TREE_DIR and e.sha256 not in out:
                        todo.append((e.sha256, e.size))
                    out.add(e.sha256)
        except CorruptionError:
            return frozenset()
        return frozenset(out)

    def expand(self, refs: Iterable[BlobRef], problems: list[tuple[str, str]] | None = None
               ) -> set[BlobRef]:
        """``refs`` plus every object and file blob the trees among them name.

        Args:
            refs: blob references; those with the tree media type are expanded.
            problems: None raises at the first damaged object (a sweep must
                not guess); a list collects ``(path, reason)`` and goes on.

        Raises:
            CorruptionError: (``problems`` None) a tree object is missing or damaged.
        """
        out: set[BlobRef] = set()
        seen: set[str] = set()
        for ref in refs:
            out.add(ref)
            if ref.media_type != TREE_MEDIA_TYPE or ref.sha256 in seen:
                continue
            seen.add(ref.sha256)
            try:
                root = self._root(ref)
            except CorruptionError as exc:
                if problems is None:
                    raise
                problems.append((exc.path, exc.reason))
                continue
            todo = [(root.sha256, root.size, "")]
            while todo:
                sha, size, where = todo.pop()
                out.add(BlobRef(sha, size))
                if sha in seen:
                    continue
                seen.add(sha)
                try:
                    entries = self._dir(sha, size, where)
                except CorruptionError as exc:
                    if problems is None:
                        raise
                    problems.append((exc.path, exc.reason))
                    continue
                for e in entries:
                    if e.kind == TREE_DIR:
                        todo.append((e.sha256, e.size, join(where, e.name)))
                    elif e.kind == TREE_FILE:
                        out.add(BlobRef(e.sha256, e.size))
        return out

    # -- restore ---------------------------------------------------------------------

    def restore(self, ref: BlobRef, dest: str | os.PathLike[str]) -> RestoreReport:
        """Make ``dest`` exactly the tree ``ref`` names; see the module's theory.

        The caller holds the blob gate shared, from reading ``ref`` to the end
        (so no sweep removes a blob of the tree meanwhile).

        Raises:
            UnsafeTreeError: the stored tree has an unsafe entry (nothing written).
            CorruptionError: a tree object or file blob is missing or damaged.
            RestoreError: ``dest`` cannot be written (run it again once fixed).
            DiskFullError: no room (run it again once there is).
        """
        counts = _Counts()
        root, dirs = self.load(ref)
        top = _make_dest(dest, self.store_dir)
        # the newest record set: what the last snapshot or restore left in dest (the
        # target tree's own set may be much older)
        cache = self._cache(top, None)
        restorer = _Restorer(self, top, cache, dirs, root, counts)
        try:
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise _restore_error(exc, top) from None
        try:
            restorer.directory(fd, "", root.sha256, root.size, IgnoreRules.of(root.exclude))
            restorer.flush()
            restorer.close_dirs()
        finally:
            os.close(fd)
            restorer.close()
        cache.save(ref.sha256)
        return RestoreReport(counts.written, counts.removed, counts.unchanged, root.files)

    def open_file(self, ref: BlobRef, parts: list[str], relpath: str) -> Any:
        """A verified reader of the file at ``parts`` in tree ``ref``; None if it is not one."""
        root = self._root(ref)
        sha, size, where = root.sha256, root.size, ""
        for i, name in enumerate(parts):
            entries = self._dir(sha, size, where)
            want = os.fsencode(name)
            e = next((e for e in entries if e.name == want), None)
            last = i == len(parts) - 1
            if e is None:
                return "is not in the tree"
            if not last:
                if e.kind != TREE_DIR:
                    return f"is not in the tree ({join(where, name)!r} is not a directory)"
                sha, size, where = e.sha256, e.size, join(where, name)
                continue
            if e.kind == TREE_DIR:
                return "is a directory of the tree"
            if e.kind == TREE_LINK:
                return f"is a symbolic link to {os.fsdecode(e.target)!r} in the tree"
            try:
                return self.blobs.open(BlobRef(e.sha256, e.size))
            except BlobMissing as exc:
                raise CorruptionError(exc.path, None, f"the blob file of {relpath!r} is "
                                      "missing", "Restore the blob file from a backup (its "
                                      "name is its SHA-256).") from None
        return "is not in the tree"

    def status(self, ref: BlobRef | None, path: str | os.PathLike[str],
               patterns: tuple[str, ...], gitignore: bool) -> TreeDiff:
        """What differs on disk at ``path`` from tree ``ref``, storing nothing."""
        top = _top(path, self.store_dir)
        old = None
        if ref is not None:
            root = self._root(ref)
            patterns, gitignore, old = root.exclude, root.gitignore, (root.sha256, root.size)
        cache = self._cache(top, ref)
        # As in a snapshot, a directory whose entries are as the head tree's record set
        # says is that tree's object: the diff then skips it.
        snap = _Snapper(self, top, cache, IgnoreRules.of(patterns), gitignore, store=False,
                        reuse=ref is not None and cache.root == ref.sha256)
        new = snap.directory(top, "", snap.rules)
        return self._diff_dirs(old, new, snap.objects)


def _tree_blob(value: Any) -> BlobRef | None:
    """The blob reference of a TreeRef value (None for anything else)."""
    return BlobRef(value.sha256, value.size, TREE_MEDIA_TYPE) if isinstance(value, TreeRef) \
        else None


def _inside(path: str, directory: str) -> bool:
    """Whether real path ``path`` is ``directory`` or below it."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _top(path: str | os.PathLike[str], store_dir: str) -> str:
    try:
        top = os.path.realpath(os.fspath(path))
    except (TypeError, ValueError) as exc:
        raise TreeSourceError(repr(path), str(exc)) from None
    if not os.path.isdir(top):
        raise TreeSourceError(top, "it is not a directory" if os.path.exists(top)
                              else "it does not exist")
    if _inside(top, store_dir):
        raise TreeSourceError(top, "it is the store's own directory, or inside it")
    return top


def _make_dest(dest: str | os.PathLike[str], store_dir: str) -> str:
    try:
        top = os.path.realpath(os.fspath(dest))
    except (TypeError, ValueError) as exc:
        raise RestoreError(repr(dest), str(exc)) from None
    if _inside(top, store_dir):
        raise RestoreError(top, "it is the store's own directory, or inside it; nothing was "
                           "written")
    try:
        os.makedirs(top, exist_ok=True)
    except OSError as exc:
        raise _restore_error(exc, os.fspath(dest)) from None
    return top
