#!/usr/bin/env python3
"""agentwal beside its baselines, in one process and one run, with the goals' ratios.

Usage::

    .venv/bin/python bench/compare.py            # full run (~3 min): 9 rounds of 2 s slices
    .venv/bin/python bench/compare.py --quick    # about a minute: 2 rounds of 1 s slices
    .venv/bin/python bench/compare.py --json     # the same figures as JSON on stdout

What is measured (each write is one ~1 KiB incompressible value, one
transaction, and — where the system offers it — durable when it returns):

- agentwal ``sync`` commits on 1 thread and on 8 threads (one run per
  thread, so they never conflict; group commit shares the fdatasyncs);
- agentwal ``async`` commits on 1 thread;
- raw ``os.write`` appending 1 KiB to a plain file + ``os.fdatasync``;
- the same raw loop overwriting a preallocated, zero-filled file (no size
  change, so fdatasync has no metadata to flush: the floor for a WAL);
- SQLite (stdlib ``sqlite3``), ``journal_mode=WAL``, ``synchronous=FULL``,
  one ``INSERT OR REPLACE`` per ``BEGIN``/``COMMIT``;
- LMDB (py-lmdb), ``sync=True``, one ``put`` per write transaction;
- for reference (no goal): SQLite as above with 8 writer threads, one
  connection each (SQLite serialises writers, one fsync per commit);
- open (recovery) time of a store whose WAL holds 64 MiB of unfolded records,
  with the page cache warm (a process crash) and with the store's pages
  evicted (closer to a reboot);
- open time of a store with 100,000 folded checkpoints vs. one with 1,000;
- reads: ``store.get`` and ``txn.get`` of a small value, from the memtable
  and after a fold into LMDB, beside py-lmdb's own begin + get + abort of
  the same bytes (microseconds per call, the minimum of several repeats;
  thread CPU, so other tenants matter little);
- a growing conversation: 200 steps of one run, each reading ``messages``,
  appending a ~1 KiB message and putting the whole list back (as agents
  do), with ``durability="none"`` so only the engine's CPU is timed: the
  log bytes of the commit at step 200, the thread CPU of put + commit of
  the last 20 steps against steps 11-30 (and of get + put + commit: the
  get decodes the list and notes what it handed out), the same through
  ``txn.append``, and the folded history's bytes per checkpoint (LMDB
  pages in use after ``snapshot()``, divided by 200).

fsync latency on a shared (virtual) disk drifts by several times within
minutes, so throughput is measured in short slices: each round runs every
system once, back to back (the order rotates from round to round), and a
ratio between two systems is the median over rounds of their ratio *within*
a round, which cancels drift slower than a round. A figure on its own is the
median over rounds. Each slice uses a fresh store, file or database. Stores
live on a real disk (see ``benchlib.bench_root``): never tmpfs, where fsync
is free.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import lmdb
from benchlib import (
    MIB,
    bench_root,
    build_history_store,
    build_wal_store,
    evict_page_cache,
    fs_type,
    open_and_release,
    scratch_dir,
    values,
)
from test_bench_history import message

import agentwal

RECORD = 1024
WAL_BYTES = 64 * MIB
FEW_CHECKPOINTS, MANY_CHECKPOINTS = 1_000, 100_000
WARMUP = 50

# (label, numerator, denominator, goal, direction): ratio = num / den, met if >= goal
# (direction "max": the figure itself must be <= goal).
# The goals are issue #16's (the open-time ones are issue #5's).
GOALS: list[tuple[str, str, str | None, float, str]] = [
    ("1-thread sync vs SQLite WAL FULL", "agentwal_sync_1t", "sqlite_wal_full", 1.0, "min"),
    (
        "1-thread sync vs raw overwrite+fdatasync",
        "agentwal_sync_1t",
        "raw_overwrite_fdatasync",
        0.9,
        "min",
    ),
    ("1-thread sync vs LMDB sync", "agentwal_sync_1t", "lmdb_sync", 1.5, "min"),
    ("8-thread sync vs 1-thread sync", "agentwal_sync_8t", "agentwal_sync_1t", 2.5, "min"),
    ("8-thread sync vs SQLite FULL 8 threads", "agentwal_sync_8t", "sqlite_wal_full_8t", 3.0,
     "min"),
    ("async commits/s", "agentwal_async_1t", None, 40_000, "min"),
    ("store.get memtable vs py-lmdb get", "get_memtable_us", "lmdb_get_us", 3.0, "max"),
    ("store.get folded vs py-lmdb get", "get_folded_us", "lmdb_get_us", 3.0, "max"),
    ("growing: log bytes of commit 200", "growth_log_bytes_step200", None, 8192, "max"),
    ("growing: CPU steps 181-200 vs 11-30", "growth_cpu_last20_us", "growth_cpu_11_30_us", 1.5,
     "max"),
    ("growing, txn.append: CPU 181-200 vs 11-30", "growth_append_cpu_last20_us",
     "growth_append_cpu_11_30_us", 1.5, "max"),
    ("growing, get+put+commit: CPU 181-200 vs 11-30", "growth_get_cpu_last20_us",
     "growth_get_cpu_11_30_us", 1.5, "max"),
    ("growing, txn.append: log bytes of commit 200", "growth_append_log_bytes_step200", None,
     8192, "max"),
    ("growing: folded bytes per checkpoint", "growth_history_bytes_per_ckpt", None, 4096,
     "max"),
    ("open, 64 MiB WAL, warm cache (s)", "open_wal_64mib_warm_s", None, 1.5, "max"),
    ("open, 64 MiB WAL, cold cache (s)", "open_wal_64mib_cold_s", None, 1.5, "max"),
    ("open, 100k vs 1k checkpoints", "open_100k_ckpt_s", "open_1k_ckpt_s", 1.3, "max"),
]


# Ratios reported beside the goals, without a target of their own.
REFERENCE: list[tuple[str, str, str]] = [
    ("1-thread sync vs raw append+fdatasync", "agentwal_sync_1t", "raw_append_fdatasync"),
    ("txn.get memtable vs py-lmdb get", "txn_get_memtable_us", "lmdb_get_us"),
    ("txn.get folded vs py-lmdb get", "txn_get_folded_us", "lmdb_get_us"),
    ("store.get memtable vs py-lmdb get, each after a commit",
     "get_memtable_after_commit_us", "lmdb_get_after_commit_us"),
    ("store.get folded vs py-lmdb get, each after a commit",
     "get_folded_after_commit_us", "lmdb_get_after_commit_us"),
    (
        "raw overwrite vs SQLite FULL (a WAL's ceiling)",
        "raw_overwrite_fdatasync",
        "sqlite_wal_full",
    ),
    ("raw overwrite vs raw append", "raw_overwrite_fdatasync", "raw_append_fdatasync"),
    ("1-thread sync vs raw overwrite", "agentwal_sync_1t", "raw_overwrite_fdatasync"),
]

# -- throughput loops -------------------------------------------------------------------------
# Each returns (operations, seconds, extra); the caller turns them into a rate.

Result = tuple[int, float, dict[str, Any]]


def _timed_loop(op: Callable[[int], None], seconds: float) -> tuple[int, float]:
    for i in range(WARMUP):
        op(i)
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(16):
            op(n)
            n += 1
        if time.perf_counter() >= deadline:
            break
    return n, time.perf_counter() - t0


def agentwal_commits(durability: str, threads: int, seconds: float) -> Result:
    vals = values()
    with scratch_dir() as d:
        store = agentwal.open(os.path.join(d, "s.awal"), durability=durability)
        try:
            if threads == 1:

                def op(i: int) -> None:
                    with store.begin("run-0") as txn:
                        txn.put("value", vals[i % len(vals)])

                n, dt = _timed_loop(op, seconds)
            else:
                n, dt = _threaded_commits(store, threads, seconds, vals)
            st = store.stats()
        finally:
            store.close()
    extra = {
        "syncs": st["syncs"],
        "batches": st["batches"],
        "commits_total": st["commits"],
        "folds": st["folds"],
        "commits_per_sync": round(st["commits"] / max(1, st["syncs"]), 2),
    }
    return n, dt, extra


def _race(threads: int, seconds: float,
          body: Callable[[int, threading.Barrier, threading.Event], int]) -> tuple[int, float]:
    """Run ``body(k, ready, stop)`` in ``threads`` threads for ``seconds`` once all are ready.

    Each body warms up, waits on ``ready``, loops until ``stop`` and returns
    its count; the total and the timed interval are returned. A body that
    raises aborts the barrier and the error is raised here.
    """
    counts = [0] * threads
    errors: list[BaseException] = []
    ready = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(k: int) -> None:
        try:
            counts[k] = body(k, ready, stop)
        except BaseException as exc:  # report, don't hang the barrier
            errors.append(exc)
            ready.abort()

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(counts), dt


def _threaded_commits(
    store: agentwal.Store, threads: int, seconds: float, vals: list[bytes]
) -> tuple[int, float]:
    def body(k: int, ready: threading.Barrier, stop: threading.Event) -> int:
        run = f"run-{k}"
        for i in range(WARMUP // 5):
            with store.begin(run) as txn:
                txn.put("value", vals[i % len(vals)])
        ready.wait()
        i = 0
        while not stop.is_set():
            with store.begin(run) as txn:
                txn.put("value", vals[(i + k) % len(vals)])
            i += 1
        return i

    return _race(threads, seconds, body)


def raw_append(seconds: float) -> Result:
    vals = values()
    with scratch_dir() as d:
        fd = os.open(os.path.join(d, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:

            def op(i: int) -> None:
                os.write(fd, vals[i % len(vals)])
                os.fdatasync(fd)

            n, dt = _timed_loop(op, seconds)
        finally:
            os.close(fd)
    return n, dt, {}


def raw_overwrite(seconds: float) -> Result:
    vals = values()
    size = 16 * MIB  # agentwal's default segment size
    with scratch_dir() as d:
        fd = os.open(os.path.join(d, "raw.log"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            zeros = bytes(MIB)
            for off in range(0, size, MIB):
                os.pwrite(fd, zeros, off)
            os.fsync(fd)
            pos = [0]

            def op(i: int) -> None:
                os.pwrite(fd, vals[i % len(vals)], pos[0])
                os.fdatasync(fd)
                pos[0] = (pos[0] + RECORD) % size

            n, dt = _timed_loop(op, seconds)
        finally:
            os.close(fd)
    return n, dt, {}


def _sqlite_open(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, timeout=60)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def sqlite_full(seconds: float) -> Result:
    vals = values()
    with scratch_dir() as d:
        db = _sqlite_open(os.path.join(d, "s.db"))
        try:
            mode = db.execute("PRAGMA journal_mode").fetchone()[0]
            db.execute(
                "CREATE TABLE kv (run TEXT, key TEXT, value BLOB, PRIMARY KEY (run, key))"
                " WITHOUT ROWID"
            )

            def op(i: int) -> None:
                db.execute("BEGIN")
                db.execute(
                    "INSERT OR REPLACE INTO kv VALUES (?, ?, ?)",
                    ("run-0", "value", vals[i % len(vals)]),
                )
                db.execute("COMMIT")

            n, dt = _timed_loop(op, seconds)
        finally:
            db.close()
    return n, dt, {"journal_mode": mode, "sqlite": sqlite3.sqlite_version}


def sqlite_full_threads(seconds: float, threads: int = 8) -> Result:
    """SQLite as above, ``threads`` writers with a connection each (SQLite serialises them)."""
    vals = values()
    with scratch_dir() as d:
        path = os.path.join(d, "s.db")
        db = _sqlite_open(path)
        db.execute(
            "CREATE TABLE kv (run TEXT, key TEXT, value BLOB, PRIMARY KEY (run, key)) WITHOUT ROWID"
        )
        db.close()

        def body(k: int, ready: threading.Barrier, stop: threading.Event) -> int:
            conn = _sqlite_open(path)
            try:
                ready.wait()
                i = 0
                while not stop.is_set():
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute(
                        "INSERT OR REPLACE INTO kv VALUES (?, ?, ?)",
                        (f"run-{k}", "value", vals[(i + k) % len(vals)]),
                    )
                    conn.execute("COMMIT")
                    i += 1
                return i
            finally:
                conn.close()

        n, dt = _race(threads, seconds, body)
    return n, dt, {}


def lmdb_sync(seconds: float) -> Result:
    vals = values()
    with scratch_dir() as d:
        env = lmdb.open(
            os.path.join(d, "lmdb"), map_size=1 << 30, sync=True, metasync=True, writemap=False
        )
        try:

            def op(i: int) -> None:
                with env.begin(write=True) as txn:
                    txn.put(b"run-0/value", vals[i % len(vals)])

            n, dt = _timed_loop(op, seconds)
        finally:
            env.close()
    return n, dt, {"lmdb": ".".join(map(str, lmdb.version()))}


# -- reads ----------------------------------------------------------------------------------

READ_CALLS = 20_000
SMALL_VALUE = {"role": "tool", "name": "search", "ok": True, "n": 3}


def _per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """Thread CPU per call of ``fn``, in µs (the loop's own cost included, as callers pay it)."""
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t0) / calls * 1e6


