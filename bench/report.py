#!/usr/bin/env python3
"""Run the side-by-side benchmarks and regenerate docs/benchmarks.md's report and plots.

Usage::

    make bench-report                          # the full run (about 12 minutes), then the page
    .venv/bin/python bench/report.py --quick   # tiny sizes, a few seconds: checks the code path
    .venv/bin/python bench/report.py --render-only   # page and plots again from bench/report.json

Every figure on the page and in the plots comes from the measurements of one
run, saved to ``bench/report.json`` first; nothing is typed in by hand. Each
measurement runs agentwal and its baselines (raw fdatasync loops, SQLite,
LMDB, LangGraph's SqliteSaver and PostgresSaver, git, plain file copies, plain
PostgreSQL inserts) in the same run, interleaved round by round where the load
of a shared machine could move between them; a ratio is the median over rounds
of the ratio *within* a round. The open issues' own benchmarks run as parts of
it (issue #13's ``langgraph_compare.py`` workload, issue #15's
``bench_workspace.py`` tree), so the page's goals table covers every goal.
Every PostgreSQL measurement uses one server (``--pg-dsn``'s, else a throwaway
one started as the tests start theirs, made durable). The load average before
the run (and at the start of each part) is recorded; above ``LOADED`` per CPU
the page, every plot and stderr say the machine was busy.

``--quick`` shrinks every size so the whole run takes seconds; its figures
mean nothing (``tests/test_bench_report.py`` runs it to keep this code
working, and never looks at a timing). Stores go under
``benchlib.bench_root()`` (never tmpfs) and are removed as each measurement
ends.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)

import bench_workspace as wsb  # noqa: E402
import compare  # noqa: E402
import lmdb  # noqa: E402
from benchlib import (  # noqa: E402
    MIB,
    build_history_store,
    build_wal_store,
    evict_page_cache,
    make_durable,
    open_and_release,
    scratch_dir,
    values,
)
from report_render import LOADED, loaded  # noqa: E402

import agentwal  # noqa: E402

Log = Callable[[str], None]


def spread(xs: list[float]) -> dict[str, float]:
    """The median of ``xs`` and its spread (drawn as error bars): the 25th and 75th
    percentiles for five samples or more, else the min and the max."""
    if len(xs) >= 5:
        lo, _, hi = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        lo, hi = min(xs), max(xs)
    return {"median": statistics.median(xs), "lo": lo, "hi": hi, "n": len(xs)}


def paired(num: list[float], den: list[float]) -> float:
    """Median over rounds of the per-round ratio ``num / den``."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def per_call(fn: Callable[[], Any], number: int, repeat: int) -> list[float]:
    """Seconds per call of ``fn``: ``repeat`` samples, each the mean of ``number`` calls."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        out.append((time.perf_counter() - t0) / number)
    return out


# -- commits/s vs writer threads --------------------------------------------------------------


def lmdb_commits(threads: int, seconds: float) -> compare.Result:
    """LMDB ``sync=True``, one put per write transaction, from ``threads`` threads."""
    if threads == 1:
        return compare.lmdb_sync(seconds)
    vals = values()
    with scratch_dir() as d:
        env = lmdb.open(os.path.join(d, "lmdb"), map_size=1 << 30, sync=True, metasync=True)
        try:

            def body(k: int, ready: threading.Barrier, stop: threading.Event) -> int:
                ready.wait()
                i = 0
                while not stop.is_set():
                    with env.begin(write=True) as txn:
                        txn.put(f"run-{k}/value".encode(), vals[(i + k) % len(vals)])
                    i += 1
                return i

            n, dt = compare._race(threads, seconds, body)
        finally:
            env.close()
    return n, dt, {}


def sqlite_commits(threads: int, seconds: float) -> compare.Result:
    if threads == 1:
        return compare.sqlite_full(seconds)
    return compare.sqlite_full_threads(seconds, threads)


def sqlite_normal(seconds: float) -> compare.Result:
    """SQLite WAL with ``synchronous=NORMAL``: a commit is not fsynced (the WAL is, at
    checkpoints), so it survives a process crash but may be lost with the machine."""
    vals = values()
    with scratch_dir() as d:
        db = sqlite3.connect(os.path.join(d, "s.db"), isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE kv (run TEXT, key TEXT, value BLOB, PRIMARY KEY (run, key))"
                       " WITHOUT ROWID")

            def op(i: int) -> None:
                db.execute("BEGIN")
                db.execute("INSERT OR REPLACE INTO kv VALUES ('run-0', 'value', ?)",
                           (vals[i % len(vals)],))
                db.execute("COMMIT")

            n, dt = compare._timed_loop(op, seconds)
        finally:
            db.close()
    return n, dt, {}


def lmdb_nosync(seconds: float) -> compare.Result:
    """LMDB with ``sync=False``: a commit is in the page cache, flushed by the OS later."""
    vals = values()
    with scratch_dir() as d:
        env = lmdb.open(os.path.join(d, "lmdb"), map_size=1 << 30, sync=False, metasync=False)
        try:

            def op(i: int) -> None:
                with env.begin(write=True) as txn:
                    txn.put(b"run-0/value", vals[i % len(vals)])

            n, dt = compare._timed_loop(op, seconds)
        finally:
            env.close()
    return n, dt, {}


# 1 thread, no fsync per commit: agentwal's async and none modes beside the baselines' own
UNSYNCED: dict[str, Callable[[float], compare.Result]] = {
    "agentwal async": lambda s: compare.agentwal_commits("async", 1, s),
    "agentwal none": lambda s: compare.agentwal_commits("none", 1, s),
    "SQLite WAL NORMAL": sqlite_normal,
    "LMDB sync=False": lmdb_nosync,
}


def threads_sweep(threads: list[int], seconds: float, rounds: int, log: Log) -> dict[str, Any]:
    systems: dict[str, Callable[[int, float], compare.Result]] = {
        "agentwal sync": lambda t, s: compare.agentwal_commits("sync", t, s),
        "SQLite WAL FULL": sqlite_commits,
        "LMDB sync": lmdb_commits,
    }
    jobs = ([(name, t) for name in systems for t in threads] + [("raw append + fdatasync", 1)]
            + [(name, 1) for name in UNSYNCED])
    samples: dict[str, list[float]] = {f"{n}@{t}": [] for n, t in jobs}
    for r in range(rounds):
        shift = r % len(jobs)
        for name, t in jobs[shift:] + jobs[:shift]:
            fn = systems.get(name)
            if fn is not None:
                n, dt, _ = fn(t, seconds)
            elif name in UNSYNCED:
                n, dt, _ = UNSYNCED[name](seconds)
            else:
                n, dt, _ = compare.raw_append(seconds)
            samples[f"{name}@{t}"].append(n / dt)
            log(f"threads round {r + 1}/{rounds}: {name} x{t}: {n / dt:,.0f} commits/s")
    series = {name: [spread(samples[f"{name}@{t}"]) for t in threads] for name in systems}
    ratios = {
        base: [paired(samples[f"agentwal sync@{t}"], samples[f"{base}@{t}"]) for t in threads]
        for base in ("SQLite WAL FULL", "LMDB sync")
    }
    raw = spread(samples["raw append + fdatasync@1"])
    unsynced = {name: spread(samples[f"{name}@1"]) for name in UNSYNCED}
    unsynced_ratios = {f"agentwal {mode} / {base}": paired(samples[f"agentwal {mode}@1"],
                                                           samples[f"{base}@1"])
                       for mode in ("async", "none")
                       for base in ("SQLite WAL NORMAL", "LMDB sync=False")}
    return {"threads": threads, "series": series, "ratios": ratios, "raw_append": raw,
            "unsynced": unsynced, "unsynced_ratios": unsynced_ratios,
            "seconds": seconds, "rounds": rounds}


# -- open time vs WAL size and vs history length ------------------------------------------------


def sqlite_log_open(d: str, commits: int, repeat: int) -> list[float]:
    """Open a crash image of SQLite with ``commits`` 1 KiB commits in its WAL; seconds.

    The database is filled with ``wal_autocheckpoint=0`` so every commit stays
    in the ``-wal`` file; its files are copied while the writer is still open
    (what a crash leaves). The timed part is ``connect`` plus reading one row,
    which makes SQLite scan the WAL to rebuild its index.
    """
    vals = values()
    src = os.path.join(d, "src.db")
    db = sqlite3.connect(src, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE kv (run TEXT, key TEXT, value BLOB, PRIMARY KEY (run, key))"
               " WITHOUT ROWID")
    for i in range(commits):
        db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)",
                   (f"run-{i % 8}", "value", vals[i % len(vals)]))
    out = []
    for k in range(repeat):
        img = os.path.join(d, f"img{k}")
        os.makedirs(img)
        for suffix in ("", "-wal"):
            shutil.copyfile(src + suffix, os.path.join(img, "c.db" + suffix))
        t0 = time.perf_counter()
        conn = sqlite3.connect(os.path.join(img, "c.db"))
        conn.execute("SELECT value FROM kv WHERE run = 'run-0' AND key = 'value'").fetchone()
        out.append(time.perf_counter() - t0)
        conn.close()
        shutil.rmtree(img)
    db.close()
    return out


def lmdb_open(d: str, records: int, repeat: int) -> list[float]:
    """Open an LMDB environment holding ``records`` records and read one; seconds."""
    vals = values()
    path = os.path.join(d, "lmdb")
    env = lmdb.open(path, map_size=1 << 32, sync=False)
    with env.begin(write=True) as txn:
        for i in range(records):
            txn.put(f"run-{i % 8}/{i:08d}".encode(), vals[i % len(vals)])
    env.sync(True)
    env.close()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        env = lmdb.open(path, map_size=1 << 32, readonly=True, lock=False)
        with env.begin() as txn:
            txn.get(b"run-0/00000000")
        out.append(time.perf_counter() - t0)
        env.close()
    return out


def replay_open(path: str, commits: int) -> float:
    """Seconds of one open of a crashed store that replays all ``commits`` of its log.

    Raises RuntimeError when the open replayed fewer: the figure would time an
    open of a folded store, not the replay the sweep is about.
    """
    dt, rec = open_and_release(path)
    if rec.get("replayed") != commits:
        raise RuntimeError(f"open of {path} replayed {rec.get('replayed')} of {commits} "
                           "records: the log was folded between opens")
    return dt


def open_sweep(wal_mib: list[float], history: list[int], repeat: int, log: Log) -> dict[str, Any]:
    wal: dict[str, Any] = {"mib": wal_mib, "commits": [], "agentwal": [], "agentwal_cold": [],
                           "SQLite WAL": [], "LMDB": []}
    for mib in wal_mib:
        with scratch_dir() as d:
            path = os.path.join(d, "s.awal")
            built = build_wal_store(path, int(mib * MIB))
            open_and_release(path)  # every timed open follows another one (warm)
            warm = [replay_open(path, built["commits"]) for _ in range(repeat)]
            cold = []
            for _ in range(max(1, repeat // 2)):
                evict_page_cache(path)
                cold.append(replay_open(path, built["commits"]))
            shutil.rmtree(path)
            wal["commits"].append(built["commits"])
            wal["agentwal"].append(spread(warm))
            wal["agentwal_cold"].append(spread(cold))
            wal["SQLite WAL"].append(spread(sqlite_log_open(d, built["commits"], repeat)))
            wal["LMDB"].append(spread(lmdb_open(d, built["commits"], repeat)))
        log(f"open: {mib:g} MiB WAL ({built['commits']:,} commits): agentwal "
            f"{wal['agentwal'][-1]['median'] * 1e3:.1f} ms, SQLite "
            f"{wal['SQLite WAL'][-1]['median'] * 1e3:.1f} ms")
    hist: dict[str, Any] = {"checkpoints": history, "agentwal": [], "SQLite": []}
    for n in history:
        with scratch_dir() as d:
            path = os.path.join(d, "h.awal")
            build_history_store(path, n)
            open_and_release(path)
            hist["agentwal"].append(spread([open_and_release(path)[0] for _ in range(repeat)]))
            shutil.rmtree(path)
            hist["SQLite"].append(spread(sqlite_history_open(d, n, repeat)))
        log(f"open: {n:,} checkpoints: agentwal {hist['agentwal'][-1]['median'] * 1e3:.1f} ms")
    return {"wal": wal, "history": hist}


def sqlite_history_open(d: str, checkpoints: int, repeat: int) -> list[float]:
    """Open a SQLite file of ``checkpoints`` rows over 10 runs and read one run's head."""
    path = os.path.join(d, "h.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE ckpt (run TEXT, id INTEGER, state BLOB, PRIMARY KEY (run, id))"
               " WITHOUT ROWID")
    db.execute("BEGIN")
    for i in range(checkpoints):
        state = json.dumps({"step": i, "message": f"step {i}: called the tool and got an answer"})
        db.execute("INSERT INTO ckpt VALUES (?, ?, ?)", (f"run-{i % 10}", i // 10, state))
    db.execute("COMMIT")
    db.close()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        conn = sqlite3.connect(path)
        row = conn.execute("SELECT state FROM ckpt WHERE run = 'run-3' ORDER BY id DESC LIMIT 1"
                           ).fetchone()
        json.loads(row[0])
        out.append(time.perf_counter() - t0)
        conn.close()
    return out


# -- a growing conversation: bytes per checkpoint, commit latency, state(at=) --------------------


def _text(rng: random.Random, step: int, size: int) -> str:
    return (f"step {step} " + rng.randbytes(size // 2).hex())[:size]


def _file_bytes(path: str) -> int:
    return os.stat(path).st_blocks * 512


class _Conversation:
    """One system under the conversation workload: ``step``, ``fold``, ``size``, ``read``."""

    name = ""

    def step(self, n: int, text: str) -> None:
        raise NotImplementedError

    def fold(self) -> None:
        raise NotImplementedError

    def size(self) -> int:
        raise NotImplementedError

    def read(self, n: int) -> int:  # the state at step n; returns its message count
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _AgentwalConversation(_Conversation):
    name = "agentwal"

    def __init__(self, d: str) -> None:
        self.path = os.path.join(d, "c.awal")
        self.store = agentwal.open(self.path, durability="sync")
        self.messages: list[dict[str, Any]] = []

    def step(self, n: int, text: str) -> None:
        self.messages.append({"role": "assistant" if n % 2 else "user", "content": text})
        with self.store.begin("chat") as txn:
            txn["messages"] = self.messages
            txn["step"] = n

    def fold(self) -> None:
        self.store.snapshot()

    def size(self) -> int:
        return _file_bytes(os.path.join(self.path, "snapshot", "data.mdb"))

    def read(self, n: int) -> int:
        return len(self.store.state("chat", at=n)["messages"])

    def close(self) -> None:
        self.store.close()


class _SqliteWholeState(_Conversation):
    name = "SQLite, whole state per checkpoint"

    def __init__(self, d: str) -> None:
        self.path = os.path.join(d, "c.db")
        self.db = compare._sqlite_open(self.path)
        self.db.execute("CREATE TABLE ckpt (run TEXT, id INTEGER, state BLOB,"
                        " PRIMARY KEY (run, id)) WITHOUT ROWID")
        self.messages: list[dict[str, Any]] = []

    def step(self, n: int, text: str) -> None:
        self.messages.append({"role": "assistant" if n % 2 else "user", "content": text})
        blob = json.dumps({"messages": self.messages, "step": n}).encode()
        self.db.execute("BEGIN")
        self.db.execute("INSERT INTO ckpt VALUES ('chat', ?, ?)", (n, blob))
        self.db.execute("COMMIT")

    def fold(self) -> None:
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def size(self) -> int:
        return _file_bytes(self.path)

    def read(self, n: int) -> int:
        row = self.db.execute("SELECT state FROM ckpt WHERE run = 'chat' AND id = ?",
                              (n,)).fetchone()
        return len(json.loads(row[0])["messages"])

    def close(self) -> None:
        self.db.close()


class _SaverConversation(_Conversation):
    """A LangGraph checkpointer driven as the Pregel loop drives it (langgraph_compare.py)."""

    def __init__(self, d: str, kind: str) -> None:
        import langgraph_compare as lgc

        self.lgc = lgc
        self.configs: dict[int, Any] = {}
        self.state: dict[str, Any] = {
            "config": {"configurable": {"thread_id": "chat", "checkpoint_ns": ""}},
            "messages": []}
        if kind == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            self.name = "LangGraph SqliteSaver"
            self.path = os.path.join(d, "lg.sqlite")
            self.conn = compare._sqlite_open(self.path)
            self.conn.close()
            self.conn = sqlite3.connect(self.path, check_same_thread=False,
                                        isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.saver: Any = SqliteSaver(self.conn)
            self.store = None
        else:
            from agentwal.integrations.langgraph import AgentWALSaver

            self.name = "LangGraph AgentWALSaver"
            self.path = os.path.join(d, "lg.awal")
            self.store = agentwal.open(self.path, durability="sync")
            self.saver = AgentWALSaver(self.store)
        self.footprint: Callable[[], int] | None = None

    def step(self, n: int, text: str) -> None:
        self.lgc.drive(self.saver, "chat", 0, n, 1, len(text), self.state)
        self.configs[n] = self.state["config"]

    def fold(self) -> None:
        if self.store is not None:
            self.store.snapshot()
        else:
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def size(self) -> int:
        if self.footprint is not None:
            return self.footprint()
        if self.store is not None:
            return _file_bytes(os.path.join(self.path, "snapshot", "data.mdb"))
        return _file_bytes(self.path)

    def read(self, n: int) -> int:
        tup = self.saver.get_tuple(self.configs[n])
        return len(tup.checkpoint["channel_values"]["messages"])

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        else:
            self.conn.close()


class _PgSaverConversation(_SaverConversation):
    """A saver on the run's PostgreSQL server, in a schema of its own (dropped at close):
    ``bench/langgraph_postgres_compare.py``'s PostgresSaver or AgentWALSaver. Its size is
    the schema's relations (``pg_total_relation_size``, in 8 KiB pages); nothing to fold."""

    def __init__(self, dsn: str, kind: str) -> None:
        import langgraph_compare as lgc
        import langgraph_postgres_compare as lpc

        self.lgc, self.configs, self.store = lgc, {}, None
        self.state = {"config": {"configurable": {"thread_id": "chat", "checkpoint_ns": ""}},
                      "messages": []}
        schema = f"conv_{kind}_{os.getpid()}"
        self.stack = contextlib.ExitStack()
        if kind == "postgres":
            self.name = "LangGraph PostgresSaver"
            self.saver = self.stack.enter_context(lpc.postgres_saver(dsn, schema, 1))
        else:
            self.name = "LangGraph AgentWALSaver (PostgreSQL)"
            self.saver = self.stack.enter_context(lpc.agentwal_saver(dsn, schema))
        size = lpc.schema_bytes(dsn)
        self.footprint = lambda: size(schema)

    def fold(self) -> None:
        pass

    def close(self) -> None:
        self.stack.close()


def conversation(steps: int, every: int, ages: list[int], size: int, repeat: int,
                 pg: PgServer, log: Log) -> dict[str, Any]:
    makers: list[Callable[[str], _Conversation]] = [_AgentwalConversation, _SqliteWholeState]
    notes = []
    try:
        import langgraph_compare  # noqa: F401

        makers += [lambda d: _SaverConversation(d, "sqlite"),
                   lambda d: _SaverConversation(d, "agentwal")]
    except ImportError as exc:
        notes.append(f"LangGraph savers skipped: {exc}")
    if pg.dsn is None:
        notes += [f"the LangGraph savers on PostgreSQL: {n}" for n in pg.notes]
    else:
        try:
            import langgraph_postgres_compare  # noqa: F401

            dsn = pg.dsn
            makers += [lambda d: _PgSaverConversation(dsn, "postgres"),
                       lambda d: _PgSaverConversation(dsn, "agentwal")]
        except ImportError as exc:
            notes.append(f"LangGraph's PostgresSaver skipped: {exc}")
    marks = list(range(every, steps + 1, every))
    out: dict[str, Any] = {"steps": steps, "every": every, "marks": marks, "ages": ages,
                           "message_bytes": size,
                           "systems": {}, "notes": notes}
    for make in makers:
        rng = random.Random(7)
        with scratch_dir() as d:
            system = make(d)
            try:
                system.fold()
                sizes, lat = [system.size()], []
                for n in range(1, steps + 1):
                    text = _text(rng, n, size)
                    t0 = time.perf_counter()
                    system.step(n, text)
                    lat.append(time.perf_counter() - t0)
                    if n in marks:
                        system.fold()
                        sizes.append(system.size())
                reads = []
                for age in ages:
                    at = steps - age
                    assert system.read(at) == at, (system.name, at)
                    reads.append(spread(per_call(lambda at=at, sy=system: sy.read(at), 1, repeat)))
            finally:
                system.close()
        per_ckpt = [(b - a) / every for a, b in itertools.pairwise(sizes)]
        windows = [spread(lat[m - every:m]) for m in marks]
        out["systems"][system.name] = {"bytes_per_checkpoint": per_ckpt, "file_bytes": sizes[1:],
                                       "commit_s": windows, "read_s": reads}
        log(f"conversation: {system.name}: {sizes[-1]:,} B after {steps} steps, "
            f"last window {windows[-1]['median'] * 1e3:.2f} ms/step")
    return out


# -- get latency vs keys in the run -------------------------------------------------------------


def get_sweep(keys: list[int], number: int, repeat: int, log: Log) -> dict[str, Any]:
    vals = values()
    out: dict[str, Any] = {"keys": keys, "series": {
        "agentwal (memtable)": [], "agentwal (folded into LMDB)": [], "SQLite": [], "LMDB": []}}
    for n in keys:
        names = [f"key-{i:06d}" for i in range(n)]
        pick = random.Random(3)
        probe = [pick.choice(names) for _ in range(number)]

        def one(get: Callable[[str], Any], probe: list[str] = probe) -> Callable[[], Any]:
            keys = itertools.cycle(probe)
            return lambda: get(next(keys))

        with scratch_dir() as d:
            store = agentwal.open(os.path.join(d, "g.awal"), durability="none")
            for lo in range(0, n, 1000):  # commits of at most 1,000 keys
                with store.begin("run-1") as txn:
                    for i in range(lo, min(n, lo + 1000)):
                        txn.put(names[i], vals[i % len(vals)])
            s = out["series"]
            s["agentwal (memtable)"].append(
                spread(per_call(one(lambda k, st=store: st.get("run-1", k)), number, repeat)))
            store.snapshot()
            s["agentwal (folded into LMDB)"].append(
                spread(per_call(one(lambda k, st=store: st.get("run-1", k)), number, repeat)))
            store.close()
            db = compare._sqlite_open(os.path.join(d, "g.db"))
            db.execute("CREATE TABLE kv (run TEXT, key TEXT, value BLOB,"
                       " PRIMARY KEY (run, key)) WITHOUT ROWID")
            db.execute("BEGIN")
            db.executemany("INSERT INTO kv VALUES ('run-1', ?, ?)",
                           [(k, vals[i % len(vals)]) for i, k in enumerate(names)])
            db.execute("COMMIT")
            q = "SELECT value FROM kv WHERE run = 'run-1' AND key = ?"

            def sget(k: str, db: sqlite3.Connection = db, q: str = q) -> Any:
                return db.execute(q, (k,)).fetchone()

            s["SQLite"].append(spread(per_call(one(sget), number, repeat)))
            db.close()
            env = lmdb.open(os.path.join(d, "lmdb"), map_size=1 << 30, sync=False)
            with env.begin(write=True) as txn:
                for i, k in enumerate(names):
                    txn.put(f"run-1/{k}".encode(), vals[i % len(vals)])

            def lget(k: str, env: Any = env) -> Any:
                with env.begin() as t:
                    return t.get(f"run-1/{k}".encode())

            s["LMDB"].append(spread(per_call(one(lget), number, repeat)))
            env.close()
        log(f"get: {n:,} keys: agentwal {s['agentwal (memtable)'][-1]['median'] * 1e6:.1f} us")
    return out


# -- effects ledger queries vs ledger size --------------------------------------------------------


def effects_sweep(sizes: list[int], runs: int, repeat: int, log: Log) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": sizes, "runs": runs, "series": {
        "agentwal effects(run=)": [], "agentwal effects(status=)": [],
        "SQLite, indexed (run)": [], "SQLite, indexed (status)": []}}
    s = out["series"]
    with scratch_dir() as d:
        store = agentwal.open(os.path.join(d, "e.awal"), durability="none")
        db = sqlite3.connect(os.path.join(d, "e.db"), isolation_level=None)
        db.execute("CREATE TABLE effects (key TEXT PRIMARY KEY, run TEXT, status TEXT,"
                   " record TEXT)")
        db.execute("CREATE INDEX effects_run ON effects (run)")
        db.execute("CREATE INDEX effects_status ON effects (status)")
        done = 0
        for size in sizes:
            rows = []
            while done < size:
                run = f"run-{done % runs}"
                with store.begin(run) as txn:
                    txn["r"] = txn.effect("send-email", lambda ctx: {"ok": True},
                                          mode="at_least_once", args={"n": done})
                rows.append((f"{run}/{done}", run, "done", json.dumps(
                    {"name": "send-email", "args": {"n": done}, "result": {"ok": True},
                     "attempts": 1, "mode": "at_least_once"})))
                done += 1
            db.execute("BEGIN")
            db.executemany("INSERT INTO effects VALUES (?, ?, ?, ?)", rows)
            db.execute("COMMIT")
            store.snapshot()
            mine = len(store.effects(run="run-3"))

            def q(col: str, val: str) -> Callable[[], Any]:
                sql = f"SELECT record FROM effects WHERE {col} = ?"
                return lambda: [json.loads(r[0]) for r in db.execute(sql, (val,))]

            assert len(q("run", "run-3")()) == mine
            s["agentwal effects(run=)"].append(
                spread(per_call(lambda: store.effects(run="run-3"), 1, repeat)))
            s["agentwal effects(status=)"].append(
                spread(per_call(lambda: store.effects(status="in_doubt"), 1, repeat)))
            s["SQLite, indexed (run)"].append(spread(per_call(q("run", "run-3"), 1, repeat)))
            s["SQLite, indexed (status)"].append(
                spread(per_call(q("status", "in_doubt"), 1, repeat)))
            log(f"effects: {size:,} entries: effects(run=) "
                f"{s['agentwal effects(run=)'][-1]['median'] * 1e3:.2f} ms")
        store.close()
        db.close()
    return out


# -- workspace snapshots vs git -----------------------------------------------------------------


def workspace_sweep(files: list[int], repeat: int, log: Log) -> dict[str, Any]:
    out: dict[str, Any] = {"files": files, "tree_mib": [], "series": {
        "agentwal first snapshot": [], "git first commit": [],
        "agentwal after 1 file changed": [], "git after 1 file changed": []}}
    if shutil.which("git") is None:
        out["notes"] = ["git is not installed: workspace figures skipped"]
        return out
    s = out["series"]
    for n in files:
        with scratch_dir() as d:
            root = os.path.join(d, "W")
            paths = wsb.generate(root, n)
            wsb.age(root, 5)
            out["tree_mib"].append(wsb.du(root) / MIB)
            wsb.git(root, "init", "-q")
            wsb.git(root, "config", "user.email", "bench@example.com")
            wsb.git(root, "config", "user.name", "bench")
            store = agentwal.open(os.path.join(d, "store.awal"))
            ws = agentwal.Workspace(store, "agent", root, exclude=agentwal.GITIGNORE)
            ta, _ = wsb.timed(lambda ws=ws: ws.checkpoint(step=0))
            tg, _ = wsb.timed(lambda root=root: wsb.git_commit(root, "first"))
            s["agentwal first snapshot"].append(spread([ta]))
            s["git first commit"].append(spread([tg]))
            one_a, one_g = [], []
            for k in range(repeat):
                wsb.change(root, paths, 1, tag=k + 1)
                ta, _ = wsb.timed(lambda ws=ws, k=k: ws.checkpoint(step=k + 1))
                tg, _ = wsb.timed(lambda root=root, k=k: wsb.git_commit(root, f"one {k}"))
                one_a.append(ta)
                one_g.append(tg)
            s["agentwal after 1 file changed"].append(spread(one_a))
            s["git after 1 file changed"].append(spread(one_g))
            store.close()
        log(f"workspace: {n:,} files: a one-file snapshot agentwal {ta:.2f} s, git {tg:.2f} s")
    return out


def workspace_goals(files: int, rounds: int, wait: float, log: Log) -> dict[str, Any]:
    """Issue #15's benchmark (``bench/bench_workspace.py``'s whole run) on one tree of
    ``files`` files: the first snapshot, status, the one-file and the 100-file snapshots and
    the restore beside git, and the bytes the one-file snapshot adds."""
    if shutil.which("git") is None:
        return {"notes": ["git is not installed: the workspace goals were not measured"]}
    with scratch_dir() as d:
        out = wsb.measure_tree(os.path.join(d, "W"), os.path.join(d, "store.awal"), files,
                               rounds, wait)
    out["summary"] = wsb.summary(out)
    for label, row in out["summary"].items():
        log(f"workspace goals: {label}: agentwal / git {row['paired']:.2f}x")
    return out


LG_LOCAL_SAVERS = ("AgentWALSaver", "SqliteSaver")


def langgraph_local(threads: list[int], steps: int, message_bytes: int, rounds: int,
                    log: Log) -> dict[str, Any]:
    """Issue #13's benchmark (``bench/langgraph_compare.py``): AgentWALSaver on a local store
    beside LangGraph's SqliteSaver (WAL, ``synchronous=FULL``), both driven with the Pregel
    loop's calls for a chat graph, rounds alternating which saver goes first."""
    out: dict[str, Any] = {"threads": threads, "steps": steps, "message_bytes": message_bytes,
                           "rounds": rounds, "series": {}, "ratios": {}}
    try:
        import langgraph_compare as lgc
    except ImportError as exc:
        out["notes"] = [f"LangGraph's SqliteSaver skipped: {exc}"]
        return out
    def one(run: Callable[..., dict[str, Any]], args: argparse.Namespace,
            _r: int) -> dict[str, Any]:
        with scratch_dir("lg-bench-") as d:
            return run(d, args)

    saver_rounds(out, dict(zip(LG_LOCAL_SAVERS, (lgc.run_agentwal, lgc.run_sqlite),
                               strict=True)), one, "langgraph", log, no_view=False,
                 fold_every=0)
    return out


# -- blobs: put_blob and open_blob throughput vs artifact size ------------------------------------

BLOB_OPS = ("copy + fsync", "copy + sha256 + fsync", "put_blob + commit (sync)",
            "read + sha256 (warm)", "open_blob, verified (warm)", "read + sha256 (cold)",
            "open_blob, verified (cold)")


def blobs_sweep(mib: list[float], rounds: int, log: Log) -> dict[str, Any]:
    """``bench/test_bench_blobs.py``'s rounds (put_blob beside a durable copy, open_blob beside
    a hashing read) at each artifact size; MB/s (10^6 bytes) per round."""
    import test_bench_blobs as tbb

    out: dict[str, Any] = {"mib": mib, "rounds": rounds, "series": {op: [] for op in BLOB_OPS}}
    for size_mib in mib:
        size = int(size_mib * MIB)
        with scratch_dir() as d:
            times = tbb.run(d, size, rounds)
        for op in BLOB_OPS:
            out["series"][op].append(spread([size / t / 1e6 for t in times[op]]))
        log(f"blobs: {size_mib:g} MiB: put_blob "
            f"{out['series']['put_blob + commit (sync)'][-1]['median']:,.0f} MB/s, copy + fsync "
            f"{out['series']['copy + fsync'][-1]['median']:,.0f} MB/s")
    return out


# -- PostgreSQL: steps/s vs worker processes ------------------------------------------------------

PG_STEP = "agentwal step on PostgreSQL"
PG_INSERT = "psycopg: one INSERT + COMMIT"


def pg_worker(kind: str, dsn: str, schema: str, name: str, seconds: float) -> int:
    """One worker process (``--pg-worker``): connect, say ready, wait for go, count for
    ``seconds``; prints the count. ``agentwal``: a step is ``begin``, a ``get``, two puts
    and a durable commit (``bench_postgres.py``'s); ``sql``: one ``INSERT`` and ``COMMIT``."""
    import psycopg

    if kind == "agentwal":
        store = agentwal.open(dsn, schema=schema, worker_id=name, durability="sync")

        def op(i: int) -> None:
            with store.begin(name) as txn:
                n = txn.get("i", 0)
                txn["i"] = n + 1
                txn[f"messages/{n:06d}"] = {"role": "agent", "text": "m" * 280}

        close: Callable[[], None] = store.close
    else:
        conn = psycopg.connect(dsn, options="-c synchronous_commit=on")

        def op(i: int) -> None:
            conn.execute(f'INSERT INTO "{schema}_sql".rows (worker, payload) VALUES (%s, %s)',
                         (name, "m" * 280))
            conn.commit()

        close = conn.close
    op(0)
    print("ready", flush=True)
    sys.stdin.readline()
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        op(n)
        n += 1
    print(n / seconds, flush=True)
    close()
    return 0


def _pg_round(kind: str, dsn: str, schema: str, workers: int, seconds: float,
              tag: str) -> float:
    """Total steps/s of ``workers`` worker processes started together."""
    procs = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--pg-worker", kind, dsn, schema,
         f"{tag}-w{k}", str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True) for k in range(workers)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", kind
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        total = 0.0
        for p in procs:
            assert p.stdout is not None
            total += float(p.stdout.readline())
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
            p.wait(timeout=120)
            if p.stdout is not None:
                p.stdout.close()
    return total


def _pg_settings(dsn: str, want_on: bool) -> dict[str, str]:
    """The server's version, ``fsync`` and ``full_page_writes`` as a new session sees them
    (a reload is asynchronous: with ``want_on``, wait up to 10 s for both to read on)."""
    import psycopg

    deadline = time.monotonic() + 10
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            got = {n: str(conn.execute(f"SHOW {n}").fetchone()[0])  # type: ignore[index]
                   for n in ("server_version", "fsync", "full_page_writes")}
        if not want_on or (got["fsync"] == got["full_page_writes"] == "on"
                           or time.monotonic() > deadline):
            return got
        time.sleep(0.2)


def postgres_sweep(workers: list[int], seconds: float, rounds: int, pg: PgServer,
                   log: Log) -> dict[str, Any]:
    """Steps/s against worker processes on one PostgreSQL server, beside plain inserts."""
    import psycopg

    out: dict[str, Any] = {"workers": workers, "seconds": seconds, "rounds": rounds,
                           "series": {PG_STEP: [], PG_INSERT: []}, "ratios": [],
                           "notes": list(pg.notes)}
    if pg.dsn is None:
        return out
    dsn = pg.dsn
    out["server"], out["settings"] = pg.how, pg.settings
    schema = f"bench_{os.getpid()}"
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}_sql"')
            conn.execute(f'CREATE TABLE "{schema}_sql".rows (id bigserial PRIMARY KEY, '
                         "worker text, payload text)")
        agentwal.open(dsn, schema=schema, worker_id="setup").close()  # create the schema once
        samples: dict[str, list[float]] = {f"{k}@{w}": [] for k in (PG_STEP, PG_INSERT)
                                           for w in workers}
        for r in range(rounds):
            order = [(k, w) for w in workers for k in (PG_STEP, PG_INSERT)]
            if r % 2:
                order.reverse()
            for kind, w in order:
                rate = _pg_round("agentwal" if kind == PG_STEP else "sql", dsn, schema, w,
                                 seconds, f"r{r}")
                samples[f"{kind}@{w}"].append(rate)
                log(f"postgres round {r + 1}/{rounds}: {kind} x{w}: {rate:,.0f}/s")
        for kind in (PG_STEP, PG_INSERT):
            out["series"][kind] = [spread(samples[f"{kind}@{w}"]) for w in workers]
        out["ratios"] = [paired(samples[f"{PG_STEP}@{w}"], samples[f"{PG_INSERT}@{w}"])
                         for w in workers]
    finally:
        _drop_schemas(dsn, schema, f"{schema}_sql")
    return out


def _drop_schemas(dsn: str, *schemas: str) -> None:
    import psycopg

    with contextlib.suppress(Exception), psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


class PgServer:
    """The one PostgreSQL server every PostgreSQL measurement of a run uses: ``--pg-dsn``'s,
    else a throwaway one started as the tests start theirs (``tests/pg.py``) and set durable
    (``fsync``, ``synchronous_commit``, ``full_page_writes`` on); ``dsn`` is None (and
    ``notes`` say why) when there is none."""

    def __init__(self, dsn: str | None, enabled: bool, log: Log) -> None:
        self.dsn, self.how, self.notes = dsn, "--pg-dsn", []
        self.settings: dict[str, str] = {}
        self._server: Any = None
        if not enabled:
            self.dsn, self.notes = None, ["skipped (--no-postgres)"]
            return
        if dsn is None:
            from tests import pg

            why: list[str] = []
            self._server = pg.start(why)
            if self._server is None:
                self.notes = ["no PostgreSQL server could be started: " + "; ".join(why)]
                log(self.notes[0])
                return
            self.dsn, self.how = self._server.dsn, self._server.how
        assert self.dsn is not None
        durable = self._server is not None and make_durable(self._server)
        self.settings = _pg_settings(self.dsn, want_on=durable)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


# -- LangGraph's PostgresSaver beside AgentWALSaver on the same server ----------------------------

LG_SAVERS = ("AgentWALSaver (PostgreSQL)", "PostgresSaver")
LG_COLUMNS = ("puts_per_s", "get_tuple_p50_ms", "list_all_s", "bytes_per_checkpoint_at_end")


def langgraph_postgres_sweep(threads: list[int], steps: int, message_bytes: int, rounds: int,
                             pg: PgServer, log: Log) -> dict[str, Any]:
    """``bench/langgraph_postgres_compare.py``'s measurement (both savers on one server, the
    Pregel loop's calls for a chat graph), rounds alternating which saver goes first."""
    out: dict[str, Any] = {"threads": threads, "steps": steps, "message_bytes": message_bytes,
                           "rounds": rounds, "series": {}, "ratios": {},
                           "notes": list(pg.notes)}
    if pg.dsn is None:
        return out
    try:
        import langgraph_postgres_compare as lpc
    except ImportError as exc:
        out["notes"].append(f"LangGraph's PostgresSaver skipped: {exc}")
        return out
    dsn = pg.dsn
    saver_rounds(out, dict(zip(LG_SAVERS, (lpc.run_agentwal, lpc.run_postgres_saver),
                               strict=True)),
                 lambda run, args, r: run(dsn, args, r), "langgraph on postgres", log)
    return out


def saver_rounds(out: dict[str, Any], runs: dict[str, Callable[..., dict[str, Any]]],
                 call: Callable[[Callable[..., dict[str, Any]], argparse.Namespace, int],
                                dict[str, Any]],
                 label: str, log: Log, **extra: Any) -> None:
    """Two LangGraph savers' rounds at each of ``out["threads"]`` (agentwal's first in
    ``runs``, then its baseline), alternating which goes first; ``call(run, args, round)``
    runs one. Fills ``out["series"]`` (each column's spread per thread count) and
    ``out["ratios"]`` (agentwal / baseline, the median of per-round ratios)."""
    threads = out["threads"]
    got: dict[str, list[list[dict[str, Any]]]] = {n: [[] for _ in threads] for n in runs}
    for i, t in enumerate(threads):
        args = argparse.Namespace(threads=t, steps=out["steps"],
                                  message_bytes=out["message_bytes"], **extra)
        for r in range(out["rounds"]):
            order = list(runs.items())
            for name, run in order if (r + i) % 2 == 0 else order[::-1]:
                got[name][i].append(call(run, args, r))
                log(f"{label} round {r + 1}/{out['rounds']}: {name} x{t}: "
                    f"{got[name][i][-1]['puts_per_s']:,.0f} puts/s")
    out["series"] = {n: {c: [spread([x[c] for x in per]) for per in got[n]] for c in LG_COLUMNS}
                     for n in runs}
    aw, base = (got[n] for n in runs)
    out["ratios"] = {c: [paired([x[c] for x in a], [x[c] for x in b]) if all(
        x[c] for x in b) else None for a, b in zip(aw, base, strict=True)] for c in LG_COLUMNS}


# -- failover time vs lease TTL on PostgreSQL ------------------------------------------------------


def failover_worker(dsn: str, schema: str, name: str, ttl: float, poll: float,
                    claims: bool) -> int:
    """One fleet worker (``--failover-worker``): every ``poll`` seconds it commits a step on
    each run it holds and, if ``claims``, adopts the runs whose lease expired
    (``claim_runs``): an adopted run gets one step and is released, and the worker prints
    ``took RUN T``, ``T`` its ``time.monotonic()`` after that step (the clock is
    system-wide on Linux). A ``take RUN`` line on stdin makes it lease and hold ``RUN``
    (it prints ``holding RUN``); EOF ends it."""
    import selectors

    store = agentwal.open(dsn, schema=schema, worker_id=name, lease_ttl=ttl, durability="sync")

    def step(run: str) -> None:
        with store.begin(run) as txn:
            txn["n"] = txn.get("n", 0) + 1
            txn["by"] = name

    held: list[str] = []
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    print("ready", flush=True)
    pending = b""
    while True:
        if sel.select(timeout=poll):
            chunk = os.read(0, 4096)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                run = line.decode().split()[1]
                store.lease(run)
                step(run)
                held.append(run)
                print(f"holding {run}", flush=True)
        for run in held:
            step(run)
        for run in store.claim_runs(10) if claims else []:
            step(run)
            print(f"took {run} {time.monotonic():.6f}", flush=True)
            store.release(run)
    store.close()
    return 0


class _Fleet:
    """Processes of :func:`failover_worker`, spoken to by lines on unbuffered pipes."""

    def __init__(self, dsn: str, schema: str, ttl: float, poll: float) -> None:
        self.args = [dsn, schema, "", str(ttl), str(poll)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.buf: dict[int, bytes] = {}

    def spawn(self, name: str, claims: bool) -> subprocess.Popen[bytes]:
        args = [*self.args[:2], name, *self.args[3:], "1" if claims else "0"]
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--failover-worker",
                              *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.procs.append(p)
        self.buf[p.pid] = b""
        return p

    def send(self, p: subprocess.Popen[bytes], line: str) -> None:
        assert p.stdin is not None
        p.stdin.write(line.encode() + b"\n")

    def line(self, procs: list[subprocess.Popen[bytes]],
             timeout: float = 120.0) -> tuple[subprocess.Popen[bytes], str]:
        """The next whole line any of ``procs`` printed, and who printed it."""
        import selectors

        deadline = time.monotonic() + timeout
        while True:
            for p in procs:
                if b"\n" in self.buf[p.pid]:
                    got, self.buf[p.pid] = self.buf[p.pid].split(b"\n", 1)
                    return p, got.decode().strip()
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"failover workers: no line within {timeout} s")
            sel = selectors.DefaultSelector()
            for p in procs:
                assert p.stdout is not None
                sel.register(p.stdout.fileno(), selectors.EVENT_READ, p)
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 4096)
                if not chunk:
                    raise RuntimeError(f"failover worker {key.data.pid} exited "
                                       f"({key.data.wait()})")
                self.buf[key.data.pid] += chunk
            sel.close()

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                if p.stdin is not None:
                    p.stdin.close()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        self.procs = []


