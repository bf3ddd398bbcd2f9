"""A seeded workload and the oracle that judges what survives a crash.

Theory of operation: :class:`Workload` is a pure function from ``(seed, i)``
to the i-th operation: a commit on one of a few runs (puts of values from a
few bytes to over a MiB, overwrites, deletes, metadata) or a transaction that
writes *poison* keys and rolls back. Because every operation is derived from
the seed, the state after the first ``c`` commits is known exactly
(:meth:`Workload.model`), and a driver can resume after a crash from
whatever count of commits survived.

:class:`Oracle` compares what a fresh store recovered with the model: it must
equal the state after every acknowledged commit, or after those plus the one
in flight. Anything else is classified, so a failure says *what* broke:

==========================  ====================================================
``lost_ack``                fewer commits than were acknowledged survived
``rolled_back_visible``     a poison key of a rolled-back transaction is visible
``partial_transaction``     some but not all writes of one commit are visible
``stale_version``           a key holds a value it had at an earlier commit
``garbage``                 a value nobody ever wrote
``history``                 checkpoint ids/parents disagree with the commits
``unrecoverable``           the store does not open, or cannot be read, after a
                            failure it is built to survive
==========================  ====================================================
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAILURE_CLASSES", "LOG_KEY", "Op", "Oracle", "Verdict", "Workload", "drive", "read_all"]

#: The list each run grows in a workload with appends (logged as append entries).
LOG_KEY = "log"

FAILURE_CLASSES = ("lost_ack", "rolled_back_visible", "partial_transaction", "stale_version",
                   "garbage", "history", "unrecoverable")


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a workload."""

    index: int
    run: str
    commit: bool  # False: write poison keys, then roll back
    puts: dict[str, Any]
    deletes: tuple[str, ...]
    meta: dict[str, Any]
    #: items appended to the run's list :data:`LOG_KEY` (``Workload(appends=...)``)
    appended: tuple[Any, ...] = ()
    #: how: True re-puts the list read and extended, False calls ``txn.append``
    reput: bool = False


