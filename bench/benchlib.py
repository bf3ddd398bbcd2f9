"""Shared helpers for the benchmarks: where to put stores, how to build them.

Both the pytest-benchmark files (``bench/test_bench_*.py``) and the
side-by-side script (``bench/compare.py``) import this module; pytest puts
``bench/`` on ``sys.path`` (no ``__init__.py``, rootdir-relative import) and a
script run as ``python bench/compare.py`` has its own directory there.

Where the stores live matters more than anything else measured here: an
fdatasync on tmpfs is free, so every durable-commit figure from a RAM-backed
directory is meaningless. :func:`bench_root` therefore refuses tmpfs/ramfs
and falls back to ``<repo>/.benchmarks/tmp`` (gitignored), and every report
names the file system it ran on. Override with ``AGENTWAL_BENCH_DIR``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import agentwal
from agentwal.testing import crash

__all__ = [
    "MIB",
    "RAM_FILESYSTEMS",
    "VALUE_BYTES",
    "bench_root",
    "build_history_store",
    "build_wal_store",
    "evict_page_cache",
    "fs_type",
    "make_durable",
    "open_and_release",
    "scratch_dir",
    "values",
]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
VALUE_BYTES = 1024
MIB = 1 << 20


def fs_type(path: str) -> str:
    """The file-system type of the mount holding ``path`` (from /proc/mounts)."""
    path = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def bench_root() -> str:
    """A directory on a real disk for benchmark stores (created if missing).

    ``AGENTWAL_BENCH_DIR`` wins (and is refused if it is RAM-backed); else the
    system temp directory unless it is tmpfs; else ``<repo>/.benchmarks/tmp``.
    """
    chosen = os.environ.get("AGENTWAL_BENCH_DIR")
    if chosen:
        os.makedirs(chosen, exist_ok=True)
        if fs_type(chosen) in RAM_FILESYSTEMS:
            raise SystemExit(
                f"AGENTWAL_BENCH_DIR={chosen} is on {fs_type(chosen)}: fsync is "
                "free there, so durable-commit figures would be meaningless"
            )
        return chosen
    tmp = tempfile.gettempdir()
    if fs_type(tmp) not in RAM_FILESYSTEMS:
        return tmp
    fallback = os.path.join(REPO, ".benchmarks", "tmp")
    os.makedirs(fallback, exist_ok=True)
    return fallback


@contextmanager
def scratch_dir(prefix: str = "agentwal-bench-") -> Iterator[str]:
    """A fresh directory under :func:`bench_root`, removed afterwards."""
    d = tempfile.mkdtemp(prefix=prefix, dir=bench_root())
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def values(n: int = 16, size: int = VALUE_BYTES, seed: int = 1) -> list[bytes]:
    """``n`` distinct incompressible values of ``size`` bytes (zstd gains nothing on them)."""
    import random

    rnd = random.Random(seed)
    return [rnd.randbytes(size) for _ in range(n)]


def build_wal_store(
    path: str, wal_bytes: int, *, value_bytes: int = VALUE_BYTES, runs: int = 8
) -> dict[str, Any]:
    """A store whose WAL holds ``wal_bytes`` of records never folded, left as after a crash.

    Built with ``durability="none"`` (the bytes on disk are the same; the
    final ``sync()`` makes them durable) and a ``wal_max_bytes`` far above
    ``wal_bytes`` so no fold runs; closed with ``testing.crash()``, which stops
    the threads and closes the handles without folding, as a crash would.
    Returns what was built: commits, WAL bytes, build seconds.
    """
    t0 = time.perf_counter()
    vals = values(size=value_bytes)
    store = agentwal.open(path, durability="none", wal_max_bytes=max(4 * wal_bytes, 256 * MIB))
    n = 0
    written = 0
    try:
        while written < wal_bytes:
            for _ in range(256):
                with store.begin(f"run-{n % runs}") as txn:
                    txn.put("value", vals[n % len(vals)])
                    txn.put("step", n)
                n += 1
            written = int(store.stats().get("wal_bytes_since_fold", 0))
            if not written:  # stats() without the key: estimate from the record size
                written = n * (value_bytes + 128)
        store.sync()
        folds = store.stats().get("folds", 0)
    finally:
        crash(store)
    if folds:
        raise RuntimeError(f"a fold ran while building the WAL ({folds}); raise wal_max_bytes")
    return {"commits": n, "wal_bytes": written, "build_seconds": time.perf_counter() - t0}


def build_history_store(path: str, checkpoints: int, *, runs: int = 10) -> dict[str, Any]:
    """A store with ``checkpoints`` folded checkpoints over ``runs`` runs and an empty WAL.

    Each commit is one step of an agent loop: a counter and a short message.
    Built with ``durability="none"``, then ``snapshot()`` and ``close()``, so
    everything is in LMDB and the WAL holds nothing to replay.
    """
    t0 = time.perf_counter()
    store = agentwal.open(path, durability="none")
    try:
        for i in range(checkpoints):
            with store.begin(f"run-{i % runs}") as txn:
                txn.put("step", i)
                txn.put("message", f"step {i}: called the tool and got an answer")
                txn.meta(node="agent", step=i)
        store.snapshot()
        stats = store.stats()
    finally:
        store.close()
    return {
        "checkpoints": stats.get("checkpoints", checkpoints),
        "lmdb_bytes": stats.get("lmdb_bytes"),
        "build_seconds": time.perf_counter() - t0,
    }


def evict_page_cache(path: str) -> None:
    """Drop the clean page-cache pages of every file under ``path`` (this store only).

    ``posix_fadvise(DONTNEED)`` per file: a cold-cache open without touching
    the rest of the machine (no global drop_caches). Best effort.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


def _wal_bytes(path: str) -> int:
    """Bytes of the log segments of the store at ``path`` (0 when there are none)."""
    wal = os.path.join(path, "wal")
    if not os.path.isdir(wal):
        return 0
    return sum(e.stat().st_size for e in os.scandir(wal) if e.is_file())


def open_and_release(path: str, **kwargs: Any) -> tuple[float, dict[str, Any]]:
    """Time ``agentwal.open(path)``; release the store without writing anything.

    Returns ``(seconds, recovery stats)``. The store is left exactly as it
    was (no fold, no close), so the same open can be timed again. Unless the
    caller says otherwise, it opens with a ``wal_max_bytes`` four times the
    log on disk: a log at or over the limit starts a fold as soon as the
    store is open, and the next open would then time an empty log.
    """
    if "wal_max_bytes" not in kwargs:
        kwargs["wal_max_bytes"] = max(4 * _wal_bytes(path), 256 * MIB)
    t0 = time.perf_counter()
    store = agentwal.open(path, **kwargs)
    dt = time.perf_counter() - t0
    try:
        rec = dict(store.stats().get("recovery", {}))
    finally:
        crash(store)
    return dt, rec


def make_durable(server: Any) -> bool:
    """Turn ``fsync``, ``synchronous_commit`` and ``full_page_writes`` on for a throwaway
    PostgreSQL server of ``tests/pg.py`` (which starts them off, for the tests' speed), so the
    figures are a durable server's; True if it did. A server named by ``$AGENTWAL_PG_DSN`` is
    someone else's (the tests' own, when a test runs a script) and is left as it is."""
    import psycopg

    if not server.root:
        return False
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        for name in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {name} = on")
        conn.execute("SELECT pg_reload_conf()")
    return True
