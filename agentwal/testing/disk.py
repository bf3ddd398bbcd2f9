"""A simulated disk: the FileSystem seam in memory, with power cuts and faults.

Theory of operation: every file and directory is a node with two images.
The *volatile* image is what reads see (the page cache); the *durable*
image is what a power cut keeps (the medium). A mutating call changes the
volatile image at once and appends an operation, stamped with a global
sequence number, to its node's *pending* log:

- ``fsync(fd)`` replays the file's pending data operations (writes,
  truncates) onto its durable data and clears them; its name is not made
  durable;
- ``fsync_dir(path)`` replays the directory's pending name operations
  (link, unlink, rename) onto its durable entries, as on Linux, so a
  directory made by ``mkdir`` is durable only after ``fsync_dir`` of its
  parent; a rename across directories is a link in the target and an
  unlink in the source, each durable with its own directory;
- a failed fsync (an injected ``EIO``) clears the pending log without
  replaying it: that data can never become durable, yet reads return it.

``crash_image(model, seed=...)`` builds a new disk from the durable images
plus a seeded choice of the pending operations, replayed in order:
``"strict"`` none; ``"prefix"`` the first k, the last write possibly torn at
a 512-byte sector boundary; ``"reorder"`` any subset, each write whole or
torn sector by sector, one torn sector possibly zeros or garbage. Only
names reachable from ``/`` through the resulting entries survive.

Paths go through ``os.path.abspath``. The disk starts with ``/`` alone.
When ``mkdir`` creates missing ancestors, those whose parent is *given*
(``/`` is) are given too: they exist and are durable at once, like the
machine's ``/tmp`` before the test began. The leaf, and anything below a
directory the disk made, follow the rules above.

Every call that can change the disk (``open`` with ``create``, ``pwrite``,
``append``, ``truncate``, ``fsync``, ``fsync_dir``, ``mkdir``, ``rename``,
``unlink``) gets an operation index from 0; ``crash_at(k)`` and the
``on_op`` hook cut the power right before operation k. ``open_read`` (no
operation index) gives a handle that refuses writes and truncates. After a crash every
protocol call raises :class:`SimulatedCrash`, except ``close``, which does
nothing so that a harness can drop a dead store's handles; inspection,
``flip`` and ``crash_image`` keep working. The disk never touches real
files and is thread-safe (one lock).
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn, TypeAlias

__all__ = ["SECTOR", "FaultPlan", "FileState", "SimulatedCrash", "SimulatedDisk"]

#: The unit a write can be torn at.
SECTOR = 512
_MODELS = ("strict", "prefix", "reorder")


class SimulatedCrash(BaseException):
    """The simulated machine lost power; a BaseException so engine code cannot swallow it."""


@dataclass
class FaultPlan:
    """Faults a :class:`SimulatedDisk` injects; every index counts from 0.

    Attributes:
        write_errors: write index (``pwrite`` and ``append`` calls) to the
            errno that write fails with, nothing written (e.g. ``ENOSPC``, ``EIO``).
        fsync_errors: ``fsync`` call indexes that fail with ``EIO`` and drop
            the file's unsynced data from what can become durable.
        budget: bytes the live files may occupy (their sizes summed; no sparse
            files). A write that would grow past it writes what fits and
            returns short, or fails with ``ENOSPC`` when nothing fits.
            Overwriting existing bytes costs nothing; ``truncate`` never fails.
        crash_at: operation index that cuts the power instead of running.

    Example::

        disk = SimulatedDisk(FaultPlan(write_errors={3: errno.ENOSPC}))
    """

    write_errors: dict[int, int] = field(default_factory=dict)
    fsync_errors: set[int] = field(default_factory=set)
    budget: int | None = None
    crash_at: int | None = None


@dataclass(frozen=True, slots=True)
class FileState:
    """One file name as the disk holds it now.

    Attributes:
        path: the absolute path.
        volatile: what reads return now; None when the name does not exist now.
        durable: what a ``"strict"`` power cut keeps under this name; None when
            the name would be lost.
    """

    path: str
    volatile: bytes | None
    durable: bytes | None


# -- nodes and pending operations -------------------------------------------------------


class _File:
    __slots__ = ("data", "durable", "nlink", "opens", "pending")

    def __init__(self, data: bytes | bytearray = b"") -> None:
        self.data = bytearray(data)
        self.durable = bytearray(data)
        self.pending: list[_DataOp] = []
        self.nlink = 0
        self.opens = 0


class _Dir:
    __slots__ = ("durable", "entries", "given", "pending")

    def __init__(self, given: bool) -> None:
        self.entries: dict[str, _Node] = {}
        self.durable: dict[str, _Node] = {}
        self.pending: list[_NameOp] = []
        self.given = given


_Node: TypeAlias = _File | _Dir


@dataclass(frozen=True, slots=True)
class _Write:
    seq: int
    node: _File
    offset: int
    data: bytes

    def apply(self, buf: bytearray) -> None:
        _write_into(buf, self.offset, self.data)


@dataclass(frozen=True, slots=True)
class _Trunc:
    seq: int
    node: _File
    size: int

    def apply(self, buf: bytearray) -> None:
        _resize(buf, self.size)


@dataclass(frozen=True, slots=True)
class _Link:
    seq: int
    node: _Dir
    name: str
    child: _Node

    def apply(self, entries: dict[str, _Node]) -> None:
        entries[self.name] = self.child


@dataclass(frozen=True, slots=True)
class _Unlink:
    seq: int
    node: _Dir
    name: str

    def apply(self, entries: dict[str, _Node]) -> None:
        entries.pop(self.name, None)


@dataclass(frozen=True, slots=True)
class _Rename:
    seq: int
    node: _Dir
    src: str
    dst: str
    child: _Node

    def apply(self, entries: dict[str, _Node]) -> None:
        if entries.get(self.src) is self.child:
            del entries[self.src]
        entries[self.dst] = self.child


_DataOp: TypeAlias = _Write | _Trunc
_NameOp: TypeAlias = _Link | _Unlink | _Rename
_Op: TypeAlias = _Write | _Trunc | _Link | _Unlink | _Rename


def _write_into(buf: bytearray, offset: int, data: bytes) -> None:
    if len(buf) < offset:
        buf.extend(bytes(offset - len(buf)))
    buf[offset : offset + len(data)] = data


def _resize(buf: bytearray, size: int) -> None:
    if size < len(buf):
        del buf[size:]
    else:
        buf.extend(bytes(size - len(buf)))


def _oserror(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


def _parts(path: str) -> list[str]:
    return [p for p in os.path.abspath(path).split("/") if p]


# -- choosing what a power cut keeps -------------------------------------------------------


def _sectors(op: _Write) -> list[_Write]:
    """``op`` cut at absolute 512-byte boundaries."""
    out: list[_Write] = []
    pos, end = op.offset, op.offset + len(op.data)
    while pos < end:
        stop = min(end, (pos // SECTOR + 1) * SECTOR)
        out.append(_Write(op.seq, op.node, pos, op.data[pos - op.offset : stop - op.offset]))
        pos = stop
    return out


def _choose_prefix(ops: list[_Op], rng: random.Random) -> list[_Op]:
    k = rng.randint(0, len(ops))
    chosen = ops[:k]
    if chosen and isinstance(chosen[-1], _Write) and rng.random() < 0.5:
        pieces = _sectors(chosen[-1])
        if len(pieces) > 1:
            chosen[-1:] = pieces[: rng.randint(1, len(pieces) - 1)]
    return chosen


def _tear(op: _Write, rng: random.Random) -> list[_Write]:
    pieces = _sectors(op)
    kept = [p for p in pieces if rng.random() < 0.5]
    if rng.random() < 0.5:
        p = pieces[rng.randrange(len(pieces))]
        junk = bytes(len(p.data)) if rng.random() < 0.5 else rng.randbytes(len(p.data))
        kept = [q for q in kept if q.offset != p.offset]
        kept.append(_Write(p.seq, p.node, p.offset, junk))
    return kept


def _choose_reorder(ops: list[_Op], rng: random.Random) -> list[_Op]:
    chosen: list[_Op] = []
    for op in ops:
        if rng.random() < 0.5:
            continue
        if isinstance(op, _Write) and rng.random() < 0.5:
            chosen.extend(_tear(op, rng))
        else:
            chosen.append(op)
    return chosen


# -- the disk ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Handle:
    node: _File
    path: str
    readonly: bool = False


class SimulatedDisk:
    """An in-memory FileSystem with a volatile and a durable image (see the module doc).

    Args:
        faults: the faults to inject (default: none); also settable later as
            ``disk.faults`` or with :meth:`crash_at`, :meth:`fail_write`,
            :meth:`fail_fsync`.
        on_op: called as ``on_op(index, name, path)`` before each mutating
            operation; it may call :meth:`crash` to cut the power there.

    Example::

        disk = SimulatedDisk()
        store = agentwal.open(path, fs=disk)
        ...
        crash(store)
        store = agentwal.open(path, fs=disk.crash_image("reorder", seed=7))
    """

    def __init__(self, faults: FaultPlan | None = None, *,
                 on_op: Callable[[int, str, str], None] | None = None) -> None:
        self.faults = faults if faults is not None else FaultPlan()
        self.on_op = on_op
        self._lock = threading.RLock()
        self._root = _Dir(given=True)
        self._nodes: list[_Node] = [self._root]
        self._fds: dict[int, _Handle] = {}
        self._next_fd = 3
        self._seq = 0
        self._ops = 0
        self._writes = 0
        self._fsyncs = 0
        self._down = False

    # -- FileSystem: files ----------------------------------------------------------------

    def open(self, path: str, create: bool = True) -> int:
        """Open ``path`` for reading and writing, creating it when ``create``.

        Raises:
            OSError: ENOENT (missing file or parent), EISDIR, ENOTDIR.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            if create:
                self._begin("open", path)
            else:
                self._check_up()
            node = self._lookup(path)
            if node is None:
                if not create:
                    raise _oserror(errno.ENOENT, path)
                node = self._create_file(path)
            if isinstance(node, _Dir):
                raise _oserror(errno.EISDIR, path)
            node.opens += 1
            fd, self._next_fd = self._next_fd, self._next_fd + 1
            self._fds[fd] = _Handle(node, os.path.abspath(path))
            return fd

    def close(self, fd: int) -> None:
        """Close a handle; does nothing once the power is off.

        Raises:
            OSError: EBADF.
        """
        with self._lock:
            if self._down:
                return
            handle = self._fds.pop(fd, None)
            if handle is None:
                raise _oserror(errno.EBADF, str(fd))
            handle.node.opens -= 1

    def pwrite(self, fd: int, offset: int, data: bytes) -> int:
        """Write ``data`` at ``offset``; returns the bytes written (short when the budget ends).

        Raises:
            OSError: EBADF, EINVAL, ENOSPC, or the errno of an injected fault.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            handle = self._writable(fd)
            self._begin("pwrite", handle.path)
            return self._write(handle, offset, data)

    def append(self, fd: int, data: bytes) -> int:
        """Write ``data`` at the end of the file; returns the bytes written.

        Raises:
            OSError: as :meth:`pwrite`.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            handle = self._writable(fd)
            self._begin("append", handle.path)
            return self._write(handle, len(handle.node.data), data)

    def read(self, fd: int, offset: int = 0, n: int | None = None) -> bytes:
        """Up to ``n`` bytes from ``offset`` (to the end when ``n`` is None), as reads see them.

        Raises:
            OSError: EBADF, EINVAL.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            data = self._handle(fd).node.data
            if offset < 0 or (n is not None and n < 0):
                raise _oserror(errno.EINVAL, str(fd))
            end = len(data) if n is None else offset + n
            return bytes(data[offset:end])

    def size(self, fd: int) -> int:
        """The file's size as reads see it.

        Raises:
            OSError: EBADF.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            return len(self._handle(fd).node.data)

    def truncate(self, fd: int, size: int) -> None:
        """Cut or zero-extend the file to ``size`` bytes.

        Raises:
            OSError: EBADF, EINVAL.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            handle = self._writable(fd, errno.EINVAL)
            self._begin("truncate", handle.path)
            if size < 0:
                raise _oserror(errno.EINVAL, handle.path)
            _resize(handle.node.data, size)
            handle.node.pending.append(_Trunc(self._stamp(), handle.node, size))

    def fsync(self, fd: int) -> None:
        """Make the file's data durable (not its name).

        Raises:
            OSError: EBADF; EIO when injected, after which the unsynced data
                can never become durable.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            handle = self._handle(fd)
            self._begin("fsync", handle.path)
            index, self._fsyncs = self._fsyncs, self._fsyncs + 1
            node = handle.node
            ops, node.pending = node.pending, []
            if index in self.faults.fsync_errors:
                raise _oserror(errno.EIO, handle.path)
            for op in ops:
                op.apply(node.durable)

    # -- FileSystem: names ----------------------------------------------------------------

    def exists(self, path: str) -> bool:
        """Whether ``path`` names a file or directory now.

        Raises:
            SimulatedCrash: the power is off.
        """
        with self._lock:
            self._check_up()
            return self._lookup(path) is not None

    def listdir(self, path: str) -> list[str]:
        """The names in directory ``path``, sorted.

        Raises:
            OSError: ENOENT, ENOTDIR.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            self._check_up()
            return sorted(self._dir(path).entries)

    def mkdir(self, path: str) -> None:
        """Create directory ``path`` and missing ancestors; nothing when it exists.

        Raises:
            OSError: EEXIST (a file is in the way), ENOTDIR.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            self._begin("mkdir", path)
            parent, parts = self._root, _parts(path)
            for i, name in enumerate(parts):
                node = parent.entries.get(name)
                if node is None:
                    node = self._new_dir(parent, name, given=parent.given and i < len(parts) - 1)
                elif isinstance(node, _File):
                    code = errno.EEXIST if i == len(parts) - 1 else errno.ENOTDIR
                    raise _oserror(code, path)
                parent = node

    def rename(self, src: str, dst: str) -> None:
        """Atomically give ``src``'s node the name ``dst``, replacing what was there.

        Raises:
            OSError: ENOENT, EISDIR, ENOTDIR, ENOTEMPTY, EINVAL.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            self._begin("rename", src)
            sdir, sname = self._parent(src)
            ddir, dname = self._parent(dst)
            node = sdir.entries.get(sname)
            if node is None:
                raise _oserror(errno.ENOENT, src)
            old = ddir.entries.get(dname)
            if old is node:
                return
            self._check_rename(node, old, src, dst)
            if isinstance(old, _File):
                old.nlink -= 1
            ddir.entries[dname] = node
            del sdir.entries[sname]
            if sdir is ddir:
                sdir.pending.append(_Rename(self._stamp(), sdir, sname, dname, node))
            else:
                ddir.pending.append(_Link(self._stamp(), ddir, dname, node))
                sdir.pending.append(_Unlink(self._stamp(), sdir, sname))

    def unlink(self, path: str) -> None:
        """Remove the file name ``path`` (open handles keep working).

        Raises:
            OSError: ENOENT, EISDIR.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            self._begin("unlink", path)
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                raise _oserror(errno.ENOENT, path)
            if isinstance(node, _Dir):
                raise _oserror(errno.EISDIR, path)
            node.nlink -= 1
            del parent.entries[name]
            parent.pending.append(_Unlink(self._stamp(), parent, name))

    def fsync_dir(self, path: str) -> None:
        """Make the names in directory ``path`` durable (creations, renames, unlinks).

        Raises:
            OSError: ENOENT, ENOTDIR.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            self._begin("fsync_dir", path)
            node = self._dir(path)
            ops, node.pending = node.pending, []
            for op in ops:
                op.apply(node.durable)

    def open_read(self, path: str) -> int:
        """Open the existing file ``path`` read-only: writes and truncates on it fail.

        Raises:
            OSError: ENOENT, EISDIR.
            SimulatedCrash: the power is off.
        """
        with self._lock:
            self._check_up()
            node = self._lookup(path)
            if node is None:
                raise _oserror(errno.ENOENT, path)
            if isinstance(node, _Dir):
                raise _oserror(errno.EISDIR, path)
            node.opens += 1
            fd, self._next_fd = self._next_fd, self._next_fd + 1
            self._fds[fd] = _Handle(node, os.path.abspath(path), readonly=True)
            return fd

    # -- faults ---------------------------------------------------------------------------

    def crash(self) -> NoReturn:
        """Cut the power: raise :class:`SimulatedCrash` now and on every later call."""
        with self._lock:
            self._down = True
        raise SimulatedCrash("simulated power cut")

    def crash_at(self, index: int) -> None:
        """Cut the power right before the mutating operation with this index (from 0)."""
        self.faults.crash_at = index

    def fail_write(self, index: int, code: int = errno.EIO) -> None:
        """Fail the write (``pwrite``/``append``) with this index with errno ``code``."""
        self.faults.write_errors[index] = code

    def fail_fsync(self, index: int) -> None:
        """Fail the ``fsync`` with this index with EIO, dropping that file's unsynced data."""
        self.faults.fsync_errors.add(index)

    def flip(self, path: str, offset: int, bit: int) -> None:
        """Flip one bit of the durable data of ``path`` (a name in the durable image).

        Reads see the flip too when the file's data has nothing unsynced
        (its cached copy equals the durable one), as after a reboot.

        Raises:
            OSError: ENOENT (no such durable file), EINVAL (offset or bit out of range).
        """
        with self._lock:
            node = self._durable_files().get(os.path.abspath(path))
            if node is None:
                raise _oserror(errno.ENOENT, path)
            if not (0 <= offset < len(node.durable) and 0 <= bit < 8):
                raise _oserror(errno.EINVAL, path)
            clean = not node.pending and node.data == node.durable
            node.durable[offset] ^= 1 << bit
            if clean:
                node.data[offset] ^= 1 << bit

    def flip_random(self, count: int, *, seed: int = 0) -> list[tuple[str, int, int]]:
        """Flip ``count`` random bits of durable file data; returns ``(path, offset, bit)`` each.

        Deterministic given ``seed``; a file's chance is proportional to its size.
        """
        with self._lock:
            files = sorted((p, len(n.durable)) for p, n in self._durable_files().items())
            total = sum(size for _, size in files)
            rng = random.Random(seed)
            done: list[tuple[str, int, int]] = []
            for _ in range(count if total else 0):
                pos, bit = rng.randrange(total), rng.randrange(8)
                for p, size in files:
                    if pos < size:
                        self.flip(p, pos, bit)
                        done.append((p, pos, bit))
                        break
                    pos -= size
            return done

    # -- power cuts -----------------------------------------------------------------------

    def crash_image(self, model: str = "strict", *, seed: int = 0) -> SimulatedDisk:
        """A new disk holding what a power cut now would leave (this disk is unchanged).

        Args:
            model: ``"strict"`` (synced data under synced names only),
                ``"prefix"`` (plus an ordered prefix of the unsynced operations,
                the last write possibly torn) or ``"reorder"`` (plus any subset,
                writes torn per sector, torn sectors possibly zeros or garbage).
            seed: makes the choice; the same disk state and seed give the same image.

        Returns:
            A fresh disk whose volatile and durable images are both that state,
            with no faults planned and its counters at 0.

        Raises:
            ValueError: an unknown model.
        """
        if model not in _MODELS:
            raise ValueError(f"unknown crash model {model!r}; use one of {', '.join(_MODELS)}")
        with self._lock:
            ops = sorted(self._pending_ops(), key=lambda op: op.seq)
            rng = random.Random(seed)
            chosen: list[_Op] = []
            if model == "prefix":
                chosen = _choose_prefix(ops, rng)
            elif model == "reorder":
                chosen = _choose_reorder(ops, rng)
            files: dict[_File, bytearray] = {}  # copies of the nodes the chosen ops change
            dirs: dict[_Dir, dict[str, _Node]] = {}
            for op in chosen:
                if isinstance(op, (_Write, _Trunc)):
                    if op.node not in files:
                        files[op.node] = bytearray(op.node.durable)
                    op.apply(files[op.node])
                else:
                    if op.node not in dirs:
                        dirs[op.node] = dict(op.node.durable)
                    op.apply(dirs[op.node])
            return _build(self._root, files, dirs)

    # -- inspection -----------------------------------------------------------------------

    @property
    def crashed(self) -> bool:
        """Whether the power is off."""
        return self._down

    @property
    def op_count(self) -> int:
        """Mutating operations so far (the next one gets this index)."""
        return self._ops

    @property
    def write_count(self) -> int:
        """``pwrite`` and ``append`` calls so far."""
        return self._writes

    @property
    def fsync_count(self) -> int:
        """``fsync`` calls so far."""
        return self._fsyncs

    @property
    def unsynced_count(self) -> int:
        """Operations not yet durable (nor dropped by a failed fsync)."""
        with self._lock:
            return sum(1 for _ in self._pending_ops())

    def files(self) -> list[str]:
        """Paths of the files that exist now, sorted."""
        with self._lock:
            return sorted(self._volatile_files())

    def inspect(self) -> dict[str, FileState]:
        """Every file name, now or in the durable image, with both contents; sorted by path.

        Example::

            state = disk.inspect()["/s/CONTROL"]
            assert state.durable == state.volatile
        """
        with self._lock:
            now, kept = self._volatile_files(), self._durable_files()
            return {p: FileState(p, bytes(now[p].data) if p in now else None,
                                 bytes(kept[p].durable) if p in kept else None)
                    for p in sorted(now.keys() | kept.keys())}

    # -- helpers --------------------------------------------------------------------------

    def _check_up(self) -> None:
        if self._down:
            raise SimulatedCrash("the simulated machine is down")

    def _begin(self, name: str, path: str) -> None:
        """Count a mutating operation; cut the power if planned or if the hook says so."""
        self._check_up()
        index, self._ops = self._ops, self._ops + 1
        if self.faults.crash_at == index:
            self.crash()
        if self.on_op is not None:
            self.on_op(index, name, path)

    def _stamp(self) -> int:
        self._seq += 1
        return self._seq

    def _handle(self, fd: int) -> _Handle:
        self._check_up()
        handle = self._fds.get(fd)
        if handle is None:
            raise _oserror(errno.EBADF, str(fd))
        return handle

    def _writable(self, fd: int, code: int = errno.EBADF) -> _Handle:
        handle = self._handle(fd)
        if handle.readonly:  # as the OS: EBADF to write a read-only fd, EINVAL to truncate it
            raise _oserror(code, handle.path)
        return handle

    def _lookup(self, path: str) -> _Node | None:
        node: _Node = self._root
        for name in _parts(path):
            if not isinstance(node, _Dir) or name not in node.entries:
                return None
            node = node.entries[name]
        return node

    def _dir(self, path: str) -> _Dir:
        node = self._lookup(path)
        if node is None:
            raise _oserror(errno.ENOENT, path)
        if not isinstance(node, _Dir):
            raise _oserror(errno.ENOTDIR, path)
        return node

    def _parent(self, path: str) -> tuple[_Dir, str]:
        parts = _parts(path)
        if not parts:
            raise _oserror(errno.EBUSY, path)
        return self._dir("/" + "/".join(parts[:-1])), parts[-1]

    def _create_file(self, path: str) -> _File:
        parent, name = self._parent(path)
        node = _File()
        node.nlink = 1
        self._nodes.append(node)
        parent.entries[name] = node
        parent.pending.append(_Link(self._stamp(), parent, name, node))
        return node

    def _new_dir(self, parent: _Dir, name: str, *, given: bool) -> _Dir:
        node = _Dir(given)
        self._nodes.append(node)
        parent.entries[name] = node
        if given:
            parent.durable[name] = node
        else:
            parent.pending.append(_Link(self._stamp(), parent, name, node))
        return node

    def _check_rename(self, node: _Node, old: _Node | None, src: str, dst: str) -> None:
        if isinstance(node, _File):
            if isinstance(old, _Dir):
                raise _oserror(errno.EISDIR, dst)
            return
        if isinstance(old, _File):
            raise _oserror(errno.ENOTDIR, dst)
        if isinstance(old, _Dir) and old.entries:
            raise _oserror(errno.ENOTEMPTY, dst)
        if (os.path.abspath(dst) + "/").startswith(os.path.abspath(src) + "/"):
            raise _oserror(errno.EINVAL, dst)

    def _write(self, handle: _Handle, offset: int, data: bytes) -> int:
        index, self._writes = self._writes, self._writes + 1
        code = self.faults.write_errors.get(index)
        if code is not None:
            raise _oserror(code, handle.path)
        if offset < 0:
            raise _oserror(errno.EINVAL, handle.path)
        if not data:
            return 0
        node = handle.node
        n = self._room(node, offset, len(data))
        if n <= 0:
            raise _oserror(errno.ENOSPC, handle.path)
        chunk = bytes(data[:n])
        _write_into(node.data, offset, chunk)
        node.pending.append(_Write(self._stamp(), node, offset, chunk))
        return n

    def _room(self, node: _File, offset: int, n: int) -> int:
        """How many of ``n`` bytes at ``offset`` fit in the budget."""
        budget = self.faults.budget
        grow = offset + n - len(node.data)
        if budget is None or grow <= 0:
            return n
        free = budget - sum(len(f.data) for f in self._nodes
                            if isinstance(f, _File) and (f.nlink > 0 or f.opens > 0))
        if grow <= free:
            return n
        return min(n, len(node.data) + max(free, 0) - offset)

    def _pending_ops(self) -> Iterator[_Op]:
        for node in self._nodes:
            yield from node.pending

    def _volatile_files(self) -> dict[str, _File]:
        return _walk(self._root, lambda d: d.entries)

    def _durable_files(self) -> dict[str, _File]:
        return _walk(self._root, lambda d: d.durable)


