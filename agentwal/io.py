"""The I/O seam: the one place agentwal touches the operating system's files.

Theory of operation: every WAL and control-file operation goes through an
object with the methods of :class:`FileSystem` (the "I/O seam").
Production uses :class:`OsFileSystem`; ``agentwal.open(path, fs=...)`` takes
any other object with the same methods, so a test can bring a simulated disk
(``agentwal.testing.SimulatedDisk``) that loses unsynced data on a power cut.

Contract of the seam, which the engine relies on and simulated disks honour:
- errors are ``OSError`` with an ``errno``; ``pwrite``/``append`` may be short;
- ``fsync(fd)`` makes that file's data durable, not its directory entry;
- ``fsync_dir(path)`` makes the names in ``path`` durable (a new file, a
  rename, an unlink), as on Linux;
- ``listdir`` returns names, sorted; ``mkdir`` is ``exist_ok``;
- ``open_read(path)`` opens an existing file read-only (blob readers; a
  handle from it refuses writes).

Blob files (``blobs.py``) go through the seam too; the *source* of a
``put_blob`` is the caller's file, outside the store, and is opened with
:func:`open_source` from the operating system whatever ``fs`` is.

The writer lock is process-level (``flock``) and not part of the seam: a
simulated disk lives inside one process, where the lock still stops a second
``Store`` on the same directory. LMDB does its own I/O in ``snapshot.py``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from io import FileIO
from typing import Protocol, runtime_checkable

from .errors import DiskFullError, DurabilityError, Error, StoreLimitError, StoreLockedError

__all__ = [
    "DISK_FULL_ERRNOS",
    "FileSystem",
    "OsFileSystem",
    "WriterLock",
    "io_error",
    "read_all",
    "replace_file",
    "write_all",
    "open_source",
]

#: errnos that mean "no room for this write": a full disk, a quota, a file-size
#: limit. Nothing was acknowledged, and the store works again once there is room.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})



def io_error(exc: OSError, path: str, what: str) -> Error:
    """The typed error for an I/O failure (not damage: the bytes read were fine)."""
    if exc.errno in DISK_FULL_ERRNOS:
        where = exc.filename or path
        return DiskFullError(where, f"{what}: no room to write {where!r} "
                             f"({exc.strerror or exc}). Free some space and open the store "
                             "again.")
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return StoreLimitError(exc.filename or path, f"{what}: no file descriptor left "
                               f"({exc.strerror})", "Close stores this process no longer uses, "
                               "or raise the limit (`ulimit -n`; each open store uses about 6).")
    return DurabilityError(exc.filename or path, f"{what}: {exc.strerror or exc}")


FILE_MODE = 0o600
DIR_MODE = 0o700
_READ_CHUNK = 1 << 20


@runtime_checkable
class FileSystem(Protocol):
    """What agentwal needs from a file system; all paths are plain strings."""

    def open(self, path: str, create: bool = True) -> int: ...
    def close(self, fd: int) -> None: ...
    def pwrite(self, fd: int, offset: int, data: bytes) -> int: ...
    def append(self, fd: int, data: bytes) -> int: ...
    def read(self, fd: int, offset: int = 0, n: int | None = None) -> bytes: ...
    def size(self, fd: int) -> int: ...
    def truncate(self, fd: int, size: int) -> None: ...
    def fsync(self, fd: int) -> None: ...
    def exists(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...
    def mkdir(self, path: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def fsync_dir(self, path: str) -> None: ...
    def open_read(self, path: str) -> int: ...


class OsFileSystem:
    """The operating system's files: ``os.pwrite``, ``fdatasync`` and friends.

    Files are created with mode 0600 and directories with 0700. A file that
    cannot be opened for writing (a read-only store on a read-only mount) is
    opened read-only instead.
    """

    def open(self, path: str, create: bool = True) -> int:
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        if create:
            flags |= os.O_CREAT
        try:
            return os.open(path, flags, FILE_MODE)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise
            return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, offset: int, data: bytes) -> int:
        return os.pwrite(fd, data, offset)

    def append(self, fd: int, data: bytes) -> int:
        os.lseek(fd, 0, os.SEEK_END)
        return os.write(fd, data)

    def read(self, fd: int, offset: int = 0, n: int | None = None) -> bytes:
        if n is None:
            n = max(0, os.fstat(fd).st_size - offset)
        # One pread for the whole range (a 16 MiB segment in one allocation, no join copy);
        # a short read goes on in pieces.
        first = os.pread(fd, n, offset) if n > 0 else b""
        if len(first) == n or not first:
            return first
        parts: list[bytes] = [first]
        offset += len(first)
        n -= len(first)
        while n > 0:
            chunk = os.pread(fd, min(n, _READ_CHUNK), offset)
            if not chunk:
                break
            parts.append(chunk)
            offset += len(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fsync(self, fd: int) -> None:
        if sys.platform == "darwin":  # pragma: no cover - fsync lies on macOS
            import fcntl

            fcntl.fcntl(fd, getattr(fcntl, "F_FULLFSYNC", 51))
        elif hasattr(os, "fdatasync"):
            os.fdatasync(fd)
        else:  # pragma: no cover
            os.fsync(fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def mkdir(self, path: str) -> None:
        # os.makedirs gives only the leaf the mode; every directory made here is 0700.
        missing = []
        head = os.path.abspath(path)
        while not os.path.isdir(head):
            missing.append(head)
            head = os.path.dirname(head)
        for d in reversed(missing):
            try:
                os.mkdir(d, DIR_MODE)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def open_read(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))


def write_all(fs: FileSystem, fd: int, offset: int, data: bytes) -> None:
    """Write all of ``data`` at ``offset``, retrying short writes until whole."""
    view = memoryview(data)
    while view:
        n = fs.pwrite(fd, offset, bytes(view))
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        offset += n
        view = view[n:]


def replace_file(fs: FileSystem, directory: str, name: str, data: bytes, *,
                 sync: bool = True) -> None:
    """Make ``directory/name`` hold ``data``, atomically and durably, through the seam.

    Written to ``name.tmp``, fsynced, renamed over ``name``, and ``directory``
    fsynced: after a crash the file is the old one or the new one, whole.
    With ``sync=False`` nothing is fsynced (for advice, not state): readers
    still see the old file or the new one, but a crash may leave either, or
    a damaged one.
    """
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    fd = fs.open(tmp, create=True)
    try:
        fs.truncate(fd, 0)
        write_all(fs, fd, 0, data)
        if sync:
            fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.rename(tmp, path)
    if sync:
        fs.fsync_dir(directory)


def read_all(fs: FileSystem, path: str) -> bytes:
    """Read a whole (small) file through the seam."""
    fd = fs.open(path, create=False)
    try:
        return fs.read(fd, 0, None)
    finally:
        fs.close(fd)


def open_source(path: str | os.PathLike[str]) -> FileIO:
    """Open the caller's file ``path`` for reading, unbuffered: a ``put_blob`` source.

    This is the operating system's file, not one of the store's, so it does
    not go through the seam (a simulated disk holds no caller's files).

    Raises:
        OSError: the file cannot be opened (missing, a directory, no permission).
    """
    return FileIO(os.fspath(path), "r")


class WriterLock:
    """The exclusive, process-level writer lock of a store directory.

    ``flock`` on the store directory itself and on ``<store>/LOCK``; the holder
    writes its pid into the file so a second writer can be told who holds it.
    The kernel drops both when the holder dies, so a crashed writer never
    leaves a stale lock. The directory's lock is the one an operator cannot
    remove by mistake: with only the file's, deleting ``LOCK`` under a running
    writer ("a stale lock file") let a second process lock a new ``LOCK`` and
    write the same log. The file's lock is still taken, for the releases that
    took only that one.
    """

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "LOCK")
        self._fd: int | None = None
        self._dir_fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`StoreLockedError` naming the holder.

        The lock and LMDB live in the real directory even when the WAL goes
        through another file system (``fs=``), so it is created if missing.
        """
        directory = os.path.dirname(self.path)
        OsFileSystem().mkdir(directory)
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                         | getattr(os, "O_CLOEXEC", 0))
        try:
            if not _try_flock(dir_fd):
                raise StoreLockedError(directory, _pid_in(self.path))
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                         FILE_MODE)
            try:
                if not _try_flock(fd):
                    raise StoreLockedError(directory, _read_pid(fd))
            except BaseException:  # held, or flock failed otherwise (ENOLCK)
                os.close(fd)
                raise
        except BaseException:
            os.close(dir_fd)
            raise
        self._fd, self._dir_fd = fd, dir_fd
        # The pid is for the error message of the next writer: best effort
        # (a full disk must not keep the lock held by a store that failed to open).
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        if self._dir_fd is not None:
            fd, self._dir_fd = self._dir_fd, None
            os.close(fd)


