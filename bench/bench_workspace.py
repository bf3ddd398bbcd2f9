"""Workspace checkpoints beside git, on one generated tree in one run.

The tree: ``--files`` files (10,000 by default) of 1..20 KiB of random bytes
(~100 MiB) in ``--files // 20`` directories, two levels deep (25 top
directories by default). One directory ``W`` holds it; git's repository
is ``W/.git`` (agentwal's ``put_tree`` skips it with ``exclude=GITIGNORE``),
the store lives outside ``W``. Every figure is one run of each operation:

1. first snapshot: ``put_tree`` + commit  vs  ``git add -A && git commit``;
2. snapshot after one file changed (the same two);
3. snapshot after 100 files changed;
4. restore of the first checkpoint after those 100 (101 files differ),
   from the same clean state for both: ``git checkout -q <first>`` (then
   back to the branch, untimed), then ``store.restore_tree(at=first)``;
5. bytes the one-file snapshot added: agentwal's new blob files (the
   file, the tree objects on its path, the root object) plus its WAL
   record, vs the growth of ``.git/objects``.

The generated files are aged 5 s before the first snapshot (both tools
then trust their stat caches; a file written within the racy window is
re-hashed by both). agentwal runs with its default durability (``sync``:
every blob fsynced before its commit); git with its defaults.

Run: ``.venv/bin/python bench/bench_workspace.py [--files N] [--keep DIR]``;
``--quick`` is 1,000 files; ``tests/test_bench_workspace_smoke.py`` runs it
on 300 (checking that it runs and what it prints, never its timings). Not
collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agentwal


def generate(root: str, files: int, seed: int = 1) -> list[str]:
    """Write the tree; returns its file paths (relative), in a fixed order."""
    rng = random.Random(seed)
    dirs = max(1, files // 20)
    top = max(1, round(dirs ** 0.5))
    paths = []
    for i in range(files):
        d = i % dirs
        rel = os.path.join(f"top{d % top:03d}", f"dir{d:04d}", f"file{i:05d}.bin")
        paths.append(rel)
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(rng.randbytes(rng.randint(1 << 10, 20 << 10)))
    return paths


def age(root: str, seconds: float) -> None:
    past = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(root):
        if ".git" in dirnames:
            dirnames.remove(".git")
        for name in filenames:
            os.utime(os.path.join(dirpath, name), (past, past))


def change(root: str, paths: list[str], n: int, tag: int) -> list[str]:
    """Overwrite the start of ``n`` files (their sizes stay); returns their paths."""
    rng = random.Random(tag)
    picked = rng.sample(paths, n)
    for rel in picked:
        with open(os.path.join(root, rel), "r+b") as f:
            f.write(b"changed %d " % tag)
    return picked


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def git(root: str, *args: str) -> str:
    return subprocess.run(["git", "-C", root, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def git_commit(root: str, msg: str) -> str:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", msg)
    return git(root, "rev-parse", "HEAD")


def du(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(dirpath, name))
    return total


def blob_bytes(store: agentwal.Store) -> int:
    return du(os.path.join(store.path, "blobs"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="1,000 files")
    ap.add_argument("--keep", help="work in this directory and keep it")
    args = ap.parse_args(argv)
    files = 1000 if args.quick else args.files
    if files < 200:
        ap.error("--files must be at least 200 (101 of them change)")
    work = args.keep or tempfile.mkdtemp(prefix="awbench-ws-")
    os.makedirs(work, exist_ok=True)
    root, store_path = os.path.join(work, "W"), os.path.join(work, "store.awal")
    try:
        return run(root, store_path, files)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(root: str, store_path: str, files: int) -> int:
    paths = generate(root, files)
    age(root, 5)
    size = du(root)
    git(root, "init", "-q")
    git(root, "config", "user.email", "bench@example.com")
    git(root, "config", "user.name", "bench")
    store = agentwal.open(store_path)
    ws = agentwal.Workspace(store, "agent", root, exclude=agentwal.GITIGNORE)
    rows: list[tuple[str, float, float]] = []

    def both(label: str, a: Callable[[], Any], g: Callable[[], Any]) -> tuple[Any, Any]:
        ta, ra = timed(a)
        tg, rg = timed(g)
        rows.append((label, ta, tg))
        return ra, rg

    first, g_first = both("first snapshot", lambda: ws.checkpoint(step=0),
                          lambda: git_commit(root, "first"))
    one = change(root, paths, 1, tag=1)
    before_blobs, before_wal = blob_bytes(store), store.stats()["wal_bytes_since_fold"]
    before_git = du(os.path.join(root, ".git", "objects"))
    both("snapshot, 1 file changed", lambda: ws.checkpoint(step=1),
         lambda: git_commit(root, "one"))
    added = blob_bytes(store) - before_blobs + store.stats()["wal_bytes_since_fold"] - before_wal
    git_added = du(os.path.join(root, ".git", "objects")) - before_git
    changed_size = os.path.getsize(os.path.join(root, one[0]))
    differ = len(set(one) | set(change(root, paths, 100, tag=2)))
    both("snapshot, 100 files changed", lambda: ws.checkpoint(step=2),
         lambda: git_commit(root, "hundred"))
    branch = git(root, "rev-parse", "--abbrev-ref", "HEAD")
    tg, _ = timed(lambda: git(root, "checkout", "-q", g_first))
    git(root, "checkout", "-q", branch)
    ta, report = timed(lambda: store.restore_tree("agent", "workspace", root, at=first.id))
    rows.append((f"restore first checkpoint ({differ} files differ)", ta, tg))
    assert report.written == differ, report
    git(root, "checkout", "-q", "--", ".")  # tidy: back to the branch's files
    store.close()

    print(f"tree: {files:,} files, {size / 2**20:.1f} MiB, {files // 20} directories; "
          f"git {git(root, '--version').split()[-1]}, Python {sys.version.split()[0]}")
    print(f"{'operation':45} {'agentwal':>10} {'git':>10} {'ratio':>7}")
    for label, a, g in rows:
        print(f"{label:45} {a * 1000:8.0f}ms {g * 1000:8.0f}ms {a / g:7.2f}")
    print(f"bytes added by the one-file snapshot: agentwal {added:,} "
          f"(file {changed_size:,} + {added - changed_size:,}), git {git_added:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
