"""A restore's writes into a directory: making ``dest`` exactly a stored tree.

Theory of operation: :class:`_Restorer` is the part of
:class:`~agentwal.treeio.TreeStore` that writes the *user's* directory for
``store.restore_tree``. ``TreeStore.restore`` loads and checks every
directory object of the tree first (an unsafe name raises
``UnsafeTreeError`` before anything is written), then hands them here. The
restorer makes ``dest`` equal to the tree directory by directory, through
directory file descriptors opened with ``O_NOFOLLOW`` relative to their
parent's (so no link on disk, planted or stale, is ever followed):

- a directory whose entries hash to a trusted stat-cache record
  (``tree_cache.py``) naming the tree's own object is left alone (only its
  subdirectories are visited); in one whose record names another object,
  only the entries differing from that object are looked at;
- a file whose cache entry or content already matches is left alone (its
  mode fixed if needed); entries the tree lacks are removed, unless the
  tree's exclude rules match them or they are the store
  [``restore_after_remove``];
- the other files are queued (up to :data:`_QUEUED_DIRS` directories or
  :data:`_QUEUED_FILES` files) and written in a pool of
  :data:`~agentwal.tree_snapshot.THREADS` threads, each to
  ``.awtmp-<random>`` in its directory, fsynced, and renamed over its name
  [``restore_after_write``, ``restore_after_rename``]; then each changed
  directory is fsynced;
- every directory looked into gets a new stat-cache record
  (:meth:`_Restorer.close_dirs`), saved by the caller.

A crash leaves every file whole (its old or its new content) and temp files
that the next restore removes: running the restore again finishes it.

It must not read the stored tree's objects beyond what it is given and
the blobs of the files it writes, decide what is committed, nor touch LMDB
or the WAL.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import failpoints, tree_scan
from .errors import CorruptionError, DiskFullError, Error, RestoreError, UnsafeTreeError
from .format import TREE_DIR, TREE_FILE, TREE_LINK
from .io import DISK_FULL_ERRNOS
from .local.blobs import CHUNK, BlobMissing
from .tree import Entry, IgnoreRules, Root, join
from .tree_cache import RACY_NS, StatCache, _digest, _dir_sig, _file_sig, _key, _link_sig
from .tree_snapshot import _READ_FLAGS, THREADS, _hash_fd, _read_lines
from .types import BlobRef

if TYPE_CHECKING:
    from .treeio import TreeStore


#: A restore writes its queued files once this many directories (or files) wait.
_QUEUED_DIRS, _QUEUED_FILES = 256, 1024
#: Name prefix of restore's temp files (removed by the next restore).
TMP_PREFIX = ".awtmp-"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(slots=True)
class _Counts:
    written: int = 0
    removed: int = 0
    unchanged: int = 0


def _restore_error(exc: OSError, path: str) -> Error:
    if exc.errno in DISK_FULL_ERRNOS:
        return DiskFullError(path, f"no room to restore {path!r} ({exc.strerror or exc}); the "
                             "files written so far are whole. Free some space and run "
                             "restore_tree again.")
    return RestoreError(path, exc.strerror or str(exc))


def _stat(ls: tree_scan.Listing, name: bytes) -> os.stat_result | None:
    """The lstat of entry ``name`` as the listing has it, or None if it has no such entry."""
    i = tree_scan.find(ls, name)
    return None if i is None else tree_scan.stat_at(ls, i)


# -- restoring a directory -------------------------------------------------------------


@dataclass(slots=True)
class _Closing:
    """A directory a restore changed (or could not vouch for): its record to be."""

    key: bytes
    sha: str
    size: int  # of its directory object
    sigs: list[bytes] = field(default_factory=list)
    newest: int = 0
    broken: bool = False  # an entry's final stat is unknown: no record

    def add(self, name: bytes, st: os.stat_result) -> None:
        self.sigs.append(_file_sig(name, st))
        self.newest = max(self.newest, st.st_mtime_ns)


class _Restorer:
    def __init__(self, trees: TreeStore, top: str, cache: StatCache,
                 dirs: dict[str, list[Entry]], root: Root, counts: _Counts) -> None:
        self.trees = trees
        self.top = top
        self.cache = cache
        self.dirs = dirs
        self.gitignore = root.gitignore
        self.counts = counts
        self._lock = threading.Lock()
        self.began = time.time_ns()  # before any stat: the directory records' "recorded"
        self.closing: list[_Closing] = []  # directories to record in the stat cache
        # directories with files still to write: (their own fd, rel, [(name, rel, entry)],
        # their record)
        self._queue: list[tuple[int, str, list[tuple[str, str, Entry]], _Closing]] = []
        self._queued = 0  # files in the queue
        inside = os.path.relpath(trees.store_dir, top)  # the store's path in dest, if inside
        self._store_rel = None if inside == os.pardir or inside.startswith(
            os.pardir + os.sep) else inside.replace(os.sep, "/")
        self._counted: dict[str, tuple[int, int]] = {}

    def flush(self) -> None:
        """Write the queued files (in a thread pool), then fsync their directories."""
        queue, self._queue, self._queued = self._queue, [], 0
        try:
            jobs = [(dfd, closing, name, crel, e) for dfd, _rel, writes, closing in queue
                    for name, crel, e in writes]
            with ThreadPoolExecutor(THREADS) as pool:
                futures = [pool.submit(self._write, *job) for job in jobs]
                errors = [exc for f in futures if (exc := f.exception()) is not None]
                if not errors:
                    futures = [pool.submit(self._fsync_dir, dfd, rel)
                               for dfd, rel, _w, _c in queue]
                    errors = [exc for f in futures if (exc := f.exception()) is not None]
            if errors:
                raise errors[0]
        finally:
            for dfd, *_rest in queue:
                os.close(dfd)

    def close(self) -> None:
        """Close what a failed restore left queued (nothing is written)."""
        queue, self._queue, self._queued = self._queue, [], 0
        for dfd, *_rest in queue:
            os.close(dfd)

    def close_dirs(self) -> None:
        """Record every directory the restore looked into (and did not carry over)."""
        for c in self.closing:
            if c.broken:
                continue
            files, nbytes = self._count(c.sha)
            self.cache.close_dir(c.key, _digest(c.sigs), self.began, c.newest, c.sha,
                                 c.size, files, nbytes)

    def _count(self, sha: str) -> tuple[int, int]:
        """Files (and links) and bytes at or below directory object ``sha``."""
        got = self._counted.get(sha)
        if got is None:
            files = nbytes = 0
            for e in self.dirs[sha]:
                if e.kind == TREE_DIR:
                    f, b = self._count(e.sha256)
                    files, nbytes = files + f, nbytes + b
                else:
                    files, nbytes = files + 1, nbytes + (e.size if e.kind == TREE_FILE else 0)
            got = self._counted[sha] = (files, nbytes)
        return got

    def _fsync_dir(self, fd: int, rel: str) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            raise _restore_error(exc, self._abs(rel)) from None

    def directory(self, fd: int, rel: str, sha: str, size: int, rules: IgnoreRules) -> None:
        entries = self.dirs[sha]
        if self.gitignore:
            gi = self.trees.gitignore_entry(sha, entries)
            if gi is not None:
                rules = rules.extended(_read_lines(self.trees.read_object(gi.sha256, gi.size)),
                                       rel)
        try:
            ls = tree_scan.scan(fd)  # lstat of every entry, through fd: no link followed
        except OSError as exc:
            raise _restore_error(exc, self._abs(rel)) from None
        kept = self._kept_names(rel, ls, rules)
        for bad, err, _link in ls.errors:
            if bad not in kept:
                raise _restore_error(OSError(err, os.strerror(err)),
                                     self._abs(join(rel, bad))) from None
        key = _key(rel)
        old = self._recorded(rel, key, sha, tree_scan.without(ls, kept) if kept else ls)
        if old is not None and old[0] == sha:
            # Exactly the directory the cache recorded, and already the tree's: only
            # the subdirectories are left to look at.
            self.cache.carry(key)
            rec = self.cache.dirs[key]  # its counts: no walk of the tree below it to count
            self._counted.setdefault(sha, (rec[5], rec[6]))
            subdirs = self.trees.subdirs(sha, entries)
            self.counts.unchanged += len(entries) - len(subdirs)
            for e in subdirs:
                name = os.fsdecode(e.name)
                self._dir(fd, name, join(rel, name), e, _stat(ls, e.name), rules)
            return
        known = {} if old is None else old[1]
        closing = _Closing(key, sha, size)
        self.closing.append(closing)
        changed = False
        wanted = {e.name for e in entries}
        for bname in ls.names:
            if bname in wanted:
                continue
            name = os.fsdecode(bname)
            crel = join(rel, name)
            if name.startswith(TMP_PREFIX):
                changed |= self._remove(fd, name, crel, None)
            elif bname not in kept:
                changed |= self._remove(fd, name, crel, rules)
        writes: list[tuple[str, str, Entry]] = []
        for e in entries:
            name = os.fsdecode(e.name)
            crel = join(rel, name)
            if crel == self._store_rel:
                raise RestoreError(self._abs(crel), "the tree has an entry where the store "
                                   "itself lives; restore it somewhere else")
            st = _stat(ls, e.name)
            if e.kind == TREE_DIR:
                closing.sigs.append(_dir_sig(e.name))
                changed |= self._dir(fd, name, crel, e, st, rules)
            elif e.kind == TREE_LINK:
                closing.sigs.append(_link_sig(e.name, e.target))
                k = known.get(e.name)
                if k is not None and k.kind == TREE_LINK and k.target == e.target:
                    self.counts.unchanged += 1
                else:
                    changed |= self._link(fd, name, crel, e, st)
            elif ((k := known.get(e.name)) is not None and k.sha256 == e.sha256
                  and k.kind == TREE_FILE and k.perm == e.perm and k.size == e.size
                  and st is not None):  # on disk as recorded (Entry ==, field by field)
                self.cache.carry_file(key, e.name)
                closing.add(e.name, st)
                self.counts.unchanged += 1
            else:
                final = self._file(fd, key, name, crel, e, st)
                if final is None:
                    writes.append((name, crel, e))
                else:
                    closing.add(e.name, final)
        if writes:  # written later, many at once; the directory is fsynced after them
            self._queue.append((os.dup(fd), rel, writes, closing))
            self._queued += len(writes)
            if len(self._queue) >= _QUEUED_DIRS or self._queued >= _QUEUED_FILES:
                self.flush()
        elif changed:
            self._fsync_dir(fd, rel)

    def _kept_names(self, rel: str, ls: tree_scan.Listing, rules: IgnoreRules) -> set[bytes]:
        """The entries of a directory that the restore leaves alone whatever the tree holds
        (:meth:`_kept`), asked only where the answer can be yes."""
        kept: set[bytes] = set()
        if self.gitignore and tree_scan.find(ls, b".git") is not None:
            kept.add(b".git")
        if rules:  # (once per entry of a directory with exclude rules in force)
            dirs, ignored = set(ls.dirs), rules.ignored
            kept.update(n for n in ls.names if ignored(join(rel, n), n in dirs))
        if self._store_rel is not None:
            kept.update(n for n in ls.dirs if join(rel, n) == self._store_rel)
        return kept

    def _recorded(self, rel: str, key: bytes, sha: str, ls: tree_scan.Listing
                  ) -> tuple[str, dict[bytes, Entry]] | None:
        """``(object hash, {name: entry})`` of the directory object the cache says the
        directory holds now (the signatures of its entries, the kept ones left out, hash
        to a trusted record's digest), or None; the entries only if that is not
        ``sha``, the tree's own."""
        rec = self.cache.get(key)
        if rec is None or rec[1] - rec[2] < RACY_NS:
            return None
        if self.cache.matches(key, _digest([ls.sigs])) is None:
            return None
        held = rec[3].hex()
        if held == sha:
            return held, {}
        try:
            entries = self.trees._dir(held, rec[4], rel)
        except (CorruptionError, UnsafeTreeError):
            return None
        return held, {e.name: e for e in entries}

    def _abs(self, rel: str) -> str:
        return os.path.join(self.top, rel) if rel else self.top

    def _kept(self, rel: str, name: str, is_dir: bool, rules: IgnoreRules) -> bool:
        """An entry the tree lacks that the restore leaves alone (excluded, or the store)."""
        if (self.gitignore and name == ".git") or (rules and rules.ignored(rel, is_dir)):
            return True
        return is_dir and rel == self._store_rel

    def _dir(self, fd: int, name: str, rel: str, e: Entry, st: os.stat_result | None,
             rules: IgnoreRules) -> bool:
        changed = False
        if st is not None and not stat.S_ISDIR(st.st_mode):
            changed |= self._remove(fd, name, rel, None)
            st = None
        try:
            if st is None:
                os.mkdir(name, 0o777, dir_fd=fd)
                changed = True
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise _restore_error(exc, self._abs(rel)) from None
        try:
            self.directory(sub, rel, e.sha256, e.size, rules)
        finally:
            os.close(sub)
        return changed

    def _link(self, fd: int, name: str, rel: str, e: Entry, st: os.stat_result | None) -> bool:
        bname = os.fsencode(name)
        if st is not None and stat.S_ISLNK(st.st_mode):
            with contextlib.suppress(OSError):
                if os.readlink(bname, dir_fd=fd) == e.target:
                    self.counts.unchanged += 1
                    return False
        if st is not None and stat.S_ISDIR(st.st_mode):
            self._remove(fd, name, rel, None)
        tmp = TMP_PREFIX + uuid.uuid4().hex
        try:
            os.symlink(e.target, os.fsencode(tmp), dir_fd=fd)
            failpoints.hit("restore_after_write")
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise _restore_error(exc, self._abs(rel)) from None
        failpoints.hit("restore_after_rename")
        self.counts.written += 1
        return True

    def _file(self, fd: int, key: bytes, name: str, rel: str, e: Entry,
              st: os.stat_result | None) -> os.stat_result | None:
        """The stat of file ``name`` if it is right (a mode fixed here), or None if it must
        be written (a directory in its place is removed here)."""
        same = self._same(fd, key, name, e, st) if st is not None and stat.S_ISREG(
            st.st_mode) else None
        if same is not None and st is not None:
            if st.st_mode & 0o777 != e.perm:
                self._chmod(fd, name, rel, e.perm)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                same = "hash"  # the ctime moved: record it again
            if same == "hash":  # (a trusted cache entry is carried over as it is)
                self.cache.record(key, e.name, st, e.sha256, time.time_ns())
            self.counts.unchanged += 1
            return st
        if st is not None and stat.S_ISDIR(st.st_mode):
            self._remove(fd, name, rel, None)
        return None

    def _write(self, fd: int, closing: _Closing, name: str, rel: str, e: Entry) -> None:
        """Write one file atomically: a temp file, its content and mode, fsync, rename."""
        tmp = TMP_PREFIX + uuid.uuid4().hex
        try:
            wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=fd)
        except OSError as exc:
            raise _restore_error(exc, self._abs(rel)) from None
        try:
            try:
                self._copy_into(wfd, e)
                failpoints.hit("restore_after_write")
                os.fchmod(wfd, e.perm)
                os.fsync(wfd)
            finally:
                os.close(wfd)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            if isinstance(exc, OSError):
                raise _restore_error(exc, self._abs(rel)) from None
            raise
        failpoints.hit("restore_after_rename")
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            closing.broken = True  # not recorded: the next snapshot reads it
        else:
            self.cache.record(closing.key, e.name, st, e.sha256, time.time_ns())
            with self._lock:
                closing.add(e.name, st)
        with self._lock:
            self.counts.written += 1

    def _copy_into(self, wfd: int, e: Entry) -> None:
        try:
            reader = self.trees.blobs.open(BlobRef(e.sha256, e.size))
        except BlobMissing as exc:
            raise CorruptionError(exc.path, None, "a file blob of the tree is missing") from None
        with reader:
            while True:
                chunk = reader.read(CHUNK)  # CorruptionError at the end if damaged
                if not chunk:
                    return
                view = memoryview(chunk)
                while view:
                    view = view[os.write(wfd, view):]

    def _same(self, fd: int, key: bytes, name: str, e: Entry, st: os.stat_result
              ) -> str | None:
        """How the file on disk is known to have the entry's content ("cache" or "hash"),
        or None if it has not."""
        if st.st_size != e.size:
            return None
        hit = self.cache.lookup(key, e.name, st)
        if hit is not None and hit[1]:
            if hit[0] == e.sha256:
                return "cache"
            self.cache.forget(key, e.name)  # about to be rewritten
            return None
        try:
            rfd = os.open(name, _READ_FLAGS, dir_fd=fd)
        except OSError:
            return None
        try:
            return "hash" if _hash_fd(rfd)[0] == e.sha256 else None
        except OSError:
            return None
        finally:
            os.close(rfd)

    def _chmod(self, fd: int, name: str, rel: str, perm: int) -> None:
        try:
            rfd = os.open(name, _READ_FLAGS, dir_fd=fd)
            try:
                os.fchmod(rfd, perm)
            finally:
                os.close(rfd)
        except OSError as exc:
            raise _restore_error(exc, self._abs(rel)) from None

    def _remove(self, fd: int, name: str, rel: str, rules: IgnoreRules | None) -> bool:
        """Remove ``name`` (a directory: what it holds that is not excluded, then itself)."""
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=fd)
                failpoints.hit("restore_after_remove")
                self.counts.removed += 1
                return True
            if os.path.join(self.top, rel) == self.trees.store_dir:
                return False  # the store itself is never removed
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                with os.scandir(sub) as it:
                    inner = [(d.name, d.is_dir(follow_symlinks=False)) for d in it]
                kept = False
                for child, is_dir in inner:
                    crel = join(rel, child)
                    if rules is not None and self._kept(crel, child, is_dir, rules):
                        kept = True
                    else:
                        self._remove(sub, child, crel, rules)
                if inner:
                    os.fsync(sub)
            finally:
                os.close(sub)
            if kept:
                return False
            os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _restore_error(exc, self._abs(rel)) from None
        failpoints.hit("restore_after_remove")
        self.counts.removed += 1
        return True