@contextlib.contextmanager
def writers_kept_out(directory: str, why: str) -> Iterator[None]:
    """Hold the store directory's writer ``flock`` (as a writer does) without writing ``LOCK``.

    For code that reads a store's files by hand and must not race a writer
    (salvage): a live writer makes this raise, and no writer can open the
    store until the block ends. Nothing in the store is created or changed.

    Raises:
        StoreLockedError: a writer holds the store (``why`` says what to do instead).
    """
    path = os.path.join(directory, "LOCK")
    fds = [os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                   | getattr(os, "O_CLOEXEC", 0))]
    try:
        with contextlib.suppress(FileNotFoundError):  # LOCK too, as WriterLock takes both
            fds.append(os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        if not all(_try_flock(fd) for fd in fds):
            raise StoreLockedError(directory, _pid_in(path), advice=why)
        yield
    finally:
        for fd in fds:
            os.close(fd)


def _try_flock(fd: int) -> bool:
    """Take ``fd``'s exclusive ``flock`` without waiting; False if another holds it."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _pid_in(path: str) -> int | None:
    """The pid a ``LOCK`` file names, or None (missing, empty, unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return _read_pid(fd)
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def writer_holder(directory: str) -> tuple[bool | None, int | None]:
    """Whether a process holds the writer lock of ``directory``, and the pid it wrote.

    Read-only and lock-free, so it never disturbs a writer: on Linux the
    kernel's ``/proc/locks`` says whether the ``LOCK`` file or the directory
    is held (and, should their numbers not match, ``/proc/<pid>/fd`` whether
    the pid the file names still has it open); elsewhere the answer is None
    (unknown). The pid is the last holder's (the file keeps it after that
    process ends), or None when the file has none or is gone.
    """
    path = os.path.join(directory, "LOCK")
    wanted = []
    pid = None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        fd = None  # never opened for writing, or LOCK removed under a writer
    if fd is not None:
        try:
            wanted.append(_lock_id(os.fstat(fd)))
            pid = _read_pid(fd)
        finally:
            os.close(fd)
    try:
        wanted.append(_lock_id(os.stat(directory)))
    except OSError:
        return False, pid
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, pid
    held = any(len(p) > 5 and p[1] == "FLOCK" and p[5] in wanted
               for p in (line.split() for line in lines))
    if not held and pid is not None:  # a file system whose locks list other numbers
        held = _keeps_open(pid, os.path.realpath(path))
    return held, pid


def _lock_id(st: os.stat_result) -> str:
    """How ``/proc/locks`` names a file: ``major:minor:inode``."""
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


def _keeps_open(pid: int, path: str) -> bool:
    """Whether process ``pid`` has ``path`` open (a writer keeps its LOCK file open)."""
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:  # gone, or not ours to look at
        return False
    for name in names:
        with contextlib.suppress(OSError):
            if os.readlink(os.path.join(fds, name)) == path:
                return True
    return False
