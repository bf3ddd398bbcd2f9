"""A snapshot's walk of a directory: what it stores, and what ``status`` compares.

Theory of operation: :class:`_Snapper` is the part of
:class:`~agentwal.treeio.TreeStore` that reads the *user's* directory for
``txn.put_tree`` (storing) and for ``ws.status()`` (hashing only, the objects
kept in memory). It runs in four phases:

1. *walk* (one thread): list each directory, ``lstat`` each entry (never
   following a link), skip excluded paths and the store's own directory.
   A directory whose entries' signatures hash to a trusted record of the
   stat cache (``tree_cache.py``), and whose subdirectories are unchanged
   too, *is* that record's directory object: nothing in it is looked up,
   encoded or pinned (only when the record's tree is the key's current one,
   which keeps its objects and files referenced). In a directory that
   changed, a file that is as its directory's trusted record says is taken
   from the record's object as it is (no lookup, no pin, no new entry). Any
   other regular file whose ``(size, mtime, ctime, inode)`` match a cache
   entry is not read: its hash comes from the cache.
2. *pin* the cache's files that the key's current tree does not already
   reach (a file whose blob is gone is read after all).
3. *read* the other files, :data:`THREADS` at a time: ``fstat`` before and
   after; a small one into memory, stored later with the directory objects
   only if its content is missing; a large one streamed into the blob
   store. A file whose stat changed, or (when its mtime is within
   :data:`~agentwal.tree_cache.RACY_NS` of now, where one clock tick could
   hide a write) whose content hashes differently on a second read, is read
   again, up to :data:`READ_ATTEMPTS` times, then
   :class:`~agentwal.errors.TreeSourceError`.
4. *encode* every changed directory's object, deepest first (each hash is
   known from its children's), record it in the stat cache, and store the
   objects, the root object and the small files read with ``put_many`` in one
   batch (their fsyncs overlap).

Everything it stores is pinned (``pins``) for the transaction, except what
the key's current tree (``known``) already reaches. Crash windows
[``tree_after_read``, ``tree_after_file``]: before the commit names the
tree, every blob written is garbage (``local/blobs.py``); the store is at
its *before*. Nothing half-read is ever stored under a name a tree uses.

It must not decide what is committed, write the stat cache's files (the
caller saves it), nor touch LMDB or the WAL.
"""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import io
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from . import failpoints, tree_scan
from .errors import BlobSourceError, CorruptionError, TreeSourceError, UnsafeTreeError
from .format import TREE_DIR, TREE_FILE, TREE_LINK
from .local.blobs import CHUNK
from .tree import Entry, IgnoreRules, Root, encode_dir, encode_root, join
from .tree_cache import (
    RACY_NS,
    StatCache,
    _digest,
    _dir_sig,
    _entry_matches,
    _file_sig,
    _key,
    _link_sig,
    _sig,
)

if TYPE_CHECKING:
    from .treeio import TreeStore

#: Reads of a file that keeps changing before put_tree gives up.
READ_ATTEMPTS = 3
#: Files read (and fsynced) at once by a snapshot: their fsyncs share journal commits,
#: and memory stays under THREADS blob chunks.
THREADS = 16
#: Bytes of small files a snapshot holds in memory to store them in one batch with
#: its directory objects (their fsyncs then overlap); beyond it, each is stored when read.
_DEFER_BYTES = 32 << 20
_T = TypeVar("_T")
_R = TypeVar("_R")
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(
    os, "O_NOCTTY", 0)


def _read_lines(data: bytes) -> list[str]:
    return data.decode("utf-8", "surrogateescape").splitlines()


# -- walking a directory (snapshot and status) -----------------------------------------


