"""blobs.py: writing, pinning, reading and sweeping blob files through the seam."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentwal import failpoints
from agentwal.errors import BlobSourceError, CorruptionError, DiskFullError, DurabilityError
from agentwal.io import OsFileSystem
from agentwal.local import blobs
from agentwal.local.blobs import BlobMissing, BlobStore, Gate, blob_path
from agentwal.testing import FaultPlan, SimulatedDisk
from agentwal.types import BlobRef

S = "/s"
ROOT = "/s/blobs"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sim(faults: FaultPlan | None = None, **kw: Any) -> tuple[SimulatedDisk, BlobStore]:
    disk = SimulatedDisk(faults, **kw)
    disk.mkdir(S)
    disk.fsync_dir("/")
    return disk, BlobStore(disk, S, "blobs")


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobs, "CHUNK", 1000)


class Trickle(io.RawIOBase):
    """A stream returning at most ``step`` bytes per read, optionally failing at ``fail_at``."""

    def __init__(self, data: bytes, step: int = 7, fail_at: int | None = None) -> None:
        self.data, self.pos, self.step, self.fail_at = data, 0, step, fail_at
        self.reads = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        self.reads += 1
        if self.fail_at is not None and self.pos >= self.fail_at:
            raise ConnectionResetError("peer went away")
        out = self.data[self.pos:self.pos + min(n, self.step)]
        self.pos += len(out)
        return out


def blob_files(disk: SimulatedDisk) -> list[str]:
    return [p for p in disk.files() if p.startswith(ROOT + "/") and "/tmp/" not in p]


def temp_files(disk: SimulatedDisk) -> list[str]:
    return [p for p in disk.files() if p.startswith(ROOT + "/tmp/")]


# -- the gate ----------------------------------------------------------------------------


def until(cond: Any, timeout: float = 10.0) -> None:
    """Wait until ``cond()`` is true (another thread reached a point)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_gate_shares_and_excludes() -> None:
    gate = Gate()
    events: list[str] = []
    with gate.shared(), gate.shared():  # holders share it (not reentrant: two holders)
        t = threading.Thread(target=lambda: _exclusive(gate, events))
        t.start()
        time.sleep(0.05)
        assert events == []  # the sweep waits for the shared holders
        events.append("shared done")
    t.join()
    assert events == ["shared done", "exclusive"]


def _exclusive(gate: Gate, events: list[str]) -> None:
    with gate.exclusive():
        events.append("exclusive")


def test_gate_makes_new_sharers_wait_behind_an_exclusive_request() -> None:
    gate = Gate()
    order: list[str] = []
    first = gate.shared()
    first.__enter__()
    sweeper = threading.Thread(target=lambda: _exclusive(gate, order))
    sweeper.start()
    until(lambda: gate._writers == 1)

    def late() -> None:
        with gate.shared():
            order.append("late")

    latecomer = threading.Thread(target=late)
    latecomer.start()
    until(lambda: gate._waiting == 1)
    assert order == []
    first.__exit__(None, None, None)
    sweeper.join()
    latecomer.join()
    assert order == ["exclusive", "late"]


def test_gate_lets_waiting_sharers_in_between_exclusive_holders() -> None:
    """A thread sweeping back to back must not starve a commit waiting at the gate."""
    gate = Gate()
    stop = threading.Event()
    sweeps = [0]

    def sweeper() -> None:
        while not stop.is_set():
            with gate.exclusive():
                sweeps[0] += 1
                time.sleep(0.001)

    t = threading.Thread(target=sweeper)
    t.start()
    try:
        time.sleep(0.02)
        entered = 0
        deadline = time.monotonic() + 5
        while entered < 20 and time.monotonic() < deadline:
            with gate.shared():
                entered += 1
        assert entered == 20
    finally:
        stop.set()
        t.join()
    assert sweeps[0] > 0


# -- writing -------------------------------------------------------------------------------


def test_put_streams_into_a_durable_file_named_by_its_hash(small_chunks: None) -> None:
    disk, bs = sim()
    data = os.urandom(4321)
    ref = bs.put(io.BytesIO(data), "application/x-test")
    assert ref == BlobRef(sha(data), 4321, "application/x-test")
    path = blob_path(ROOT, ref.sha256)
    assert path == f"{ROOT}/{ref.sha256[:2]}/{ref.sha256[2:]}"
    state = disk.inspect()[path]
    assert state.volatile == data and state.durable == data  # durable when put returns
    assert temp_files(disk) == []
    assert bs.pinned() == {ref.sha256}
    bs.unpin([ref.sha256])
    assert bs.pinned() == set()