def _per_call_after_us(fn: Callable[[], Any], before: Callable[[], Any], calls: int) -> float:
    """µs per call of ``fn`` when ``before`` (untimed) runs before each call: the median of
    the calls, each timed alone on the wall clock (a thread-CPU clock is a system call on
    this VM, longer than the call), less the median cost of timing nothing."""
    clock = time.perf_counter_ns
    spent: list[int] = []
    empty: list[int] = []
    for _ in range(calls):
        before()
        t0 = clock()
        fn()
        t1 = clock()
        t2 = clock()
        spent.append(t1 - t0)
        empty.append(t2 - t1)
    return max(0.0, statistics.median(spent) - statistics.median(empty)) / 1e3


def reads(repeats: int, calls: int = READ_CALLS) -> dict[str, list[float]]:
    """µs per call of ``store.get``/``txn.get`` (memtable, folded) and py-lmdb begin+get+abort
    (thread CPU of a loop of calls; and the wall median of single calls, each right
    after a commit to another run).

    One store holds the small value in its memtable (a commit never folded),
    another the same value folded into LMDB; a plain LMDB environment holds
    its encoded bytes. Each repeat measures all of them back to back; the
    lists hold one figure per repeat (the caller takes the minimum or pairs
    them).
    """
    out: dict[str, list[float]] = {k: [] for k in (
        "lmdb_get_us", "get_memtable_us", "get_folded_us", "txn_get_memtable_us",
        "txn_get_folded_us", "get_memtable_after_commit_us", "get_folded_after_commit_us",
        "lmdb_get_after_commit_us")}
    with scratch_dir() as d:
        mem = agentwal.open(os.path.join(d, "mem.awal"), durability="none")
        fold = agentwal.open(os.path.join(d, "fold.awal"), durability="none")
        env = lmdb.open(os.path.join(d, "lmdb"), map_size=1 << 26)
        try:
            for s in (mem, fold):
                for i in range(10):  # some history, so the head is not the first checkpoint
                    with s.begin("run-1") as txn:
                        txn.put("small", SMALL_VALUE)
                        txn.put("step", i)
            fold.snapshot()
            raw = agentwal.codec.encode_value("small", SMALL_VALUE)
            with env.begin(write=True) as w:
                w.put(b"run-1/small", raw)

            def lmdb_get() -> Any:
                t = env.begin()
                try:
                    return t.get(b"run-1/small")
                finally:
                    t.abort()

            assert mem.get("run-1", "small") == SMALL_VALUE == fold.get("run-1", "small")
            tm, tf = mem.begin("run-1"), fold.begin("run-1")
            try:
                cases: list[tuple[str, Callable[[], Any]]] = [
                    ("lmdb_get_us", lmdb_get),
                    ("get_memtable_us", lambda: mem.get("run-1", "small")),
                    ("get_folded_us", lambda: fold.get("run-1", "small")),
                    ("txn_get_memtable_us", lambda: tm.get("small")),
                    ("txn_get_folded_us", lambda: tf.get("small")),
                ]
                for fn in (f for _, f in cases):
                    _per_call_us(fn, calls // 10)  # warm-up
                for _ in range(repeats):
                    for key, fn in cases:
                        out[key].append(_per_call_us(fn, calls))
            finally:
                tm.rollback()
                tf.rollback()
            # Each call right after a commit to another run (no transaction open, so the
            # memtable keeps no old versions): a get whose value is no longer known to be
            # the latest reads the memtable or LMDB (which that commit did not change), with
            # the caches the commit left; py-lmdb after the same commit is its baseline.
            after: list[tuple[str, Callable[[], Any], agentwal.Store]] = [
                ("get_memtable_after_commit_us", functools.partial(
                    mem.get, "run-1", "small"), mem),
                ("get_folded_after_commit_us", functools.partial(
                    fold.get, "run-1", "small"), fold),
                ("lmdb_get_after_commit_us", lmdb_get, mem)]
            n = 0

            def commit_elsewhere(s: agentwal.Store) -> None:
                nonlocal n
                n += 1
                with s.begin("run-2") as txn:
                    txn.put("tick", n)

            for _ in range(repeats):
                for key, read, s in after:
                    out[key].append(_per_call_after_us(
                        read, functools.partial(commit_elsewhere, s), calls // 10))
        finally:
            mem.close()
            fold.close()
            env.close()
    return out


# -- a growing conversation -------------------------------------------------------------------

GROWTH_STEPS = 200
def growth(seed: int = 5, *, append: bool = False) -> dict[str, Any]:
    """One 200-step conversation that re-puts the whole ``messages`` list at every step.

    Each step begins a transaction, reads ``messages``, appends a ~1 KiB
    message, puts the list back (with ``append``: calls ``txn.append``
    instead, reading nothing), sets two small keys and commits
    (``durability="none"``: the engine's CPU, no fsync). Per step: the thread
    CPU from the put to the end of the commit, and the log bytes the commit
    wrote (the writer's byte count before and after). Then ``snapshot()``
    folds everything and the LMDB pages in use are divided by the steps.
    """
    import random

    rnd = random.Random(seed)
    cpu_us: list[float] = []
    get_us: list[float] = []  # the txn.get of the list (its decode, and the handout snapshot)
    log_bytes: list[int] = []
    with scratch_dir() as d:
        path = os.path.join(d, "chat.awal")
        # A WAL limit far above the ~10 MB the log can reach: no fold during the steps.
        store = agentwal.open(path, durability="none", wal_max_bytes=256 * MIB)
        try:
            written = store.stats()["wal_bytes_since_fold"]
            for step in range(1, GROWTH_STEPS + 1):
                msg = message(rnd, step)  # ~1 KiB, as in the history benchmark
                txn = store.begin("chat")
                if append:  # txn.append: nothing read, the list's bytes joined
                    t0 = time.thread_time()
                    txn.append("messages", msg)
                else:
                    g0 = time.thread_time()
                    messages = txn.get("messages", [])
                    get_us.append((time.thread_time() - g0) * 1e6)
                    messages.append(msg)
                    t0 = time.thread_time()
                    txn.put("messages", messages)
                txn.put("step", step)
                txn.put("tokens", step * 250)
                txn.commit()
                cpu_us.append((time.thread_time() - t0) * 1e6)
                now = store.stats()["wal_bytes_since_fold"]
                log_bytes.append(now - written)
                written = now
            folds_during = store.stats()["folds"]
            store.snapshot()
            st = store.stats()
            used = (st["lmdb_last_page"] + 1) * st["lmdb_page_size"]
            final = store.get("chat", "messages")
            state_s = []
            for _ in range(5):  # the head of a folded 200-message list
                t0 = time.perf_counter()
                store.state("chat")
                state_s.append(time.perf_counter() - t0)
            if len(final) != GROWTH_STEPS:
                raise RuntimeError("the conversation lost messages")
        finally:
            store.close()
    return {
        "cpu_us": cpu_us,
        "get_us": get_us,
        "log_bytes": log_bytes,
        "lmdb_used_bytes": used,
        "folds_during_steps": folds_during,
        "whole_list_bytes": len(agentwal.codec.encode_value("m", final)),
        "state_head_s": min(state_s),
    }


# -- the effects ledger ------------------------------------------------------------------------

LEDGER_RUNS, LEDGER_PER_RUN = 200, 100


def ledger_queries(repeats: int, runs: int = LEDGER_RUNS) -> dict[str, Any]:
    """``store.effects(run=...)`` and ``(run=..., status=...)`` among 20,000 folded entries.

    200 runs (``runs``: fewer for a quick check of the code path) each commit
    100 deferred effects (outbox entries, ``pending``),
    then ``snapshot()`` folds them. Each query is timed (wall, best of
    ``repeats``) and its Python allocation peak traced (``tracemalloc``),
    beside the unfiltered ``store.effects()`` that reads the whole ledger.
    """
    import tracemalloc

    out: dict[str, Any] = {}
    with scratch_dir() as d:
        store = agentwal.open(os.path.join(d, "ledger.awal"), durability="none")
        try:
            for r in range(runs):
                with store.begin(f"run-{r}") as txn:
                    for i in range(LEDGER_PER_RUN):
                        txn.defer("notify", mode="at_least_once", args={"i": i})
            store.snapshot()
            queries: list[tuple[str, Callable[[], list[Any]], int]] = [
                ("ledger_all", store.effects, runs * LEDGER_PER_RUN),
                ("ledger_run", lambda: store.effects(run="run-7"), LEDGER_PER_RUN),
                ("ledger_run_status",
                 lambda: store.effects(run="run-7", status="pending"), LEDGER_PER_RUN),
                ("ledger_status_none", lambda: store.effects(status="in_doubt"), 0),
            ]
            for key, fn, want in queries:
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    got = fn()
                    times.append(time.perf_counter() - t0)
                if len(got) != want:
                    raise RuntimeError(f"{key}: {len(got)} entries, not {want}")
                tracemalloc.start()
                fn()
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                out[f"{key}_s"] = min(times)
                out[f"{key}_peak_bytes"] = peak
        finally:
            store.close()
    return out


# -- open times ------------------------------------------------------------------------------


def open_wal(path: str, warm: int, cold: int) -> dict[str, Any]:
    """Open (replay) a crashed store ``warm`` times with a warm cache and ``cold`` times cold."""
    out: dict[str, Any] = {"warm_s": [], "cold_s": []}
    if warm > 2:  # a first open so that every timed warm open follows another one
        open_and_release(path)
    for _ in range(warm):
        dt, rec = open_and_release(path)
        out["warm_s"].append(dt)
        out["replayed"] = rec.get("replayed")
    for _ in range(cold):
        evict_page_cache(path)
        dt, _rec = open_and_release(path)
        out["cold_s"].append(dt)
    return out


def open_history(few: str, many: str, rounds: int) -> dict[str, list[float]]:
    """Open the two history stores alternately ``rounds`` times each."""
    out: dict[str, list[float]] = {"few": [], "many": []}
    for path in (few, many):
        open_and_release(path)  # warm-up
    for _ in range(rounds):
        out["few"].append(open_and_release(few)[0])
        out["many"].append(open_and_release(many)[0])
    return out


# -- the run ----------------------------------------------------------------------------------

THROUGHPUT: list[tuple[str, str, Callable[[float], Result]]] = [
    ("agentwal_sync_1t", "agentwal sync, 1 thread", lambda s: agentwal_commits("sync", 1, s)),
    ("agentwal_sync_8t", "agentwal sync, 8 threads", lambda s: agentwal_commits("sync", 8, s)),
    ("agentwal_async_1t", "agentwal async, 1 thread", lambda s: agentwal_commits("async", 1, s)),
    ("raw_append_fdatasync", "raw append + fdatasync", raw_append),
    ("raw_overwrite_fdatasync", "raw overwrite (preallocated) + fdatasync", raw_overwrite),
    ("sqlite_wal_full", "SQLite WAL, synchronous=FULL", sqlite_full),
    ("sqlite_wal_full_8t", "SQLite WAL FULL, 8 threads (reference)", sqlite_full_threads),
    ("lmdb_sync", "LMDB sync=True", lmdb_sync),
]


READS: list[tuple[str, str]] = [
    ("lmdb_get_us", "py-lmdb begin + get + abort"),
    ("get_memtable_us", "store.get, memtable"),
    ("get_folded_us", "store.get, folded"),
    ("txn_get_memtable_us", "txn.get, memtable"),
    ("txn_get_folded_us", "txn.get, folded"),
    ("get_memtable_after_commit_us", "store.get, memtable, after a commit (wall)"),
    ("get_folded_after_commit_us", "store.get, folded, after a commit (wall)"),
    ("lmdb_get_after_commit_us", "py-lmdb get, after a commit (wall)"),
]


def _revision() -> str:
    """The git commit of the checkout, with ``+dirty`` if ``agentwal/`` has local edits."""
    import subprocess

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            text=True,
            capture_output=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "agentwal"],
            cwd=here,
            text=True,
            capture_output=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev or "unknown") + ("+dirty" if dirty else "")


def environment() -> dict[str, Any]:
    root = bench_root()
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "kernel": platform.release(),
        "revision": _revision(),
        "python": platform.python_version(),
        "bench_dir": root,
        "bench_fs": fs_type(root),
        "sqlite": sqlite3.sqlite_version,
        "lmdb": ".".join(map(str, lmdb.version())),
        "agentwal": getattr(agentwal, "__version__", "?"),
        "agentwal_path": os.path.dirname(agentwal.__file__),
    }


