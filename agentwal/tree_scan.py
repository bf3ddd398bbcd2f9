"""One directory's listing for the tree walks: its entries, the lstat of each, and the
stat cache's signatures of them; from the C extension ``agentwal._treewalk`` when it
was built, else from the Python here. Both give the same :class:`Listing`.

Theory of operation: a snapshot, a status and a restore each look at every
directory of a tree, and almost all of them are as the stat cache
(``tree_cache.py``) recorded them: for those, all a walk needs is the
directory's digest (to compare with the record) and its subdirectories (to go
on). :func:`scan` gives exactly that per directory in one call: the entries'
signatures already sorted and joined (:attr:`Listing.sigs`, so the digest is
one SHA-256), the subdirectories, and, for the few directories that did
change, every entry's lstat packed (:func:`stat_at` unpacks one). In C it is
one call with the GIL released and no Python object per entry beyond its
name; the Python version (:func:`py_scan`) makes the calls the walks made
before the extension and is the fallback when the extension is missing (no
compiler at install time, or ``AGENTWAL_NO_EXT=1``). The tests run the walks
over both and check that the two give identical listings.

What a listing holds, and what the C code must match byte for byte:

- an entry that vanishes between the listing and its lstat (or readlink) is
  left out; names in ``skip`` are left out before any lstat;
- a directory's stat record holds only ``S_IFDIR`` (no lstat is made for a
  directory the listing names as one, as ``os.DirEntry.is_dir`` does);
- an entry whose lstat (or a link whose readlink) fails otherwise is in
  :attr:`Listing.errors` only, with its errno; the caller maps it to its own
  error (a snapshot's ``TreeSourceError``, a restore's ``RestoreError``);
- a failure to open or list the directory raises :class:`OSError`.

A directory given as a descriptor is read through a duplicate of it (its
offset is restored, it is not closed); one given as a path is opened without
``O_NOFOLLOW``, as ``os.scandir`` opens it (the restore, which must never
follow a link, opens each directory itself and passes the descriptor).

It must not decide what is stored, skipped or written, nor read the files' content.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import stat
import struct
from types import ModuleType
from typing import NamedTuple

#: An entry's stat record: size, mtime_ns, ctime_ns, inode, mode (for every inode
#: below 2**63 the same bytes as ``tree_cache._FILE_SIG``, which a file's signature
#: ends with).
RECORD = struct.Struct("<qqqQq")
_DIR_RECORD = RECORD.pack(0, 0, 0, 0, stat.S_IFDIR)


class Listing(NamedTuple):
    """One directory as :func:`scan` saw it, every list sorted by name.

    Attributes:
        sigs: the signatures of its files, links and subdirectories (``tree_cache``),
            joined: its digest is ``tree_cache._digest([sigs])``.
        newest: the newest mtime (ns) among its regular files, 0 if none.
        names: every entry (files, links, directories and others: sockets, FIFOs,
            devices).
        stats: per name a :data:`RECORD` (:func:`stat_at`).
        targets: the links' targets, by name.
        dirs: the subdirectories' names.
        errors: ``(name, errno, reading the link)`` of the entries that could not be
            looked at (in none of the other fields).
    """

    sigs: bytes
    newest: int
    names: list[bytes]
    stats: bytes
    targets: dict[bytes, bytes]
    dirs: list[bytes]
    errors: list[tuple[bytes, int, bool]]


def _load_extension() -> tuple[ModuleType | None, str]:
    """The C module and, if it is not used, why."""
    if os.environ.get("AGENTWAL_NO_EXT"):
        return None, "AGENTWAL_NO_EXT is set"
    try:
        from . import _treewalk
    except ImportError as exc:
        return None, f"not built ({exc})"
    return _treewalk, ""


_EXT, WHY_NOT = _load_extension()
#: Whether the C extension was built (and not turned off by ``AGENTWAL_NO_EXT=1``).
HAVE_EXTENSION = _EXT is not None


def use(implementation: str) -> None:
    """Make :func:`scan` the C one (``"c"``) or the Python one (``"python"``); for tests
    and benchmarks.

    Raises:
        RuntimeError: ``"c"`` when the extension was not built.
        ValueError: any other name.
    """
    global _scan
    if implementation == "python":
        _scan = py_scan
    elif implementation == "c":
        if _EXT is None:
            raise RuntimeError(f"the C walk is not available: {WHY_NOT}")
        _scan = c_scan
    else:
        raise ValueError(f"no walk implementation {implementation!r} (c or python)")


def implementation() -> str:
    """``"c"`` or ``"python"``: what :func:`scan` runs."""
    return "c" if _scan is c_scan else "python"


def scan(where: int | bytes, skip: tuple[bytes, ...] = ()) -> Listing:
    """The listing of directory ``where`` (an open descriptor, or a path), without the
    names in ``skip``.

    Raises:
        OSError: the directory cannot be opened or listed.
    """
    return _scan(where, skip)


def c_scan(where: int | bytes, skip: tuple[bytes, ...] = ()) -> Listing:
    """:func:`scan` in C."""
    assert _EXT is not None
    return Listing(*_EXT.scan(where, skip))


def py_scan(where: int | bytes, skip: tuple[bytes, ...] = ()) -> Listing:
    """:func:`scan` in Python."""
    found: list[tuple[bytes, bytes, bytes, bytes]] = []  # name, kind, record, link target
    errors: list[tuple[bytes, int, bool]] = []
    fd = where if isinstance(where, int) else None
    pack, is_reg, is_dir, is_link = RECORD.pack, stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK
    with os.scandir(where) as it:
        for d in it:
            name = os.fsencode(d.name)
            if name in skip:
                continue
            try:
                listed_dir = d.is_dir(follow_symlinks=False)
            except OSError:
                listed_dir = False  # its lstat failed: d.stat raises it again below
            if listed_dir:
                found.append((name, b"d", _DIR_RECORD, b""))
                continue
            try:
                st = d.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                errors.append((name, exc.errno or 0, False))
                continue
            mode = st.st_mode
            record = pack(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, mode)
            if is_reg(mode):
                found.append((name, b"f", record, b""))
            elif is_dir(mode):
                found.append((name, b"d", _DIR_RECORD, b""))
            elif is_link(mode):
                try:
                    target = os.readlink(name if fd is not None else os.fsencode(d.path),
                                         dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    errors.append((name, exc.errno or 0, True))
                    continue
                found.append((name, b"l", record, target))
            else:
                found.append((name, b"o", record, b""))
    found.sort()
    sigs: list[bytes] = []
    for name, kind, record, target in found:
        if kind == b"f":
            sigs.append(name + b"\0f" + record)
        elif kind == b"d":
            sigs.append(name + b"\0d")
        elif kind == b"l":
            sigs.append(name + b"\0l" + target + b"\0")
    newest = max((RECORD.unpack(r)[1] for _n, k, r, _t in found if k == b"f"), default=0)
    return Listing(b"".join(sigs), newest, [f[0] for f in found],
                   b"".join([f[2] for f in found]),
                   {name: t for name, k, _r, t in found if k == b"l"},
                   [name for name, k, _r, _t in found if k == b"d"], sorted(errors))


def without(listing: Listing, drop: set[bytes]) -> Listing:
    """The listing with the entries named in ``drop`` left out (excluded ones)."""
    size = RECORD.size
    names: list[bytes] = []
    records: list[bytes] = []
    sigs: list[bytes] = []
    dirs: list[bytes] = []
    newest = 0
    for i, name in enumerate(listing.names):
        if name in drop:
            continue
        record = listing.stats[i * size:(i + 1) * size]
        names.append(name)
        records.append(record)
        _size, mtime, _ctime, _ino, mode = RECORD.unpack(record)
        if stat.S_ISREG(mode):
            sigs.append(name + b"\0f" + record)
            newest = max(newest, mtime)
        elif stat.S_ISDIR(mode):
            sigs.append(name + b"\0d")
            dirs.append(name)
        elif stat.S_ISLNK(mode):
            sigs.append(name + b"\0l" + listing.targets[name] + b"\0")
    return Listing(b"".join(sigs), newest, names, b"".join(records),
                   {n: t for n, t in listing.targets.items() if n not in drop}, dirs,
                   [e for e in listing.errors if e[0] not in drop])


#: Directories deeper than this below the top are left to the per-directory walk
#: (the whole-tree pass holds a descriptor per level).
MAX_DEPTH = 64
_SUBDIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def walk(top: bytes, skip: tuple[bytes, ...], trusted: dict[bytes, bytes],
         store: bytes | None, stop: bytes | None) -> tuple[set[bytes], dict[bytes, Listing]]:
    """The whole-tree pass of a snapshot or status: every directory below ``top``
    listed as :func:`scan` lists it (subdirectories opened with ``O_NOFOLLOW``).

    Args:
        top: the tree's top directory.
        skip: names left out everywhere (``scan``'s).
        trusted: ``{relpath: digest}`` of the stat cache's trusted records
            (relpaths as ``tree_cache._key`` gives them, ``b""`` for the top).
        store: the store directory's relpath if it is inside the tree (left out).
        stop: a file name (``b".gitignore"``) below which the walk is left to the
            caller, whose exclude rules it changes: a directory holding one is
            listed, not gone into.

    Returns:
        ``(clean, listings)``: the relpaths of the directories whose digest is their
        trusted record's, every directory below them clean too (nothing else is
        known of them: their records stand for them); and the listing of every other
        directory looked into, by relpath. A directory that could not be opened or
        listed is in neither (the caller lists it again, and reports); nor is
        anything below a ``stop``, or :data:`MAX_DEPTH` levels down.
    """
    if _scan is c_scan:
        assert _EXT is not None
        clean, raw = _EXT.walk(top, skip, trusted, store, stop)
        return clean, {rel: Listing(*t) for rel, t in raw.items()}
    return py_walk(top, skip, trusted, store, stop)


def py_walk(top: bytes, skip: tuple[bytes, ...], trusted: dict[bytes, bytes],
            store: bytes | None, stop: bytes | None) -> tuple[set[bytes], dict[bytes, Listing]]:
    """:func:`walk` in Python."""
    clean: set[bytes] = set()
    listings: dict[bytes, Listing] = {}
    store_in, _slash, store_name = (None, b"", b"") if store is None else store.rpartition(b"/")

    def directory(fd: int, rel: bytes, depth: int) -> bool:
        try:
            ls = py_scan(fd, skip)
        except OSError:
            return False
        if store is not None and store_in == rel and store_name in ls.dirs:
            ls = without(ls, {store_name})
        at = None if stop is None else find(ls, stop)
        deep = depth >= MAX_DEPTH or (at is not None and stat.S_ISREG(stat_at(ls, at).st_mode))
        ok = not deep and not ls.errors and trusted.get(rel) == hashlib.sha256(
            ls.sigs).digest()[:16]
        for name in [] if deep else ls.dirs:
            try:
                sub = os.open(name, _SUBDIR_FLAGS, dir_fd=fd)
            except OSError:
                ok = False
                continue
            try:
                ok &= directory(sub, rel + b"/" + name if rel else name, depth + 1)
            finally:
                os.close(sub)
        if ok:
            clean.add(rel)
        else:
            listings[rel] = ls
        return ok

    try:
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return clean, listings
    try:
        directory(fd, b"", 0)
    finally:
        os.close(fd)
    return clean, listings


def find(listing: Listing, name: bytes) -> int | None:
    """The index of ``name`` among the listing's names, or None."""
    i = bisect.bisect_left(listing.names, name)
    return i if i < len(listing.names) and listing.names[i] == name else None


def stat_at(listing: Listing, i: int) -> os.stat_result:
    """The lstat of entry ``i`` as far as the listing has it: size, mtime, ctime, inode
    and mode (the rest zero; a directory's only its type)."""
    size, mtime, ctime, ino, mode = RECORD.unpack_from(listing.stats, i * RECORD.size)
    return os.stat_result((mode, ino, 0, 0, 0, 0, size, 0, mtime // 1_000_000_000,
                           ctime // 1_000_000_000, 0.0, mtime / 1e9, ctime / 1e9, 0, mtime,
                           ctime))


_scan = c_scan if HAVE_EXTENSION else py_scan