def test_put_syncs_before_naming_and_names_before_returning(small_chunks: None) -> None:
    seen: list[tuple[str, str]] = []
    disk, bs = sim(on_op=lambda _i, name, path: seen.append((name, path)))
    del seen[:]
    ref = bs.put(io.BytesIO(b"x" * 2500))
    fan = f"{ROOT}/{ref.sha256[:2]}"
    names = [n for n, _p in seen]
    # the directories are made and made durable first (once per process)
    assert ("mkdir", ROOT) in seen and ("fsync_dir", S) in seen and ("mkdir", fan) in seen
    body = names[names.index("open"):]
    assert body == ["open", "pwrite", "pwrite", "pwrite", "fsync", "mkdir", "fsync_dir",
                    "rename", "fsync_dir"]
    assert seen[-1] == ("fsync_dir", fan)
    del seen[:]
    bs.put(io.BytesIO(b"y"))
    assert ("mkdir", ROOT) not in seen  # known durable now
    assert disk.inspect()[blob_path(ROOT, ref.sha256)].durable == b"x" * 2500


def test_identical_content_is_stored_once() -> None:
    disk, bs = sim()
    data = b"same bytes" * 100
    a = bs.put(io.BytesIO(data))
    ops: list[str] = []
    disk.on_op = lambda _i, name, _p: ops.append(name)
    b = bs.put(io.BytesIO(data), "text/plain")
    assert a.sha256 == b.sha256 and b.media_type == "text/plain"
    assert "rename" not in ops and "unlink" in ops  # the temp file was dropped
    assert ops[-1] == "fsync_dir"  # the name is made durable anyway
    assert len(blob_files(disk)) == 1 and temp_files(disk) == []
    assert bs.pinned() == {a.sha256}
    bs.unpin([a.sha256])
    assert bs.pinned() == {a.sha256}  # pinned twice, once per put
    bs.unpin([a.sha256])
    assert bs.pinned() == set()


def test_a_damaged_file_of_another_size_is_replaced_by_the_new_copy() -> None:
    disk, bs = sim()
    data = b"artifact" * 64
    ref = bs.put(io.BytesIO(data))
    path = blob_path(ROOT, ref.sha256)
    fd = disk.open(path)
    disk.truncate(fd, 10)
    disk.close(fd)
    bs.put(io.BytesIO(data))
    assert disk.inspect()[path].volatile == data


def test_put_from_a_path_and_from_short_reads(tmp_path: Path, small_chunks: None) -> None:
    disk, bs = sim()
    data = os.urandom(3000)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    assert bs.put(src).sha256 == sha(data)  # PathLike
    assert bs.put(str(src)).sha256 == sha(data)
    stream = Trickle(data, step=7)
    assert bs.put(stream) == BlobRef(sha(data), 3000)
    assert stream.reads > 400  # every short read was taken, up to the empty one
    assert len(blob_files(disk)) == 1


def test_short_writes_are_finished(tmp_path: Path) -> None:
    class Short(OsFileSystem):
        def pwrite(self, fd: int, offset: int, data: bytes) -> int:
            return super().pwrite(fd, offset, data[:100])

    bs = BlobStore(Short(), str(tmp_path), "blobs")
    data = os.urandom(1234)
    ref = bs.put(io.BytesIO(data))
    assert Path(blob_path(str(tmp_path / "blobs"), ref.sha256)).read_bytes() == data


def test_an_empty_source_is_an_empty_blob() -> None:
    disk, bs = sim()
    ref = bs.put(io.BytesIO(b""))
    assert ref == BlobRef(sha(b""), 0)
    assert disk.inspect()[blob_path(ROOT, ref.sha256)].durable == b""


def test_put_accepts_bytearray_and_memoryview_chunks() -> None:
    class Views:
        def __init__(self) -> None:
            self.parts = [bytearray(b"ab"), memoryview(b"cd"), b""]

        def read(self, n: int) -> Any:
            return self.parts.pop(0)

    _disk, bs = sim()
    assert bs.put(Views()).sha256 == sha(b"abcd")


