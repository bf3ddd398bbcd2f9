"""The I/O seam: OsFileSystem, the short-write loops, read_all and the writer lock."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentwal import io
from agentwal.errors import StoreLockedError
from agentwal.io import (
    DISK_FULL_ERRNOS,
    FileSystem,
    OsFileSystem,
    WriterLock,
    read_all,
    write_all,
)


def mode_of(p: str | Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def fs() -> OsFileSystem:
    return OsFileSystem()


@pytest.fixture
def fd(fs: OsFileSystem, tmp_path: Path) -> Iterator[int]:
    fd = fs.open(str(tmp_path / "f"))
    yield fd
    fs.close(fd)


# -- the protocol ---------------------------------------------------------------------------


def test_os_file_system_satisfies_the_protocol(fs: OsFileSystem) -> None:
    assert isinstance(fs, FileSystem)


def test_an_object_missing_a_method_is_not_a_file_system() -> None:
    class NoFsyncDir:
        def open(self, path: str, create: bool = True) -> int:
            return 0

    assert not isinstance(NoFsyncDir(), FileSystem)


def test_disk_full_errnos() -> None:
    assert frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG}) == DISK_FULL_ERRNOS
    assert isinstance(DISK_FULL_ERRNOS, frozenset)
    assert errno.EIO not in DISK_FULL_ERRNOS


# -- open / close ---------------------------------------------------------------------------


def test_open_creates_the_file_with_mode_0600(fs: OsFileSystem, tmp_path: Path) -> None:
    p = tmp_path / "new"
    old = os.umask(0)  # the mode must come from agentwal, not from a strict umask
    try:
        fd = fs.open(str(p))
    finally:
        os.umask(old)
    fs.close(fd)
    assert p.is_file() and mode_of(p) == 0o600


def test_open_existing_file_keeps_its_bytes(fs: OsFileSystem, tmp_path: Path) -> None:
    p = tmp_path / "old"
    p.write_bytes(b"hello")
    for create in (True, False):
        fd = fs.open(str(p), create=create)
        assert fs.read(fd) == b"hello"
        fs.close(fd)


def test_open_without_create_on_a_missing_file_is_enoent(fs: OsFileSystem,
                                                          tmp_path: Path) -> None:
    p = tmp_path / "missing"
    with pytest.raises(OSError) as ei:
        fs.open(str(p), create=False)
    assert ei.value.errno == errno.ENOENT
    assert not p.exists()


def test_open_falls_back_to_read_only_when_writing_is_refused(
        fs: OsFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "ro"
    p.write_bytes(b"data")
    real_open = os.open
    seen: list[int] = []

    def fake_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        seen.append(flags)
        if str(path) == str(p) and flags & os.O_RDWR:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", fake_open)
    fd = fs.open(str(p))
    try:
        assert fs.read(fd) == b"data"
        with pytest.raises(OSError) as ei:
            fs.pwrite(fd, 0, b"x")
        assert ei.value.errno == errno.EBADF  # opened O_RDONLY
    finally:
        fs.close(fd)
    assert len(seen) == 2 and seen[1] & os.O_ACCMODE == os.O_RDONLY


def test_open_does_not_swallow_other_errors(fs: OsFileSystem, tmp_path: Path) -> None:
    with pytest.raises(OSError) as ei:
        fs.open(str(tmp_path / "no-such-dir" / "f"))
    assert ei.value.errno == errno.ENOENT


def test_close_closes_the_descriptor(fs: OsFileSystem, tmp_path: Path) -> None:
    fd = fs.open(str(tmp_path / "f"))
    fs.close(fd)
    with pytest.raises(OSError) as ei:
        os.fstat(fd)
    assert ei.value.errno == errno.EBADF


# -- writing and reading --------------------------------------------------------------------


def test_pwrite_writes_at_the_offset_and_returns_the_count(fs: OsFileSystem, fd: int) -> None:
    assert fs.pwrite(fd, 0, b"abcdef") == 6
    assert fs.pwrite(fd, 2, b"XY") == 2
    assert fs.read(fd) == b"abXYef"
    assert fs.pwrite(fd, 10, b"z") == 1  # past the end: a hole of zeros
    assert fs.read(fd) == b"abXYef\0\0\0\0z"
    assert fs.size(fd) == 11


def test_append_goes_to_the_end_whatever_was_written_where(fs: OsFileSystem, fd: int) -> None:
    assert fs.append(fd, b"one") == 3
    fs.pwrite(fd, 0, b"O")
    os.lseek(fd, 0, os.SEEK_SET)  # a moved file position must not matter
    assert fs.append(fd, b"two") == 3
    assert fs.read(fd) == b"Onetwo"


def test_read_with_n_none_reads_from_offset_to_the_end(fs: OsFileSystem, fd: int) -> None:
    fs.pwrite(fd, 0, b"0123456789")
    assert fs.read(fd) == b"0123456789"
    assert fs.read(fd, 4) == b"456789"
    assert fs.read(fd, 4, None) == b"456789"
    assert fs.read(fd, 10) == b""
    assert fs.read(fd, 50) == b""  # offset past the end


def test_read_with_n_stops_at_the_end_of_the_file(fs: OsFileSystem, fd: int) -> None:
    fs.pwrite(fd, 0, b"0123456789")
    assert fs.read(fd, 2, 3) == b"234"
    assert fs.read(fd, 8, 100) == b"89"
    assert fs.read(fd, 0, 0) == b""


def test_read_of_an_empty_file(fs: OsFileSystem, fd: int) -> None:
    assert fs.read(fd) == b""
    assert fs.read(fd, 0, 10) == b""


def test_read_asks_for_the_whole_range_once_then_goes_on_in_chunks(
        fs: OsFileSystem, fd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytes(range(256)) * 4
    fs.pwrite(fd, 0, data)
    monkeypatch.setattr(io, "_READ_CHUNK", 100)
    calls: list[tuple[int, int]] = []
    real = os.pread

    def pread(f: int, n: int, off: int) -> bytes:
        calls.append((n, off))
        return real(f, n, off)

    monkeypatch.setattr(os, "pread", pread)
    assert fs.read(fd, 24) == data[24:]
    assert calls == [(len(data) - 24, 24)]  # a segment image in one allocation, no join
    calls.clear()

    def short(f: int, n: int, off: int) -> bytes:  # the OS gives at most 150 bytes a call
        calls.append((n, off))
        return real(f, min(n, 150), off)

    monkeypatch.setattr(os, "pread", short)
    assert fs.read(fd, 24) == data[24:]
    assert calls[0] == (len(data) - 24, 24)
    assert all(n <= 100 for n, _ in calls[1:])
    assert [off for _, off in calls] == [24, *range(174, len(data), 100)]


def test_read_retries_short_reads(fs: OsFileSystem, fd: int,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fs.pwrite(fd, 0, b"abcdefghij")
    real = os.pread
    calls = 0

    def short_pread(f: int, n: int, off: int) -> bytes:
        nonlocal calls
        calls += 1
        return real(f, min(n, 3), off)  # the kernel may return less than asked

    monkeypatch.setattr(os, "pread", short_pread)
    assert fs.read(fd, 1, 8) == b"bcdefghi"
    assert calls == 3
    assert fs.read(fd) == b"abcdefghij"


def test_read_stops_when_the_file_shrinks_under_it(fs: OsFileSystem, fd: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fs.pwrite(fd, 0, b"abcdefghij")
    real = os.pread

    def pread(f: int, n: int, off: int) -> bytes:
        out = real(f, min(n, 4), off)
        os.ftruncate(f, 6)  # shrunk after the first chunk
        return out

    monkeypatch.setattr(os, "pread", pread)
    assert fs.read(fd, 0, 10) == b"abcdef"  # no endless loop on EOF


def test_size_and_truncate(fs: OsFileSystem, fd: int) -> None:
    assert fs.size(fd) == 0
    fs.pwrite(fd, 0, b"abcdef")
    assert fs.size(fd) == 6
    fs.truncate(fd, 2)
    assert fs.size(fd) == 2 and fs.read(fd) == b"ab"
    fs.truncate(fd, 5)  # growing fills with zeros
    assert fs.read(fd) == b"ab\0\0\0"
    fs.truncate(fd, 0)
    assert fs.size(fd) == 0


def test_fsync(fs: OsFileSystem, tmp_path: Path) -> None:
    fd = fs.open(str(tmp_path / "f"))
    fs.pwrite(fd, 0, b"x")
    fs.fsync(fd)
    fs.close(fd)
    with pytest.raises(OSError) as ei:
        fs.fsync(fd)
    assert ei.value.errno == errno.EBADF


# -- names ----------------------------------------------------------------------------------


def test_exists(fs: OsFileSystem, tmp_path: Path) -> None:
    assert fs.exists(str(tmp_path))
    assert not fs.exists(str(tmp_path / "nope"))
    (tmp_path / "f").write_bytes(b"")
    assert fs.exists(str(tmp_path / "f"))


def test_listdir_is_sorted(fs: OsFileSystem, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["b.wal", "a.wal", "00000000000000000010.wal", "00000000000000000002.wal", "Z"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    assert fs.listdir(str(tmp_path)) == sorted(names)
    # whatever order the OS gives
    monkeypatch.setattr(os, "listdir", lambda p: ["c", "a", "b"])
    assert fs.listdir(str(tmp_path)) == ["a", "b", "c"]


def test_listdir_of_empty_and_missing_directories(fs: OsFileSystem, tmp_path: Path) -> None:
    assert fs.listdir(str(tmp_path)) == []
    with pytest.raises(OSError) as ei:
        fs.listdir(str(tmp_path / "nope"))
    assert ei.value.errno == errno.ENOENT


def test_mkdir_is_exist_ok_makes_parents_and_uses_mode_0700(fs: OsFileSystem,
                                                            tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    old = os.umask(0)
    try:
        fs.mkdir(str(d))
        fs.mkdir(str(d))  # exist_ok
    finally:
        os.umask(old)
    assert d.is_dir()
    assert mode_of(d) == 0o700  # the leaf; parents follow the umask, like ``mkdir -p``


def test_mkdir_over_a_file_fails(fs: OsFileSystem, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(OSError) as ei:
        fs.mkdir(str(tmp_path / "f"))
    assert ei.value.errno == errno.EEXIST


def test_rename_replaces_the_destination(fs: OsFileSystem, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"new")
    dst.write_bytes(b"old")
    ino = os.stat(src).st_ino
    old_fd = fs.open(str(dst), create=False)
    try:
        fs.rename(str(src), str(dst))
        assert not src.exists()
        assert dst.read_bytes() == b"new"
        assert os.stat(dst).st_ino == ino  # the same file, not a copy
        assert fs.read(old_fd) == b"old"  # a handle on the old file still reads it
    finally:
        fs.close(old_fd)


def test_rename_never_leaves_the_destination_missing(fs: OsFileSystem, tmp_path: Path) -> None:
    dst = tmp_path / "CONTROL"
    dst.write_bytes(b"v0")
    stop = threading.Event()
    missing: list[BaseException] = []
    seen: set[bytes] = set()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.add(dst.read_bytes())
            except FileNotFoundError as exc:
                missing.append(exc)
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(300):
            tmp = tmp_path / "CONTROL.tmp"
            tmp.write_bytes(b"v%d" % (i % 2))
            fs.rename(str(tmp), str(dst))
    finally:
        stop.set()
        t.join()
    assert not missing
    assert seen <= {b"v0", b"v1"}


def test_rename_of_a_missing_source(fs: OsFileSystem, tmp_path: Path) -> None:
    with pytest.raises(OSError) as ei:
        fs.rename(str(tmp_path / "a"), str(tmp_path / "b"))
    assert ei.value.errno == errno.ENOENT


def test_unlink(fs: OsFileSystem, tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x")
    fs.unlink(str(p))
    assert not p.exists()
    with pytest.raises(OSError) as ei:
        fs.unlink(str(p))
    assert ei.value.errno == errno.ENOENT


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_fsync_dir_syncs_and_closes_its_descriptor(fs: OsFileSystem, tmp_path: Path) -> None:
    before = open_fds()
    for _ in range(5):
        fs.fsync_dir(str(tmp_path))
    assert open_fds() == before


def test_fsync_dir_of_a_missing_directory(fs: OsFileSystem, tmp_path: Path) -> None:
    with pytest.raises(OSError) as ei:
        fs.fsync_dir(str(tmp_path / "nope"))
    assert ei.value.errno == errno.ENOENT


# -- write_all / read_all ------------------------------------------------------


class TrickleFs(OsFileSystem):
    """Writes at most ``step`` bytes per call (0: makes no progress), recording every call."""

    def __init__(self, step: int = 1) -> None:
        self.step = step
        self.calls: list[tuple[str, int, int]] = []  # (op, offset, len)
        self.closed: list[int] = []

    def pwrite(self, fd: int, offset: int, data: bytes) -> int:
        self.calls.append(("pwrite", offset, len(data)))
        return super().pwrite(fd, offset, data[: self.step]) if self.step > 0 else self.step

    def append(self, fd: int, data: bytes) -> int:
        self.calls.append(("append", -1, len(data)))
        return super().append(fd, data[: self.step]) if self.step > 0 else self.step

    def close(self, fd: int) -> None:
        self.closed.append(fd)
        super().close(fd)


def test_write_all_retries_short_writes(tmp_path: Path) -> None:
    tfs = TrickleFs(step=1)
    fd = tfs.open(str(tmp_path / "f"))
    write_all(tfs, fd, 3, b"hello")
    assert [c[1] for c in tfs.calls] == [3, 4, 5, 6, 7]  # each retry at the new offset
    assert [c[2] for c in tfs.calls] == [5, 4, 3, 2, 1]  # with what is left
    assert tfs.read(fd) == b"\0\0\0hello"
    tfs.close(fd)


def test_write_all_with_bigger_short_writes(tmp_path: Path) -> None:
    tfs = TrickleFs(step=3)
    fd = tfs.open(str(tmp_path / "f"))
    data = bytes(range(100))
    write_all(tfs, fd, 0, data)
    assert tfs.read(fd) == data
    assert len(tfs.calls) == 34
    tfs.close(fd)


def test_write_all_of_nothing_makes_no_call(tmp_path: Path) -> None:
    tfs = TrickleFs()
    fd = tfs.open(str(tmp_path / "f"))
    write_all(tfs, fd, 0, b"")
    assert tfs.calls == []
    tfs.close(fd)


@pytest.mark.parametrize("step", [0, -1])
def test_write_all_without_progress_is_eio(tmp_path: Path, step: int) -> None:
    tfs = TrickleFs(step=step)
    fd = tfs.open(str(tmp_path / "f"))
    with pytest.raises(OSError) as ei:
        write_all(tfs, fd, 0, b"abc")
    assert ei.value.errno == errno.EIO
    assert len(tfs.calls) == 1  # not an endless loop
    tfs.close(fd)


def test_write_all_passes_errors_through(tmp_path: Path) -> None:
    class Full(OsFileSystem):
        def pwrite(self, fd: int, offset: int, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    ffs = Full()
    fd = ffs.open(str(tmp_path / "f"))
    with pytest.raises(OSError) as ei:
        write_all(ffs, fd, 0, b"abc")
    assert ei.value.errno == errno.ENOSPC
    ffs.close(fd)


def test_read_all_reads_the_whole_file_and_closes_it(tmp_path: Path) -> None:
    p = tmp_path / "f"
    data = os.urandom(3 << 20)  # several read chunks
    p.write_bytes(data)
    tfs = TrickleFs()
    assert read_all(tfs, str(p)) == data
    assert len(tfs.closed) == 1


def test_read_all_of_an_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"")
    assert read_all(OsFileSystem(), str(p)) == b""


def test_read_all_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    p = tmp_path / "nope"
    with pytest.raises(OSError) as ei:
        read_all(OsFileSystem(), str(p))
    assert ei.value.errno == errno.ENOENT
    assert not p.exists()


def test_read_all_closes_the_file_when_reading_fails(tmp_path: Path) -> None:
    class BadRead(TrickleFs):
        def read(self, fd: int, offset: int = 0, n: int | None = None) -> bytes:
            raise OSError(errno.EIO, "Input/output error")

    p = tmp_path / "f"
    p.write_bytes(b"x")
    bfs = BadRead()
    with pytest.raises(OSError):
        read_all(bfs, str(p))
    assert len(bfs.closed) == 1


# -- the writer lock ------------------------------------------------------------------------


def test_writer_lock_acquire_writes_our_pid(tmp_path: Path) -> None:
    lock = WriterLock(str(tmp_path))
    assert lock.path == str(tmp_path / "LOCK")
    lock.acquire()
    try:
        assert (tmp_path / "LOCK").read_text() == f"{os.getpid()}\n"
        assert mode_of(tmp_path / "LOCK") & 0o077 == 0
    finally:
        lock.release()


def test_writer_lock_replaces_a_stale_longer_pid(tmp_path: Path) -> None:
    (tmp_path / "LOCK").write_text("123456789012345\n")  # left by a dead holder
    lock = WriterLock(str(tmp_path))
    lock.acquire()
    try:
        assert (tmp_path / "LOCK").read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()


def test_second_acquire_in_the_same_process_is_store_locked(tmp_path: Path) -> None:
    first, second = WriterLock(str(tmp_path)), WriterLock(str(tmp_path))
    first.acquire()
    try:
        with pytest.raises(StoreLockedError) as ei:
            second.acquire()
        assert ei.value.pid == os.getpid()
        assert ei.value.path == str(tmp_path)
        assert str(os.getpid()) in str(ei.value)
    finally:
        first.release()
    second.acquire()  # free once released
    second.release()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_failed_acquire_leaks_no_descriptor(tmp_path: Path) -> None:
    first = WriterLock(str(tmp_path))
    first.acquire()
    try:
        before = open_fds()
        for _ in range(5):
            with pytest.raises(StoreLockedError):
                WriterLock(str(tmp_path)).acquire()
        assert open_fds() == before
    finally:
        first.release()


def test_holder_without_a_readable_pid_is_reported_as_none(tmp_path: Path) -> None:
    first = WriterLock(str(tmp_path))
    first.acquire()
    try:
        (tmp_path / "LOCK").write_text("not a pid\n")
        with pytest.raises(StoreLockedError) as ei:
            WriterLock(str(tmp_path)).acquire()
        assert ei.value.pid is None
        (tmp_path / "LOCK").write_text("")
        with pytest.raises(StoreLockedError) as ei:
            WriterLock(str(tmp_path)).acquire()
        assert ei.value.pid is None
    finally:
        first.release()


def test_release_is_idempotent(tmp_path: Path) -> None:
    lock = WriterLock(str(tmp_path))
    lock.release()  # never acquired
    lock.acquire()
    lock.release()
    lock.release()
    lock.acquire()  # and can be taken again
    lock.release()


def test_acquire_creates_a_missing_directory(tmp_path: Path) -> None:
    # The lock (and LMDB) live in the real directory even when the WAL goes
    # through another file system, so the lock makes sure it exists (0700).
    lock = WriterLock(str(tmp_path / "a" / "b"))
    lock.acquire()
    try:
        assert os.path.isdir(tmp_path / "a" / "b")
        assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    finally:
        lock.release()


# -- blobs: open_read and open_source ---------------------------------------------------------


def test_open_read_gives_a_read_only_descriptor(fs: OsFileSystem, tmp_path: Path) -> None:
    p = tmp_path / "blob"
    p.write_bytes(b"content")
    fd = fs.open_read(str(p))
    try:
        assert fs.read(fd) == b"content" and fs.size(fd) == 7
        with pytest.raises(OSError) as info:
            fs.pwrite(fd, 0, b"x")
        assert info.value.errno == errno.EBADF
    finally:
        fs.close(fd)
    assert p.read_bytes() == b"content"


def test_open_read_never_creates(fs: OsFileSystem, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fs.open_read(str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()


def test_open_read_works_on_a_file_we_may_not_write(fs: OsFileSystem, tmp_path: Path) -> None:
    p = tmp_path / "ro"
    p.write_bytes(b"abc")
    p.chmod(0o400)
    fd = fs.open_read(str(p))
    try:
        assert fs.read(fd) == b"abc"
    finally:
        fs.close(fd)


def test_open_source_reads_the_callers_file_unbuffered(tmp_path: Path) -> None:
    p = tmp_path / "src"
    p.write_bytes(b"x" * 10)
    with io.open_source(p) as f:  # PathLike accepted
        assert f.read(4) == b"xxxx"
        assert f.readable() and not f.writable()
    with pytest.raises(FileNotFoundError):
        io.open_source(str(tmp_path / "missing"))
    with pytest.raises(IsADirectoryError):
        io.open_source(str(tmp_path))


def test_a_lock_file_flock_that_fails_leaks_no_descriptor(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The directory's flock succeeds, LOCK's fails with an error other than "held"
    # (ENOLCK): the error reaches the caller and both descriptors are closed.
    real, calls = io._try_flock, []

    def flaky(fd: int) -> bool:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOLCK, "no locks available")
        return real(fd)

    monkeypatch.setattr(io, "_try_flock", flaky)
    store = tmp_path / "s.awal"
    store.mkdir()
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as err:
        io.WriterLock(str(store)).acquire()
    assert err.value.errno == errno.ENOLCK
    assert sorted(os.listdir("/proc/self/fd")) == before