FAILOVER = ("kill -9 to the next worker's commit", "lease left at the kill",
            "expiry to the next worker's commit")


def failover_sweep(ttls: list[float], samples: int, takers: int, poll: float, pg: PgServer,
                   log: Log) -> dict[str, Any]:
    """Seconds from ``kill -9`` of a run's lease holder to another worker's first commit on
    it, per lease TTL, and how much of the lease was left at the kill (the server's view)."""
    out: dict[str, Any] = {"ttls": ttls, "samples": samples, "takers": takers, "poll": poll,
                           "series": {}, "notes": list(pg.notes)}
    if pg.dsn is None:
        return out
    import psycopg

    dsn, schema = pg.dsn, f"failover_{os.getpid()}"
    agentwal.open(dsn, schema=schema, worker_id="setup").close()
    rng = random.Random(11)
    series: dict[str, list[dict[str, float]]] = {name: [] for name in FAILOVER}
    try:
        for ttl in ttls:
            fleet = _Fleet(dsn, schema, ttl, poll)
            got: dict[str, list[float]] = {name: [] for name in FAILOVER}
            try:
                crew = [fleet.spawn(f"taker-{ttl:g}-{k}", True) for k in range(takers)]
                victims = [fleet.spawn(f"holder-{ttl:g}-{k}", False) for k in range(samples)]
                for p in crew + victims:
                    assert fleet.line([p])[1] == "ready"
                for k, victim in enumerate(victims):
                    run = f"run-{ttl:g}-{k}"
                    fleet.send(victim, f"take {run}")
                    assert fleet.line([victim])[1] == f"holding {run}"
                    time.sleep(ttl * rng.uniform(0.5, 1.5))  # a random phase of the renewals
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        row = conn.execute(
                            "SELECT extract(epoch FROM lease_expires - clock_timestamp())"
                            f' FROM "{schema}".runs WHERE run = %s', (run,)).fetchone()
                    os.kill(victim.pid, signal.SIGKILL)
                    killed = time.monotonic()
                    victim.wait()
                    said = fleet.line(crew, timeout=3 * ttl + 60)[1].split()
                    assert said[:2] == ["took", run], said
                    t, left = float(said[2]) - killed, float(row[0]) if row else 0.0
                    for name, v in zip(FAILOVER, (t, left, t - left), strict=True):
                        got[name].append(v)
                    log(f"failover: ttl {ttl:g} s: {t:.2f} s from the kill to the next commit "
                        f"({left:.2f} s of the lease left)")
            finally:
                fleet.close()
            for name in FAILOVER:
                series[name].append(spread(got[name]))
    finally:
        _drop_schemas(dsn, schema)
    out["series"] = series
    return out