@pytest.mark.parametrize(("source", "match"), [
    (io.StringIO("text"), "text stream"),
    ("/definitely/not/here", "No such file"),
])
def test_unreadable_sources_are_blob_source_errors(source: Any, match: str) -> None:
    disk, bs = sim()
    with pytest.raises(BlobSourceError, match=match):
        bs.put(source)
    assert blob_files(disk) == [] and temp_files(disk) == [] and bs.pinned() == set()


def test_a_directory_source(tmp_path: Path) -> None:
    _disk, bs = sim()
    with pytest.raises(BlobSourceError) as info:
        bs.put(tmp_path)
    assert isinstance(info.value.__cause__, IsADirectoryError)


@pytest.mark.parametrize(("chunk", "match"), [
    ("str", "returned str"),
    (None, "returned None"),
    (17, "returned int"),
])
def test_a_stream_returning_no_bytes_is_refused(chunk: Any, match: str) -> None:
    class Odd:
        def read(self, n: int) -> Any:
            return chunk

    disk, bs = sim()
    with pytest.raises(BlobSourceError, match=match):
        bs.put(Odd())
    assert temp_files(disk) == []


def test_a_stream_that_raises_midway_leaves_nothing(small_chunks: None) -> None:
    disk, bs = sim()
    with pytest.raises(BlobSourceError, match="ConnectionResetError") as info:
        bs.put(Trickle(os.urandom(5000), step=1000, fail_at=3000))
    assert isinstance(info.value.__cause__, ConnectionResetError)
    assert blob_files(disk) == [] and temp_files(disk) == [] and bs.pinned() == set()


@pytest.mark.parametrize("source", [42, b"raw bytes", object()])
def test_sources_of_no_accepted_kind_are_type_errors(source: Any) -> None:
    _disk, bs = sim()
    with pytest.raises(TypeError, match=r"path .* binary stream"):
        bs.put(source)


def test_bytes_get_a_hint() -> None:
    _disk, bs = sim()
    with pytest.raises(TypeError, match=r"io\.BytesIO"):
        bs.put(b"x")


def test_a_full_disk_is_disk_full_and_removes_the_temp_file(small_chunks: None) -> None:
    disk, bs = sim()
    bs.put(io.BytesIO(b"warm up the directories"))
    disk.faults.budget = sum(len(disk.inspect()[p].volatile or b"") for p in disk.files()) + 2500
    with pytest.raises(DiskFullError, match="nothing was stored") as info:
        bs.put(io.BytesIO(os.urandom(10_000)))
    assert "/tmp/" in info.value.path
    assert len(blob_files(disk)) == 1 and temp_files(disk) == []


def test_a_write_error_is_a_durability_error() -> None:
    disk, bs = sim()
    disk.fail_write(disk.write_count, errno.EIO)
    with pytest.raises(DurabilityError, match="cannot write a blob file"):
        bs.put(io.BytesIO(b"data"))
    assert temp_files(disk) == []


def test_a_failed_fsync_is_a_durability_error() -> None:
    disk, bs = sim()
    disk.fail_fsync(disk.fsync_count)
    with pytest.raises(DurabilityError, match="cannot sync a blob file"):
        bs.put(io.BytesIO(b"data"))
    assert blob_files(disk) == [] and temp_files(disk) == [] and bs.pinned() == set()


def test_a_failed_directory_sync_unpins(tmp_path: Path) -> None:
    class BadDirSync(OsFileSystem):
        fail = False

        def fsync_dir(self, path: str) -> None:
            if self.fail and path.endswith("/" + sha(b"b")[:2]):
                raise OSError(errno.EIO, "I/O error", path)
            super().fsync_dir(path)

    fs = BadDirSync()
    bs = BlobStore(fs, str(tmp_path), "blobs")
    bs.put(io.BytesIO(b"a"))
    fs.fail = True
    with pytest.raises(DurabilityError, match="cannot sync a blob directory"):
        bs.put(io.BytesIO(b"b"))
    assert bs.pinned() == {sha(b"a")}
    assert sha(b"b") in bs.files()  # named, never referenced: garbage


def test_failpoints_mark_each_window() -> None:
    _disk, bs = sim()
    failpoints.count_hits()
    bs.put(io.BytesIO(b"x"))
    assert {k: v for k, v in failpoints.hits().items() if k.startswith("blob_")} == {
        "blob_after_write": 1, "blob_after_fsync": 1, "blob_after_rename": 1,
        "blob_after_sync": 1}


