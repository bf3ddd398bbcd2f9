"""The simulated disk: the FileSystem seam, power cuts under each model, injected faults."""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest

from agentwal.io import FileSystem, write_all
from agentwal.testing import SECTOR, FaultPlan, FileState, SimulatedCrash, SimulatedDisk

D = "/data"
SEEDS = range(64)


def fresh() -> SimulatedDisk:
    """A disk with a durable directory ``/data``."""
    disk = SimulatedDisk()
    disk.mkdir(D)
    disk.fsync_dir("/")
    return disk


def durable_file(disk: SimulatedDisk, name: str, data: bytes) -> int:
    """Create ``/data/name`` with ``data``, all of it durable; returns the open handle."""
    fd = disk.open(f"{D}/{name}")
    write_all(disk, fd, 0, data)
    disk.fsync(fd)
    disk.fsync_dir(D)
    return fd


def content(disk: SimulatedDisk, path: str) -> bytes | None:
    return disk.inspect()[path].volatile if path in disk.inspect() else None


def errno_of(fn: Callable[[], object]) -> int | None:
    with pytest.raises(OSError) as info:
        fn()
    return info.value.errno


# -- the FileSystem seam -------------------------------------------------------------------


def test_is_a_filesystem() -> None:
    assert isinstance(SimulatedDisk(), FileSystem)


def test_write_read_size_truncate() -> None:
    disk = fresh()
    fd = disk.open(f"{D}/f")
    assert disk.pwrite(fd, 0, b"hello") == 5
    assert disk.append(fd, b" world") == 6
    assert disk.read(fd) == b"hello world"
    assert disk.read(fd, 6, 3) == b"wor"
    assert disk.read(fd, 100) == b""
    assert disk.pwrite(fd, 13, b"!") == 1  # past the end: the gap reads as zeros
    assert disk.read(fd, 11) == b"\0\0!"
    assert disk.pwrite(fd, 100, b"") == 0 and disk.size(fd) == 14  # empty: no extension
    disk.truncate(fd, 5)
    assert (disk.size(fd), disk.read(fd)) == (5, b"hello")
    disk.truncate(fd, 7)
    assert disk.read(fd) == b"hello\0\0"


def test_names() -> None:
    disk = fresh()
    disk.mkdir(f"{D}/sub")
    disk.mkdir(f"{D}/sub")  # exist_ok
    for name in ("b", "a", "c"):
        disk.close(disk.open(f"{D}/{name}"))
    assert disk.listdir(D) == ["a", "b", "c", "sub"]
    assert disk.exists(f"{D}/a") and disk.exists(f"{D}/sub") and not disk.exists(f"{D}/z")
    disk.rename(f"{D}/a", f"{D}/b")
    disk.unlink(f"{D}/c")
    assert disk.listdir(D) == ["b", "sub"]
    assert disk.files() == [f"{D}/b"]


def test_rename_replaces_atomically_and_handles_survive_unlink() -> None:
    disk = fresh()
    old, new = disk.open(f"{D}/x"), disk.open(f"{D}/x.tmp")
    disk.pwrite(old, 0, b"old")
    disk.pwrite(new, 0, b"new")
    disk.rename(f"{D}/x.tmp", f"{D}/x")
    assert disk.read(disk.open(f"{D}/x")) == b"new"
    assert disk.read(old) == b"old"  # the replaced file lives on through its handle
    disk.unlink(f"{D}/x")
    assert disk.read(new) == b"new" and not disk.exists(f"{D}/x")