# -- the machine --------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    env = compare.environment()
    mem = "unknown"
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            kib = int(f.readline().split()[1])
        mem = f"{kib / (1 << 20):.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    git = None
    if shutil.which("git"):
        git = subprocess.run(["git", "--version"], capture_output=True, text=True,
                             check=False).stdout.split()[-1]
    env.update(memory=mem, git=git, implementation=platform.python_implementation(),
               packages={d: _version(d) for d in (
                   "cbor2", "zstandard", "lmdb", "langgraph", "langgraph-checkpoint",
                   "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres", "psycopg",
                   "matplotlib")})
    return env


# -- the run ------------------------------------------------------------------------------------

FULL = {
    "compare": {"seconds": 1.5, "rounds": 5},
    "threads": {"threads": [1, 2, 4, 8], "seconds": 1.5, "rounds": 3},
    "open": {"wal_mib": [1, 4, 16, 64], "history": [1_000, 10_000, 100_000], "repeat": 5},
    "conversation": {"steps": 300, "every": 30, "ages": [0, 10, 50, 100, 200, 299],
                     "size": 1024, "repeat": 15},
    "get": {"keys": [100, 1_000, 10_000, 50_000], "number": 2000, "repeat": 5},
    "effects": {"sizes": [100, 300, 1_000, 2_000], "runs": 10, "repeat": 7},
    "workspace": {"files": [250, 1_000, 4_000], "repeat": 5},
    # issue #15's benchmark: its tree (10,000 files, ~100 MiB), 3 rounds
    "workspace_goals": {"files": 10_000, "rounds": 3, "wait": wsb.RACY_WAIT},
    # issue #13's benchmark: 4 LangGraph threads x 200 steps, ~1 KiB messages
    "langgraph": {"threads": [4], "steps": 200, "message_bytes": 1024, "rounds": 3},
    "blobs": {"mib": [1, 16, 128], "rounds": 3},
    "postgres": {"workers": [1, 2, 4], "seconds": 3.0, "rounds": 3},
    # 200 steps: the goals (puts/s, bytes per checkpoint) are at step 200
    "langgraph_postgres": {"threads": [1, 4], "steps": 200, "message_bytes": 1024,
                           "rounds": 3},
    "failover": {"ttls": [0.5, 1.0, 2.0, 5.0], "samples": 5, "takers": 2, "poll": 0.05},
}
QUICK = {
    "compare": {"seconds": 0.05, "rounds": 1},
    "threads": {"threads": [1, 2], "seconds": 0.05, "rounds": 1},
    "open": {"wal_mib": [0.25, 0.5], "history": [50, 200], "repeat": 2},
    "conversation": {"steps": 6, "every": 3, "ages": [0, 5], "size": 256, "repeat": 2},
    "get": {"keys": [10, 100], "number": 20, "repeat": 2},
    "effects": {"sizes": [5, 10], "runs": 5, "repeat": 2},
    "workspace": {"files": [40, 80], "repeat": 1},
    "workspace_goals": {"files": 200, "rounds": 1, "wait": 0.0},
    "langgraph": {"threads": [2], "steps": 4, "message_bytes": 256, "rounds": 1},
    "blobs": {"mib": [0.25, 1], "rounds": 1},
    "postgres": {"workers": [1], "seconds": 0.2, "rounds": 1},
    "langgraph_postgres": {"threads": [1], "steps": 4, "message_bytes": 256, "rounds": 1},
    "failover": {"ttls": [0.3, 0.6], "samples": 1, "takers": 1, "poll": 0.05},
}
# the sweeps that need the PostgreSQL server (one for the whole run)
PG_SWEEPS = ("conversation", "postgres", "langgraph_postgres", "failover")