def test_a_raising_failpoint_after_rename_leaves_garbage_but_no_pin() -> None:
    disk, bs = sim()
    failpoints.arm("blob_after_rename")
    with pytest.raises(failpoints.FailpointFired):
        bs.put(io.BytesIO(b"x"))
    assert len(blob_files(disk)) == 1 and bs.pinned() == set()
    assert bs.sweep(set) == (1, 1)
    assert blob_files(disk) == []


# -- many small blobs at once (a snapshot's objects) ------------------------------------


def test_put_many_stores_each_durably_and_pins_it_once() -> None:
    disk, bs = sim()
    old = bs.put(io.BytesIO(b"present"))  # stored once: not written again
    items = [(sha(d), d) for d in (b"a", b"b", b"c" * 5000, b"present")]
    failpoints.count_hits()
    bs.put_many(items)
    assert failpoints.hits()["blob_after_write"] == 4  # (the present one's temp is dropped)
    assert bs._pins == {**{h: 1 for h, _d in items}, old.sha256: 2}
    assert temp_files(disk) == []
    after = disk.crash_image("strict")  # a power cut now: every one of them is there
    for h, d in items:
        path = blob_path(ROOT, h)
        fd = after.open_read(path)
        assert after.read(fd) == d
        after.close(fd)


@pytest.mark.parametrize("point", ["blob_after_write", "blob_after_rename"])
def test_put_many_that_fails_pins_nothing_and_leaves_no_temp_file(point: str) -> None:
    disk, bs = sim()
    items = [(sha(d), d) for d in (b"a", b"b", b"c")]
    failpoints.arm(point, nth=2)
    with pytest.raises(failpoints.FailpointFired):
        bs.put_many(items)
    assert bs.pinned() == set() and temp_files(disk) == [] and bs._unsynced == {}
    bs.sweep(set)  # what was named is garbage
    assert blob_files(disk) == []
    bs.put_many(items)  # and a second try stores them all
    assert sorted(bs.pinned()) == sorted(h for h, _d in items)


def test_put_many_with_a_failed_directory_sync_is_a_durability_error() -> None:
    disk, bs = sim()
    items = [(sha(d), d) for d in (b"a", b"b")]
    bs._ensure_dir(ROOT, S)
    bs._ensure_dir(bs.tmp_dir, ROOT)
    for h, _d in items:
        bs._ensure_dir(os.path.dirname(blob_path(ROOT, h)), ROOT)
    fsyncs = [0]
    real = disk.fsync_dir

    def failing(path: str) -> None:
        fsyncs[0] += 1
        if path != ROOT and path != bs.tmp_dir:
            raise OSError(errno.EIO, "I/O error", path)
        real(path)

    disk.fsync_dir = failing  # type: ignore[method-assign]
    with pytest.raises(DurabilityError, match="cannot sync a blob directory"):
        bs.put_many(items)
    assert bs.pinned() == set() and bs._unsynced == {}


# -- linking an existing blob ----------------------------------------------------------


def test_a_blob_ref_source_pins_the_existing_file() -> None:
    disk, bs = sim()
    ref = bs.put(io.BytesIO(b"weights"), "a/b")
    bs.unpin([ref.sha256])
    ops = disk.op_count
    again = bs.put(ref)
    assert again == ref and bs.pinned() == {ref.sha256}
    assert disk.op_count - ops == 1  # only the directory fsync: nothing copied
    assert bs.put(ref, "c/d").media_type == "c/d"


def test_a_blob_ref_of_no_blob_here() -> None:
    _disk, bs = sim()
    with pytest.raises(BlobSourceError, match="no blob with that hash"):
        bs.put(BlobRef(sha(b"elsewhere"), 9))
    assert bs.pinned() == set()


def test_a_blob_ref_whose_file_has_another_size() -> None:
    _disk, bs = sim()
    ref = bs.put(io.BytesIO(b"12345"))
    with pytest.raises(CorruptionError, match="5 bytes"):
        bs.put(BlobRef(ref.sha256, 6))


# -- reading -----------------------------------------------------------------------------


@pytest.fixture
def stored() -> Iterator[tuple[SimulatedDisk, BlobStore, BlobRef, bytes]]:
    disk, bs = sim()
    data = os.urandom(3 * 1000 + 17)
    ref = bs.put(io.BytesIO(data))
    yield disk, bs, ref, data