@pytest.mark.parametrize(("call", "code"), [
    (lambda d: d.open(f"{D}/missing", create=False), errno.ENOENT),
    (lambda d: d.open("/nowhere/f"), errno.ENOENT),
    (lambda d: d.open(D), errno.EISDIR),
    (lambda d: d.listdir("/nowhere"), errno.ENOENT),
    (lambda d: d.listdir(f"{D}/f"), errno.ENOTDIR),
    (lambda d: d.fsync_dir("/nowhere"), errno.ENOENT),
    (lambda d: d.unlink(f"{D}/missing"), errno.ENOENT),
    (lambda d: d.unlink(D), errno.EISDIR),
    (lambda d: d.rename(f"{D}/missing", f"{D}/g"), errno.ENOENT),
    (lambda d: d.rename(f"{D}/f", D), errno.EISDIR),
    (lambda d: d.mkdir(f"{D}/f"), errno.EEXIST),
    (lambda d: d.mkdir(f"{D}/f/sub"), errno.ENOTDIR),
    (lambda d: d.close(99), errno.EBADF),
    (lambda d: d.read(99), errno.EBADF),
    (lambda d: d.pwrite(99, 0, b"x"), errno.EBADF),
])
def test_errors_carry_errno(call: Callable[[SimulatedDisk], object], code: int) -> None:
    disk = fresh()
    disk.close(disk.open(f"{D}/f"))
    assert errno_of(lambda: call(disk)) == code


def test_missing_file_is_file_not_found_error() -> None:
    with pytest.raises(FileNotFoundError):
        fresh().open(f"{D}/missing", create=False)


# -- what a strict power cut keeps -----------------------------------------------------------


def test_unsynced_write_is_lost() -> None:
    disk = fresh()
    fd = durable_file(disk, "f", b"synced")
    disk.pwrite(fd, 0, b"UNSYNCED")
    assert disk.read(fd) == b"UNSYNCED"
    assert content(disk.crash_image("strict"), f"{D}/f") == b"synced"


def test_fsynced_new_file_without_fsync_dir_is_lost() -> None:
    disk = fresh()
    fd = disk.open(f"{D}/f")
    disk.pwrite(fd, 0, b"data")
    disk.fsync(fd)
    assert disk.crash_image("strict").files() == []
    disk.fsync_dir(D)
    assert content(disk.crash_image("strict"), f"{D}/f") == b"data"


def test_fsync_dir_alone_keeps_the_name_not_the_data() -> None:
    disk = fresh()
    disk.pwrite(disk.open(f"{D}/f"), 0, b"data")
    disk.fsync_dir(D)
    assert content(disk.crash_image("strict"), f"{D}/f") == b""


def test_rename_is_durable_only_after_fsync_dir() -> None:
    disk = fresh()
    durable_file(disk, "x", b"old")
    durable_file(disk, "x.tmp", b"new")
    disk.rename(f"{D}/x.tmp", f"{D}/x")
    image = disk.crash_image("strict")
    assert (content(image, f"{D}/x"), content(image, f"{D}/x.tmp")) == (b"old", b"new")
    disk.fsync_dir(D)
    image = disk.crash_image("strict")
    assert (content(image, f"{D}/x"), image.files()) == (b"new", [f"{D}/x"])


def test_unlink_is_durable_only_after_fsync_dir() -> None:
    disk = fresh()
    durable_file(disk, "f", b"data")
    disk.unlink(f"{D}/f")
    assert disk.crash_image("strict").files() == [f"{D}/f"]
    disk.fsync_dir(D)
    assert disk.crash_image("strict").files() == []


def test_new_directory_is_durable_only_after_fsync_dir_of_its_parent() -> None:
    disk = fresh()
    disk.mkdir(f"{D}/wal")
    fd = disk.open(f"{D}/wal/seg")
    disk.fsync(fd)
    disk.fsync_dir(f"{D}/wal")
    assert not disk.crash_image("strict").exists(f"{D}/wal")
    disk.fsync_dir(D)
    assert disk.crash_image("strict").files() == [f"{D}/wal/seg"]


def test_unknown_ancestors_exist_and_are_durable() -> None:
    disk = SimulatedDisk()
    disk.mkdir("/tmp/pytest-1/store")
    image = disk.crash_image("strict")
    assert image.exists("/tmp/pytest-1") and not image.exists("/tmp/pytest-1/store")
    disk.fsync_dir("/tmp/pytest-1")
    assert disk.crash_image("strict").exists("/tmp/pytest-1/store")


