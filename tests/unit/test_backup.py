"""store.backup(dest): a consistent copy, made while commits go on, that opens as the same store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal.io import OsFileSystem
from agentwal.local.wal.frame import parse_header
from agentwal.local.wal.reader import scan_segment
from tests.stores import Built, build

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(str(tmp_path_factory.mktemp("backup") / "base.awal"), tail=3)


def everything(store: agentwal.Store, upto: dict[str, int] | None = None) -> dict[str, Any]:
    """Each run's checkpoints (id, hash, origin) and state at each (up to ``upto[run]``)."""
    out: dict[str, Any] = {}
    for run in store.runs():
        hist = sorted(store.history(run), key=lambda c: c.id)
        if upto is not None:
            hist = [c for c in hist if c.id <= upto.get(run, 0)]
        out[run] = [(c.id, c.hash, c.origin, c.meta, store.state(run, at=c.id)) for c in hist]
    return out


def test_backup_opens_as_the_same_store(base: Built, tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    shutil.copytree(base.path, src)
    dest = str(tmp_path / "backups" / "b1")  # the parent is made
    with agentwal.open(src) as s:  # a writer; the tail is replayed, not folded
        report = s.backup(dest)
        want = everything(s)
        effects = [(e.key, e.status) for e in s.effects()]
        sid = s.store_id
        lsn = s.stats()["visible_lsn"]
    assert report.path == dest and report.lsn == lsn and report.files == 3
    assert report.bytes > 0 and report.seconds >= 0
    assert not os.path.exists(dest + ".tmp")
    assert sorted(os.listdir(dest)) == ["CONTROL", "snapshot", "wal"]
    with agentwal.open(dest, readonly=True) as b:
        assert b.store_id == sid
        assert everything(b) == want
        assert [(e.key, e.status) for e in b.effects()] == effects
        assert b.verify().ok
    with agentwal.open(dest) as b:  # and it takes new commits
        with b.begin("chat") as txn:
            txn["after"] = True
        assert b.head("chat").id == base.head + 1  # type: ignore[union-attr]
        assert b.verify().ok


def test_a_read_only_store_backs_up_too(base: Built, tmp_path: Path) -> None:
    dest = str(tmp_path / "b")
    with agentwal.open(base.path, readonly=True) as s:
        s.backup(dest)
        want = everything(s)
    with agentwal.open(dest, readonly=True) as b:
        assert everything(b) == want and b.verify().ok


def test_the_destination_must_not_exist(base: Built, tmp_path: Path) -> None:
    with agentwal.open(base.path, readonly=True) as s:
        (tmp_path / "there").mkdir()
        with pytest.raises(agentwal.PathExistsError, match="already exists") as e:
            s.backup(tmp_path / "there")
        assert e.value.code == "path_exists"
        (tmp_path / "half.tmp").mkdir()
        with pytest.raises(agentwal.PathExistsError, match="half-made backup"):
            s.backup(str(tmp_path / "half"))
        with pytest.raises(ValueError, match="inside the store"):
            s.backup(os.path.join(base.path, "wal", "copy"))
    assert not (tmp_path / "half").exists()


def test_blobs_are_copied(base: Built, tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    shutil.copytree(base.path, src)
    blobs = Path(src, "blobs")
    (blobs / "ab").mkdir(parents=True)
    (blobs / "ab" / "abcdef").write_bytes(b"x" * 3_000_000)
    (blobs / "top").write_bytes(b"t")
    (blobs / "ab" / "incoming.tmp").write_bytes(b"half")
    dest = tmp_path / "b"
    with agentwal.open(src, readonly=True) as s:
        report = s.backup(dest)
    assert (dest / "blobs" / "ab" / "abcdef").read_bytes() == b"x" * 3_000_000
    assert (dest / "blobs" / "top").read_bytes() == b"t"
    assert not (dest / "blobs" / "ab" / "incoming.tmp").exists()
    assert report.files == 5 and report.bytes > 3_000_000


def test_a_damaged_log_is_refused_and_nothing_is_published(path: str, tmp_path: Path) -> None:
    with agentwal.open(path, durability="sync") as s:
        for i in range(5):
            with s.begin("r") as txn:
                txn["i"] = i
        wal = Path(path, "wal")
        seg = wal / sorted(n for n in os.listdir(wal) if n.endswith(".wal"))[-1]
        data = bytearray(seg.read_bytes())
        data[64 + 40] ^= 0x01  # inside the first frame
        seg.write_bytes(bytes(data))
        with pytest.raises(agentwal.CorruptionError, match="wal"):
            s.backup(tmp_path / "b")
        data[64 + 40] ^= 0x01
        seg.write_bytes(bytes(data))
    assert not (tmp_path / "b").exists() and (tmp_path / "b.tmp").exists()


def test_backup_during_concurrent_commits(path: str, tmp_path: Path) -> None:
    """Threads commit (and folds run) while a writer makes backups: each backup holds every
    commit acknowledged before its call, and every checkpoint it holds is the source's."""
    s = agentwal.open(path, durability="none", segment_bytes=1 << 13, wal_max_bytes=1 << 15)
    acked: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(run: str) -> None:
        try:
            while not stop.is_set():
                with s.begin(run) as txn:
                    n = txn.get("n", 0) + 1
                    txn["n"] = n
                    txn["log"] = [*txn.get("log", []), f"{run}:{n}" * 20][-30:]
                    if n % 7 == 0:
                        txn.defer("ping", mode="at_least_once", args={"n": n})
                assert txn.checkpoint is not None
                with lock:
                    acked[run] = txn.checkpoint.id
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=writer, args=(f"r{k}",)) for k in range(4)]
    for t in pool:
        t.start()
    made = []
    try:
        deadline = time.monotonic() + 60  # every run exists before the first backup (under load
        while len(acked) < 4 and time.monotonic() < deadline:  # 0.2 s was not always enough)
            time.sleep(0.01)
        time.sleep(0.2)
        for i in range(4):
            with lock:
                before = dict(acked)
            dest = str(tmp_path / f"b{i}")
            s.backup(dest)
            made.append((dest, before))
            time.sleep(0.1)
    finally:
        stop.set()
        for t in pool:
            t.join()
    assert not errors, errors
    assert s.stats()["folds"] >= 1
    for dest, before in made:
        with agentwal.open(dest, readonly=True) as b:
            heads = {r: b.head(r).id for r in b.runs()}  # type: ignore[union-attr]
            assert all(heads.get(r, 0) >= n for r, n in before.items()), (heads, before)
            assert everything(b) == everything(s, heads)
            report = b.verify()
            assert report.ok, report.problems
    s.close()


