"""Retention against a model: compaction never changes a kept checkpoint's state.

``RetentionMachine`` drives a store with commits (small values, big shared
values, a growing list), rollback_to, fork, delete_run, compact (keep_last,
older_than, runs, keep_fork_origins, vacuum), an interrupted compaction, folds,
close + reopen and crash + reopen, against a model that holds every
checkpoint's state per run. After every step: each run's history lists
exactly the kept checkpoints, the state at every kept checkpoint equals the
model's, every dropped one raises ``CheckpointNotFoundError``, a deleted run
is gone, the history objects' reference counts in LMDB equal a recount, and
``store.verify()`` finds nothing (gaps, parent hashes and deletions are not damage).

``older_than`` is drawn as "older than checkpoint k": the cut falls just
after k's creation time plus however long the call took, so checkpoints
created inside that window may go either way; the model accepts what the
store did there and checks everything outside it.
"""

from __future__ import annotations

import datetime as dt
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import agentwal
from agentwal import CheckpointNotFoundError, RunNotFoundError, failpoints
from agentwal.testing import crash as crash_store
from agentwal.testing import fold_lock
from tests.helpers import check_history_counts

RUNS = ("r1", "r2", "r3")
OPTIONS: dict[str, Any] = {"durability": "none", "segment_bytes": 16384,
                           "wal_max_bytes": 1 << 20}
BLOBS = [random.Random(i).randbytes(1500) for i in range(3)]  # shared across runs

small = st.one_of(st.integers(-5, 5), st.text(max_size=4), st.none())


def _blob(i: int) -> bytes:
    return BLOBS[i]


values = st.one_of(small, st.integers(0, len(BLOBS) - 1).map(_blob))


def _pick_kept(data: st.DataObject, kept: set[int]) -> int:
    """One of a run's kept checkpoints, drawn as an index so the strategy never depends on it.

    Which checkpoints a time-based compaction keeps depends on the clock (the window
    the module docstring describes), so ``sampled_from(sorted(kept))`` would be a
    different strategy when Hypothesis replays a case, and it reports that as
    ``FlakyStrategyDefinition``. A fixed integer range, reduced modulo the choices,
    draws the same way on every replay.
    """
    choices = sorted(kept)
    return choices[data.draw(st.integers(0, 255), label="kept index") % len(choices)]


@dataclass
class RunModel:
    """One incarnation of a run: every checkpoint's state and which ones are kept."""

    states: dict[int, dict[str, Any]] = field(default_factory=dict)
    created: dict[int, float] = field(default_factory=dict)
    kept: set[int] = field(default_factory=set)
    origin: tuple[str, int] | None = None

    @property
    def head(self) -> int:
        return max(self.states)

    def add(self, ckpt: agentwal.Checkpoint, state: dict[str, Any]) -> None:
        assert ckpt.id == (max(self.states) + 1 if self.states else 1)
        self.states[ckpt.id] = dict(state)
        self.created[ckpt.id] = ckpt.created_at
        self.kept.add(ckpt.id)


class RetentionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="agentwal-retention-"))
        self.path = self.dir / "store.awal"
        self.store = agentwal.open(self.path, **OPTIONS)
        self.runs: dict[str, RunModel] = {}
        self.deleted: set[str] = set()  # run ids deleted at some point
        self.counts = {"dropped": 0, "vacuums": 0, "deletes": 0, "recreated": 0,
                       "reopens": 0, "origins kept": 0}

    def teardown(self) -> None:
        try:
            for name, n in self.counts.items():
                event(f"{name}: {'0' if not n else '1-4' if n < 5 else '5+'}")
            self.store.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- writes --------------------------------------------------------------------------

    def _commit(self, run: str, writes: dict[str, Any]) -> None:
        m = self.runs.get(run)
        state = dict(m.states[m.head]) if m is not None else {}
        with self.store.begin(run) as txn:
            for k, v in writes.items():
                if v is _DEL:
                    txn.delete(k)
                    state.pop(k, None)
                else:
                    txn[k] = v
                    state[k] = v
            txn.meta(n=1)  # a checkpoint even when the writes change nothing
        assert txn.checkpoint is not None
        if m is None:
            m = self.runs[run] = RunModel()
            self.counts["recreated"] += run in self.deleted
        m.add(txn.checkpoint, state)

    @rule(run=st.sampled_from(RUNS), key=st.sampled_from(["a", "b", "c"]),
          value=values, delete=st.booleans())
    def commit(self, run: str, key: str, value: Any, delete: bool) -> None:
        self._commit(run, {key: _DEL if delete else value})

    @rule(run=st.sampled_from(RUNS), n=st.integers(5, 40))
    def burst(self, run: str, n: int) -> None:
        """Many steps at once, so compactions have history to drop and manifests to cross."""
        for i in range(n):
            self._commit(run, {"a": i % 7, "log": [f"{run}-{j}-{'y' * 100}" for j in
                                                   range(i % 12)]})

    @rule(run=st.sampled_from(RUNS), n=st.integers(1, 3))
    def append(self, run: str, n: int) -> None:
        """A growing list (the fold stores it as list nodes sharing the old items)."""
        m = self.runs.get(run)
        old = list(m.states[m.head].get("log", [])) if m is not None else []
        self._commit(run, {"log": old + [f"{run}-{len(old) + i}-{'x' * 150}"
                                         for i in range(n)]})

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def rollback_to(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(sorted(self.runs)))
        m = self.runs[run]
        target = _pick_kept(data, m.kept)
        ckpt = self.store.rollback_to(run, target)
        m.add(ckpt, m.states[target])

    @precondition(lambda self: self.runs and len(self.runs) < len(RUNS))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        src = data.draw(st.sampled_from(sorted(self.runs)))
        dst = data.draw(st.sampled_from([r for r in RUNS if r not in self.runs]))
        target = _pick_kept(data, self.runs[src].kept)
        ckpt = self.store.fork(src, target, dst)
        m = self.runs[dst] = RunModel(origin=(src, target))
        m.add(ckpt, self.runs[src].states[target])

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def fork_then_compact(self, data: st.DataObject) -> None:
        """Fork from an old checkpoint, move the source on, compact hard: the origin stays."""
        src = data.draw(st.sampled_from(sorted(self.runs)))
        free = [r for r in RUNS if r not in self.runs]
        if not free:
            self.delete_run(data.draw(st.sampled_from([r for r in RUNS if r != src])))
            free = [r for r in RUNS if r not in self.runs]
        dst = data.draw(st.sampled_from(free))
        target = _pick_kept(data, self.runs[src].kept)
        ckpt = self.store.fork(src, target, dst)
        m = self.runs[dst] = RunModel(origin=(src, target))
        m.add(ckpt, self.runs[src].states[target])
        self.burst(src, 3)
        self.compact_all(1)
        assert target in self.runs[src].kept

    @rule(run=st.sampled_from(RUNS))
    def delete_run(self, run: str) -> None:
        if run not in self.runs:
            with pytest.raises(RunNotFoundError):
                self.store.delete_run(run)
            return
        self.store.delete_run(run)
        del self.runs[run]
        self.deleted.add(run)
        self.counts["deletes"] += 1

    # -- retention -----------------------------------------------------------------------

    def _protected(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for m in self.runs.values():
            if m.origin is not None:
                out.setdefault(m.origin[0], set()).add(m.origin[1])
        return out

    @rule(data=st.data(), keep_last=st.one_of(st.none(), st.integers(1, 6)),
          age=st.sampled_from(["none", "zero", "day", "mid"]),
          origins=st.booleans(), vacuum=st.integers(0, 5))
    def compact(self, data: st.DataObject, keep_last: int | None, age: str, origins: bool,
                vacuum: int) -> None:
        selected: list[str] | None = None
        if self.runs and data.draw(st.booleans()):
            selected = data.draw(st.lists(st.sampled_from(sorted(self.runs)), min_size=1,
                                          unique=True))
        older_than: dt.timedelta | None = None
        pivot = 0.0
        if age == "zero":
            older_than = dt.timedelta(0)
        elif age == "day":
            older_than = dt.timedelta(days=1)
        elif age == "mid" and self.runs:
            m = self.runs[data.draw(st.sampled_from(sorted(self.runs)))]
            pivot = m.created[_pick_kept(data, m.kept)]
            older_than = dt.timedelta(seconds=max(0.0, time.time() - pivot))
        t0 = time.time()
        report = self.store.compact(keep_last=keep_last, older_than=older_than, runs=selected,
                                    keep_fork_origins=origins, vacuum=vacuum == 0)
        t1 = time.time()
        protected = self._protected() if origins else {}
        dropped = 0
        for run, m in self.runs.items():
            if selected is not None and run not in selected:
                continue
            if keep_last is None and older_than is None:
                continue
            must = {m.head} | (protected.get(run, set()) & m.kept)
            if keep_last is not None:
                must |= {c for c in m.kept if c > m.head - keep_last}
            may = set(must)
            if older_than is not None:
                lo, hi = t0 - older_than.total_seconds(), t1 - older_than.total_seconds()
                must |= {c for c in m.kept if m.created[c] >= hi}
                may |= {c for c in m.kept if m.created[c] >= lo}
            got = {c.id for c in self.store.history(run)}
            assert must <= got <= may, (run, sorted(must), sorted(got), sorted(may))
            assert report.runs.get(run, 0) == len(m.kept - got)
            dropped += len(m.kept - got)
            self.counts["origins kept"] += len(protected.get(run, set()) & got - {m.head})
            m.kept = got
        assert report.checkpoints_dropped == dropped
        assert report.vacuumed == (vacuum == 0)
        self.counts["dropped"] += dropped
        self.counts["vacuums"] += vacuum == 0

    @precondition(lambda self: self.runs)
    @rule(keep_last=st.integers(1, 3))
    def compact_all(self, keep_last: int) -> None:
        """The common call: every run, the last few (fork origins kept)."""
        report = self.store.compact(keep_last=keep_last)
        protected = self._protected()
        for run, m in self.runs.items():
            want = {c for c in m.kept if c > m.head - keep_last or c == m.head
                    or c in protected.get(run, set())}
            assert report.runs.get(run, 0) == len(m.kept - want)
            self.counts["dropped"] += len(m.kept - want)
            self.counts["origins kept"] += len(protected.get(run, set()) & want
                                               - set(range(m.head - keep_last + 1, m.head + 1)))
            m.kept = want

    @precondition(lambda self: self.runs)
    @rule()
    def compact_interrupted(self) -> None:
        """A compaction that fails before its LMDB transaction commits changes nothing."""
        failpoints.arm("compact_before_commit")
        try:
            with pytest.raises(failpoints.FailpointFired):
                self.store.compact(keep_last=1)
        finally:
            failpoints.disarm()

    # -- folds and reopens ----------------------------------------------------------------

    @rule()
    def fold(self) -> None:
        self.store.snapshot()

    @rule(crash=st.booleans())
    def reopen(self, crash: bool) -> None:
        if crash:
            crash_store(self.store)  # durability "none": what reached the OS stays
        else:
            self.store.close()
        self.store = agentwal.open(self.path, **OPTIONS)
        self.counts["reopens"] += 1

    # -- the invariant ---------------------------------------------------------------------

    @invariant()
    def kept_checkpoints_match_the_model(self) -> None:
        store = self.store
        assert store.runs() == sorted(self.runs)
        for run in RUNS:
            m = self.runs.get(run)
            if m is None:
                assert store.head(run) is None
                with pytest.raises(RunNotFoundError):
                    store.state(run)
                assert store.history(run) == []
                continue
            with fold_lock(store):  # see test_store_model: a fold's window lists twice
                got = store.history(run)
            assert [c.id for c in got] == sorted(m.kept, reverse=True)
            assert got[0].id == m.head and store.state(run) == m.states[m.head]
            for cid in range(1, m.head + 1):
                if cid in m.kept:
                    assert store.state(run, at=cid) == m.states[cid], (run, cid)
                else:
                    with pytest.raises(CheckpointNotFoundError):
                        store.state(run, at=cid)
            if m.origin is not None and 1 in m.kept:
                assert got[-1].origin == m.origin
        check_history_counts(store)
        report = store.verify()  # gaps, parent hashes, deletions in the WAL: none is damage
        assert report.ok, [f"{p.where}: {p.what}" for p in report.problems]


_DEL: Any = object()

RetentionMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=40,
                                              deadline=None)
test_retention_machine = RetentionMachine.TestCase