def test_ancestors_below_a_made_directory_are_not_durable() -> None:
    disk = fresh()
    disk.mkdir(f"{D}/a/b")
    disk.fsync_dir(f"{D}/a")
    assert not disk.crash_image("strict").exists(f"{D}/a")


def test_image_is_a_fresh_disk_and_leaves_the_original_alone() -> None:
    disk = fresh()
    fd = durable_file(disk, "f", b"synced")
    disk.pwrite(fd, 0, b"dirty!")
    before = disk.inspect()
    image = disk.crash_image("reorder", seed=3)
    assert disk.inspect() == before
    assert image.op_count == 0 and image.unsynced_count == 0
    assert all(s.volatile == s.durable for s in image.inspect().values())


# -- prefix and reorder ------------------------------------------------------------------------


def three_unsynced_writes() -> tuple[SimulatedDisk, list[tuple[str, int]]]:
    """Durable files a and b of four sectors of zeros, then three one-sector writes."""
    disk = fresh()
    fa = durable_file(disk, "a", bytes(4 * SECTOR))
    fb = durable_file(disk, "b", bytes(4 * SECTOR))
    steps = [("a", 0), ("b", 1), ("a", 2)]
    for (_, sector), fd in zip(steps, (fa, fb, fa), strict=True):
        disk.pwrite(fd, sector * SECTOR, b"\xff" * SECTOR)
    return disk, steps


def applied(image: SimulatedDisk, steps: list[tuple[str, int]]) -> list[bool]:
    out = []
    for name, sector in steps:
        data = content(image, f"{D}/{name}")
        assert data is not None
        out.append(data[sector * SECTOR : (sector + 1) * SECTOR] == b"\xff" * SECTOR)
    return out


def test_prefix_keeps_an_ordered_prefix() -> None:
    disk, steps = three_unsynced_writes()
    seen = {tuple(applied(disk.crash_image("prefix", seed=s), steps)) for s in SEEDS}
    assert seen == {(False,) * 3, (True, False, False), (True, True, False), (True,) * 3}


def test_reorder_keeps_any_subset() -> None:
    disk, steps = three_unsynced_writes()
    seen = {tuple(applied(disk.crash_image("reorder", seed=s), steps)) for s in range(256)}
    assert (False, False, True) in seen and (False, True, False) in seen
    assert {(False,) * 3, (True,) * 3} <= seen


def test_images_lie_between_strict_and_full() -> None:
    disk, _ = three_unsynced_writes()
    strict, full = disk.crash_image("strict").inspect(), disk.inspect()
    for model in ("prefix", "reorder"):
        states = [disk.crash_image(model, seed=s).inspect() for s in SEEDS]
        assert any(st == strict for st in states)
        assert any({p: s.volatile for p, s in st.items()} == {p: s.volatile
                                                             for p, s in full.items()}
                   for st in states)


def test_strict_ignores_the_seed() -> None:
    disk, _ = three_unsynced_writes()
    assert len({str(disk.crash_image("strict", seed=s).inspect()) for s in range(8)}) == 1


def one_unsynced_big_write() -> tuple[SimulatedDisk, bytes, bytes]:
    disk = fresh()
    old = bytes(range(256)) * 8  # four sectors
    new = b"\xaa" * len(old)
    disk.pwrite(durable_file(disk, "f", old), 0, new)
    return disk, old, new


def sector_kinds(data: bytes, old: bytes, new: bytes) -> str:
    """One letter per sector: o(ld), n(ew) or x (neither: zeros or garbage)."""
    out = ""
    for i in range(0, len(old), SECTOR):
        got = data[i : i + SECTOR]
        out += "o" if got == old[i : i + SECTOR] else "n" if got == new[i : i + SECTOR] else "x"
    return out


def test_prefix_tears_the_last_write_at_a_sector_boundary() -> None:
    disk, old, new = one_unsynced_big_write()
    kinds = set()
    for s in SEEDS:
        data = content(disk.crash_image("prefix", seed=s), f"{D}/f")
        assert data is not None
        kinds.add(sector_kinds(data, old, new))
    assert kinds <= {"oooo", "nooo", "nnoo", "nnno", "nnnn"}
    assert {"oooo", "nnnn"} < kinds  # and at least one torn state