def measure(quick: bool, log: Log, pg_dsn: str | None = None,
            postgres: bool = True) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    started = datetime.now(timezone.utc)
    load = os.getloadavg()
    busy = loaded(load, os.cpu_count())
    if busy:
        log(f"WARNING: load average {load[0]:.2f} on {os.cpu_count()} CPUs before the run: the "
            "machine is busy, so the figures will be too; the page will say so. Rerun "
            "`make bench-report` on a quiet machine before quoting them.")
    t0 = time.perf_counter()
    c = cfg["compare"]
    res: dict[str, Any] = {"quick": quick, "config": cfg, "machine": machine()}
    cmp = compare.run(c["seconds"], c["rounds"], False, 0, 0, 0, log, quick=quick)
    res["compare"] = {k: cmp[k] for k in ("figures", "goals", "reference", "seconds", "rounds")}
    res["compare"]["samples"] = cmp["detail"]["samples"]
    res["compare"]["commits_per_sync_8t"] = statistics.median(
        e["commits_per_sync"] for e in cmp["detail"]["extra"]["agentwal_sync_8t"])
    stages: dict[str, float] = {"compare": time.perf_counter() - t0}
    stage_load: dict[str, float] = {"compare": load[0]}
    sweeps: dict[str, Callable[..., dict[str, Any]]] = {
        "threads": threads_sweep, "open": open_sweep, "conversation": conversation,
        "get": get_sweep, "effects": effects_sweep, "workspace": workspace_sweep,
        "workspace_goals": workspace_goals, "langgraph": langgraph_local,
        "blobs": blobs_sweep, "postgres": postgres_sweep,
        "langgraph_postgres": langgraph_postgres_sweep, "failover": failover_sweep}
    pg = PgServer(pg_dsn, postgres, log)
    try:
        res["postgres_server"] = {"how": pg.how if pg.dsn else None, "settings": pg.settings,
                                  "notes": pg.notes}
        for name, sweep in sweeps.items():
            t1 = time.perf_counter()
            stage_load[name] = os.getloadavg()[0]
            extra = {"pg": pg} if name in PG_SWEEPS else {}
            res[name] = sweep(log=log, **cfg[name], **extra)
            stages[name] = time.perf_counter() - t1
            log(f"{name}: {stages[name]:.1f} s")
    finally:
        pg.stop()
    res["run"] = {"started": started.strftime("%Y-%m-%d %H:%M UTC"),
                  "minutes": (time.perf_counter() - t0) / 60,
                  "load_before": load, "load_after": os.getloadavg(), "loaded": busy,
                  "loaded_above": LOADED, "stage_seconds": stages, "stage_load": stage_load,
                  "command": "make bench-report" if not quick else
                  ".venv/bin/python bench/report.py --quick"}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, a few seconds (the figures mean nothing)")
    ap.add_argument("--render-only", action="store_true",
                    help="do not measure: render the page and plots from --json")
    ap.add_argument("--json", default=os.path.join(HERE, "report.json"),
                    help="where the measurements are saved (default bench/report.json)")
    ap.add_argument("--page", default=os.path.join(REPO, "docs", "benchmarks.md"),
                    help="the page whose generated section is rewritten")
    ap.add_argument("--images", default=os.path.join(REPO, "docs", "images", "bench"),
                    help="where the plots go")
    ap.add_argument("--pg-dsn", help="run the PostgreSQL workers on this server (default: "
                    "start a throwaway one as the tests do, with fsync on)")
    ap.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL workers")
    ap.add_argument("--pg-worker", nargs=5, metavar=("KIND", "DSN", "SCHEMA", "NAME", "SECONDS"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--failover-worker", nargs=6,
                    metavar=("DSN", "SCHEMA", "NAME", "TTL", "POLL", "CLAIMS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.pg_worker:
        kind, dsn, schema, name, seconds = args.pg_worker
        return pg_worker(kind, dsn, schema, name, float(seconds))
    if args.failover_worker:
        dsn, schema, name, ttl, poll, claims = args.failover_worker
        return failover_worker(dsn, schema, name, float(ttl), float(poll), claims == "1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.render_only:
        with open(args.json, encoding="utf-8") as f:
            res = json.load(f)
    else:
        res = measure(args.quick, log, args.pg_dsn, not args.no_postgres)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1, default=str)
            f.write("\n")
    import report_render

    written = report_render.render(res, args.page, args.images)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
