"""The effects ledger's run and status indexes: ``effects(run=, status=)`` without a scan.

A query by run or status reads LMDB through the indexes (format 2) and
then the memtables. Each test compares it with the full scan
(``effects()`` filtered in Python), through status changes, folds,
expiry, a store written before the indexes existed, and damage.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random

import lmdb
import pytest

import agentwal
from agentwal.effects import STATUSES
from agentwal.local.snapshot.layout import EFFECTS_INDEX

RUNS = ("a", "b", "c")


def scan(store: agentwal.Store, run: str | None, status: str | None) -> list[str]:
    return [e.key for e in store.effects()
            if (run is None or e.run == run) and (status is None or e.status == status)]


def assert_queries_match_the_scan(store: agentwal.Store) -> None:
    for run in (None, *RUNS, "none-such"):
        for status in (None, *STATUSES):
            got = [e.key for e in store.effects(run=run, status=status)]
            assert got == scan(store, run, status), (run, status)


def boom(ctx: agentwal.EffectContext) -> None:
    raise ValueError("the downstream refused")


def record(store: agentwal.Store, rnd: random.Random, n: int) -> None:
    """``n`` standalone effects over three runs: done, failed, some retired."""
    for i in range(n):
        run = rnd.choice(RUNS)
        fails = rnd.random() < 0.3
        with contextlib.suppress(ValueError):
            store.effect(run, "op", boom if fails else (lambda ctx: {"i": ctx.args}),
                         key=f"{run}/op/{i}", mode="at_least_once", args=i)
        if rnd.random() < 0.2:
            mine = store.effects(run=run)
            if mine and mine[-1].status != "retired":
                store.retire_effect(mine[-1].effect_id)


def test_queries_match_the_scan_through_folds_and_status_changes(path: str) -> None:
    rnd = random.Random(7)
    with agentwal.open(path, durability="none") as store:
        for rnd_round in range(4):
            record(store, rnd, 15)
            assert_queries_match_the_scan(store)  # part in the memtable, part folded
            if rnd_round % 2 == 0:
                store.snapshot()
                assert_queries_match_the_scan(store)
        # Retiring folded entries changes their status in the memtable over LMDB's.
        for e in store.effects(status="done")[:5]:
            store.retire_effect(e.effect_id)
        assert_queries_match_the_scan(store)
        store.snapshot()
        assert_queries_match_the_scan(store)
        assert store.verify().ok
    with agentwal.open(path, readonly=True) as ro:
        assert_queries_match_the_scan(ro)


def strip_the_indexes(path: str) -> int:
    """Make the snapshot look written before the indexes (format 1): rows and marker gone."""
    env = lmdb.open(os.path.join(path, "snapshot"), max_dbs=16)
    try:
        effects, meta = env.open_db(b"effects"), env.open_db(b"meta")
        with env.begin(write=True) as txn:
            doomed = [bytes(k) for k, _ in txn.cursor(db=effects) if bytes(k)[:1] in b"rs"]
            for k in doomed:
                txn.delete(k, db=effects)
            assert txn.delete(EFFECTS_INDEX, db=meta)
    finally:
        env.close()
    return len(doomed)


def test_a_store_written_before_the_indexes_opens_queries_and_gets_them(path: str) -> None:
    with agentwal.open(path, durability="none") as store:
        record(store, random.Random(3), 30)
        store.snapshot()
    assert strip_the_indexes(path) >= 60
    with agentwal.open(path, readonly=True) as ro:  # no fold: the queries scan
        assert ro.verify().ok
        assert_queries_match_the_scan(ro)
    with agentwal.open(path, durability="none") as store:
        assert_queries_match_the_scan(store)
        record(store, random.Random(4), 5)
        store.snapshot()  # the first fold builds the indexes
        assert_queries_match_the_scan(store)
        assert store.verify().ok
    env = lmdb.open(os.path.join(path, "snapshot"), max_dbs=16, readonly=True)
    try:
        with env.begin() as txn:
            assert txn.get(EFFECTS_INDEX, db=env.open_db(b"meta", txn=txn)) is not None
    finally:
        env.close()


def test_expired_entries_leave_the_indexes(path: str) -> None:
    with agentwal.open(path, durability="none",
                       effect_retention=datetime.timedelta(seconds=0)) as store:
        record(store, random.Random(5), 20)
        store.snapshot()  # expiry runs with the fold: every settled entry goes
        assert_queries_match_the_scan(store)
        assert store.effects(status="done") == []
        assert store.verify().ok


def test_verify_reports_an_entry_missing_from_an_index(path: str) -> None:
    with agentwal.open(path, durability="none") as store:
        store.effect("a", "op", lambda ctx: 1, key="only", mode="at_least_once")
        store.snapshot()
    env = lmdb.open(os.path.join(path, "snapshot"), max_dbs=16)
    try:
        effects = env.open_db(b"effects")
        with env.begin(write=True) as txn:
            row = next(bytes(k) for k, _ in txn.cursor(db=effects) if bytes(k)[:1] == b"s")
            txn.delete(row, db=effects)
    finally:
        env.close()
    with agentwal.open(path, readonly=True) as ro:
        report = ro.verify()
        assert not report.ok
        assert any("status index" in str(p) for p in report.problems)


def test_a_query_decodes_what_it_returns_not_the_ledger(path: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts ledger entries decoded from LMDB (not a timing: the count is the machine's own)."""
    from agentwal.local.snapshot import ledger_reads as reader

    with agentwal.open(path, durability="none") as store:
        for i in range(200):
            store.effect("big", "op", lambda ctx: 1, key=f"big/{i}", mode="at_least_once")
        for i in range(5):
            store.effect("small", "op", lambda ctx: 1, key=f"small/{i}", mode="at_least_once")
        store.snapshot()
        decoded = 0
        real = reader.decode_entry

        def counting(data: bytes) -> agentwal.EffectRecord:
            nonlocal decoded
            decoded += 1
            return real(data)

        monkeypatch.setattr(reader, "decode_entry", counting)
        assert len(store.effects(run="small")) == 5
        assert len(store.effects(run="small", status="done")) == 5
        assert store.effects(status="failed") == []
        assert decoded == 10
        assert len(store.effects()) == 205  # the scan still reads them all
        assert decoded == 215