def test_reorder_tears_sectors_with_zeros_or_garbage() -> None:
    disk, old, new = one_unsynced_big_write()
    kinds = set()
    zeros = garbage = False
    for s in range(256):
        data = content(disk.crash_image("reorder", seed=s), f"{D}/f")
        assert data is not None and len(data) == len(old)
        kinds.add(sector_kinds(data, old, new))
        for i in range(0, len(old), SECTOR):
            sector = data[i : i + SECTOR]
            if sector not in (old[i : i + SECTOR], new[i : i + SECTOR]):
                zeros |= sector == bytes(SECTOR)
                garbage |= sector != bytes(SECTOR)
    assert {"oooo", "nnnn"} < kinds
    assert any("o" in k and "n" in k for k in kinds)  # sectors of one write kept apart
    assert zeros and garbage


def test_tearing_follows_absolute_sector_boundaries() -> None:
    disk = fresh()
    fd = durable_file(disk, "f", bytes(1024))
    disk.pwrite(fd, 100, b"\xff" * 800)  # touches sectors 0 and 1: pieces 100..512, 512..900
    for s in SEEDS:
        data = content(disk.crash_image("prefix", seed=s), f"{D}/f")
        assert data is not None
        assert data[100:512] in (bytes(412), b"\xff" * 412)
        assert data[512:900] in (bytes(388), b"\xff" * 388)
        assert data[:100] == bytes(100) and data[900:] == bytes(124)


def test_same_seed_same_image_and_seeds_differ() -> None:
    disk, _ = three_unsynced_writes()
    for model in ("prefix", "reorder"):
        once, again = disk.crash_image(model, seed=5), disk.crash_image(model, seed=5)
        assert once.inspect() == again.inspect()
        assert len({str(disk.crash_image(model, seed=s).inspect()) for s in range(16)}) > 1


def test_names_follow_the_models_too() -> None:
    disk = fresh()
    for name in ("a", "b"):
        disk.close(disk.open(f"{D}/{name}"))
    prefix = {tuple(disk.crash_image("prefix", seed=s).files()) for s in SEEDS}
    assert prefix == {(), (f"{D}/a",), (f"{D}/a", f"{D}/b")}
    reorder = {tuple(disk.crash_image("reorder", seed=s).files()) for s in SEEDS}
    assert (f"{D}/b",) in reorder


def test_unknown_model_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown crash model"):
        SimulatedDisk().crash_image("chaos")


# -- power cut now ----------------------------------------------------------------------------


def test_crash_is_a_base_exception() -> None:
    assert issubclass(SimulatedCrash, BaseException)
    assert not issubclass(SimulatedCrash, Exception)


@pytest.mark.parametrize("call", [
    lambda d, fd: d.open(f"{D}/g"),
    lambda d, fd: d.open(f"{D}/f", create=False),
    lambda d, fd: d.pwrite(fd, 0, b"x"),
    lambda d, fd: d.append(fd, b"x"),
    lambda d, fd: d.read(fd),
    lambda d, fd: d.size(fd),
    lambda d, fd: d.truncate(fd, 0),
    lambda d, fd: d.fsync(fd),
    lambda d, fd: d.exists(D),
    lambda d, fd: d.listdir(D),
    lambda d, fd: d.mkdir(f"{D}/sub"),
    lambda d, fd: d.rename(f"{D}/f", f"{D}/g"),
    lambda d, fd: d.unlink(f"{D}/f"),
    lambda d, fd: d.fsync_dir(D),
])
def test_after_crash_every_call_raises(call: Callable[[SimulatedDisk, int], object]) -> None:
    disk = fresh()
    fd = durable_file(disk, "f", b"data")
    with pytest.raises(SimulatedCrash):
        disk.crash()
    assert disk.crashed
    with pytest.raises(SimulatedCrash):
        call(disk, fd)


