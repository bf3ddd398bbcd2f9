"""Workspace checkpoints beside git, on one generated tree in one run.

The tree: ``--files`` files (10,000 by default) of 1..20 KiB of random bytes
(~100 MiB) in ``--files // 20`` directories, two levels deep (25 top
directories by default). One directory ``W`` holds it; git's repository
is ``W/.git`` (agentwal's ``put_tree`` skips it with ``exclude=GITIGNORE``),
the store lives outside ``W``. Both tools start each timed operation
with nothing left to write back (``os.sync()``, untimed), so neither pays
at its next fsync for the pages the other left dirty:

1. first snapshot (one run): ``put_tree`` + commit  vs  ``git add -A && git
   commit``;
2. then ``--rounds`` rounds (5 by default) of: ``ws.status()`` after one
   file changed vs ``git status --porcelain``; a snapshot of that change (the
   same two as in 1); a snapshot after 100 more files changed; a restore of
   the round's first checkpoint, 101 files differ: ``git checkout -q
   <commit>`` (then back to the branch, untimed), then
   ``store.restore_tree(at=...)``. The two tools take turns going first
   (agentwal in even rounds), except in the restore. Each restore starts at
   the head with its tool's cache fresh: after git's checkout and back, and
   after agentwal's restore and ``ws.restore()`` back, both wait 2.1 s (the
   files just written leave the racy window) and refresh their caches
   (``ws.checkpoint()``, which commits nothing for an unchanged tree, and
   ``git update-index --refresh``), untimed. Printed: the medians, the ratio
   of the medians, and the median of the rounds' own ratios ("paired": the
   two tools of one round ran seconds apart, under the same load);
3. bytes the first one-file snapshot added: agentwal's new blob files (the
   file, the tree objects on its path, the root object) plus its WAL
   record, vs the growth of ``.git/objects``.

The generated files are aged 5 s before the first snapshot (both tools
then trust their stat caches; a file written within the racy window is
re-hashed by both). agentwal runs with its default durability (``sync``:
every blob fsynced before its commit); git with its defaults, except that
automatic ``gc`` is off (it would repack in the background mid-run).

Run: ``.venv/bin/python bench/bench_workspace.py [--files N] [--rounds R] [--keep DIR]``;
``--quick`` is 1,000 files; ``tests/test_bench_workspace_smoke.py`` runs it
on 300 (checking that it runs and what it prints, never its timings). Not
collected by pytest (no ``test_`` prefix). The work directory is removed at
the end, also after an error, Ctrl-C, SIGTERM or SIGHUP (not after SIGKILL).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import signal
import statistics
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


#: CPU seconds (user + system, this process's threads and its finished children) of
#: every timed call, in order: a figure the other processes of a loaded machine
#: disturb far less than wall time.
CPU: list[float] = []


#: Seconds :func:`settle` waits for the files just written to leave both tools' racy
#: window (2 s for agentwal's stat cache; git's is the index's own timestamp).
RACY_WAIT = 2.1


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    os.sync()  # untimed: no tool pays for the other's unwritten pages at its next fsync
    c, t = _cpu(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t
    CPU.append(_cpu() - c)
    return wall, out


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
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of the incremental operations (medians are printed)")
    args = ap.parse_args(argv)
    files = 1000 if args.quick else args.files
    if files < 200:
        ap.error("--files must be at least 200 (101 of them change)")
    # a kill (SIGTERM, SIGHUP) ends through the finally below, which removes the work
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    work = args.keep or tempfile.mkdtemp(prefix="awbench-ws-")
    os.makedirs(work, exist_ok=True)
    root, store_path = os.path.join(work, "W"), os.path.join(work, "store.awal")
    try:
        return run(root, store_path, files, max(1, args.rounds))
    finally:
        if not args.keep:
            remove(work)


def remove(work: str) -> None:
    """Remove the work directory, retrying while threads of a killed run still write in it."""
    for _attempt in range(20):
        shutil.rmtree(work, ignore_errors=True)
        if not os.path.exists(work):
            return
        time.sleep(0.25)
    print(f"could not remove {work}", file=sys.stderr)


def run(root: str, store_path: str, files: int, rounds: int) -> int:
    print_results(measure_tree(root, store_path, files, rounds))
    return 0


def measure_tree(root: str, store_path: str, files: int, rounds: int,
                 wait: float = RACY_WAIT) -> dict[str, Any]:
    """Generate the tree in ``root``, make it a git repository and measure both tools on it
    (the store at ``store_path``); returns :func:`measure`'s figures."""
    paths = generate(root, files)
    age(root, 5)
    size = du(root)
    git(root, "init", "-q")
    git(root, "config", "user.email", "bench@example.com")
    git(root, "config", "user.name", "bench")
    git(root, "config", "gc.auto", "0")  # no background repack mid-run (agentwal compacts
    git(root, "config", "maintenance.auto", "false")  # only when asked, too)
    store = agentwal.open(store_path)
    try:
        return measure(root, store, paths, files, size, rounds, wait)
    finally:
        store.close()