def test_read_to_the_end_verifies(stored: Any, small_chunks: None) -> None:
    _disk, bs, ref, data = stored
    with bs.open(ref) as f:
        assert f.readable() and not f.writable() and f.seekable()
        assert f.read(10) == data[:10]
        assert f.read() == data[10:]
        assert f.read() == b"" and f.read(5) == b""
        assert f.tell() == len(data)
        assert f.ref == ref and f.name == blob_path(ROOT, ref.sha256)
    assert f.closed
    with pytest.raises(ValueError, match="closed"):
        f.read(1)


def test_readinto_copyfileobj_and_buffered(stored: Any) -> None:
    _disk, bs, ref, data = stored
    with bs.open(ref) as f:
        buf = bytearray(100)
        assert f.readinto(buf) == 100 and bytes(buf) == data[:100]
        out = io.BytesIO()
        shutil.copyfileobj(f, out)
        assert out.getvalue() == data[100:]
    with io.BufferedReader(bs.open(ref)) as b:
        assert b.read() == data


def test_seek_and_verify(stored: Any) -> None:
    _disk, bs, ref, data = stored
    with bs.open(ref) as f:
        assert f.seek(-5, io.SEEK_END) == len(data) - 5
        assert f.read() == data[-5:]  # out of order: not hashed, not judged
        assert f.seek(0) == 0
        assert f.read() == data  # in order from 0: hashed and checked
        f.verify()
        assert f.seek(3, io.SEEK_CUR) == len(data) + 3
        assert f.read(1) == b""
        with pytest.raises(ValueError):
            f.seek(-1)
        with pytest.raises(ValueError):
            f.seek(0, 7)


def test_a_flipped_byte_is_reported_when_the_end_is_read(stored: Any) -> None:
    disk, bs, ref, data = stored
    path = blob_path(ROOT, ref.sha256)
    disk.flip(path, 1234, 0)
    with bs.open(ref) as f:
        assert f.read(2000) != data[:2000]  # not judged before the end
        with pytest.raises(CorruptionError, match="SHA-256") as info:
            f.read()
        assert info.value.path == path
        with pytest.raises(CorruptionError):
            f.read(1)  # stays failed
        with pytest.raises(CorruptionError, match="SHA-256"):
            f.verify()
    with bs.open(ref, verify=False) as f:
        assert len(f.read()) == len(data)  # reading without verification


def test_a_truncated_file_is_reported_at_open(stored: Any) -> None:
    disk, bs, ref, _data = stored
    path = blob_path(ROOT, ref.sha256)
    fd = disk.open(path)
    disk.truncate(fd, 100)
    disk.close(fd)
    with pytest.raises(CorruptionError, match="100 bytes; its reference says 3017"):
        bs.open(ref)


def test_a_file_shrinking_after_open_is_reported(stored: Any) -> None:
    disk, bs, ref, _data = stored
    with bs.open(ref) as f:
        fd = disk.open(f.name)
        disk.truncate(fd, 100)
        with pytest.raises(CorruptionError, match="ends at 100"):
            f.read()


def test_a_missing_file_is_blob_missing(stored: Any) -> None:
    disk, bs, ref, _data = stored
    disk.unlink(blob_path(ROOT, ref.sha256))
    with pytest.raises(BlobMissing) as info:
        bs.open(ref)
    assert info.value.path == blob_path(ROOT, ref.sha256)


def test_an_empty_blob_reads_and_verifies() -> None:
    _disk, bs = sim()
    ref = bs.put(io.BytesIO(b""))
    with bs.open(ref) as f:
        assert f.read() == b""
    bad = BlobRef(sha(b"not empty"), 0)
    with pytest.raises(BlobMissing):
        bs.open(bad)


def test_readers_work_on_the_os_file_system(tmp_path: Path) -> None:
    bs = BlobStore(OsFileSystem(), str(tmp_path), "blobs")
    data = os.urandom(5000)
    ref = bs.put(io.BytesIO(data))
    path = blob_path(str(tmp_path / "blobs"), ref.sha256)
    assert Path(path).read_bytes() == data
    with bs.open(ref) as f:
        os.unlink(path)  # an open stream survives the removal of its file
        assert f.read() == data


# -- sweeping -----------------------------------------------------------------------------


