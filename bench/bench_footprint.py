"""Footprint of many stores in one process (issue #10, case 1).

Usage: ``.venv/bin/python bench/bench_footprint.py [--stores 2000] [--steps 200]``

Three goals, each printed with its figure and whether it is met:

- ``--stores`` writer stores open at once in this process, one commit each
  (before issue #10 each reserved 1 TiB of address space and the 127th
  open failed); reports the time, the threads, the file descriptors and the
  resident memory per store;
- an empty store (opened, closed) takes at most 1 MiB on disk;
- a store holding a ``--steps``-step conversation (each step appends one
  message of about 400 bytes to a list and sets a few keys), closed, takes at
  most twice its LMDB data file on disk.

Everything is made in a temporary directory that is removed at the end.
The soft limit of open files is raised to the hard limit first (each store
holds about 5 descriptors).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import threading
import time

import agentwal


def disk_bytes(path: str) -> int:
    """Bytes allocated on disk under ``path`` (``du``'s figure)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def apparent_bytes(path: str) -> int:
    """The sum of the file sizes under ``path``."""
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _dirs, files in os.walk(path) for name in files)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def many_stores(root: str, n: int) -> dict[str, float]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fds0, threads0, rss0 = len(os.listdir("/proc/self/fd")), threading.active_count(), rss_bytes()
    os.makedirs(root)
    stores = []
    started = time.perf_counter()
    try:
        for i in range(n):
            store = agentwal.open(os.path.join(root, f"user-{i}"))
            with store.begin("session") as txn:
                txn["user"] = i
            stores.append(store)
        opened = time.perf_counter() - started
        time.sleep(4.0)  # let the background threads of the first commits go idle
        figures = {
            "stores": float(len(stores)),
            "open_and_commit_s": opened,
            "threads": float(threading.active_count() - threads0),
            "fds_per_store": (len(os.listdir("/proc/self/fd")) - fds0) / n,
            "rss_kib_per_store": (rss_bytes() - rss0) / n / 1024,
            "disk_kib_per_store": disk_bytes(root) / n / 1024,
        }
    finally:
        for store in stores:
            store.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return figures


def empty_store(root: str) -> dict[str, float]:
    path = os.path.join(root, "empty")
    agentwal.open(path).close()
    return {"disk_kib": disk_bytes(path) / 1024, "apparent_kib": apparent_bytes(path) / 1024}


def conversation(root: str, steps: int) -> dict[str, float]:
    path = os.path.join(root, "conversation")
    with agentwal.open(path) as store:
        for i in range(steps):
            with store.begin("chat") as txn:
                messages = txn.get("messages", [])
                messages.append({"role": "user" if i % 2 else "assistant",
                                 "content": f"message {i}: " + "lorem ipsum dolor sit " * 18})
                txn["messages"] = messages
                txn["step"] = i
                txn["node"] = "agent" if i % 2 else "tools"
    data = os.path.getsize(os.path.join(path, "snapshot", "data.mdb"))
    return {"lmdb_data_kib": data / 1024, "disk_kib": disk_bytes(path) / 1024,
            "apparent_kib": apparent_bytes(path) / 1024,
            "ratio": disk_bytes(path) / data}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="agentwal-footprint-")
    try:
        many = many_stores(os.path.join(root, "many"), args.stores)
        empty = empty_store(root)
        conv = conversation(root, args.steps)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{int(many['stores'])} stores open at once (goal {args.stores}): "
          f"{many['open_and_commit_s']:.1f} s to open and commit once each; "
          f"{int(many['threads'])} threads when idle, {many['fds_per_store']:.1f} fds, "
          f"{many['rss_kib_per_store']:.0f} KiB RSS and {many['disk_kib_per_store']:.0f} KiB of "
          "disk per store")
    print(f"empty store: {empty['disk_kib']:.0f} KiB on disk ({empty['apparent_kib']:.0f} KiB "
          f"of file sizes); goal <= 1024 KiB: {'met' if empty['disk_kib'] <= 1024 else 'NOT met'}")
    print(f"{args.steps}-step conversation: {conv['disk_kib']:.0f} KiB on disk, LMDB data "
          f"{conv['lmdb_data_kib']:.0f} KiB, ratio {conv['ratio']:.2f}; goal <= 2: "
          f"{'met' if conv['ratio'] <= 2 else 'NOT met'}")


if __name__ == "__main__":
    main()
