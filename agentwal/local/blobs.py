"""Large binary artifacts: content-addressed files under ``<store>/blobs/``.

Theory of operation: ``txn.put_blob(key, source)`` streams the source, in
:data:`CHUNK`-sized pieces, into a new file under ``blobs/tmp/`` while
hashing it with SHA-256; the file is then named by its hash
(``blobs/<sha[:2]>/<sha[2:]>``) and the key's value becomes a small
*blob reference* (``codec.encode_blob_ref``), committed like any value. The
artifact is never held in memory, and identical content is one file however
many keys, runs or checkpoints name it. Every file operation goes through
the I/O seam (``io.FileSystem``); this module never decides what is
committed, it only guarantees that a blob is durable before a commit can
name it.

Write path and crash windows (failpoints in brackets); "garbage" means a
file nothing references, which :meth:`BlobStore.sweep` removes:

1. write the temp file ``blobs/tmp/<random>.tmp`` [``blob_after_write``]
   -- death here leaves a partial temp file: garbage;
2. fsync it [``blob_after_fsync``] -- a whole, durable temp file: garbage;
3. under the sweep gate, name it: if ``<sha>`` already exists with the
   same size the temp file is dropped (stored once), otherwise it is renamed
   to ``<sha>``; the hash is *pinned* [``blob_after_rename``] -- the name may
   not be durable yet, and no commit names the blob: garbage;
4. fsync the fan-out directory [``blob_after_sync``] -- durable under its
   hash, still unreferenced: garbage until the commit.

:meth:`BlobStore.put_many` (a snapshot's directory objects and small files,
in memory) takes each blob through the same four steps, phase by phase: every
temp file written and fsynced (at once, in the caller's thread pool), then
all named, then each fan-out directory they went into fsynced once; it
returns when all are durable, and a failure in any phase unpins them all.

Only then does ``put_blob`` return, so the commit that references the blob
(made later, through the WAL, in any durability mode) can never be durable
before the blob: after a crash a reference always finds its file, and a
blob whose commit was lost is only garbage. A fan-out directory, and
``blobs/`` itself, are fsynced into their parent the first time this
process uses them, whoever created them.

Reading is :class:`~agentwal.local.blobread.BlobReader` (``blobread.py``),
and the lock between naming and sweeping is :class:`~agentwal.local.blobgate.Gate`
(``blobgate.py``); this module re-exports both.

Sweeping (garbage collection): the caller (``BlobRefs.sweep``) gives
the set of hashes any retained state or history references. A blob that
is written but not yet committed is in no such set, so every blob a
transaction put stays *pinned* (an in-process count) until that
transaction commits (its reference is then visible to every later view),
rolls back, or is dropped; a commit whose outcome is unknown (an I/O error,
a crash of the pipeline) leaves its pins in place for the life of the
process. The :class:`Gate` orders the two: naming + pinning (and a fork or
rollback copying references) hold it shared, a sweep holds it exclusive,
reads the pins, then computes the referenced set, then removes what is in
neither. So a blob cannot be named and lose its file to a sweep that
started before it was pinned, and a pin dropped during a sweep belongs to
a commit the sweep's view already shows. Temp files of writes in progress
are never removed (they are registered before they are created).

This module does not touch LMDB or the WAL, and it never deletes a file
that does not look like a blob or a temp file.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import io
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .. import failpoints
from ..errors import BlobSourceError, CorruptionError, DiskFullError, DurabilityError, Error
from ..format import BLOB_TMP_DIR
from ..io import DISK_FULL_ERRNOS, FileSystem, open_source, write_all
from ..types import BlobRef
from .blobgate import Gate
from .blobread import BlobMissing, BlobReader

__all__ = ["CHUNK", "BlobMissing", "BlobReader", "BlobStore", "Gate", "blob_path",
           "source_chunks"]
# BlobReader (blobread.py) and Gate (blobgate.py) are re-exported: their users import them here.

#: Bytes read from a source, written and hashed at a time.
CHUNK = 1 << 20

_HEX = frozenset("0123456789abcdef")
_TMP_SUFFIX = ".tmp"


def blob_path(root: str, sha256: str) -> str:
    """Where the blob with hex SHA-256 ``sha256`` lives under the blob directory ``root``."""
    return os.path.join(root, sha256[:2], sha256[2:])


def _is_hex(name: str, n: int) -> bool:
    return len(name) == n and set(name) <= _HEX


# -- the blob directory ----------------------------------------------------------------


def _source(source: object) -> tuple[Any, bool, str]:
    """``(stream, owned, label)`` for a put_blob source: a path is opened here (owned).

    Raises:
        BlobSourceError: a path that cannot be opened, or a text stream.
        TypeError: neither a path nor something with ``read(n)``.
    """
    if isinstance(source, (str, os.PathLike)):
        label = repr(os.fspath(source))
        try:
            return open_source(source), True, label
        except OSError as exc:
            raise BlobSourceError(label, exc.strerror or str(exc)) from exc
        except ValueError as exc:  # an embedded NUL
            raise BlobSourceError(label, str(exc)) from exc
    label = f"<{type(source).__name__} object>"
    if isinstance(source, io.TextIOBase):
        raise BlobSourceError(label, "it is a text stream; open the file in binary mode ('rb')")
    if not callable(getattr(source, "read", None)):
        hint = " (wrap bytes in io.BytesIO)" if isinstance(source, (bytes, bytearray)) else ""
        raise TypeError("put_blob's source must be a path (str or os.PathLike), a readable "
                        "binary stream (anything with read(n)) or a BlobRef, not "
                        f"{type(source).__name__}{hint}")
    return source, False, label


@contextlib.contextmanager
def source_chunks(source: object) -> Iterator[Iterator[bytes]]:
    """The pieces of a ``put_blob`` source (a path or a binary stream), :data:`CHUNK` each.

    The one reader of a blob's source for both backends. A path is opened
    here and closed when the block ends; a stream stays the caller's.

    Raises:
        BlobSourceError: the source cannot be opened or read (while iterating, too).
        TypeError: ``source`` is of no accepted kind.
    """
    stream, owned, label = _source(source)

    def pieces() -> Iterator[bytes]:
        while chunk := _read_chunk(stream, label):
            yield chunk

    try:
        yield pieces()
    finally:
        if owned:
            with contextlib.suppress(OSError):
                stream.close()


def _read_chunk(stream: Any, label: str) -> bytes:
    """The next piece of a source (b"" at its end), or BlobSourceError."""
    try:
        chunk = stream.read(CHUNK)
    except Exception as exc:
        raise BlobSourceError(label, f"reading it raised {type(exc).__name__}: {exc}") from exc
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, (bytearray, memoryview)):
        return bytes(chunk)
    if chunk is None:
        raise BlobSourceError(label, "read() returned None (a non-blocking stream with no data "
                              "ready)")
    if isinstance(chunk, str):
        raise BlobSourceError(label, "read() returned str, not bytes (a text stream); open it "
                              "in binary mode ('rb')")
    raise BlobSourceError(label, f"read() returned {type(chunk).__name__}, not bytes")


class BlobStore:
    """The blob directory of one writer (or reader) process: writes, pins, reads, sweeps.

    Args:
        fs: the store's file system.
        store_dir: the store directory; blobs live in ``<store_dir>/<root>``.
        root: the blob directory's name (``format.BLOBS_DIR``).

    A :class:`DurabilityError` from any method means a write, fsync or
    removal failed: the caller stops its writer, as for the WAL.
    """

    def __init__(self, fs: FileSystem, store_dir: str, root: str) -> None:
        self.fs = fs
        self.store_dir = store_dir
        self.root = os.path.join(store_dir, root)
        self.tmp_dir = os.path.join(self.root, BLOB_TMP_DIR)
        self.gate = Gate()
        self._lock = threading.Lock()
        self._pins: collections.Counter[str] = collections.Counter()
        self._writing: set[str] = set()
        self._dead: collections.deque[list[str]] = collections.deque()
        self._ready: set[str] = set()  # directories made durable by this process
        self._unsynced: collections.Counter[str] = collections.Counter()  # named, name not durable
        self._synced_fans: set[str] = set()  # fan-out directories this process fsynced

    # -- writing ---------------------------------------------------------------------

    def put(self, source: object, media_type: str | None = None) -> BlobRef:
        """Store ``source`` durably under its hash and pin it; returns its reference.

        The caller must :meth:`unpin` the hash once the transaction that
        names it has committed or rolled back.

        Args:
            source: a path, a binary stream (``read(n)``), or a
                :class:`BlobRef` of a blob already in this store.
            media_type: recorded in the reference (a BlobRef's own is kept
                when None).

        Raises:
            BlobSourceError: the source cannot be read (or names no blob here).
            TypeError: ``source`` is of no accepted kind.
            DiskFullError: no room; the temp file is removed, nothing is pinned.
            DurabilityError: a write or fsync failed.
            CorruptionError: a BlobRef source whose file has another size.
        """
        if isinstance(source, BlobRef):
            return self._link(source, media_type)
        with source_chunks(source) as chunks:
            sha, size = self._write(chunks)
        return BlobRef(sha, size, media_type)

    def _write(self, chunks: Iterator[bytes]) -> tuple[str, int]:
        fs = self.fs
        self._ensure_dir(self.root, self.store_dir)
        self._ensure_dir(self.tmp_dir, self.root)
        tmp = os.path.join(self.tmp_dir, uuid.uuid4().hex + _TMP_SUFFIX)
        with self._lock:
            self._writing.add(tmp)  # before the file exists: a sweep leaves it alone
        try:
            sha, size = self._write_temp(tmp, chunks)
            self._install(tmp, sha, size)
            return sha, size
        except BaseException:
            with contextlib.suppress(OSError):
                fs.unlink(tmp)  # gone already if it was renamed or dropped
            raise
        finally:
            with self._lock:
                self._writing.discard(tmp)

    def _write_temp(self, tmp: str, chunks: Iterable[bytes], sha: str | None = None
                    ) -> tuple[str, int]:
        """Steps 1-2: the temp file ``tmp`` made of ``chunks`` and fsynced; returns their
        hex SHA-256 (``sha`` if given: not computed again) and size."""
        fs = self.fs
        try:
            fd = fs.open(tmp, create=True)
        except OSError as exc:
            raise self._fs_error(exc, tmp, "cannot create a blob file") from None
        try:
            got, size = self._copy(chunks, fd, tmp, hashed=sha is None)
            failpoints.hit("blob_after_write")
            try:
                fs.fsync(fd)
            except OSError as exc:
                raise self._fs_error(exc, tmp, "cannot sync a blob file", sync=True) from None
        finally:
            with contextlib.suppress(OSError):
                fs.close(fd)
        failpoints.hit("blob_after_fsync")
        return got if sha is None else sha, size

    def _copy(self, chunks: Iterable[bytes], fd: int, tmp: str, *, hashed: bool = True
              ) -> tuple[str, int]:
        """Write the source's pieces into ``fd``; returns its hex SHA-256 ("" if not
        ``hashed``) and size."""
        h = hashlib.sha256()
        size = 0
        for chunk in chunks:
            if hashed:
                h.update(chunk)
            try:
                n = self.fs.pwrite(fd, size, chunk)  # whole, as a rule: no copy
                if n < len(chunk):  # a short write: finish it
                    write_all(self.fs, fd, size + n, chunk[n:])
            except OSError as exc:
                raise self._fs_error(exc, tmp, "cannot write a blob file") from None
            size += len(chunk)
        return (h.hexdigest() if hashed else ""), size

    def _install(self, tmp: str, sha: str, size: int) -> None:
        """Name the synced temp file by its hash (or drop it for an equal file) and pin it."""
        fan = self._name(tmp, sha, size)
        try:
            failpoints.hit("blob_after_rename")
            try:
                self._sync_fan(fan)
            finally:
                self._synced(sha)
            failpoints.hit("blob_after_sync")
        except BaseException:
            self.unpin([sha])
            raise

    def _name(self, tmp: str, sha: str, size: int) -> str:
        """Step 3: name the synced temp file by its hash (or drop it for an equal file),
        pinned, counted in ``_unsynced`` until :meth:`_synced`; returns its fan-out
        directory (to fsync)."""
        fs = self.fs
        final = blob_path(self.root, sha)
        fan = os.path.dirname(final)
        self._ensure_dir(fan, self.root)
        with self.gate.shared():
            with self._lock:
                self._unsynced[sha] += 1
            try:
                if self._size_of(final) == size:
                    with contextlib.suppress(OSError):
                        fs.unlink(tmp)  # stored once; a left-over temp file is garbage
                else:  # missing, or damaged to another size: ours replaces it
                    fs.rename(tmp, final)
            except OSError as exc:
                self._synced(sha)
                raise self._fs_error(exc, final, "cannot name a blob file") from None
            self._pin(sha)
        return fan

    def _sync_fan(self, fan: str) -> None:
        try:
            self.fs.fsync_dir(fan)
        except OSError as exc:
            raise self._fs_error(exc, fan, "cannot sync a blob directory", sync=True) from None
        self._synced_fans.add(fan)  # every name in it now is durable

    def put_many(self, items: list[tuple[str, bytes]],
                 map_: Callable[..., Iterator[Any]] = map) -> None:
        """Store small in-memory blobs ``(sha256, data)`` (a snapshot's directory objects
        and small files, their hashes known) and pin each, as :meth:`put` would, in
        phases whose fsyncs overlap: every temp file written and fsynced (through
        ``map_``, e.g. a thread pool's), then all named, then each fan-out directory
        they went into fsynced once (through ``map_``). Returns once all are durable.

        Raises:
            As :meth:`put` (whatever was pinned is unpinned; temp files are removed).
        """
        if not items:
            return
        self._ensure_dir(self.root, self.store_dir)
        self._ensure_dir(self.tmp_dir, self.root)
        tmps = [os.path.join(self.tmp_dir, uuid.uuid4().hex + _TMP_SUFFIX) for _ in items]
        with self._lock:
            self._writing.update(tmps)  # before the files exist: a sweep leaves them alone
        named: list[str] = []  # pinned, and counted in _unsynced until the fans are synced
        try:
            for _ in map_(lambda tmp, item: self._write_temp(tmp, [item[1]], item[0]), tmps,
                          items):
                pass
            fans: set[str] = set()
            try:
                for tmp, (sha, data) in zip(tmps, items, strict=True):
                    fans.add(self._name(tmp, sha, len(data)))
                    named.append(sha)
                    failpoints.hit("blob_after_rename")
                for _ in map_(self._sync_fan, sorted(fans)):
                    pass
            finally:
                for sha in named:
                    self._synced(sha)
            for _ in named:
                failpoints.hit("blob_after_sync")
        except BaseException:
            self.unpin(named)
            for tmp in tmps:
                with contextlib.suppress(OSError):
                    self.fs.unlink(tmp)  # gone already if it was renamed or dropped
            raise
        finally:
            with self._lock:
                self._writing.difference_update(tmps)

    def _synced(self, sha: str) -> None:
        with self._lock:
            if self._unsynced[sha] > 0:
                self._unsynced[sha] -= 1
            if self._unsynced[sha] <= 0:
                del self._unsynced[sha]

    def put_bytes(self, data: bytes) -> BlobRef:
        """Store small ``data`` (a tree object) and pin it; nothing is written if it is present.

        Raises:
            As :meth:`put`.
        """
        sha = hashlib.sha256(data).hexdigest()
        if self.pin_present([(sha, len(data))]) == [True]:
            return BlobRef(sha, len(data))
        return self.put(io.BytesIO(data))

    def pin_present(self, refs: Iterable[tuple[str, int]]) -> list[bool]:
        """Pin each ``(sha256, size)`` whose blob file is present.

        What is pinned is durable when this returns: each fan-out directory
        is fsynced once per process (a name another process made, then died,
        may not have been), and again for a name whose own fsync is still
        under way. Returns, in order, which ones were pinned; the caller
        :meth:`unpin` s those.

        Raises:
            DurabilityError: a directory fsync failed (nothing stays pinned).
        """
        refs = list(refs)
        fans: set[str] = set()
        with self.gate.shared():
            got = []
            for sha, _size in refs:
                try:  # presence only (one stat): sizes are checked when read, and by verify
                    got.append(self.fs.exists(blob_path(self.root, sha)))
                except OSError:
                    got.append(False)
            pinned = [sha for (sha, _size), ok in zip(refs, got, strict=True) if ok]
            with self._lock:
                for sha in pinned:
                    self._pins[sha] += 1
                    fan = os.path.join(self.root, sha[:2])
                    if sha in self._unsynced or fan not in self._synced_fans:
                        fans.add(fan)
        try:
            for fan in sorted(fans):
                try:
                    self.fs.fsync_dir(fan)
                except OSError as exc:
                    raise self._fs_error(exc, fan, "cannot sync a blob directory",
                                         sync=True) from None
                self._synced_fans.add(fan)
        except BaseException:
            self.unpin(pinned)
            raise
        return got

    def _link(self, ref: BlobRef, media_type: str | None) -> BlobRef:
        """Pin a blob already in the store (a BlobRef source): nothing is copied."""
        final = blob_path(self.root, ref.sha256)
        with self.gate.shared():
            try:
                size = self._size_of(final)
            except OSError as exc:
                raise CorruptionError(final, None, "cannot open the blob file: "
                                      f"{exc.strerror or exc}") from None
            if size is None:
                raise BlobSourceError(f"BlobRef {ref.sha256}", "this store has no blob with "
                                      "that hash (it was never stored here, or was swept)")
            if size != ref.size:
                raise CorruptionError(final, None, f"blob file is {size} bytes; the reference "
                                      f"says {ref.size}")
            self._pin(ref.sha256)
        try:
            try:
                self._ensure_dir(self.root, self.store_dir)
                self._ensure_dir(os.path.dirname(final), self.root)
                self.fs.fsync_dir(os.path.dirname(final))  # whoever named it may have died
            except OSError as exc:
                raise self._fs_error(exc, final, "cannot sync a blob directory",
                                     sync=True) from None
        except BaseException:
            self.unpin([ref.sha256])
            raise
        return BlobRef(ref.sha256, ref.size, ref.media_type if media_type is None else media_type)

    def _ensure_dir(self, path: str, parent: str) -> None:
        """Make ``path`` exist and its name durable (once per process)."""
        if path in self._ready:
            return
        try:
            self.fs.mkdir(path)
            self.fs.fsync_dir(parent)
        except OSError as exc:
            raise self._fs_error(exc, path, "cannot make the blob directory", sync=True) from None
        self._ready.add(path)

    def _size_of(self, path: str) -> int | None:
        """The size of file ``path``, or None if there is none."""
        try:
            fd = self.fs.open_read(path)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise
        try:
            return self.fs.size(fd)
        finally:
            self.fs.close(fd)

    def _fs_error(self, exc: OSError, path: str, what: str, *, sync: bool = False) -> Error:
        """The typed error for a failed write (DiskFullError unless it was a sync)."""
        if exc.errno in DISK_FULL_ERRNOS and not sync:
            return DiskFullError(path, f"{what}: no room to write {path!r} "
                                 f"({exc.strerror or exc}); nothing was stored or committed. "
                                 "Free some space and put the blob again.")
        return DurabilityError(path, f"{what}: {exc.strerror or exc}")

    def where(self, sha: str) -> str:
        """The file of blob ``sha`` (``treeio.TreeBlobs``)."""
        return blob_path(self.root, sha)

    def exists(self, sha: str) -> bool:
        """True if blob ``sha``'s file is present (``treeio.TreeBlobs``)."""
        return os.path.exists(blob_path(self.root, sha))

    # -- pins ------------------------------------------------------------------------

    def _pin(self, sha: str) -> None:
        with self._lock:
            self._pins[sha] += 1

    def unpin(self, hashes: Iterable[str]) -> None:
        """Drop one pin of each hash (its transaction committed or rolled back)."""
        with self._lock:
            for sha in hashes:
                self._pins[sha] -= 1
                if self._pins[sha] <= 0:
                    del self._pins[sha]

    def abandon(self, hashes: Iterable[str]) -> None:
        """:meth:`unpin` later: safe from a finalizer (takes no lock)."""
        self._dead.append(list(hashes))

    def pinned(self) -> set[str]:
        """The hashes pinned now (by transactions not finished, or in doubt)."""
        while self._dead:
            self.unpin(self._dead.popleft())
        with self._lock:
            return set(self._pins)

    # -- reading ---------------------------------------------------------------------

    def open(self, ref: BlobRef, *, verify: bool = True) -> BlobReader:
        """A :class:`BlobReader` of ``ref``'s file, its size checked.

        Raises:
            BlobMissing: there is no such file.
            CorruptionError: the file has another size, or cannot be opened.
        """
        path = blob_path(self.root, ref.sha256)
        try:
            fd = self.fs.open_read(path)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                raise BlobMissing(path) from None
            raise CorruptionError(path, None, "cannot open the blob file: "
                                  f"{exc.strerror or exc}") from None
        try:
            size = self.fs.size(fd)
            if size != ref.size:
                raise CorruptionError(path, None, f"blob file is {size} bytes; its reference "
                                      f"says {ref.size}",
                                      "The blob file is damaged; the rest of the store is not "
                                      "affected. Restore it from a backup, or put the "
                                      "artifact again.")
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.fs.close(fd)
            raise CorruptionError(path, None, "cannot read the blob file: "
                                  f"{exc.strerror or exc}") from None
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.close(fd)
            raise
        return BlobReader(self.fs, fd, path, ref, verify=verify)

    # -- sweeping --------------------------------------------------------------------

    def sweep(self, referenced: Callable[[], set[str]], keep: Iterable[str] = ()
              ) -> tuple[int, int]:
        """Remove every blob file neither referenced, pinned nor in ``keep``.

        Holds the gate exclusive: reads the pins, *then* calls
        ``referenced()`` (so a pin dropped meanwhile belongs to a commit that
        call sees), then removes the other blob files and the temp files of
        no write in progress, and fsyncs each directory it changed.

        Returns:
            ``(files removed, bytes freed)``.

        Raises:
            DurabilityError: a removal or directory fsync failed.
            Whatever ``referenced()`` raises (nothing is removed then).
        """
        with self.gate.exclusive():
            protected = self.pinned()
            protected |= referenced()
            protected.update(keep)
            return self._remove(protected)

    def files(self) -> dict[str, str]:
        """``{sha256: path}`` of every blob file present (temp files aside)."""
        out: dict[str, str] = {}
        for d, names in self._listing():
            if d != BLOB_TMP_DIR:
                out.update((d + n, os.path.join(self.root, d, n)) for n in names)
        return out

    def _listing(self) -> Iterator[tuple[str, list[str]]]:
        """``(directory name, blob or temp file names)`` for each directory of ``blobs/``."""
        fs = self.fs
        if not fs.exists(self.root):
            return
        for d in fs.listdir(self.root):
            tmp = d == BLOB_TMP_DIR
            if not tmp and not _is_hex(d, 2):
                continue
            try:
                names = fs.listdir(os.path.join(self.root, d))
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ENOENT):
                    continue
                raise
            yield d, [n for n in names
                      if (n.endswith(_TMP_SUFFIX) if tmp else _is_hex(n, 62))]

    def _remove(self, protected: set[str]) -> tuple[int, int]:
        fs = self.fs
        files = freed = 0
        try:
            for d, names in self._listing():
                dpath = os.path.join(self.root, d)
                if d == BLOB_TMP_DIR:
                    with self._lock:
                        writing = set(self._writing)
                    doomed = [n for n in names if os.path.join(dpath, n) not in writing]
                else:
                    doomed = [n for n in names if d + n not in protected]
                removed = False
                for n in doomed:
                    p = os.path.join(dpath, n)
                    size = self._size_of(p)
                    if size is None:
                        continue
                    failpoints.hit("blob_sweep_before_unlink")
                    try:
                        fs.unlink(p)
                    except FileNotFoundError:
                        continue
                    files += 1
                    freed += size
                    removed = True
                if removed:
                    fs.fsync_dir(dpath)
        except OSError as exc:
            raise self._fs_error(exc, exc.filename or self.root, "cannot sweep blobs",
                                 sync=True) from None
        return files, freed