def paired(r: int, fa: Callable[[], Any], fg: Callable[[], Any]) -> tuple[float, float, Any]:
    """Time ``fa`` (agentwal) and ``fg`` (git), agentwal first in even rounds, git first
    in odd ones; returns both times and agentwal's result."""
    if r % 2:
        tg, _ = timed(fg)
        ta, out = timed(fa)
        CPU[-2:] = CPU[-1:-3:-1]  # (kept in agentwal, git order)
    else:
        ta, out = timed(fa)
        tg, _ = timed(fg)
    return ta, tg, out


def settle(root: str, ws: agentwal.Workspace, wait: float = RACY_WAIT) -> None:
    """Untimed: both tools refresh their stat cache / index for the files on disk, once
    those are older than the racy window (``ws.checkpoint()`` commits nothing for an
    unchanged tree). ``wait=0`` (the report's quick run) skips the wait: the files are then
    re-hashed by both tools, which changes the timings, never the results."""
    time.sleep(wait)
    ws.checkpoint()
    git(root, "update-index", "-q", "--refresh")


#: The incremental operations, in the order of a round (``{}``: how many files differ).
OPERATIONS = ("status, 1 file changed (git status)", "snapshot, 1 file changed",
              "snapshot, 100 files changed", "restore the round's first checkpoint ({} differ)")


def measure(root: str, store: agentwal.Store, paths: list[str], files: int, size: int,
            rounds: int, wait: float = RACY_WAIT) -> dict[str, Any]:
    """Both tools on the tree at ``root`` (see the module's docstring); returns the figures:
    ``first`` (the first snapshot's ``agentwal_s`` and ``git_s``), ``operations`` (for each
    of :data:`OPERATIONS`, per round: ``agentwal_s``, ``git_s``, ``agentwal_cpu_s``,
    ``git_cpu_s``), ``differ``, and the bytes the first one-file snapshot added
    (``added_bytes``, of which the file ``file_bytes``; ``git_added_bytes``)."""
    ws = agentwal.Workspace(store, "agent", root, exclude=agentwal.GITIGNORE)
    ops: dict[str, dict[str, list[float]]] = {
        label: {"agentwal_s": [], "git_s": [], "agentwal_cpu_s": [], "git_cpu_s": []}
        for label in OPERATIONS}

    def note(label: str, ta: float, tg: float, ca: float, cg: float) -> None:
        op = ops[label]
        op["agentwal_s"].append(ta)
        op["git_s"].append(tg)
        op["agentwal_cpu_s"].append(ca)
        op["git_cpu_s"].append(cg)

    ta, first = timed(lambda: ws.checkpoint(step=0))
    tg, g_first = timed(lambda: git_commit(root, "first"))
    first_row = {"agentwal_s": ta, "git_s": tg}
    branch = git(root, "rev-parse", "--abbrev-ref", "HEAD")
    added = git_added = changed_size = differ = 0
    start, g_start = first.id, g_first
    for r in range(rounds):
        one = change(root, paths, 1, tag=3 * r + 1)
        ta, tg, st = paired(r, ws.status, lambda: git(root, "status", "--porcelain"))
        assert list(st.modified) == [one[0].replace(os.sep, "/")], st
        note(OPERATIONS[0], ta, tg, CPU[-2], CPU[-1])
        before_blobs, before_wal = blob_bytes(store), store.stats()["wal_bytes_since_fold"]
        before_git = du(os.path.join(root, ".git", "objects"))
        ta, tg, _ = paired(r, lambda: ws.checkpoint(step=1), lambda: git_commit(root, "one"))
        note(OPERATIONS[1], ta, tg, CPU[-2], CPU[-1])
        if r == 0:
            added = (blob_bytes(store) - before_blobs + store.stats()["wal_bytes_since_fold"]
                     - before_wal)
            git_added = du(os.path.join(root, ".git", "objects")) - before_git
            changed_size = os.path.getsize(os.path.join(root, one[0]))
        hundred = change(root, paths, 100, tag=3 * r + 2)
        differ = len(set(hundred) | set(one))
        ta, tg, head = paired(r, lambda: ws.checkpoint(step=2),
                              lambda: git_commit(root, "hundred"))
        g_head = git(root, "rev-parse", "HEAD")
        note(OPERATIONS[2], ta, tg, CPU[-2], CPU[-1])
        # Each restore starts at the head with its tool's cache fresh: git goes to the old
        # commit (timed) and back, then agentwal (whose records the files git rewrote no
        # longer match) refreshes them, untimed, before its own restore.
        tg, _ = timed(lambda c=g_start: git(root, "checkout", "-q", c))
        git(root, "checkout", "-q", branch)
        settle(root, ws, wait)
        ta, report = timed(lambda at=start: store.restore_tree("agent", "workspace", root,
                                                                at=at))
        note(OPERATIONS[3], ta, tg, CPU[-1], CPU[-2])  # git's checkout ran first
        assert report.written == differ, (report, differ)
        ws.restore()  # untimed: both back at the head, caches refreshed
        settle(root, ws, wait)
        start, g_start = head.id, g_head
    return {"files": files, "mib": size / 2**20, "directories": files // 20,
            "rounds": rounds, "git": git(root, "--version").split()[-1],
            "python": sys.version.split()[0], "load": os.getloadavg()[0],
            "first": first_row, "operations": ops, "differ": differ,
            "added_bytes": added, "file_bytes": changed_size, "git_added_bytes": git_added}


