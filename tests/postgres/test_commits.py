"""Commits on PostgreSQL: the chain, optimistic validation, reads at a view, history writes."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

import cbor2
import psycopg
import pytest

from agentwal import (
    BackendUnavailableError,
    CheckpointNotFoundError,
    ConflictError,
    RunExistsError,
    RunNotFoundError,
    SchemaVersionError,
    failpoints,
)
from agentwal.codec import checkpoint_hash
from agentwal.postgres import PostgresStore
from tests.helpers import in_forked_child, refused_after_fork


def _recompute_chain(dsn: str, schema: str, run: str) -> list[tuple[int, bool]]:
    """``(id, hash ok)`` per checkpoint, recomputed from the rows alone."""
    out = []
    with psycopg.connect(dsn) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        rows = conn.execute("SELECT id, parent, created_at, meta, hash, outbox, origin_run, "
                            "origin_id FROM checkpoints WHERE run = %s ORDER BY id",
                            (run,)).fetchall()
        prev = bytes(32)
        for cid, parent, created, meta, hsh, outbox, orun, oid in rows:
            deltas = conn.execute(
                "SELECT d.key, coalesce(d.inline, v.data) FROM deltas d LEFT JOIN vals v "
                "ON v.digest = d.digest WHERE run = %s AND ckpt = %s ORDER BY key",
                (run, cid)).fetchall()
            delta = {k: (bytes(v) if v is not None else None) for k, v in deltas}
            digest = hashlib.sha256(cbor2.dumps(delta)).digest()
            origin = (orun, oid) if orun is not None else None
            want = checkpoint_hash(prev, run, cid, parent, created, bytes(meta), origin, digest,
                                   bytes(outbox) if outbox is not None else None)
            out.append((cid, want == bytes(hsh)))
            prev = bytes(hsh)
    return out


def test_checkpoints_chain_like_the_local_engine(pgstore: PostgresStore, pg_dsn: str,
                                                 pg_schema: str) -> None:
    ids = []
    for i in range(5):
        with pgstore.begin("r") as txn:
            txn["step"] = i
            txn["big"] = "x" * (100 + i)  # stored once in vals, by digest
            if i == 3:
                del txn["big"]
            txn.meta(node="n", i=i)
        assert txn.checkpoint is not None
        ids.append(txn.checkpoint.id)
    assert ids == [1, 2, 3, 4, 5]
    hist = pgstore.history("r")
    assert [c.id for c in hist] == [5, 4, 3, 2, 1]
    assert [c.parent for c in hist] == [4, 3, 2, 1, None]
    assert [c.lsn for c in hist] == sorted((c.lsn for c in hist), reverse=True)
    assert hist[0].meta == {"node": "n", "i": 4}
    assert _recompute_chain(pg_dsn, pg_schema, "r") == [(i, True) for i in range(1, 6)]
    assert pgstore.head("r") == hist[0]
    assert pgstore.history("r", limit=2, before=4) == hist[2:4]


def test_reads_at_checkpoints_and_diff(pgstore: PostgresStore) -> None:
    with pgstore.begin("r") as txn:
        txn["a"], txn["b/1"], txn["b/2"] = 1, [1, 2], {"x": "y" * 200}
    with pgstore.begin("r") as txn:
        txn["a"] = 2
        del txn["b/1"]
        txn["c"] = None
    assert pgstore.state("r") == {"a": 2, "b/2": {"x": "y" * 200}, "c": None}
    assert pgstore.state("r", at=1) == {"a": 1, "b/1": [1, 2], "b/2": {"x": "y" * 200}}
    assert pgstore.get("r", "a", at=1) == 1 and pgstore.get("r", "b/1") is None
    assert pgstore.get("r", "b/1", "gone") == "gone"
    d = pgstore.diff("r", 1, 2)
    assert d.added == {"c": None} and d.removed == {"b/1": [1, 2]}
    assert d.changed == {"a": (1, 2)}
    with pytest.raises(CheckpointNotFoundError):
        pgstore.state("r", at=3)
    with pytest.raises(RunNotFoundError):
        pgstore.state("nope")
    with pytest.raises(RunNotFoundError):
        pgstore.get("nope", "a", at=1)
    assert pgstore.runs() == ["r"]


def test_a_transaction_reads_its_snapshot(pgstore: PostgresStore) -> None:
    with pgstore.begin("r") as txn:
        txn["a"], txn["p/1"] = "old", 1
    reader = pgstore.begin("r")
    with pgstore.begin("r") as txn:
        txn["a"], txn["p/2"] = "new", 2
    assert reader.get("a") == "old"
    assert dict(reader.items("p/")) == {"p/1": 1}
    reader.rollback()


def test_disjoint_commits_rebase_and_overlaps_conflict(pgstore: PostgresStore) -> None:
    with pgstore.begin("r") as txn:
        txn["a"], txn["b"] = 0, 0
    t1, t2, t3 = pgstore.begin("r"), pgstore.begin("r"), pgstore.begin("r")
    t1["a"] = 1
    t2["b"] = 2  # disjoint from t1: rebases onto it
    t3.get("a")  # read what t1 writes: conflicts
    t3["z"] = 3
    assert t1.commit() is not None and t1.checkpoint is not None
    c2 = t2.commit()
    assert c2 is not None and (c2.id, c2.parent) == (3, 2)
    with pytest.raises(ConflictError) as info:
        t3.commit()
    assert info.value.key == "a" and info.value.code == "conflict"
    assert pgstore.state("r") == {"a": 1, "b": 2}
    assert pgstore.head("r") == c2


def test_a_scanned_prefix_conflicts(pgstore: PostgresStore) -> None:
    with pgstore.begin("r") as txn:
        txn["m/1"] = "a"
    scanner = pgstore.begin("r")
    assert scanner.keys("m/") == ["m/1"]
    scanner["count"] = 1
    with pgstore.begin("r") as txn:
        txn["m/2"] = "b"
    with pytest.raises(ConflictError) as info:
        scanner.commit()
    assert info.value.key is None
    assert pgstore.get("r", "count") is None


def test_an_empty_commit_makes_no_checkpoint(pgstore: PostgresStore) -> None:
    txn = pgstore.begin("r")
    assert txn.commit() is None
    with pgstore.begin("r") as txn:
        txn["a"] = 1
    head = pgstore.head("r")
    txn = pgstore.begin("r")
    sp = txn.savepoint()
    txn["b"] = 1
    txn.rollback_to(sp)  # nothing left to write
    assert txn.commit() == head


def test_values_are_stored_once(pgstore: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    big = {"text": "z" * 2000}
    for run in ("r1", "r2"):
        for i in range(3):
            with pgstore.begin(run) as txn:
                txn["doc"] = big
                txn["i"] = i
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{pg_schema}".vals').fetchone()
    assert row == (1,)


def test_delete_run_then_a_stale_view_conflicts(pgstore: PostgresStore) -> None:
    with pgstore.begin("r") as txn:
        txn["a"] = 1
    stale = pgstore.begin("r")
    stale["a"] = 2
    pgstore.delete_run("r")
    assert pgstore.head("r") is None and pgstore.runs() == [] and pgstore.history("r") == []
    with pytest.raises(ConflictError) as info:
        stale.commit()
    assert info.value.deleted
    with pytest.raises(RunNotFoundError):
        pgstore.delete_run("r")
    with pgstore.begin("r") as txn:
        assert txn.get("a") is None
        txn["a"] = 3
    assert txn.checkpoint is not None and txn.checkpoint.id == 1


def test_rollback_to_and_fork(pgstore: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    for i in range(3):
        with pgstore.begin("r") as txn:
            txn["i"] = i
            txn[f"k{i}"] = i
    back = pgstore.rollback_to("r", 1)
    assert (back.id, back.parent, back.meta) == (4, 3, {"rollback_to": 1})
    assert pgstore.state("r") == pgstore.state("r", at=1) == {"i": 0, "k0": 0}
    first = pgstore.fork("r", 3, "f")
    assert (first.id, first.parent, first.origin) == (1, None, ("r", 3))
    assert pgstore.state("f") == pgstore.state("r", at=3)
    with pytest.raises(RunExistsError):
        pgstore.fork("r", 2, "f")
    assert _recompute_chain(pg_dsn, pg_schema, "f") == [(1, True)]
    assert all(ok for _, ok in _recompute_chain(pg_dsn, pg_schema, "r"))


def test_a_lost_reply_to_commit_is_resolved_as_landed(pgstore: PostgresStore) -> None:
    def lose_the_reply(_name: str) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    failpoints.arm("pg_commit_after_commit", "call", fn=lose_the_reply)
    with pgstore.begin("r") as txn:
        txn["a"] = 1
    assert txn.checkpoint is not None and txn.checkpoint.id == 1
    assert pgstore.head("r") == txn.checkpoint  # reported once, and it is there
    with pgstore.begin("r") as txn:
        txn["a"] = 2
    assert txn.checkpoint is not None and txn.checkpoint.id == 2


def test_a_session_lost_before_commit_is_reported_not_applied(
        pgstore: PostgresStore, pg_dsn: str) -> None:
    with pgstore.begin("r") as txn:
        txn["a"] = 1

    def kill_my_session(_name: str) -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                         "application_name LIKE 'agentwal:%%' AND state = 'idle in transaction'")

    failpoints.arm("pg_commit_before_commit", "call", fn=kill_my_session)
    txn = pgstore.begin("r")
    txn["a"] = 2
    with pytest.raises(BackendUnavailableError, match="not applied"):
        txn.commit()
    assert pgstore.get("r", "a") == 1 and pgstore.head("r").id == 1  # type: ignore[union-attr]
    with pgstore.begin("r") as txn:  # the store carries on with a new session
        txn["a"] = 3
    assert pgstore.get("r", "a") == 3


def test_durable_modes_commit_the_same(open_pg: Callable[..., PostgresStore]) -> None:
    store = open_pg(worker_id="w", durability="sync")
    with store.begin("r") as txn:
        txn["a"] = 1
    store.sync()
    assert store.get("r", "a") == 1
    assert store.stats()["checkpoints_rows"] == 1


def _history_states(store: PostgresStore, run: str) -> list[dict[str, Any]]:
    head = store.head(run)
    assert head is not None
    return [store.state(run, at=i) for i in range(1, head.id + 1)]


def _back_to_version(dsn: str, schema: str, version: int, undo: tuple[str, ...]) -> None:
    """Make the store in ``schema`` look as schema ``version`` left it: run ``undo``
    (what the later migrations added, dropped) and record the version."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        for statement in undo:
            conn.execute(statement)
        conn.execute("UPDATE meta SET schema_version = %s", (version,))