def test_sweep_removes_what_is_neither_referenced_nor_pinned() -> None:
    disk, bs = sim()
    keep, drop, pinned = (bs.put(io.BytesIO(x)) for x in (b"keep", b"drop!", b"pinned"))
    bs.unpin([keep.sha256, drop.sha256])
    assert bs.sweep(lambda: {keep.sha256}) == (1, 5)
    assert sorted(bs.files()) == sorted([keep.sha256, pinned.sha256])
    assert blob_path(ROOT, drop.sha256) not in disk.files()
    # the directory it changed is durable without the file: gone from both images
    assert blob_path(ROOT, drop.sha256) not in disk.inspect()
    bs.unpin([pinned.sha256])
    assert bs.sweep(set, keep=[pinned.sha256]) == (1, 4)
    assert list(bs.files()) == [pinned.sha256]


def test_sweep_removes_stale_temp_files_and_ignores_strangers() -> None:
    disk, bs = sim()
    bs.put(io.BytesIO(b"x"))
    for name in (f"{ROOT}/tmp/dead.tmp", f"{ROOT}/README", f"{ROOT}/ab/not-a-hash",
                 f"{ROOT}/zz/{'0' * 62}"):
        disk.mkdir(os.path.dirname(name))
        disk.close(disk.open(name))
    assert bs.sweep(lambda: {sha(b"x")}) == (1, 0)
    assert f"{ROOT}/tmp/dead.tmp" not in disk.files()
    for name in (f"{ROOT}/README", f"{ROOT}/ab/not-a-hash", f"{ROOT}/zz/{'0' * 62}"):
        assert name in disk.files()


def test_sweep_spares_the_temp_file_of_a_write_in_progress(small_chunks: None) -> None:
    disk, bs = sim()
    swept: list[tuple[int, int]] = []

    class SweepMidway(Trickle):
        def read(self, n: int = -1) -> bytes:
            if self.pos == 2000 and not swept:
                assert len(temp_files(disk)) == 1
                swept.append(bs.sweep(set))
            return super().read(n)

    ref = bs.put(SweepMidway(os.urandom(5000), step=1000))
    assert swept == [(0, 0)]
    assert list(bs.files()) == [ref.sha256]


def test_a_failing_reference_scan_removes_nothing() -> None:
    _disk, bs = sim()
    ref = bs.put(io.BytesIO(b"x"))
    bs.unpin([ref.sha256])

    def boom() -> set[str]:
        raise CorruptionError("/s/snapshot/data.mdb", None, "damaged")

    with pytest.raises(CorruptionError):
        bs.sweep(boom)
    assert list(bs.files()) == [ref.sha256]


def test_a_put_racing_a_sweep_keeps_its_file() -> None:
    """The sweep's reference scan runs while another thread names a new blob.

    Without the gate the put would rename and pin during the scan, after the
    sweep read the pins, and the sweep would remove the file it just named.
    """
    _disk, bs = sim()
    bs.put(io.BytesIO(b"warm"))  # make the directories
    bs.unpin([sha(b"warm")])
    done: list[BlobRef] = []
    t = threading.Thread(target=lambda: done.append(bs.put(io.BytesIO(b"racer"))))

    def scan() -> set[str]:
        t.start()
        until(lambda: bs.gate._waiting == 1)  # the racer wrote its temp file, waits at the gate
        return set()

    assert bs.sweep(scan) == (1, 4)  # "warm" only
    t.join()
    assert done and list(bs.files()) == [done[0].sha256]
    assert bs.pinned() == {done[0].sha256}


def test_an_abandoned_pin_is_dropped_at_the_next_sweep() -> None:
    _disk, bs = sim()
    ref = bs.put(io.BytesIO(b"x"))
    bs.abandon([ref.sha256])
    assert bs.sweep(set) == (1, 1)


def test_sweep_of_a_store_without_blobs() -> None:
    _disk, bs = sim()
    assert bs.sweep(set) == (0, 0)
    assert bs.files() == {}


def test_a_failed_removal_is_a_durability_error(tmp_path: Path) -> None:
    disk, bs = sim()
    ref = bs.put(io.BytesIO(b"x"))
    bs.unpin([ref.sha256])
    disk.crash_at(disk.op_count)  # the unlink never happens
    with pytest.raises(BaseException, match="power cut"):
        bs.sweep(set)

    class NoUnlink(OsFileSystem):
        def unlink(self, path: str) -> None:
            raise OSError(errno.EACCES, "Permission denied", path)

    bs2 = BlobStore(NoUnlink(), str(tmp_path), "blobs")
    ref = bs2.put(io.BytesIO(b"y"))
    bs2.unpin([ref.sha256])
    with pytest.raises(DurabilityError, match="cannot sweep blobs"):
        bs2.sweep(set)