WRITER = textwrap.dedent(r"""
    import os, sys, agentwal
    path, acked = sys.argv[1], sys.argv[2]
    s = agentwal.open(path, durability="sync", segment_bytes=4096, wal_max_bytes=1 << 14)
    n = 0
    while not os.path.exists(acked + ".stop"):
        n += 1
        with s.begin("w") as txn:
            txn["n"] = n
            txn["v"] = os.urandom(8).hex() * (1 + n % 40)
        with open(acked + ".new", "w") as f:
            f.write(str(n))
        os.replace(acked + ".new", acked)
    s.close()
""")


def test_backup_from_another_process_while_a_writer_folds(tmp_path: Path) -> None:
    """A read-only store copies the log first and LMDB after: the writer folds and removes
    segments meanwhile, and every backup still opens with every acknowledged commit."""
    path, acked = str(tmp_path / "s"), str(tmp_path / "acked")
    child = subprocess.Popen([sys.executable, "-c", WRITER, path, acked],
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    results = []
    try:
        while not os.path.exists(acked):
            time.sleep(0.01)
        for i in range(8):
            before = int(Path(acked).read_text())
            dest = str(tmp_path / f"b{i}")
            with agentwal.open(path, readonly=True) as ro:
                ro.backup(dest)
            results.append((dest, before))
            time.sleep(0.05)
    finally:
        Path(acked + ".stop").write_text("")
        assert child.wait(timeout=60) == 0
    with agentwal.open(path, readonly=True) as src:
        want = {c.id: src.state("w", at=c.id) for c in src.history("w")}
    assert min(os.listdir(os.path.join(path, "wal"))) > f"{1:020d}", "no segment was removed"
    torn = 0
    for dest, before in results:
        with agentwal.open(dest, readonly=True) as b:
            torn += b.stats()["recovery"]["torn_bytes"] > 0
        with agentwal.open(dest) as b:  # a writer: repairs a torn tail, like after a crash
            head = b.head("w")
            assert head is not None and head.id >= before, (head, before)
            assert all(b.state("w", at=c) == want[c] for c in range(1, head.id + 1))
            report = b.verify()
            assert report.ok, json.dumps([str(p) for p in report.problems])
    print(f"\n{len(results)} backups of a store a child commits to, {torn} with a torn tail, "
          f"{len(want)} commits in all")


class TornReads(OsFileSystem):
    """Reads of one segment see a frame in its middle still zeroed ``left`` more times:
    what copying a segment under a writer can catch (a later batch read whole, an earlier
    one not yet), which the reader calls damage, since the later frame proves it durable."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.left = 0
        self.fds: dict[int, str] = {}

    def open(self, path: str, create: bool = True) -> int:
        fd = super().open(path, create)
        self.fds[fd] = path
        return fd

    def read(self, fd: int, offset: int = 0, n: int | None = None) -> bytes:
        data = super().read(fd, offset, n)
        if self.fds.get(fd) == self.target and self.left > 0 and offset == 0:
            self.left -= 1
            header = parse_header(data)
            assert not isinstance(header, str)
            f = scan_segment(data, header).frames[3]
            data = data[:f.offset] + bytes(f.end - f.offset) + data[f.end:]
        return data


@pytest.mark.parametrize("torn_reads,ok", [(1, True), (4, True), (5, False)])
def test_a_segment_caught_mid_write_is_copied_again(path: str, tmp_path: Path,
                                                    torn_reads: int, ok: bool) -> None:
    with agentwal.open(path, durability="sync") as s:
        for i in range(8):
            with s.begin("r") as txn:
                txn["i"] = i
    wal = os.path.join(path, "wal")
    fs = TornReads(os.path.join(wal, sorted(n for n in os.listdir(wal) if n.endswith(".wal"))[-1]))
    with agentwal.open(path, readonly=True, fs=fs) as ro:
        fs.left = torn_reads
        if ok:
            ro.backup(tmp_path / "b")
        else:
            with pytest.raises(agentwal.CorruptionError, match="is damaged, but record"):
                ro.backup(tmp_path / "b")
    assert fs.left == 0
    if ok:
        with agentwal.open(tmp_path / "b", readonly=True) as b:
            assert b.state("r") == {"i": 7} and b.verify().ok


def test_a_store_on_a_simulated_disk_backs_up_to_the_os(tmp_path: Path) -> None:
    """The log is read through the store's file system; the backup is a real directory."""
    from agentwal.testing import SimulatedDisk

    disk = SimulatedDisk()
    path = str(tmp_path / "sim")
    with agentwal.open(path, fs=disk, durability="sync", segment_bytes=65536) as s:
        for i in range(5):
            with s.begin("r") as txn:
                txn["i"] = i
        s.snapshot()
        with s.begin("r") as txn:
            txn["i"] = 99  # in the simulated log only
        s.backup(tmp_path / "b")
    assert not os.path.exists(os.path.join(path, "wal"))  # the log never touched the OS
    with agentwal.open(tmp_path / "b", readonly=True) as b:
        assert b.state("r") == {"i": 99} and b.state("r", at=5) == {"i": 4}
        assert b.verify().ok