@dataclass(slots=True)
class _Node:
    """One directory of a snapshot's walk, its entries filled in as the phases run."""

    rel: str
    key: bytes  # rel as the stat cache keys it
    depth: int
    entries: list[Entry] = field(default_factory=list)
    subdirs: list[tuple[bytes, _Node]] = field(default_factory=list)
    pending: list[tuple[bytes, bytes]] = field(default_factory=list)  # name, path
    cached: list[tuple[bytes, bytes, os.stat_result, str, bool]] = field(
        default_factory=list)  # name, path, stat, sha256, trusted
    sigs: list[bytes] = field(default_factory=list)  # of the entries as stored
    newest: int = 0  # the newest mtime among its files as stored
    blob: bytes | None = None  # its files' cache entries, if all are as recorded
    reused: bool = False  # unchanged since the cache's record: sha, size, counts from it
    sha: str = ""
    size: int = 0
    files: int = 0  # files and links at or below it
    nbytes: int = 0


class _Snapper:
    """A snapshot in four phases: walk (stat, links, unchanged directories, cache
    lookups), pin the cache's files, read the others (in a thread pool: their fsyncs
    overlap), then encode every changed directory's object deepest first and store
    them all at once (in the pool).

    A directory whose entries' signatures (name, kind, and a file's size, mtime,
    ctime, inode and mode, or a link's target) hash to its cache record's digest,
    whose record is trusted (its newest mtime was :data:`RACY_NS` older than the
    walk that made it) and whose subdirectories are all unchanged too, is the
    record's directory object: nothing in it is looked up, encoded or pinned.
    This is only done when the record's tree is the key's current one (``reuse``).
    """

    def __init__(self, trees: TreeStore, top: str, cache: StatCache, rules: IgnoreRules,
                 gitignore: bool, *, store: bool = True, known: set[str] | None = None,
                 reuse: bool = False) -> None:
        self.trees = trees
        self.known = set() if known is None else known  # reached by the key's tree: no pin
        self.reuse = reuse
        self.blobs = trees.blobs
        self.top = top
        self.cache = cache
        self.rules = rules
        self.gitignore = gitignore
        self.store = store  # False: only hash (status), keep the objects in memory
        self.pins: list[str] = []
        self.objects: dict[str, list[Entry]] = {}  # (not storing) the changed directories'
        self.files_read = self.bytes_read = 0
        self.root: Root | None = None
        self.began = time.time_ns()  # before any stat: the directory records' "recorded"
        self._lock = threading.Lock()
        # small files read and checked, stored with the objects (one batch of fsyncs)
        self._deferred: list[bytes] = []
        self._deferred_bytes = 0
        self._skip = (b".git",) if gitignore else ()  # left out of every listing
        # the whole-tree pass's (_prefetch): directories as recorded, listings of the others
        self._clean: set[bytes] = set()
        self._listings: dict[bytes, tree_scan.Listing] = {}
        self._store_parent, self._store_name = os.path.split(trees.store_dir_b)

    def snapshot(self, top: str, patterns: tuple[str, ...]) -> Root:
        """Store the tree at ``top`` with its root object; returns the root."""
        self.directory(top, "", self.rules, patterns)
        assert self.root is not None
        return self.root

    def directory(self, path: str, rel: str, rules: IgnoreRules,
                  patterns: tuple[str, ...] = ()) -> tuple[str, int]:
        """Walk, read and store the directory ``path`` (and, storing, the root object
        naming it, in the same batch); returns its object's ``(sha256, size)``."""
        nodes: list[_Node] = []
        self._prefetch(os.fsencode(path), rules)
        top = self._walk(os.fsencode(path), rel, rules, 0, nodes)
        changed = [n for n in nodes if not n.reused]
        if self.reuse and self.store:
            self._old_known(changed)
        self._pin_cached(changed)
        jobs = [(node, item) for node in changed for item in node.pending]
        with ThreadPoolExecutor(THREADS) as pool:
            for (node, (name, _p)), got in zip(
                    jobs, _map(pool, lambda j: self._file(j[0], *j[1]), jobs), strict=True):
                if got is not None:
                    node.entries.append(got[0])
                    node.sigs.append(_file_sig(name, got[1]))
                    node.newest = max(node.newest, got[1].st_mtime_ns)
            # Every object's hash is known from its children's: encode them all, deepest
            # first, in memory, then store them at once (their fsyncs overlap too).
            objects = [self._encode_dir(n) for n in sorted(changed, key=lambda n: -n.depth)]
            if self.store:
                self.root = Root(top.sha, top.size, top.files, top.nbytes, patterns,
                                 self.gitignore)
                objects.append(encode_root(self.root))
                self._put_objects(pool, objects + self._deferred)
        return top.sha, top.size

    def _prefetch(self, top: bytes, rules: IgnoreRules) -> None:
        """The whole-tree pass (``tree_scan.walk``, one C call when the extension is
        built): the directories as their trusted records say, all below them too, and the
        listings of the others. Not where exclude patterns are in force (they decide
        where the walk may go); under GITIGNORE it stops at each ``.gitignore``, below
        which the walk lists directory by directory."""
        if rules:
            return
        inside = self.trees.store_dir_b[len(top.rstrip(b"/")) + 1:] if \
            self.trees.store_dir_b.startswith(top.rstrip(b"/") + b"/") else None
        self._clean, self._listings = tree_scan.walk(
            top, self._skip, self.cache.trusted() if self.reuse else {}, inside,
            b".gitignore" if self.gitignore else None)
        for key in self._clean:  # each is reached below one the walk looks at: kept as is
            self.cache.carry(key)

    def _walk(self, path: bytes, rel: str, rules: IgnoreRules, depth: int,
              nodes: list[_Node]) -> _Node:
        """One directory (``path`` as bytes: names come back as bytes, no decoding)."""
        node = _Node(rel, _key(rel), depth)
        nodes.append(node)
        if node.key in self._clean:  # as recorded, and all below it: the record's object
            rec = self.cache.get(node.key)
            rec = None if rec is None else self.cache.reusable(node.key, rec[0])
            if rec is not None:
                node.reused = True
                node.sha, node.size, node.files, node.nbytes = rec[3].hex(), *rec[4:7]
                return node
        ls = self._listings.pop(node.key, None)
        if ls is None:
            try:
                ls = tree_scan.scan(path, self._skip)  # lstat of each entry, no link followed
            except OSError as exc:
                raise TreeSourceError(os.fsdecode(path), f"cannot list it: "
                                      f"{exc.strerror or exc}") from None
        if self.gitignore:
            rules = self._gitignore(path, ls, rules, rel)
        drop = self._dropped(path, ls, rel, rules)
        if drop:
            ls = tree_scan.without(ls, drop)
        if ls.errors:
            name, err, link = ls.errors[0]
            raise TreeSourceError(os.fsdecode(os.path.join(path, name)),
                                  f"cannot {'read the link' if link else 'stat it'}: "
                                  f"{os.strerror(err)}")
        for name in ls.dirs:
            sub = self._walk(os.path.join(path, name), join(rel, name), rules, depth + 1,
                             nodes)
            node.subdirs.append((name, sub))
        if self.reuse and self._as_recorded(node, ls):
            return node
        # a changed directory (or no record to reuse): its entries one by one
        node.sigs = [_dir_sig(name) for name in ls.dirs]
        files: list[tuple[bytes, bytes, os.stat_result]] = []
        is_reg, stat_at = stat.S_ISREG, tree_scan.stat_at
        for i, name in enumerate(ls.names):
            st = stat_at(ls, i)
            if is_reg(st.st_mode):
                files.append((name, os.path.join(path, name), st))
        for name, target in ls.targets.items():
            node.sigs.append(_link_sig(name, target))
            node.entries.append(Entry(name, TREE_LINK, 0, "", len(target), target))
        if self.reuse:
            files = self._as_before(node, files)
        lookup, key = self.cache.lookup, node.key
        for name, fpath, st in files:
            hit = lookup(key, name, st)
            if hit is not None and (hit[1] or _hashes_to(fpath, hit[0])):
                node.cached.append((name, fpath, st, hit[0], hit[1]))
            else:
                node.pending.append((name, fpath))
        return node

    def _dropped(self, path: bytes, ls: tree_scan.Listing, rel: str, rules: IgnoreRules
                 ) -> set[bytes]:
        """The entries of a directory that the snapshot leaves out: excluded by the rules,
        or the store's own directory."""
        drop: set[bytes] = set()
        if path == self._store_parent and self._store_name in ls.dirs:
            drop.add(self._store_name)
        if rules:  # (once per entry of a directory with exclude rules in force)
            dirs, ignored = set(ls.dirs), rules.ignored
            drop.update(name for name in ls.names if ignored(join(rel, name), name in dirs))
        return drop

    def _as_recorded(self, node: _Node, ls: tree_scan.Listing) -> bool:
        """Whether the directory's own entries are as its trusted record says: then it
        is the record's object if its subdirectories are unchanged too, else its files
        and links are the old object's (only its subdirectories' entries are new)."""
        digest = _digest([ls.sigs])
        if all(sub.reused for _name, sub in node.subdirs):
            rec = self.cache.reusable(node.key, digest)
            if rec is not None:
                node.reused = True
                node.sha, node.size, node.files, node.nbytes = rec[3].hex(), *rec[4:7]
                return True
            return False
        rec = self.cache.matches(node.key, digest)
        if rec is None:
            return False
        try:
            old = self.trees._dir(rec[3].hex(), rec[4], node.rel)
        except (CorruptionError, UnsafeTreeError):
            return False
        node.entries = [e for e in old if e.kind != TREE_DIR]
        node.sigs = [ls.sigs]  # (joined already: the digest is the same)
        node.newest = ls.newest
        node.blob = rec[7]  # its files' cache entries, unchanged
        self.known.update(e.sha256 for e in node.entries if e.kind == TREE_FILE)
        return True

    def _as_before(self, node: _Node, files: list[tuple[bytes, bytes, os.stat_result]]
                   ) -> list[tuple[bytes, bytes, os.stat_result]]:
        """Take the files of a changed directory that are as its trusted record says
        straight from the record's directory object, an entry of the key's current tree
        (so no pin, no lookup, no new entry); returns the other files."""
        rec = self.cache.get(node.key)
        if rec is None:
            return files
        try:
            old = {e.name: e for e in self.trees._dir(rec[3].hex(), rec[4], node.rel)}
        except (CorruptionError, UnsafeTreeError):
            return files
        recorded = self.cache.files_of(node.key)
        seen = self.cache.seen.setdefault(node.key, {})
        entries, sigs, newest = node.entries, node.sigs, node.newest
        rest = []
        for item in files:  # (once per file of a changed directory)
            name, _p, st = item
            e = recorded.get(name)
            o = old.get(name)
            if (o is not None and e is not None and _entry_matches(e, st)
                    and e[5] - st.st_mtime_ns >= RACY_NS
                    and o.kind == TREE_FILE and o.size == st.st_size
                    and o.perm == st.st_mode & 0o777 and o.sha256 == e[4].hex()):
                entries.append(o)
                sigs.append(_file_sig(name, st))
                newest = max(newest, st.st_mtime_ns)
                seen[name] = e  # carried over to the directory's new record
            else:
                rest.append(item)
        node.newest = newest
        return rest

    def _gitignore(self, path: bytes, ls: tree_scan.Listing, rules: IgnoreRules,
                   rel: str) -> IgnoreRules:
        i = tree_scan.find(ls, b".gitignore")
        if i is None or not stat.S_ISREG(tree_scan.stat_at(ls, i).st_mode):
            return rules
        gi = os.path.join(path, b".gitignore")
        try:
            with open(gi, "rb") as f:
                return rules.extended(_read_lines(f.read()), rel)
        except OSError as exc:
            raise TreeSourceError(os.fsdecode(gi), f"cannot read it: "
                                  f"{exc.strerror or exc}") from None

    def _old_known(self, changed: list[_Node]) -> None:
        """Add what the key's tree held in each changed directory (its old object, as the
        cache records it, is in that tree) to ``known``: those need no pin."""
        for node in changed:
            rec = self.cache.get(node.key)
            if rec is None:
                continue
            try:
                entries = self.trees._dir(rec[3].hex(), rec[4], node.rel)
            except (CorruptionError, UnsafeTreeError):
                continue
            self.known.update(e.sha256 for e in entries if e.kind != TREE_LINK)

    def _pin_cached(self, nodes: list[_Node]) -> None:
        """Entries of the files the cache vouched for (to be read if their blob is gone)."""
        cached = [(node, item) for node in nodes for item in node.cached]
        if not cached:
            return
        present = [True] * len(cached)
        if self.store:  # pin what the key's current tree does not already hold
            known = self.known
            ask = [i for i, (_n, item) in enumerate(cached) if item[3] not in known]
            got = self.blobs.pin_present([(cached[i][1][3], cached[i][1][2].st_size)
                                          for i in ask])
            for i, ok in zip(ask, got, strict=True):
                present[i] = ok
        now = time.time_ns()
        for (node, (name, path, st, sha, trusted)), ok in zip(cached, present, strict=True):
            if not ok:
                node.pending.append((name, path))
                self.cache.forget(node.key, name)
                continue
            if self.store and sha not in self.known:
                self.pins.append(sha)
            e = Entry(name, TREE_FILE, st.st_mode & 0o777, sha, st.st_size)
            if not trusted:  # a racy entry, hashed again just now
                self.cache.record(node.key, name, st, sha, now)
            node.entries.append(e)
            node.sigs.append(_file_sig(name, st))
            node.newest = max(node.newest, st.st_mtime_ns)

    def _put_objects(self, pool: ThreadPoolExecutor, objects: list[bytes]) -> None:
        """Pin the objects (and deferred small files) already stored, write the others."""
        refs = [(hashlib.sha256(data).hexdigest(), len(data)) for data in objects]
        ask = [i for i, (sha, _n) in enumerate(refs) if sha not in self.known]
        present = [True] * len(refs)
        for i, ok in zip(ask, self.blobs.pin_present([refs[i] for i in ask]), strict=True):
            present[i] = ok
        with self._lock:
            self.pins.extend(refs[i][0] for i in ask if present[i])
        missing = {sha: data for (sha, _n), data, ok in zip(refs, objects, present, strict=True)
                   if not ok}
        # (their absence was just seen; a blob named meanwhile by another writer is still
        # stored once, by put_many's own check) Written in phases: all files fsynced, then
        # named, then each fan-out directory fsynced once, the fsyncs of each phase at once.
        self.blobs.put_many(list(missing.items()), lambda fn, *its: _run_all(pool, fn, *its))
        with self._lock:
            self.pins.extend(missing)

    def _encode_dir(self, node: _Node) -> bytes:
        """The node's directory object (its subdirectories' are encoded already); records
        the directory in the stat cache."""
        subs = [Entry(name, TREE_DIR, 0, sub.sha, sub.size) for name, sub in node.subdirs]
        entries = sorted(node.entries + subs, key=lambda e: e.name)
        data = encode_dir(entries)
        node.sha, node.size = hashlib.sha256(data).hexdigest(), len(data)
        node.files = len(node.entries) + sum(sub.files for _name, sub in node.subdirs)
        node.nbytes = sum(e.size for e in node.entries if e.kind == TREE_FILE) + sum(
            sub.nbytes for _name, sub in node.subdirs)
        if self.store:
            self.trees.remember(node.sha, entries)  # what a restore or a listing reads next
            self.cache.close_dir(node.key, _digest(node.sigs), self.began, node.newest, node.sha,
                                 node.size, node.files, node.nbytes, node.blob)
        else:
            self.objects[node.sha] = entries
        return data

    def _file(self, node: _Node, name: bytes, bpath: bytes
              ) -> tuple[Entry, os.stat_result] | None:
        """Read one file into the blob store (or only hash it), consistently; None if gone."""
        path = os.fsdecode(bpath)
        for _attempt in range(READ_ATTEMPTS):
            try:
                fd = os.open(bpath, _READ_FLAGS)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    return None  # became a link meanwhile: seen at the next snapshot
                raise TreeSourceError(path, f"cannot open it: {exc.strerror or exc}") from None
            try:
                got = self._read_once(fd, path)
            finally:
                os.close(fd)
            if got is None:
                continue
            sha, st = got
            self.cache.record(node.key, name, st, sha, time.time_ns())
            e = Entry(name, TREE_FILE, st.st_mode & 0o777, sha, st.st_size)
            with self._lock:
                self.files_read += 1
                self.bytes_read += st.st_size
            failpoints.hit("tree_after_file")
            return e, st
        raise TreeSourceError(path, f"it kept changing while it was read ({READ_ATTEMPTS} "
                              "attempts)")


    def _read_once(self, fd: int, path: str) -> tuple[str, os.stat_result] | None:
        """``(sha256, stat)`` of one consistent read (pinned if stored), or None if it changed.

        A file of at most one chunk is read into memory, checked, and then stored
        (nothing is written if its content is stored already); a larger one is
        streamed into the blob store and checked after.
        """
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise TreeSourceError(path, "it is no longer a regular file")
        small = before.st_size <= CHUNK
        data = b""
        try:
            if small:
                data = _read_fd(fd)
                sha, size = hashlib.sha256(data).hexdigest(), len(data)
            elif self.store:
                sha, size = self._put(io.FileIO(fd, closefd=False), path)
            else:
                sha, size = _hash_fd(fd)
        except OSError as exc:
            raise TreeSourceError(path, f"cannot read it: {exc.strerror or exc}") from None
        failpoints.hit("tree_after_read")
        after = os.fstat(fd)
        ok = _sig(before) == _sig(after) and size == after.st_size
        if ok and time.time_ns() - after.st_mtime_ns < RACY_NS:
            ok = _hash_fd(fd)[0] == sha  # a write in the same clock tick hides from stat
        if small and ok and self.store:
            with self._lock:  # stored with the directory objects, in one batch
                defer = self._deferred_bytes + size <= _DEFER_BYTES
                if defer:
                    self._deferred.append(data)
                    self._deferred_bytes += size
            if not defer:
                self.blobs.put_bytes(data)  # pinned, written only if missing
                with self._lock:
                    self.pins.append(sha)
        elif not small and not ok and self.store:  # a streamed read that did not hold
            with self._lock:
                self.pins.remove(sha)
            self.blobs.unpin([sha])
        return (sha, after) if ok else None

    def _put(self, stream: io.FileIO, path: str) -> tuple[str, int]:
        try:
            ref = self.blobs.put(stream)
        except BlobSourceError as exc:
            raise TreeSourceError(path, exc.reason) from None
        with self._lock:
            self.pins.append(ref.sha256)  # dropped by _read_once if the read was inconsistent
        return ref.sha256, ref.size


