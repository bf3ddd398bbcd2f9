"""Blobs: MB/s of ``put_blob`` and ``open_blob`` for a large artifact, beside a plain copy.

The workload: one incompressible artifact (256 MiB by default, ``--mib``)
in a file on the benchmark disk. Each round, interleaved, best and median
of ``--rounds``:

- ``copy + fsync``: read the source 1 MiB at a time, write a new file,
  fdatasync it (what any durable copy must at least do);
- ``copy + sha256 + fsync``: the same, hashing as it copies (what put_blob
  must do, without agentwal);
- ``put_blob + commit``: a fresh store each round (so nothing is deduped;
  opened, and a 1-byte blob put, before the clock starts, so its
  directories exist), ``txn.put_blob(key, path)`` and the commit, in
  ``sync`` mode;
- ``read + sha256``: read the blob file and hash it, no agentwal;
- ``open_blob``: read the blob back to the end through ``store.open_blob``
  (which checks its SHA-256), 1 MiB reads;
- the two reads again after evicting the file from the page cache
  (``posix_fadvise(DONTNEED)``), ``cold``.

Run as a script for the figures (``python bench/test_bench_blobs.py
[--mib 256] [--rounds 5]``) or with pytest-benchmark
(``pytest bench/test_bench_blobs.py --benchmark-only``, 32 MiB).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pytest

import agentwal

MIB = 1 << 20


def make_source(path: str, size: int) -> None:
    """An incompressible file of ``size`` bytes, written 1 MiB at a time."""
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
        f.write(os.urandom(size % MIB))
        f.flush()
        os.fsync(f.fileno())


def copy_fsync(src: str, dst: str, *, digest: bool = False) -> str:
    h = hashlib.sha256()
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        while chunk := fin.read(MIB):
            if digest:
                h.update(chunk)
            fout.write(chunk)
        os.fdatasync(fout.fileno())
    return h.hexdigest()


def read_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def put_blob(store: agentwal.Store, src: str) -> agentwal.BlobRef:
    with store.begin("run") as txn:
        ref = txn.put_blob("artifact", src)
    return ref


def open_blob(store: agentwal.Store) -> int:
    n = 0
    with store.open_blob("run", "artifact") as f:
        while chunk := f.read(MIB):
            n += len(chunk)
    return n


def evict(path: str) -> None:
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(root: str, size: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per operation, per round."""
    src = os.path.join(root, "artifact.bin")
    make_source(src, size)
    want = read_sha(src)
    times: dict[str, list[float]] = {}

    def note(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    for r in range(rounds):
        dst = os.path.join(root, f"copy-{r}.bin")
        note("copy + fsync", timed(lambda dst=dst: copy_fsync(src, dst)))
        os.unlink(dst)
        note("copy + sha256 + fsync", timed(lambda dst=dst: copy_fsync(src, dst, digest=True)))
        os.unlink(dst)
        path = os.path.join(root, f"store-{r}")
        refs: list[agentwal.BlobRef] = []
        with agentwal.open(path) as store:  # opened (its WAL segment made) before timing
            with store.begin("warm") as txn:  # blobs/ and blobs/tmp/ made before timing
                txn.put_blob("x", io.BytesIO(b"x"))
            note("put_blob + commit (sync)",
                 timed(lambda s=store, out=refs: out.append(put_blob(s, src))))
            assert refs[0].sha256 == want
            blob = os.path.join(path, "blobs", want[:2], want[2:])
            note("read + sha256 (warm)", timed(lambda b=blob: read_sha(b)))
            note("open_blob, verified (warm)", timed(lambda s=store: open_blob(s)))
            evict(blob)
            note("read + sha256 (cold)", timed(lambda b=blob: read_sha(b)))
            evict(blob)
            note("open_blob, verified (cold)", timed(lambda s=store: open_blob(s)))
        shutil.rmtree(path)
    return times


# -- pytest-benchmark ----------------------------------------------------------------------

BENCH_SIZE = 32 * MIB


@pytest.fixture(scope="module")
def source(module_scratch: str) -> str:
    src = os.path.join(module_scratch, "artifact.bin")
    make_source(src, BENCH_SIZE)
    return src


def test_put_blob(benchmark: Any, scratch: str, source: str) -> None:
    stores = [agentwal.open(os.path.join(scratch, f"s{i}")) for i in range(3)]
    it = iter(stores)  # a fresh store per round: nothing is deduped
    ref = benchmark.pedantic(lambda: put_blob(next(it), source), rounds=3)
    for s in stores:
        s.close()
    assert ref.size == BENCH_SIZE


def test_copy_sha256_fsync(benchmark: Any, scratch: str, source: str) -> None:
    benchmark.pedantic(lambda: copy_fsync(source, os.path.join(scratch, "c"), digest=True),
                       rounds=3)


def test_open_blob(benchmark: Any, scratch: str, source: str) -> None:
    with agentwal.open(os.path.join(scratch, "s")) as store:
        put_blob(store, source)
        assert benchmark.pedantic(lambda: open_blob(store), rounds=3) == BENCH_SIZE


# -- script --------------------------------------------------------------------------------


def main() -> None:
    from benchlib import bench_root, fs_type

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="artifact size in MiB")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="agentwal-bench-", dir=bench_root())
    try:
        size = args.mib * MIB
        times = run(root, size, args.rounds)
        print(f"dir: {root} ({fs_type(root)}); artifact {args.mib} MiB, {args.rounds} rounds; "
              f"cpus {os.cpu_count()}, load {os.getloadavg()[0]:.2f}")
        base = statistics.median(times["copy + fsync"])
        print(f"{'operation':<28} {'best MB/s':>10} {'median MB/s':>12} {'vs copy':>8}")
        for name, secs in times.items():
            best, med = size / min(secs) / 1e6, size / statistics.median(secs) / 1e6
            print(f"{name:<28} {best:10.0f} {med:12.0f} {base / statistics.median(secs):7.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