class Workload:
    """Seeded operations over a few runs.

    Args:
        seed: everything derives from it.
        runs: how many runs the operations spread over.
        keys: distinct keys per run.
        big: probability that a put carries a large value.
        big_bytes: size of a large value (over 1 MiB by default).
        rollback_every: about one operation in this many rolls back.
        appends: probability that an operation also appends to the run's list
            :data:`LOG_KEY` (through ``txn.append``, or a re-put of the list it
            read, which the transaction logs as an append too).
    """

    def __init__(self, seed: int | str, *, runs: int = 3, keys: int = 6, big: float = 0.01,
                 big_bytes: int = (1 << 20) + 4096, rollback_every: int = 6,
                 appends: float = 0.0) -> None:
        self.seed = seed
        self.appends = appends
        self.runs = [f"run-{i}" for i in range(runs)]
        self.keys = keys
        self.big = big
        self.big_bytes = big_bytes
        self.rollback_every = rollback_every
        self._ops: list[Op] = []
        self._models: list[dict[str, dict[str, Any]]] = [{r: {} for r in self.runs}]
        self._commit_ops: list[int] = []  # op index of the c-th commit

    def op(self, i: int) -> Op:
        """The i-th operation (cached; deterministic)."""
        while len(self._ops) <= i:
            self._ops.append(self._make(len(self._ops)))
        return self._ops[i]

    def _make(self, i: int) -> Op:
        rng = random.Random(f"{self.seed}/{i}")
        run = rng.choice(self.runs)
        commit = rng.randrange(self.rollback_every) != 0
        puts: dict[str, Any] = {}
        for _ in range(rng.randint(1, 3)):
            key = f"k{rng.randrange(self.keys)}" if commit else f"poison/{i}"
            puts[key] = self._value(rng, i, key)
        deletes: tuple[str, ...] = ()
        if commit and rng.random() < 0.2:
            victim = f"k{rng.randrange(self.keys)}"
            if victim not in puts:
                deletes = (victim,)
        appended: tuple[Any, ...] = ()
        reput = False
        if self.appends and rng.random() < self.appends:
            appended = tuple({"op": i, "n": n, "text": rng.randbytes(4).hex() * 40}
                             for n in range(rng.randint(1, 3)))
            reput = rng.random() < 0.5
        return Op(i, run, commit, puts, deletes, {"op": i}, appended, reput)

    def _value(self, rng: random.Random, i: int, key: str) -> Any:
        roll = rng.random()
        if roll < self.big:
            size = self.big_bytes
        elif roll < 0.15:
            size = rng.randint(1024, 16384)
        else:
            size = rng.randint(0, 200)
        return {"op": i, "key": key, "pad": rng.randbytes(8) * (size // 8)}

    def commit_op(self, c: int) -> int:
        """Op index of the c-th commit (0-based)."""
        i = self._commit_ops[-1] + 1 if self._commit_ops else 0
        while len(self._commit_ops) <= c:
            if self.op(i).commit:
                self._commit_ops.append(i)
            i += 1
        return self._commit_ops[c]

    def resume_index(self, commits: int) -> int:
        """Op index to continue from once ``commits`` commits are durable."""
        return 0 if commits == 0 else self.commit_op(commits - 1) + 1

    def model(self, commits: int) -> dict[str, dict[str, Any]]:
        """State of every run after the first ``commits`` commits (a fresh copy)."""
        while len(self._models) <= commits:
            c = len(self._models) - 1
            op = self.op(self.commit_op(c))
            nxt = {r: dict(s) for r, s in self._models[-1].items()}
            state = nxt[op.run]
            state.update(op.puts)
            for k in op.deletes:
                state.pop(k, None)
            if op.appended:
                state[LOG_KEY] = [*state.get(LOG_KEY, []), *op.appended]
            self._models.append(nxt)
        return {r: dict(s) for r, s in self._models[commits].items()}

    def commits_per_run(self, commits: int) -> dict[str, int]:
        """How many of the first ``commits`` commits touched each run."""
        out = dict.fromkeys(self.runs, 0)
        for c in range(commits):
            out[self.op(self.commit_op(c)).run] += 1
        return out


def drive(store: Any, workload: Workload, start: int, count: int,
          on_ack: Callable[[int], None] | None = None) -> int:
    """Run ``count`` operations from op ``start``; returns commits acknowledged.

    ``on_ack(op_index)`` is called after each commit returns. Exceptions (a
    simulated crash, a kill, a full disk) propagate to the caller.
    """
    acked = 0
    for i in range(start, start + count):
        op = workload.op(i)
        txn = store.begin(op.run)
        for k, v in op.puts.items():
            txn.put(k, v)
        for k in op.deletes:
            txn.delete(k)
        if op.appended and op.reput:
            grown = txn.get(LOG_KEY, [])
            grown.extend(op.appended)
            txn.put(LOG_KEY, grown)
        elif op.appended:
            txn.append(LOG_KEY, *op.appended)
        txn.meta(**op.meta)
        if op.commit:
            txn.commit()
            acked += 1
            if on_ack is not None:
                on_ack(i)
        else:
            txn.rollback()
    return acked


def read_all(store: Any, runs: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, list[Any]]]:
    """Every run's state and history, as a fresh reader sees them."""
    states: dict[str, dict[str, Any]] = {}
    history: dict[str, list[Any]] = {}
    for run in runs:
        head = store.head(run)
        states[run] = store.state(run) if head is not None else {}
        history[run] = store.history(run)
    return states, history


@dataclass
class Verdict:
    """What the oracle concluded about one recovered store."""

    ok: bool
    commits: int  # how many commits the recovered state corresponds to (when ok)
    failure: str = ""  # one of FAILURE_CLASSES when not ok
    detail: str = ""
    problems: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "ok" if self.ok else f"{self.failure}: {self.detail}"


class Oracle:
    """Judges a recovered store against a :class:`Workload`'s model."""

    def __init__(self, workload: Workload) -> None:
        self.w = workload

    def check(self, states: dict[str, dict[str, Any]], history: dict[str, list[Any]],
              acked: int, in_flight: bool, *, durable: int | None = None) -> Verdict:
        """Judge a recovered store.

        Args:
            acked: commits acknowledged before the crash.
            in_flight: whether one more commit may have been under way.
            durable: for ``async``/``none`` stores, the commits known durable
                (fewer may survive than were acknowledged, never fewer than
                these); None means every acknowledged commit must survive.
        """
        lo = acked if durable is None else durable
        hi = acked + 1 if in_flight else acked
        for c in range(hi, lo - 1, -1):
            if states == self.w.model(c):
                problem = self._history_problem(history, c)
                if problem:
                    return Verdict(False, c, "history", problem)
                return Verdict(True, c)
        return self._classify(states, lo, hi)

    def _history_problem(self, history: dict[str, list[Any]], commits: int) -> str:
        counts = self.w.commits_per_run(commits)
        for run, n in counts.items():
            ids = [c.id for c in history.get(run, [])]
            if ids != list(range(n, 0, -1)):
                return f"{run}: checkpoint ids {ids[:5]}... for {n} commits"
            for c in history.get(run, []):
                if c.parent != (c.id - 1 if c.id > 1 else None):
                    return f"{run}: checkpoint {c.id} has parent {c.parent}"
        return ""

    def _classify(self, states: dict[str, dict[str, Any]], lo: int, hi: int) -> Verdict:
        for run, st in states.items():
            for key in st:
                if key.startswith("poison/"):
                    return Verdict(False, -1, "rolled_back_visible", f"{run}/{key} is visible")
        for c in range(lo):
            if states == self.w.model(c):
                return Verdict(False, c, "lost_ack",
                               f"state after {c} commits, {lo} were acknowledged as durable")
        newest = self.w.model(hi)
        oldest = self.w.model(lo)
        written = self._all_values()
        for run, st in states.items():
            for key, value in st.items():
                if (run, key, _fingerprint(value)) not in written:
                    return Verdict(False, -1, "garbage", f"{run}/{key} holds a value never written")
        mixed = [(run, key) for run in states for key in set(states[run]) | set(newest[run])
                 if states[run].get(key) not in (oldest[run].get(key), newest[run].get(key))]
        if mixed:
            run, key = mixed[0]
            return Verdict(False, -1, "stale_version",
                           f"{run}/{key} holds a value older than the acknowledged one")
        return Verdict(False, -1, "partial_transaction",
                       "some writes of the in-flight commit are visible, others not")

    def _all_values(self) -> set[tuple[str, str, str]]:
        out = set()
        for i in range(len(self.w._ops)):
            op = self.w.op(i)
            for k, v in op.puts.items():
                out.add((op.run, k, _fingerprint(v)))
        if self.w.appends:  # every list a commit left
            for model in self.w._models:
                for run, st in model.items():
                    if LOG_KEY in st:
                        out.add((run, LOG_KEY, _fingerprint(st[LOG_KEY])))
        return out


def _fingerprint(value: Any) -> str:
    if isinstance(value, list):
        return f"list/{len(value)}/" + (_fingerprint(value[-1]) if value else "")
    if isinstance(value, dict) and "op" in value and "pad" in value:
        return f"{value.get('op')}/{value.get('key')}/{len(value['pad'])}/{value['pad'][:8]!r}"
    return repr(value)[:200]