def _map(pool: ThreadPoolExecutor, fn: Callable[[_T], _R], items: list[_T]) -> Iterator[_R]:
    """``pool.map``, or in this thread for one item (no thread is started for it: a
    status or one-file snapshot reads one file)."""
    return map(fn, items) if len(items) <= 1 else pool.map(fn, items)


def _run_all(pool: ThreadPoolExecutor, fn: Callable[..., _R], *iterables: Iterable[Any]
             ) -> Iterator[_R]:
    """``fn`` over the items in the pool (in this thread for one), all of them finished
    before the first error (if any) is raised: nothing is left running behind it."""
    args = list(zip(*iterables, strict=True))
    if len(args) <= 1:
        return iter([fn(*a) for a in args])
    futures = [pool.submit(fn, *a) for a in args]
    concurrent.futures.wait(futures)
    return iter([f.result() for f in futures])


def _hash_fd(fd: int) -> tuple[str, int]:
    h = hashlib.sha256()
    offset = 0
    while True:
        chunk = os.pread(fd, CHUNK, offset)
        if not chunk:
            return h.hexdigest(), offset
        h.update(chunk)
        offset += len(chunk)


def _read_fd(fd: int) -> bytes:
    """The whole content of a (small) file, from offset 0."""
    parts: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, CHUNK, offset)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        offset += len(chunk)


def _hashes_to(path: bytes, sha: str) -> bool:
    """Whether the file at ``path`` has content hash ``sha`` (a racy cache entry's check)."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return False
    try:
        return _hash_fd(fd)[0] == sha
    except OSError:
        return False
    finally:
        os.close(fd)