def summary(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per operation (the first snapshot included, as ``"first snapshot"``): the medians of
    ``agentwal_s`` and ``git_s``, their ``ratio``, the median of the rounds' own ratios
    (``paired``; the first snapshot's is its one ratio) and the CPU medians and their
    ``cpu_ratio``."""
    med = statistics.median
    first = res["first"]
    out = {"first snapshot": {"agentwal_s": first["agentwal_s"], "git_s": first["git_s"],
                              "ratio": first["agentwal_s"] / first["git_s"],
                              "paired": first["agentwal_s"] / first["git_s"]}}
    for label, op in res["operations"].items():
        a, g = med(op["agentwal_s"]), med(op["git_s"])
        ca, cg = med(op["agentwal_cpu_s"]), med(op["git_cpu_s"])
        out[label.format(res["differ"])] = {
            "agentwal_s": a, "git_s": g, "ratio": a / g,
            "paired": med(x / y for x, y in zip(op["agentwal_s"], op["git_s"], strict=True)),
            "agentwal_cpu_s": ca, "git_cpu_s": cg,
            "cpu_ratio": ca / cg if cg else float("inf")}
    return out


def print_results(res: dict[str, Any]) -> None:
    """The figures of :func:`measure` as a table."""
    rows = summary(res)
    print(f"tree: {res['files']:,} files, {res['mib']:.1f} MiB, {res['directories']} "
          f"directories; git {res['git']}, Python {res['python']}; "
          f"load average {res['load']:.1f}")
    print(f"{'operation':52} {'agentwal':>10} {'git':>10} {'ratio':>7} {'paired':>7}")
    for label, row in rows.items():
        paired_col = "" if label == "first snapshot" else f"{row['paired']:7.2f}"
        print(f"{label:52} {row['agentwal_s'] * 1000:8.0f}ms {row['git_s'] * 1000:8.0f}ms "
              f"{row['ratio']:7.2f} {paired_col:>7}")
    print(f"{'CPU time (user + system, medians)':52} {'agentwal':>10} {'git':>10} {'ratio':>7}")
    for label, row in rows.items():
        if "cpu_ratio" in row:
            print(f"{label:52} {row['agentwal_cpu_s'] * 1000:8.0f}ms "
                  f"{row['git_cpu_s'] * 1000:8.0f}ms {row['cpu_ratio']:7.2f}")
    print(f"(first snapshot: one run; the others: medians of {res['rounds']} rounds, the two "
          "tools in turn first; ratio: of the medians; paired: the median of the rounds' "
          "ratios)")
    added, size = res["added_bytes"], res["file_bytes"]
    print(f"bytes added by the one-file snapshot: agentwal {added:,} "
          f"(file {size:,} + {added - size:,}), git {res['git_added_bytes']:,}")


if __name__ == "__main__":
    sys.exit(main())
