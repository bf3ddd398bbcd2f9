"""The stat cache of a snapshotted (or restored) directory: what it looked like, so
that what did not change is neither read nor looked into again.

Theory of operation: a *signature* names what a walk sees of one entry
without reading it (a regular file's name, size, mtime, ctime, inode and
mode; a link's name and target; a directory's name). A directory's *digest*
is a hash of its entries' signatures, sorted. :class:`StatCache` keeps, per
directory a snapshot (``tree_snapshot.py``) or a restore
(``tree_restore.py``) looked into, a *record*: that digest, when the walk
that made it began, its newest file's mtime, its directory object's hash and
size, its counts, and its files' entries (size, mtime, ctime, inode, content
hash, when recorded). A record or entry is trusted only when its mtime was
:data:`RACY_NS` older than the moment it was recorded (git's "racy clean"
rule), so a write in the same clock tick as a walk is never missed. No
directory's own mtime is relied on: a file rewritten in place does not
change it.

The records of one tree form a *record set*, one file per set under
``<store>/cache/stat-<hash of the directory's path>.<root hash>``, the last
:data:`_CACHE_SETS` kept; each is written whole to a temp file and renamed
into place, so a reader sees an old set, a new one or none. The cache is a
hint, never state: a missing, torn, stale or damaged set is an empty one
(it costs reads, never a wrong tree), and nothing here is fsynced. An open
store keeps the sets it last read or wrote, decoded (:class:`_SetMemo`).

It must not read or write the user's files, blobs, LMDB or the WAL: the
walks that use it do.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import threading
import uuid
from typing import Any

import cbor2

from .codec import CodecError, loads

#: A file modified less than this before it was looked at may change again
#: within the same timestamp tick (2 s covers the coarsest file systems).
RACY_NS = 2_000_000_000
_CACHE_MAGIC = "awstat"
_CACHE_VERSION = 3
#: Record sets (trees) a stat cache file keeps, newest first.
_CACHE_SETS = 4


def _key(rel: str) -> bytes:
    """A stat-cache key: the path's bytes (as ``os.fsencode`` gives them on POSIX, faster)."""
    return rel.encode("utf-8", "surrogateescape")