def test_after_crash_close_is_a_no_op_and_the_image_still_works() -> None:
    disk = fresh()
    fd = durable_file(disk, "f", b"data")
    with pytest.raises(SimulatedCrash):
        disk.crash()
    disk.close(fd)
    assert content(disk.crash_image("strict"), f"{D}/f") == b"data"


def test_crash_at_cuts_power_before_operation_k() -> None:
    disk = fresh()  # operations 0 (mkdir) and 1 (fsync_dir)
    assert disk.op_count == 2
    disk.crash_at(3)
    fd = disk.open(f"{D}/f")  # 2
    with pytest.raises(SimulatedCrash):
        disk.pwrite(fd, 0, b"never")  # 3
    assert disk.inspect()[f"{D}/f"].volatile == b""
    with pytest.raises(SimulatedCrash):
        disk.read(fd)


def test_reads_and_close_are_not_operations() -> None:
    disk = fresh()
    fd = disk.open(f"{D}/f")
    n = disk.op_count
    disk.read(fd)
    disk.size(fd)
    disk.exists(D)
    disk.listdir(D)
    disk.close(disk.open(f"{D}/f", create=False))
    assert disk.op_count == n


def test_hook_sees_every_operation_and_may_crash() -> None:
    seen: list[tuple[int, str, str]] = []

    def hook(index: int, name: str, path: str) -> None:
        seen.append((index, name, path))
        if name == "fsync":
            disk.crash()

    disk = SimulatedDisk(on_op=hook)
    disk.mkdir(D)
    fd = disk.open(f"{D}/f")
    disk.append(fd, b"x")
    with pytest.raises(SimulatedCrash):
        disk.fsync(fd)
    assert seen == [(0, "mkdir", D), (1, "open", f"{D}/f"), (2, "append", f"{D}/f"),
                    (3, "fsync", f"{D}/f")]


# -- injected faults ---------------------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_nth_write_fails(code: int) -> None:
    disk = fresh()
    disk.fail_write(1, code)
    fd = disk.open(f"{D}/f")
    disk.pwrite(fd, 0, b"first")
    assert errno_of(lambda: disk.append(fd, b"second")) == code
    disk.append(fd, b"third")
    assert disk.read(fd) == b"firstthird"
    assert disk.write_count == 3


def test_failed_fsync_drops_dirty_data_but_reads_still_see_it() -> None:
    disk = fresh()
    fd = durable_file(disk, "f", b"A" * 8)  # fsync 0
    disk.fail_fsync(1)
    disk.pwrite(fd, 0, b"BB")
    assert errno_of(lambda: disk.fsync(fd)) == errno.EIO
    assert disk.read(fd) == b"BBAAAAAA"
    assert disk.unsynced_count == 0
    for model in ("strict", "prefix", "reorder"):
        assert content(disk.crash_image(model, seed=1), f"{D}/f") == b"A" * 8
    disk.pwrite(fd, 6, b"CC")
    disk.fsync(fd)  # succeeds: only the later write becomes durable
    assert disk.inspect()[f"{D}/f"] == FileState(f"{D}/f", b"BBAAAACC", b"AAAAAACC")
    assert disk.fsync_count == 3


def test_budget_gives_a_short_write_then_enospc() -> None:
    disk = fresh()
    disk.faults.budget = 1000
    fd = disk.open(f"{D}/f")
    assert disk.pwrite(fd, 0, b"x" * 1500) == 1000
    assert errno_of(lambda: disk.append(fd, b"y")) == errno.ENOSPC
    assert disk.pwrite(fd, 0, b"z" * 1000) == 1000  # overwriting costs nothing
    assert errno_of(lambda: write_all(disk, fd, 900, b"w" * 200)) == errno.ENOSPC
    assert disk.read(fd, 900) == b"w" * 100


def test_budget_counts_live_files_only() -> None:
    disk = fresh()
    disk.faults.budget = 1000
    fd = disk.open(f"{D}/f")
    disk.pwrite(fd, 0, b"x" * 1000)
    disk.unlink(f"{D}/f")
    g = disk.open(f"{D}/g")
    assert errno_of(lambda: disk.pwrite(g, 0, b"y")) == errno.ENOSPC  # f is still open
    disk.close(fd)
    assert disk.pwrite(g, 0, b"y" * 1000) == 1000


