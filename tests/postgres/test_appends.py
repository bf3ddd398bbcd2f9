"""Append-shared lists on PostgreSQL: a growing list costs its new items per commit."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import agentwal
from agentwal.history import MAX_CHAIN
from agentwal.postgres import PostgresStore


def _sql(dsn: str, schema: str, query: str, args: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        cur = conn.execute(query, args)
        return cur.fetchall() if cur.description else []


def _msg(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 else "assistant", "content": f"message {i} " + "x" * 200}


def _grow(store: Any, run: str, n: int) -> list[list[dict[str, Any]]]:
    """``n`` steps, half appending with txn.append, half putting the grown list back."""
    states: list[list[dict[str, Any]]] = []
    for i in range(n):
        with store.begin(run) as txn:
            if i % 2:
                txn.append("messages", _msg(i))
            else:
                txn["messages"] = [*txn.get("messages", []), _msg(i)]
            txn[f"notes/{i % 3}"] = i
        states.append(store.get(run, "messages"))
    return states


def test_a_growing_list_stores_its_tails_and_reads_back_whole(
        pgstore: PostgresStore, pg_dsn: str, pg_schema: str) -> None:
    n = MAX_CHAIN + 16
    states = _grow(pgstore, "r", n)
    assert states[-1] == [_msg(i) for i in range(n)]
    for at in (1, 2, MAX_CHAIN - 1, MAX_CHAIN, MAX_CHAIN + 1, n):
        assert pgstore.get("r", "messages", at=at) == states[at - 1]
        assert pgstore.state("r", at=at)["messages"] == states[at - 1]
    with pgstore.begin("r") as txn:
        assert txn["messages"] == states[-1] and dict(txn.items("mess")) == {"messages": states[-1]}
    rows = _sql(pg_dsn, pg_schema, "SELECT ckpt, base, depth, coalesce(octet_length(inline), "
                "octet_length(v.data)) FROM deltas d LEFT JOIN vals v ON v.digest = d.digest "
                "WHERE key = 'messages' ORDER BY ckpt")
    # Each append row extends the row before it; a chain restarts (a whole value) after
    # MAX_CHAIN rows. A re-put list under 2 KiB is not handed out as an append (txn.py).
    assert rows[0][1] is None and len(rows) == n
    for (prev, _b, depth, _n), (_cid, base, d, size) in itertools.pairwise(rows):
        if base is not None:
            assert (base, d) == (prev, depth + 1) and size < 300  # one message
    restarts = [cid for (_p, _b, depth, _n), (cid, base, _d, _s) in itertools.pairwise(rows)
                if base is None and depth == MAX_CHAIN - 1]
    assert restarts and sum(base is not None for _c, base, _d, _s in rows) > n // 2
    assert pgstore.diff("r", 3, 5).changed["messages"] == (states[2], states[4])
    assert pgstore.verify().ok


def test_compact_keeps_the_lists_it_keeps(pgstore: PostgresStore) -> None:
    states = _grow(pgstore, "r", 12)
    pgstore.compact(keep_last=3)
    for at in (10, 11, 12):
        assert pgstore.get("r", "messages", at=at) == states[at - 1]
    with pgstore.begin("r") as txn:  # the chain goes on over the rebased row
        txn.append("messages", _msg(99))
    assert pgstore.get("r", "messages") == states[-1] + [_msg(99)]
    assert pgstore.verify().ok


def test_verify_and_reads_catch_a_broken_chain(pgstore: PostgresStore, pg_dsn: str,
                                               pg_schema: str) -> None:
    _grow(pgstore, "r", 4)
    _sql(pg_dsn, pg_schema, "UPDATE deltas SET base_len = base_len + 1 WHERE key = 'messages' "
         "AND ckpt = 4")
    report = pgstore.verify()
    assert not report.ok and any("append" in p.what for p in report.problems)
    with pytest.raises(agentwal.CorruptionError):
        pgstore.get("r", "messages")
    assert len(pgstore.get("r", "messages", at=3)) == 3


def test_copy_carries_lists_both_ways_as_appends(pgstore: PostgresStore, pg_dsn: str,
                                                 pg_schema: str, tmp_path: Path) -> None:
    with agentwal.open(str(tmp_path / "a.awal"), durability="none") as local:
        states = _grow(local, "r", 6)
        local.copy_runs(pgstore)
    assert [pgstore.get("r", "messages", at=i + 1) for i in range(6)] == states
    assert _sql(pg_dsn, pg_schema, "SELECT ckpt FROM deltas WHERE key = 'messages' AND "
                "base IS NOT NULL ORDER BY ckpt") == [(c,) for c in range(2, 7)]
    assert pgstore.verify().ok
    with agentwal.open(str(tmp_path / "b.awal"), durability="none") as back:
        pgstore.copy_runs(back)
        assert [back.get("r", "messages", at=i + 1) for i in range(6)] == states
        assert back.verify().ok


def test_a_version_6_store_appends_after_one_whole_write(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str) -> None:
    store = open_pg(worker_id="w")
    with store.begin("r") as txn:
        txn["messages"] = [_msg(0)]
    store.close()
    _sql(pg_dsn, pg_schema, "ALTER TABLE deltas DROP COLUMN base, DROP COLUMN base_count, "
         "DROP COLUMN base_len, DROP COLUMN depth, DROP COLUMN vlen")
    _sql(pg_dsn, pg_schema, "DROP FUNCTION commit_step, write_checkpoint")
    _sql(pg_dsn, pg_schema, "UPDATE meta SET schema_version = 6")
    again = open_pg(worker_id="w2")
    for i in (1, 2):
        with again.begin("r") as txn:
            txn.append("messages", _msg(i))
    assert again.get("r", "messages") == [_msg(0), _msg(1), _msg(2)]
    assert _sql(pg_dsn, pg_schema, "SELECT ckpt, base FROM deltas ORDER BY ckpt") == [
        (1, None), (2, None), (3, 2)]  # the old row's length is unknown: one whole write
    assert again.verify().ok