def _paired(samples: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of the per-round ratio ``num / den`` (drift cancels within a round)."""
    return statistics.median(a / b for a, b in zip(samples[num], samples[den], strict=True))


def run(
    seconds: float,
    rounds: int,
    do_open: bool,
    wal_opens: int,
    cold_opens: int,
    hist_opens: int,
    log: Callable[[str], None],
    wal_value_bytes: int = RECORD,
    do_reads: bool = True,
    do_throughput: bool = True,
    do_ledger: bool = True,
    read_repeats: int = 7,
    growth_runs: int = 3,
    quick: bool = False,
) -> dict[str, Any]:
    """Every figure of the comparison; ``quick`` shrinks the reads and the ledger to a check
    of the code path (``bench/report.py --quick``: its figures mean nothing)."""
    load_before = os.getloadavg()
    samples: dict[str, list[float]] = {k: [] for k, _, _ in THROUGHPUT}
    extras: dict[str, list[dict[str, Any]]] = {k: [] for k, _, _ in THROUGHPUT}
    for r in range(rounds if do_throughput else 0):
        order = THROUGHPUT[r % len(THROUGHPUT) :] + THROUGHPUT[: r % len(THROUGHPUT)]
        for key, label, fn in order:
            n, dt, extra = fn(seconds)
            samples[key].append(n / dt)
            extras[key].append(extra)
            log(f"round {r + 1}/{rounds}  {label:<42} {n / dt:>10,.0f} /s")
    figures: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items() if v}
    detail: dict[str, Any] = {"samples": samples, "extra": extras}
    if do_open:
        with scratch_dir() as d:
            wal_path = os.path.join(d, "wal64.awal")
            built = build_wal_store(wal_path, WAL_BYTES, value_bytes=wal_value_bytes)
            log(
                f"built a {built['wal_bytes'] / MIB:.1f} MiB WAL ({built['commits']:,} commits) "
                f"in {built['build_seconds']:.1f} s"
            )
            ow = open_wal(wal_path, wal_opens, cold_opens)
            figures["open_wal_64mib_warm_s"] = statistics.median(ow["warm_s"])
            if ow["cold_s"]:
                figures["open_wal_64mib_cold_s"] = statistics.median(ow["cold_s"])
            detail["open_wal"] = {**built, **ow, "value_bytes": wal_value_bytes}
            log(
                f"open with 64 MiB WAL: warm {_fmt_list(ow['warm_s'])}, "
                f"cold {_fmt_list(ow['cold_s'])}"
            )
        with scratch_dir() as d:
            few, many = os.path.join(d, "few.awal"), os.path.join(d, "many.awal")
            b1 = build_history_store(few, FEW_CHECKPOINTS)
            b2 = build_history_store(many, MANY_CHECKPOINTS)
            log(
                f"built history stores in {b1['build_seconds']:.1f} s and "
                f"{b2['build_seconds']:.1f} s"
            )
            oh = open_history(few, many, hist_opens)
            figures["open_1k_ckpt_s"] = statistics.median(oh["few"])
            figures["open_100k_ckpt_s"] = statistics.median(oh["many"])
            samples["open_1k_ckpt_s"], samples["open_100k_ckpt_s"] = oh["few"], oh["many"]
            detail["open_history"] = {
                "few": {**b1, "open_s": oh["few"]},
                "many": {**b2, "open_s": oh["many"]},
            }
    if do_reads:
        rs = reads(1, calls=200) if quick else reads(read_repeats)
        samples.update(rs)
        figures.update({k: min(v) for k, v in rs.items()})
        log("reads (µs per call, min of repeats): " +
            ", ".join(f"{k} {min(v):.2f}" for k, v in rs.items()))
    if do_ledger:
        lq = (ledger_queries(1, runs=10) if quick else
              ledger_queries(3 if read_repeats < 7 else 5))
        figures.update(lq)
        detail["ledger"] = lq
        log("effects ledger of 20,000 entries: " + ", ".join(
            f"{k} {v * 1e3:.2f} ms" for k, v in lq.items() if k.endswith("_s")))
    if growth_runs:
        convs = [growth(seed=5 + i) for i in range(growth_runs)]
        for c in convs:
            cpu, lb = c["cpu_us"], c["log_bytes"]
            samples.setdefault("growth_cpu_11_30_us", []).append(statistics.median(cpu[10:30]))
            samples.setdefault("growth_cpu_last20_us", []).append(statistics.median(cpu[-20:]))
            samples.setdefault("growth_log_bytes_step200", []).append(float(lb[-1]))
            samples.setdefault("growth_history_bytes_per_ckpt", []).append(
                c["lmdb_used_bytes"] / GROWTH_STEPS)
            samples.setdefault("growth_state_head_ms", []).append(c["state_head_s"] * 1e3)
            whole = [p + g for p, g in zip(cpu, c["get_us"], strict=True)]
            samples.setdefault("growth_get_cpu_11_30_us", []).append(
                statistics.median(whole[10:30]))
            samples.setdefault("growth_get_cpu_last20_us", []).append(
                statistics.median(whole[-20:]))
        for k in ("growth_cpu_11_30_us", "growth_cpu_last20_us", "growth_log_bytes_step200",
                  "growth_history_bytes_per_ckpt", "growth_state_head_ms",
                  "growth_get_cpu_11_30_us", "growth_get_cpu_last20_us"):
            figures[k] = statistics.median(samples[k])
        detail["growth"] = [
            {"cpu_us": [round(x, 1) for x in c["cpu_us"]], "log_bytes": c["log_bytes"],
             "get_us": [round(x, 1) for x in c["get_us"]],
             "lmdb_used_bytes": c["lmdb_used_bytes"],
             "folds_during_steps": c["folds_during_steps"],
             "whole_list_bytes": c["whole_list_bytes"],
             "state_head_s": c["state_head_s"]} for c in convs]
        if hasattr(agentwal.Transaction, "append"):
            ap = growth(seed=5, append=True)
            figures["growth_append_cpu_11_30_us"] = statistics.median(ap["cpu_us"][10:30])
            figures["growth_append_cpu_last20_us"] = statistics.median(ap["cpu_us"][-20:])
            figures["growth_append_log_bytes_step200"] = float(ap["log_bytes"][-1])
            for k in ("growth_append_cpu_11_30_us", "growth_append_cpu_last20_us"):
                samples[k] = [figures[k]]
            detail["growth_append"] = {"cpu_us": [round(x, 1) for x in ap["cpu_us"]],
                                       "log_bytes": ap["log_bytes"]}
        log(f"growing conversation: commit 200 logged {figures['growth_log_bytes_step200']:,.0f} B,"
            f" put+commit {figures['growth_cpu_11_30_us']:.0f} µs (steps 11-30) -> "
            f"{figures['growth_cpu_last20_us']:.0f} µs (181-200), history "
            f"{figures['growth_history_bytes_per_ckpt']:,.0f} B per checkpoint")
    goals = []
    for label, num, den, goal, direction in GOALS:
        if num not in figures or (den is not None and den not in figures):
            continue
        value = _paired(samples, num, den) if den is not None else figures[num]
        met = value >= goal if direction == "min" else value <= goal
        goals.append(
            {
                "goal": label,
                "value": value,
                "target": goal,
                "direction": ">=" if direction == "min" else "<=",
                "met": met,
            }
        )
    reference = [
        {"ratio": label, "value": _paired(samples, num, den)}
        for label, num, den in REFERENCE
        if samples.get(num) and samples.get(den)
    ]
    env = {**environment(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    return {
        "environment": env,
        "seconds": seconds,
        "rounds": rounds,
        "figures": figures,
        "goals": goals,
        "reference": reference,
        "detail": detail,
    }


def _fmt_list(xs: list[float]) -> str:
    return "[" + ", ".join(f"{x:.3f}" for x in xs) + "]"


def print_table(res: dict[str, Any]) -> None:
    env, figs = res["environment"], res["figures"]
    print(
        f"\nagentwal {env['agentwal']} ({env.get('revision', '?')}) on {env['cpus']} x "
        f"{env['cpu_model']}, Linux "
        f"{env['kernel']}, Python {env['python']}; stores in {env['bench_dir']} "
        f"({env['bench_fs']}); {res['rounds']} round(s) x {res['seconds']:g} s, medians; "
        f"load average {env['loadavg_before'][0]:.2f} before, {env['loadavg_after'][0]:.2f} "
        "after\n"
    )
    if "agentwal_sync_1t" in figs:
        print(f"{'commits/s (1 KiB value)':<44}{'median':>12}{'min':>10}{'max':>10}")
        for key, label, _ in THROUGHPUT:
            s = res["detail"]["samples"][key]
            print(f"{label:<44}{figs[key]:>12,.0f}{min(s):>10,.0f}{max(s):>10,.0f}")
        b8 = res["detail"]["extra"]["agentwal_sync_8t"]
        if b8:
            cps = statistics.median(e["commits_per_sync"] for e in b8)
            print(f"{'  (8 threads: commits per fdatasync)':<44}{cps:>12.2f}")
    if "lmdb_get_us" in figs:
        print(f"\n{'reads of a small value (thread CPU)':<44}{'min µs':>12}")
        for key, label in READS:
            print(f"{label:<44}{figs[key]:>12.2f}")
    if "ledger_all_s" in figs:
        print(f"\n{'effects ledger, 20,000 folded entries':<44}{'best ms':>12}{'peak MB':>10}")
        for key, label in (("ledger_all", "effects() (every entry)"),
                           ("ledger_run", "effects(run=) (100 entries)"),
                           ("ledger_run_status", "effects(run=, status=) (100)"),
                           ("ledger_status_none", "effects(status=in_doubt) (none)")):
            print(f"{label:<44}{figs[key + '_s'] * 1e3:>12.2f}"
                  f"{figs[key + '_peak_bytes'] / MIB:>10.2f}")
    if "growth_log_bytes_step200" in figs:
        print(f"\n{'growing conversation (200 steps, medians)':<44}{'value':>12}")
        step200 = figs["growth_log_bytes_step200"]
        print(f"{'log bytes of the commit at step 200':<44}{step200:>12,.0f}")
        print(f"{'put+commit CPU, steps 11-30 (µs)':<44}{figs['growth_cpu_11_30_us']:>12,.0f}")
        print(f"{'put+commit CPU, steps 181-200 (µs)':<44}{figs['growth_cpu_last20_us']:>12,.0f}")
        print(f"{'get+put+commit CPU, steps 11-30 (µs)':<44}"
              f"{figs['growth_get_cpu_11_30_us']:>12,.0f}")
        print(f"{'get+put+commit CPU, steps 181-200 (µs)':<44}"
              f"{figs['growth_get_cpu_last20_us']:>12,.0f}")
        print(f"{'folded history, bytes per checkpoint':<44}"
              f"{figs['growth_history_bytes_per_ckpt']:>12,.0f}")
        print(f"{'state() of the folded head (ms, best of 5)':<44}"
              f"{figs['growth_state_head_ms']:>12.3f}")
        if "growth_append_cpu_last20_us" in figs:
            print(f"{'txn.append instead: CPU steps 11-30 (µs)':<44}"
                  f"{figs['growth_append_cpu_11_30_us']:>12,.0f}")
            print(f"{'txn.append instead: CPU steps 181-200 (µs)':<44}"
                  f"{figs['growth_append_cpu_last20_us']:>12,.0f}")
    if "open_wal_64mib_warm_s" in figs:
        ow = res["detail"]["open_wal"]
        print(f"\n{'open / recovery':<44}{'median s':>12}")
        print(
            f"{'64 MiB WAL, warm cache':<44}{figs['open_wal_64mib_warm_s']:>12.3f}"
            f"   ({ow['replayed']:,} records of {ow['value_bytes']:,} B values)"
        )
        if "open_wal_64mib_cold_s" in figs:
            print(f"{'64 MiB WAL, store pages evicted':<44}{figs['open_wal_64mib_cold_s']:>12.3f}")
        print(f"{'1,000 folded checkpoints':<44}{figs['open_1k_ckpt_s']:>12.4f}")
        print(f"{'100,000 folded checkpoints':<44}{figs['open_100k_ckpt_s']:>12.4f}")
    print(f"\n{'goal':<44}{'value':>12}{'target':>12}  met")
    for g in res["goals"]:
        unit = "x" if " vs " in g["goal"] else ""
        value = f"{g['value']:,.2f}{unit}" if g["value"] < 1000 else f"{g['value']:,.0f}"
        target = f"{g['direction']} {g['target']:g}{unit}"
        print(f"{g['goal']:<44}{value:>12}{target:>12}  {'yes' if g['met'] else 'NO'}")
    if res.get("reference"):
        print(f"\n{'reference ratio (no goal)':<50}{'value':>6}")
        for ref in res["reference"]:
            print(f"{ref['ratio']:<50}{ref['value']:>5.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="seconds per throughput slice (default 2, --quick 1)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved rounds; figures are medians (default 9, --quick 2)",
    )
    ap.add_argument("--quick", action="store_true", help="short run (about a minute)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--no-open", action="store_true", help="skip the open/recovery measurements")
    ap.add_argument("--no-throughput", action="store_true", help="skip the commits/s slices")
    ap.add_argument("--no-reads", action="store_true", help="skip the read micro-benchmarks")
    ap.add_argument("--no-ledger", action="store_true",
                    help="skip the effects-ledger queries")
    ap.add_argument("--no-growth", action="store_true",
                    help="skip the growing-conversation figures")
    ap.add_argument(
        "--wal-value-bytes",
        type=int,
        default=RECORD,
        help="value size of the commits in the 64 MiB WAL (default 1024; "
        "smaller values mean more records to replay)",
    )
    args = ap.parse_args(argv)
    seconds = args.seconds or (1.0 if args.quick else 2.0)
    rounds = args.rounds or (2 if args.quick else 9)
    if seconds <= 0 or rounds < 1:
        ap.error("--seconds must be > 0 and --rounds >= 1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    res = run(
        seconds,
        rounds,
        not args.no_open,
        wal_opens=2 if args.quick else 5,
        cold_opens=1 if args.quick else 3,
        hist_opens=10 if args.quick else 30,
        log=log,
        wal_value_bytes=args.wal_value_bytes,
        do_reads=not args.no_reads,
        do_throughput=not args.no_throughput,
        do_ledger=not args.no_ledger,
        read_repeats=3 if args.quick else 7,
        growth_runs=0 if args.no_growth else (1 if args.quick else 3),
    )
    if args.json:
        json.dump(res, sys.stdout, indent=2, default=str)
        print()
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