def test_a_version_3_store_gets_its_intervals_filled_in(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    """Schema v4 adds ``deltas.until``; a v3 store's rows get theirs from its history."""
    store = open_pg(worker_id="w")
    for i in range(6):
        with store.begin("r") as txn:
            txn["n"] = i
            txn[f"m/{i % 3}"] = "x" * (10 * i)
            if i == 4:
                del txn["m/0"]
    with store.begin("s") as txn:
        txn["n"] = "other run"
    before = _history_states(store, "r")
    store.close()
    _back_to_version(pg_dsn, pg_schema, 3, (
        "DROP INDEX deltas_live, deltas_superseded, deltas_by_digest",
        "ALTER TABLE deltas DROP COLUMN until",
        "ALTER TABLE checkpoints DROP COLUMN dropped",
        "DROP TABLE tree_edges",
        "ALTER TABLE deltas DROP COLUMN base, DROP COLUMN base_count, DROP COLUMN base_len, "
        "DROP COLUMN depth, DROP COLUMN vlen",
        "DROP FUNCTION commit_step, write_checkpoint"))
    again = open_pg(worker_id="w2")
    assert _history_states(again, "r") == before
    assert again.state("s") == {"n": "other run"}
    assert again.verify().ok


def test_verify_finds_a_wrong_interval(pgstore: PostgresStore, pg_dsn: str,
                                       pg_schema: str) -> None:
    for i in range(3):
        with pgstore.begin("r") as txn:
            txn["k"] = i
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{pg_schema}".deltas SET until = 3 WHERE ckpt = 1')
    [problem] = pgstore.verify().problems
    assert problem.db == "deltas" and "next written at 2" in problem.what


def test_prefix_reads_are_index_ranges_that_miss_nothing(pgstore: PostgresStore) -> None:
    keys = ["a", "a/", "a/b", "a/\U0010ffff", "a/\U0010ffffz", "a0", "a\U0010ffff/x", "b"]
    with pgstore.begin("r") as txn:
        for k in keys:
            txn[k] = k
    with pgstore.begin("r") as txn:
        assert sorted(txn.items("a/")) == [(k, k) for k in sorted(keys) if k.startswith("a/")]
        assert sorted(k for k, _ in txn.items("a\U0010ffff")) == ["a\U0010ffff/x"]
        assert len(list(txn.items(""))) == len(keys)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_postgres_store_does_not_cross_a_fork(pgstore: PostgresStore) -> None:
    # A child forked after the open must not talk through the parent's sessions (their
    # protocol streams would interleave): it is refused, says why, and its close() leaves
    # the parent's sessions and leases alone.
    with pgstore.begin("r") as txn:
        txn["n"] = 1
    def child(said: list[str]) -> None:
        said += [refused_after_fork(call) for call in (
            lambda: pgstore.begin("r"), lambda: pgstore.get("r", "n"))]
        pgstore.close()

    said = in_forked_child(child)
    assert said == "fork fork"
    for n in range(2, 6):  # the parent's sessions and lease still work
        with pgstore.begin("r") as txn:
            txn["n"] = n
    assert pgstore.get("r", "n") == 5


def _rows_of(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        return conn.execute(
            "SELECT c.run, c.id, c.parent, c.lease_epoch, d.key, d.inline, d.digest, d.base, "
            "d.base_count, d.base_len, d.depth, d.vlen, d.until FROM checkpoints c "
            "LEFT JOIN deltas d ON d.run = c.run AND d.ckpt = c.id ORDER BY 1, 2, 5").fetchall()


def _steps(store: PostgresStore, run: str, n: int, *, start: int = 0) -> None:
    """``n`` commits: a counter, an inline and a ``vals`` value, a growing list, a delete."""
    for i in range(start, start + n):
        with store.begin(run) as txn:
            txn["n"] = i
            txn["ключ/☃"] = "x" * (40 + 10 * i)  # inline at first, then in vals
            txn.append("messages", {"i": i, "text": "y" * 100})
            if i % 3 == 2:
                del txn["n"]


def test_a_version_7_store_is_migrated_and_still_reads(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    """Schema v8 adds the commit functions; a v7 store (without them) reads as before,
    is refused by a read-only open, and a writable open migrates it and commits on."""
    store = open_pg(worker_id="w")
    _steps(store, "r", 5)
    before = _history_states(store, "r")
    store.close()
    _back_to_version(pg_dsn, pg_schema, 7, ("DROP FUNCTION commit_step, write_checkpoint",))
    with pytest.raises(SchemaVersionError):
        open_pg(readonly=True)
    again = open_pg(worker_id="w2")
    assert _history_states(again, "r") == before
    _steps(again, "r", 2, start=5)  # the one-statement commit
    with again.begin("r") as txn:  # the checked path (an outbox entry)
        txn.defer("mail", args={"to": "x"}, mode="at_least_once")
        txn["n"] = "last"
    assert again.head("r").id == 8  # type: ignore[union-attr]
    assert again.get("r", "messages") == [{"i": i, "text": "y" * 100} for i in range(7)]
    assert again.verify().ok  # the hash chain, the intervals and the append chains


def test_the_one_statement_commit_writes_the_rows_the_checked_path_writes(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    store = open_pg(worker_id="w")
    _steps(store, "fast", 5)
    failpoints.arm("pg_commit_before_commit", "call", fn=lambda _name: None)  # checked path
    try:
        _steps(store, "checked", 5)
    finally:
        failpoints.disarm("pg_commit_before_commit")
    rows = _rows_of(pg_dsn, pg_schema)
    fast = [r[1:] for r in rows if r[0] == "fast"]
    checked = [r[1:] for r in rows if r[0] == "checked"]
    assert len(fast) == 15 and fast == checked  # 5 checkpoints of 3 keys
    assert store.verify().ok


def _call_commit_step(dsn: str, schema: str, **changes: Any) -> Any:
    """``commit_step`` of checkpoint 2 of run ``r`` (head 1, run epoch 0, worker ``w``, lease
    epoch 1), with ``changes`` to those arguments."""
    args: dict[str, Any] = {"run": "r", "base": 1, "run_epoch": 0, "owner": "w",
                            "lease_epoch": 1}
    args.update(changes)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        got = conn.execute(
            "SELECT commit_step(%(run)s, %(base)s, %(run_epoch)s, %(owner)s, %(lease_epoch)s, "
            "0.0, '\\x'::bytea, '\\x00'::bytea, '\\x00'::bytea, gen_random_uuid(), '[]', "
            "'[[\"k\", \"01\", null, null, null, null, 0, 1]]', '[]')", args).fetchone()
    return got[0] if got else None


@pytest.mark.parametrize("changes", [
    {"base": 0}, {"base": 2}, {"run_epoch": 1}, {"owner": "v"}, {"lease_epoch": 2},
    {"run": "nobody"}])
def test_commit_step_refuses_without_writing_when_its_guard_fails(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str,
        changes: dict[str, Any]) -> None:
    store = open_pg(worker_id="w")
    with store.begin("r") as txn:
        txn["k"] = 0
    before = _rows_of(pg_dsn, pg_schema)
    assert _call_commit_step(pg_dsn, pg_schema, **changes) is None
    assert _rows_of(pg_dsn, pg_schema) == before
    assert store.head("r").id == 1  # type: ignore[union-attr]


def test_commit_step_refuses_an_expired_lease(open_pg: Callable[..., PostgresStore],
                                               pg_dsn: str, pg_schema: str) -> None:
    store = open_pg(worker_id="w")
    with store.begin("r") as txn:
        txn["k"] = 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{pg_schema}".runs SET lease_expires = now() - interval \'1s\'')
    before = _rows_of(pg_dsn, pg_schema)
    assert _call_commit_step(pg_dsn, pg_schema) is None
    assert _rows_of(pg_dsn, pg_schema) == before
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{pg_schema}".runs SET lease_expires = now() + interval \'1h\'')
    assert _call_commit_step(pg_dsn, pg_schema) is not None  # the same call, lease live
    assert store.get("r", "k") == 1
