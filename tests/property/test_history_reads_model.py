"""History reads against a model, across folds: the versions index answers as the deltas did.

``HistoryMachine`` commits to two runs (small values, large values held as
objects, a list that grows, shrinks or is replaced, deletions and re-puts of
the same key), folds at random points (so a key's versions are spread over
folds, and a read mixes folded history with the memtable), compacts with
``keep_last`` (so reads start from a block's manifest), rolls back, forks and
reopens, against a model of every checkpoint's state. After every step, for
each run: ``state(at=)`` of every kept checkpoint, ``get(key, at=)`` of every
key the run ever had (absent ones included), ``diff`` between two kept
checkpoints, and the head read through ``state()``, all equal the model;
dropped checkpoints are gone, and every reference count in LMDB matches a
recount. ``verify`` runs at the end of each example.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import agentwal
from agentwal import CheckpointNotFoundError
from tests.helpers import check_history_counts

OPTIONS: dict[str, Any] = {"durability": "none", "segment_bytes": 16384,
                           "wal_max_bytes": 1 << 20}
KEYS = ("a", "b", "big", "msgs", "z" * 40)
RUNS = ("r", "s")

small = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none())
large = st.integers(0, 3).map(lambda i: f"{i}" * 1500)  # an object (>= history.LARGE)
lists = st.integers(0, 12).map(lambda n: [f"m{j}-" + "x" * 200 for j in range(n)])
values = st.one_of(small, large, lists)
writes = st.dictionaries(st.sampled_from(KEYS), st.one_of(values, st.just(DELETE := object())),
                         min_size=1, max_size=3)


class HistoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="agentwal-history-"))
        self.path = self.dir / "store.awal"
        self.store = agentwal.open(self.path, **OPTIONS)
        #: run -> checkpoint id -> state; the kept ids per run
        self.states: dict[str, dict[int, dict[str, Any]]] = {}
        self.kept: dict[str, set[int]] = {}

    def _add(self, run: str, state: dict[str, Any], cid: int) -> None:
        self.states.setdefault(run, {})[cid] = dict(state)
        self.kept.setdefault(run, set()).add(cid)

    def _head(self, run: str) -> dict[str, Any]:
        return dict(self.states[run][max(self.states[run])]) if run in self.states else {}

    @rule(run=st.sampled_from(RUNS), w=writes)
    def commit(self, run: str, w: dict[str, Any]) -> None:
        state = self._head(run)
        with self.store.begin(run) as txn:
            for k, v in w.items():
                if v is DELETE:
                    txn.delete(k)
                    state.pop(k, None)
                elif isinstance(v, list) and isinstance(state.get(k), list) and len(v) > 2:
                    grown = state[k] + v[:2]  # the messages pattern: the list grows
                    txn[k] = grown
                    state[k] = grown
                else:
                    txn[k] = v
                    state[k] = v
        head = self.store.head(run)
        assert head is not None
        self._add(run, state, head.id)

    @rule()
    def fold(self) -> None:
        self.store.snapshot()

    @precondition(lambda self: bool(self.states))
    @rule(keep=st.integers(1, 6))
    def compact(self, keep: int) -> None:
        self.store.compact(keep_last=keep, keep_fork_origins=False)
        for run, ids in self.kept.items():
            head = max(self.states[run])
            ids.intersection_update(range(head - keep + 1, head + 1))

    @precondition(lambda self: "r" in self.states)
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.kept["r"])))
        c = self.store.rollback_to("r", cid)
        self._add("r", self.states["r"][cid], c.id)

    @precondition(lambda self: "r" in self.states and "f" not in self.states)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.kept["r"])))
        self.store.fork("r", cid, "f")
        self._add("f", self.states["r"][cid], 1)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = agentwal.open(self.path, **OPTIONS)

    @invariant()
    def history_reads_match_the_model(self) -> None:
        for run, states in self.states.items():
            ids = sorted(self.kept[run])
            assert [c.id for c in self.store.history(run)] == ids[::-1]
            for cid in ids:
                want = states[cid]
                assert self.store.state(run, at=cid) == want, (run, cid)
                for key in KEYS:
                    assert self.store.get(run, key, "absent", at=cid) == want.get(key, "absent")
            for cid in set(states) - set(ids):
                try:
                    self.store.state(run, at=cid)
                except CheckpointNotFoundError:
                    pass
                else:
                    raise AssertionError(f"{run}/{cid} was dropped, yet reads")
            a, b = ids[0], ids[-1]
            d = self.store.diff(run, a, b)
            sa, sb = states[a], states[b]
            assert set(d.added) == sb.keys() - sa.keys()
            assert set(d.removed) == sa.keys() - sb.keys()
            assert {k for k in d.changed} == {k for k in sa.keys() & sb.keys()
                                              if sa[k] != sb[k]}
            assert self.store.state(run) == states[ids[-1]]
        check_history_counts(self.store)

    def teardown(self) -> None:
        try:
            report = self.store.verify()
            assert report.ok, report.problems
            self.store.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


HistoryMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=25,
                                            deadline=None)
TestHistoryReads = HistoryMachine.TestCase