def _walk(root: _Dir, entries: Callable[[_Dir], dict[str, _Node]]) -> dict[str, _File]:
    """Every file reachable from ``root`` through ``entries``, by path."""
    out: dict[str, _File] = {}
    stack: list[tuple[str, _Dir]] = [("", root)]
    seen = {id(root)}
    while stack:
        prefix, node = stack.pop()
        for name, child in entries(node).items():
            path = f"{prefix}/{name}"
            if isinstance(child, _File):
                out[path] = child
            elif id(child) not in seen:
                seen.add(id(child))
                stack.append((path, child))
    return out


def _build(root: _Dir, files: dict[_File, bytearray],
           dirs: dict[_Dir, dict[str, _Node]]) -> SimulatedDisk:
    """A new disk holding the durable tree under ``root``, overlaid with ``files`` and ``dirs``."""
    disk = SimulatedDisk()
    memo: dict[int, _Node] = {id(root): disk._root}
    stack = [root]
    while stack:
        old = stack.pop()
        new = memo[id(old)]
        assert isinstance(new, _Dir)
        for name, child in sorted(dirs.get(old, old.durable).items()):
            twin = memo.get(id(child))
            if twin is None:
                twin = (_File(files.get(child, child.durable)) if isinstance(child, _File)
                        else _Dir(child.given))
                memo[id(child)] = twin
                disk._nodes.append(twin)
                if isinstance(child, _Dir):
                    stack.append(child)
            elif isinstance(twin, _Dir):
                continue  # a directory keeps one name, as the file system requires
            if isinstance(twin, _File):
                twin.nlink += 1
            new.entries[name] = new.durable[name] = twin
    return disk