def test_fault_plan_at_construction() -> None:
    disk = SimulatedDisk(FaultPlan(write_errors={0: errno.EIO}, crash_at=3))
    disk.mkdir(D)
    fd = disk.open(f"{D}/f")
    assert errno_of(lambda: disk.pwrite(fd, 0, b"x")) == errno.EIO
    with pytest.raises(SimulatedCrash):
        disk.fsync(fd)


def test_flip_changes_the_durable_image() -> None:
    disk = fresh()
    fd = durable_file(disk, "f", b"\x00\x00")
    disk.flip(f"{D}/f", 1, 3)
    assert disk.read(fd) == b"\x00\x08"  # clean file: reads see the medium
    disk.pwrite(fd, 0, b"\x01")
    disk.flip(f"{D}/f", 0, 0)
    assert disk.read(fd) == b"\x01\x08"  # dirty file: reads see the cache
    assert disk.inspect()[f"{D}/f"].durable == b"\x01\x08"
    assert errno_of(lambda: disk.flip(f"{D}/nope", 0, 0)) == errno.ENOENT
    assert errno_of(lambda: disk.flip(f"{D}/f", 2, 0)) == errno.EINVAL


def test_flip_random_is_deterministic() -> None:
    def flipped(seed: int) -> tuple[list[tuple[str, int, int]], bytes | None]:
        disk = fresh()
        durable_file(disk, "f", bytes(100))
        durable_file(disk, "g", bytes(300))
        done = disk.flip_random(5, seed=seed)
        return done, disk.crash_image("strict").inspect()[f"{D}/g"].volatile

    assert flipped(1) == flipped(1)
    assert flipped(1) != flipped(2)
    assert len(flipped(1)[0]) == 5


def test_inspect_reports_both_images() -> None:
    disk = fresh()
    durable_file(disk, "kept", b"k")
    disk.pwrite(disk.open(f"{D}/new"), 0, b"n")
    disk.unlink(f"{D}/kept")
    assert disk.inspect() == {
        f"{D}/kept": FileState(f"{D}/kept", None, b"k"),
        f"{D}/new": FileState(f"{D}/new", b"n", None),
    }
    assert disk.unsynced_count == 3  # link of new, its write, unlink of kept


# -- open_read (blob readers) -----------------------------------------------------------------


def test_open_read_reads_and_refuses_writes() -> None:
    disk = fresh()
    fd = disk.open(f"{D}/f")
    disk.pwrite(fd, 0, b"data")
    ops = disk.op_count
    ro = disk.open_read(f"{D}/f")
    assert disk.op_count == ops  # opening for reading changes nothing
    assert disk.read(ro) == b"data" and disk.size(ro) == 4
    assert errno_of(lambda: disk.pwrite(ro, 0, b"x")) == errno.EBADF
    assert errno_of(lambda: disk.append(ro, b"x")) == errno.EBADF
    assert errno_of(lambda: disk.truncate(ro, 0)) == errno.EINVAL
    assert disk.read(fd) == b"data"
    disk.close(ro)
    assert errno_of(lambda: disk.read(ro)) == errno.EBADF


def test_open_read_errors_and_power_cut() -> None:
    disk = fresh()
    assert errno_of(lambda: disk.open_read(f"{D}/missing")) == errno.ENOENT
    assert errno_of(lambda: disk.open_read(D)) == errno.EISDIR
    assert not disk.exists(f"{D}/missing")
    with pytest.raises(SimulatedCrash):
        disk.crash()
    with pytest.raises(SimulatedCrash):
        disk.open_read(f"{D}/f")


def test_a_read_handle_keeps_an_unlinked_file_readable() -> None:
    disk = fresh()
    fd = disk.open(f"{D}/f")
    disk.pwrite(fd, 0, b"kept")
    ro = disk.open_read(f"{D}/f")
    disk.unlink(f"{D}/f")
    assert disk.read(ro) == b"kept"
