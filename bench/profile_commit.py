#!/usr/bin/env python3
"""Where a commit spends its time: a per-stage breakdown of the commit path.

Usage::

    .venv/bin/python bench/profile_commit.py                       # sync, 1 thread
    .venv/bin/python bench/profile_commit.py --durability none --commits 20000
    .venv/bin/python bench/profile_commit.py --threads 8 --seconds 3
    .venv/bin/python bench/profile_commit.py --cprofile            # cProfile's top functions too

It wraps the engine's commit-path functions at run time (nothing under
``agentwal/`` is changed) with a ``perf_counter`` pair and reports, for each
stage, the inclusive time per commit. The wrappers cost ~0.3 us per call, so
the instrumented wall time is a little above the plain one, which is
measured first. Stages the engine no longer has are skipped, so the script
survives refactors; add new ones to ``STAGES``.

With ``--threads N`` it also reports how long a committer waits between its
batch being published and its ``commit()`` returning (the group-commit
hand-off), and how busy the disk was (share of wall time inside fdatasync).

For a sampling view without the wrappers: ``py-spy record -r 250 --nonblocking
--idle -f raw -o out.txt -- .venv/bin/python bench/profile_commit.py ...``.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import importlib
import os
import pstats
import sys
import threading
import time
from typing import Any

from benchlib import scratch_dir, values

import agentwal

# (depth, label, candidates): the commit path as a tree, outermost first. A
# candidate is "module:Attr" or "module:Class.attr"; every one that exists is
# wrapped (a function imported by name into several modules is wrapped in each,
# only one of them is on the path). The engine moves code between modules, so
# each stage lists where it has lived.
STAGES: list[tuple[int, str, list[str]]] = [
    (0, "Transaction.commit (validate, log, publish)", ["agentwal.txn:Transaction.commit"]),
    (
        1,
        "encode_delta: CBOR + sha256 + zstd attempt",
        ["agentwal.local.commit:encode_delta", "agentwal.store:encode_delta"],
    ),
    (2, "zstd compress attempt", ["zstd"]),
    (
        1,
        "checkpoint_hash (canonical CBOR + sha256)",
        ["agentwal.local.commit:checkpoint_hash", "agentwal.store:checkpoint_hash"],
    ),
    (
        1,
        "encode_commit (CBOR of the record)",
        ["agentwal.local.commit:encode_commit", "agentwal.store:encode_commit"],
    ),
    (1, "encode_meta", ["agentwal.local.commit:encode_meta"]),
    (
        1,
        "_validate (OCC)",
        ["agentwal.local.commit:CommitPipeline._validate", "agentwal.store:Store._validate"],
    ),
    (
        1,
        "_drive (group commit: wait or lead)",
        ["agentwal.local.commit:CommitPipeline._drive", "agentwal.store:Store._drive"],
    ),
    (
        2,
        "lead (leader: write, sync, publish)",
        ["agentwal.local.commit:CommitPipeline.lead", "agentwal.store:Store._lead"],
    ),
    (3, "Writer.append (frame + write)", ["agentwal.local.wal.writer:Writer.append"]),
    (4, "os.pwrite", ["agentwal.io:OsFileSystem.pwrite"]),
    (4, "segment rotation (preallocate)", ["agentwal.local.wal.writer:Writer._rotate"]),
    (3, "Writer.sync", ["agentwal.local.wal.writer:Writer.sync"]),
    (4, "fdatasync", ["agentwal.io:OsFileSystem.fsync"]),
    (3, "Memtable.apply (publish)", ["agentwal.local.memtable:Memtable.apply"]),
    (
        1,
        "end the read view (RunStore.end)",
        ["agentwal.local.backend:LocalBackend.end", "agentwal.local.engine:Engine._txn_release",
         "agentwal.store:Store._txn_release"],
    ),
    (0, "Store.begin (read view + LMDB read txn)", ["agentwal.store:Store.begin"]),
    (0, "Transaction.put (check key, CBOR value)", ["agentwal.txn:Transaction.put"]),
]


def resolve(spec: str) -> tuple[Any, str] | None:
    """``"module:Class.attr"`` -> (owner object, attribute name), or None if absent."""
    mod_name, _, path = spec.partition(":")
    try:
        owner: Any = importlib.import_module(mod_name)
    except ImportError:
        return None
    *parents, attr = path.split(".")
    for name in parents:
        owner = getattr(owner, name, None)
        if owner is None:
            return None
    return (owner, attr) if callable(getattr(owner, attr, None)) else None


class Timers:
    def __init__(self) -> None:
        self.total: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._local = threading.local()

    def wrap(self, owner: Any, attr: str, label: str) -> bool:
        fn = getattr(owner, attr, None)
        if fn is None or not callable(fn):
            return False
        total, calls = self.total, self.calls

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                total[label] += time.perf_counter() - t0
                calls[label] += 1

        setattr(owner, attr, timed)
        return True

    def wrap_zstd(self, label: str) -> bool:
        codec = importlib.import_module("agentwal.codec")
        get = getattr(codec, "_compressor", None)
        if get is None:
            return False
        total, calls = self.total, self.calls

        class Timed:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def compress(self, data: bytes) -> bytes:
                t0 = time.perf_counter()
                try:
                    return bytes(self.inner.compress(data))
                finally:
                    total[label] += time.perf_counter() - t0
                    calls[label] += 1

        cache: dict[int, Timed] = {}

        def compressor() -> Timed:
            key = threading.get_ident()
            if key not in cache:
                cache[key] = Timed(get())
            return cache[key]

        codec._compressor = compressor
        return True


def workload(
    store: agentwal.Store, threads: int, commits: int, seconds: float | None, vals: list[bytes]
) -> tuple[int, float]:
    """Commit ``commits`` times per thread (or for ``seconds``); returns (commits, wall)."""
    counts = [0] * threads
    stop = threading.Event()

    def loop(k: int) -> None:
        run, i = f"run-{k}", 0
        while (i < commits) if seconds is None else not stop.is_set():
            with store.begin(run) as t:
                t.put("value", vals[(i + k) % len(vals)])
            i += 1
        counts[k] = i

    ts = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    if seconds is not None:
        time.sleep(seconds)
        stop.set()
    for t in ts:
        t.join()
    return sum(counts), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--durability", default="sync", choices=["sync", "async", "none"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--commits", type=int, default=3000, help="per thread (without --seconds)")
    ap.add_argument("--seconds", type=float, default=None, help="run for this long instead")
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--cprofile", action="store_true", help="also print cProfile's top 25")
    args = ap.parse_args(argv)
    vals = values(size=args.value_bytes)

    def fresh(d: str, name: str) -> agentwal.Store:
        s = agentwal.open(os.path.join(d, name), durability=args.durability)
        workload(s, args.threads, 50, None, vals)  # warm-up: runs exist, segment created
        return s

    with scratch_dir() as d:
        s = fresh(d, "plain.awal")
        n, wall = workload(s, args.threads, args.commits, args.seconds, vals)
        s.close()
        print(
            f"{args.durability}, {args.threads} thread(s), {args.value_bytes} B values: "
            f"{n:,} commits, {n / wall:,.0f} commits/s, {wall / n * 1e6:.1f} us/commit "
            "(plain)"
        )

        timers = Timers()
        done_at: dict[int, float] = {}
        handoff: list[float] = []
        wrapped = []
        for depth, label, candidates in STAGES:
            ok = False
            for spec in candidates:
                if spec == "zstd":
                    ok = timers.wrap_zstd(label) or ok
                    continue
                found = resolve(spec)
                if found is not None:
                    ok = timers.wrap(found[0], found[1], label) or ok
            if ok:
                wrapped.append((depth, label))
        drive_at = resolve("agentwal.local.commit:CommitPipeline._drive") or resolve(
            "agentwal.store:Store._drive"
        )
        apply_at = resolve("agentwal.local.memtable:Memtable.apply")
        if args.threads > 1 and drive_at and apply_at:  # hand-off: published -> returns
            apply, drive = getattr(*apply_at), getattr(*drive_at)

            def apply_hook(self: Any, lsn: int, *a: Any, **k: Any) -> Any:
                done_at[lsn] = time.perf_counter()
                return apply(self, lsn, *a, **k)

            def drive_hook(self: Any, pc: Any) -> Any:
                try:
                    return drive(self, pc)
                finally:
                    if pc.lsn in done_at:
                        handoff.append(time.perf_counter() - done_at[pc.lsn])

            setattr(*apply_at, apply_hook)
            setattr(*drive_at, drive_hook)
        s = fresh(d, "timed.awal")
        timers.total.clear()
        timers.calls.clear()
        prof = cProfile.Profile() if args.cprofile else None
        if prof:
            prof.enable()
        n, wall = workload(s, args.threads, args.commits, args.seconds, vals)
        if prof:
            prof.disable()
        st = s.stats()
        s.close()

    print(
        f"instrumented: {n:,} commits, {wall / n * 1e6:.1f} us/commit wall; "
        f"{st['commits'] / max(1, st['syncs']):.2f} commits per fdatasync"
        if st["syncs"]
        else f"instrumented: {n:,} commits, {wall / n * 1e6:.1f} us/commit"
    )
    print(
        f"\n{'stage (inclusive, summed over threads)':<56}{'us/commit':>10}{'calls':>9}"
        f"{'us/call':>10}"
    )
    for depth, label in wrapped:
        c = timers.calls[label]
        if not c:
            continue
        t = timers.total[label]
        print(f"{'  ' * depth + label:<56}{t / n * 1e6:>10.1f}{c:>9,}{t / c * 1e6:>10.1f}")
    fsync = timers.total.get("fdatasync", 0.0)
    if fsync:
        print(f"\ndisk busy (inside fdatasync): {fsync / wall * 100:.0f}% of wall time")
    if handoff:
        handoff.sort()
        q = {
            p: handoff[min(len(handoff) - 1, int(p * len(handoff)))] * 1e6 for p in (0.5, 0.9, 0.99)
        }
        print(
            f"published -> commit() returns: p50 {q[0.5]:.0f} us, p90 {q[0.9]:.0f} us, "
            f"p99 {q[0.99]:.0f} us"
        )
    if prof:
        print()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