def _sig(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


_FILE_SIG = struct.Struct("<qqqqq")


def _file_sig(name: bytes, st: os.stat_result) -> bytes:
    """What a directory's digest holds of one regular file: its name, size, mtime,
    ctime, inode and mode. Names hold no NUL and the rest is of fixed length (a
    link's target holds no NUL either), so a list of signatures names one set of
    entries."""
    return name + b"\0f" + _FILE_SIG.pack(st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                           st.st_ino, st.st_mode)


def _link_sig(name: bytes, target: bytes) -> bytes:
    return name + b"\0l" + target + b"\0"


def _dir_sig(name: bytes) -> bytes:
    return name + b"\0d"


def _digest(sigs: list[bytes]) -> bytes:
    """A directory's digest: the first 16 bytes of SHA-256 over its entries'
    signatures, sorted."""
    return hashlib.sha256(b"".join(sorted(sigs))).digest()[:16]


# -- the stat cache --------------------------------------------------------------------


class StatCache:
    """What one directory tree looked like when it was last snapshotted (or restored),
    for each of the last :data:`_CACHE_SETS` trees it held.

    A *record set* belongs to one tree (its root object's hash, ``root``): per
    directory (``dirs[relpath bytes]``, ``b""`` for the top) a record
    ``[digest, recorded, newest, sha256, size, files, bytes, entries]``:
    the digest of the signatures of its entries as stored (see
    :func:`_digest`), when the walk that made it began, the newest mtime
    among its files, its directory object's hash and size, the files and
    bytes below it, and its files' entries, CBOR
    ``{name: [size, mtime, ctime, inode, sha256, recorded]}``, decoded only
    for a directory that changed. The set loaded is the one of tree
    ``prefer`` if there is one (the key's current tree: its records may
    then stand for directories), else the newest; a file lookup that
    misses in it tries the sets newer than it (a file entry names a
    content hash whatever tree it came from). So two keys (or a restore of
    another checkpoint) alternating on one directory each find their own
    set, and the files the other one read or wrote.

    Each set is a file of its own, ``<path>.<root hash>``: ``sha256(body)[:16] +
    body`` (CBOR), written by rename; a snapshot reads one and writes one (none
    if nothing in it changed), and the oldest beyond :data:`_CACHE_SETS` are
    removed. A hint, never state: a missing, torn or stale file is an empty set.
    """

    def __init__(self, path: str | None, top: str, *, load: bool = True,
                 prefer: str | None = None, memo: _SetMemo | None = None) -> None:
        self.path = path
        self.top = top
        self._memo = memo
        self.root: str | None = None
        self.dirs: dict[bytes, list[Any]] = {}  # the loaded set (read records with get)
        self._valid: set[bytes] = set()  # directories whose record get checked
        self._files: dict[bytes, dict[bytes, list[Any]]] = {}
        self.seen: dict[bytes, dict[bytes, list[Any]]] = {}  # file entries to save, by dir
        self.out: dict[bytes, list[Any]] = {}  # directory records to save
        # the other record sets, newest first: (root bytes or None, body) as read, and
        # their decoded directory records (once a lookup needs them)
        self._loaded: dict[bytes, list[Any]] = {}  # the loaded set, as read
        self._sets: list[str] = []  # the files of the sets newer than the loaded one
        self._others: list[dict[bytes, list[Any]]] | None = None
        self._other_files: dict[bytes, list[dict[bytes, list[Any]]]] = {}
        self._keep = _CACHE_SETS - 1 if load else 0  # other sets kept by save (rehash: none)
        if path is not None and load:
            self._load(prefer)

    def _set_files(self) -> list[str]:
        """This directory's record-set files, newest first."""
        assert self.path is not None
        folder, base = os.path.split(self.path)
        try:
            names = [n for n in os.listdir(folder) if n.startswith(base + ".")
                     and len(n) == len(base) + 65 and not n.endswith(".tmp")]
        except OSError:
            return []
        dated = []
        for n in names:
            with contextlib.suppress(OSError):
                dated.append((os.stat(os.path.join(folder, n)).st_mtime_ns, n))
        return [os.path.join(folder, n) for _t, n in sorted(dated, reverse=True)]

    def _load(self, prefer: str | None) -> None:
        assert self.path is not None
        files = self._set_files()
        want = None if prefer is None else f"{self.path}.{prefer}"
        pick = want if want in files else (files[0] if files else None)
        if pick is None:
            return
        self._sets = files[:files.index(pick)]  # the newer sets: where a lookup may go on
        got = self._read_set(pick)
        if got is not None:
            self.root, self.dirs = got
            self._loaded = self.dirs

    def _read_set(self, path: str) -> tuple[str, dict[bytes, list[Any]]] | None:
        """``(root, records)`` of one record-set file, or None if it is missing or damaged
        (from the memo if the file is the one it holds)."""
        try:
            with open(path, "rb") as f:
                sig = _sig(os.fstat(f.fileno()))
                got = None if self._memo is None else self._memo.get(path, sig)
                if got is not None:
                    return got
                data = f.read()
        except OSError:
            return None
        got = self._parse_set(path, data)
        if got is not None and self._memo is not None:
            self._memo.put(path, sig, got)
        return got

    def _parse_set(self, path: str, data: bytes) -> tuple[str, dict[bytes, list[Any]]] | None:
        body = data[16:]
        if hashlib.sha256(body).digest()[:16] != data[:16]:
            return None
        try:
            obj = loads(body)
        except CodecError:
            return None
        if not (isinstance(obj, list) and len(obj) == 5 and obj[0] == _CACHE_MAGIC
                and obj[1] == _CACHE_VERSION and obj[2] == self.top
                and isinstance(obj[3], bytes) and len(obj[3]) == 32
                and isinstance(obj[4], dict) and path.endswith(obj[3].hex())):
            return None
        return obj[3].hex(), obj[4]  # each record is checked when first used (get)

    def get(self, rel: bytes) -> list[Any] | None:
        """The directory's record in the loaded set, if it has a well-formed one."""
        rec = self.dirs.get(rel)
        if rec is None or rel in self._valid:
            return rec
        if not _valid_record(rel, rec):
            del self.dirs[rel]
            return None
        self._valid.add(rel)
        return rec

    def trusted(self) -> dict[bytes, bytes]:
        """``{relpath: digest}`` of the loaded set's well-formed, trusted records (what
        :meth:`matches` could say yes to)."""
        return {rel: rec[0] for rel, rec in self.dirs.items()
                if _valid_record(rel, rec) and rec[1] - rec[2] >= RACY_NS}

    def reusable(self, rel: bytes, digest: bytes) -> list[Any] | None:
        """The directory's record if its entries are exactly as recorded (same digest)
        and it is trusted: its newest mtime was :data:`RACY_NS` older than the walk
        that recorded it. The record is carried over to the next save."""
        rec = self.matches(rel, digest)
        if rec is not None:
            self.out[rel] = rec
        return rec

    def matches(self, rel: bytes, digest: bytes) -> list[Any] | None:
        """As :meth:`reusable`, without carrying the record over."""
        rec = self.get(rel)
        if rec is None or rec[0] != digest or rec[1] - rec[2] < RACY_NS:
            return None
        return rec

    def carry(self, rel: bytes) -> None:
        """Carry the directory's record over to the next save as it is."""
        self.out[rel] = self.dirs[rel]

    def carry_file(self, rel: bytes, name: bytes) -> None:
        """Carry a file's entry over to the directory's next record."""
        e = self.files_of(rel).get(name)
        if e is not None:
            self.seen.setdefault(rel, {})[name] = e

    def files_of(self, rel: bytes) -> dict[bytes, list[Any]]:
        """The directory's recorded file entries (decoded once)."""
        got = self._files.get(rel)
        if got is None:
            got = self._files[rel] = _decode_files(self.get(rel))
        return got

    def _others_of(self, rel: bytes) -> list[dict[bytes, list[Any]]]:
        """The directory's file entries in the other record sets (decoded once)."""
        got = self._other_files.get(rel)
        if got is None:
            if self._others is None:
                self._others = [read[1] for read in map(self._read_set, self._sets)
                                if read is not None]
            got = self._other_files[rel] = [f for f in (
                _decode_files(d[rel]) for d in self._others
                if _valid_record(rel, d.get(rel))) if f]
        return got

    def lookup(self, rel: bytes, name: bytes, st: os.stat_result) -> tuple[str, bool] | None:
        """``(sha256, trusted)`` if file ``name`` of directory ``rel`` matches ``st``
        (trusted: not racy), in the loaded record set or else in another. A trusted
        entry is carried over to the next save as it is."""
        e: list[Any] | None = self.files_of(rel).get(name)
        if not _entry_matches(e, st):
            e = next((o[name] for o in self._others_of(rel)
                      if _entry_matches(o.get(name), st)), None) if self._sets else None
        if e is None:
            return None
        trusted = e[5] - st.st_mtime_ns >= RACY_NS
        if trusted:
            self.seen.setdefault(rel, {})[name] = e
        return e[4].hex(), trusted

    def record(self, rel: bytes, name: bytes, st: os.stat_result, sha: str, now: int) -> None:
        self.seen.setdefault(rel, {})[name] = [*_sig(st), bytes.fromhex(sha), now]

    def forget(self, rel: bytes, name: bytes) -> None:
        self.seen.get(rel, {}).pop(name, None)

    def close_dir(self, rel: bytes, digest: bytes, recorded: int, newest: int, sha: str,
                  size: int, files: int, nbytes: int, blob: bytes | None = None) -> None:
        """Record a directory as just stored (or restored); ``blob``: its files' entries,
        encoded, if they are its old record's."""
        if blob is None:
            blob = _encode_files(self.seen.get(rel, {}))
        self.out[rel] = [digest, recorded, newest, bytes.fromhex(sha), size, files, nbytes,
                         blob]

    def save(self, root: str | None) -> None:
        """Write the records closed or carried as the set of tree ``root`` (nothing if
        that set is the one loaded, unchanged), and remove the oldest sets beyond
        :data:`_CACHE_SETS` (a cache made with ``load=False``, a rehash's: every other
        set, since any set's file entries may be looked up); errors are ignored."""
        if self.path is None or root is None:
            return
        path = f"{self.path}.{root}"
        try:
            if (root == self.root and len(self.out) == len(self._loaded)
                    and all(self._loaded.get(k) is v for k, v in self.out.items())):
                os.utime(path)  # the same records: only marked as the newest
                if self._memo is not None:
                    self._memo.put(path, _sig(os.stat(path)), (root, self._loaded))
            else:
                body = bytes(cbor2.dumps([_CACHE_MAGIC, _CACHE_VERSION, self.top,
                                          bytes.fromhex(root), self.out]))
                tmp = f"{path}.{uuid.uuid4().hex}.tmp"
                try:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(tmp, "wb") as f:
                        f.write(hashlib.sha256(body).digest()[:16] + body)
                    # Not os.replace: a rename over an existing file makes ext4
                    # (auto_da_alloc) allocate and start writing the new one at once,
                    # which waits behind the journal commits of the restore or snapshot
                    # just made (measured: up to 300 ms). The file is only a hint, so
                    # a moment without it costs nothing but reads.
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    os.rename(tmp, path)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
                if self._memo is not None:  # the next snapshot of this tree reads no file
                    self._memo.put(path, _sig(os.stat(path)), (root, dict(self.out)))
            for old in [f for f in self._set_files() if f != path][self._keep:]:
                os.unlink(old)
            if os.path.exists(self.path):
                os.unlink(self.path)  # a version-2 file (one set, no suffix)
        except OSError:
            pass


class _SetMemo:
    """The record sets a store read or wrote last, decoded, by file path and the file's
    stat signature (a file replaced or touched since is read again). Sets are only
    read from it (a record found damaged may be dropped, as it would be anyway)."""

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._sets: dict[str, tuple[tuple[int, int, int, int], tuple[str, dict[bytes,
                                                                             list[Any]]]]] = {}
        self._lock = threading.Lock()

    def get(self, path: str, sig: tuple[int, int, int, int]
            ) -> tuple[str, dict[bytes, list[Any]]] | None:
        with self._lock:
            got = self._sets.get(path)
        return got[1] if got is not None and got[0] == sig else None

    def put(self, path: str, sig: tuple[int, int, int, int],
            got: tuple[str, dict[bytes, list[Any]]]) -> None:
        with self._lock:
            self._sets.pop(path, None)
            if len(self._sets) >= self._size:
                self._sets.pop(next(iter(self._sets)))  # the oldest
            self._sets[path] = (sig, got)


def _entry_matches(e: object, st: os.stat_result) -> bool:
    """Whether a file's cache entry has its stat signature (and is well formed)."""
    return (isinstance(e, list) and len(e) == 6 and e[0] == st.st_size
            and e[1] == st.st_mtime_ns and e[2] == st.st_ctime_ns and e[3] == st.st_ino
            and isinstance(e[4], bytes) and len(e[4]) == 32 and isinstance(e[5], int))


#: A record's file entries, packed (:func:`_encode_files`): this first byte (no CBOR
#: map starts with it), then per file ``_ENTRY`` and the name.
_PACKED = b"\x01"
#: size, mtime_ns, ctime_ns, inode, recorded_ns, sha256, length of the name.
_ENTRY = struct.Struct("<qqqqq32sH")


def _encode_files(files: dict[bytes, list[Any]]) -> bytes:
    """A directory's file entries ``{name: [size, mtime, ctime, inode, sha256,
    recorded]}`` as a record holds them: packed, which encodes and decodes several
    times faster than CBOR (one directory per changed directory of every snapshot
    and restore)."""
    pack = _ENTRY.pack
    try:
        return _PACKED + b"".join([pack(e[0], e[1], e[2], e[3], e[5], e[4], len(name)) + name
                                   for name, e in files.items()])
    except (struct.error, TypeError, IndexError):  # an entry carried from a damaged set
        return _PACKED + b"".join([pack(e[0], e[1], e[2], e[3], e[5], e[4], len(name)) + name
                                   for name, e in files.items() if _well_formed(e)])


def _well_formed(e: object) -> bool:
    return (isinstance(e, list) and len(e) == 6 and all(type(v) is int for v in e[:4])
            and type(e[5]) is int and isinstance(e[4], bytes) and len(e[4]) == 32
            and all(-1 << 63 <= v < 1 << 63 for v in (*e[:4], e[5])))


def _decode_files(rec: list[Any] | None) -> dict[bytes, list[Any]]:
    """A directory record's file entries ({} for none, or a damaged one): packed, or
    a CBOR map (as sets written before the packed form hold them)."""
    if rec is None:
        return {}
    blob = rec[7]
    if blob[:1] != _PACKED:
        with contextlib.suppress(CodecError):
            obj = loads(blob)
            if isinstance(obj, dict):
                return obj
        return {}
    out: dict[bytes, list[Any]] = {}
    unpack, fixed, end, off = _ENTRY.unpack_from, _ENTRY.size, len(blob), 1
    try:
        while off < end:  # (once per file of a changed directory)
            size, mtime, ctime, ino, recorded, sha, n = unpack(blob, off)
            off += fixed
            out[blob[off:off + n]] = [size, mtime, ctime, ino, sha, recorded]
            off += n
    except struct.error:
        return {}
    return out if off == end else {}


def _valid_record(rel: object, rec: object) -> bool:
    # (once per directory of a walk: plain type checks, no generator)
    if not (type(rel) is bytes and type(rec) is list and len(rec) == 8):
        return False
    digest, recorded, newest, sha, size, files, nbytes, blob = rec
    return (type(digest) is bytes and type(recorded) is int and type(newest) is int
            and type(sha) is bytes and len(sha) == 32 and type(size) is int
            and type(files) is int and type(nbytes) is int and size >= 0 and files >= 0
            and nbytes >= 0 and type(blob) is bytes)
