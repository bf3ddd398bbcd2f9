"""Directory trees on PostgreSQL: the local tree code over the blob rows (postgres/trees.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import agentwal
from agentwal.postgres import PostgresStore
from agentwal.postgres import blobs as pg_blobs
from tests import trees

SPEC: trees.Spec = {"a.txt": b"alpha\n", "src/app.py": b"print(1)\n", "bin/run": ("x", b"#!\n"),
                    "link": ("l", "a.txt"), "empty": ("d",), "big.bin": bytes(range(256)) * 5000}


def _sql(dsn: str, schema: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        return conn.execute(query).fetchall()


def test_put_restore_list_open_and_diff_a_tree(pgstore: PostgresStore, tmp_path: Path) -> None:
    work = str(tmp_path / "work")
    trees.build(work, SPEC)
    with pgstore.begin("r") as txn:
        first = txn.put_tree("ws", work)
        txn["step"] = 1
    assert isinstance(first, agentwal.TreeRef) and pgstore.get("r", "ws") == first
    (tmp_path / "work" / "a.txt").write_bytes(b"changed\n")
    (tmp_path / "work" / "src" / "new.py").write_bytes(b"x = 2\n")
    with pgstore.begin("r") as txn:
        assert txn.put_tree("ws", work) != first
    d = pgstore.diff("r", 1, 2)
    assert list(d.trees["ws"].modified) == ["a.txt"] and d.trees["ws"].added == {"src/new.py": 6}
    out = str(tmp_path / "out")
    pgstore.restore_tree("r", "ws", out, at=1)
    assert trees.read(out)["a.txt"] == ("f", 0o644, b"alpha\n")
    assert trees.read(out)["bin/run"][1] == 0o755 and trees.read(out)["link"] == ("l", "a.txt")
    report = pgstore.restore_tree("r", "ws", out)  # to the head: two files change
    assert report.written == 2 and report.files == 6 and trees.read(out) == trees.read(work)
    listed = {f.path: f.size for f in pgstore.list_tree("r", "ws", at=1)}
    assert listed["big.bin"] == 256 * 5000 and "src/new.py" not in listed
    with pgstore.open_tree_file("r", "ws", "src/app.py") as f:
        assert f.read() == b"print(1)\n"
    with pytest.raises(agentwal.TreePathError):
        pgstore.open_tree_file("r", "ws", "src")
    with pytest.raises(agentwal.NotATreeError):
        pgstore.list_tree("r", "step")
    assert pgstore.verify().ok


def test_a_workspace_on_a_uri_rolls_its_files_back(pgstore: PostgresStore, tmp_path: Path
                                                    ) -> None:
    work = tmp_path / "repo"
    trees.build(str(work), {"README": b"v1\n", "lib/x.py": b"x = 1\n"})
    ws = agentwal.Workspace(pgstore, "agent", work)
    before = ws.checkpoint(step="plan")
    (work / "README").write_bytes(b"v2\n")
    (work / "lib" / "x.py").unlink()
    status = ws.status()
    assert list(status.modified) == ["README"] and list(status.removed) == ["lib/x.py"]
    ws.checkpoint(step="edit")
    ws.rollback_to(before.id)
    assert trees.read(str(work)) == {"README": ("f", 0o644, b"v1\n"), "lib": ("d",),
                                     "lib/x.py": ("f", 0o644, b"x = 1\n")}


def test_a_tree_put_again_from_its_ref_and_a_subdir(pgstore: PostgresStore, tmp_path: Path
                                                    ) -> None:
    trees.build(str(tmp_path / "w"), SPEC)
    with pgstore.begin("r") as txn:
        ref = txn.put_tree("ws", tmp_path / "w")
    with pgstore.begin("r2") as txn:
        assert txn.put_tree("copy", ref) == ref
        txn.put_tree("src", ref, subdir="src")
    assert [f.path for f in pgstore.list_tree("r2", "src")] == ["app.py"]


def test_collection_keeps_shared_files_and_deletes_a_tree_from_the_top(
        open_pg: Callable[..., PostgresStore], pg_dsn: str, pg_schema: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_pg(worker_id="w")
    trees.build(str(tmp_path / "w"), SPEC)
    for run in ("a", "b"):
        with store.begin(run) as txn:
            txn.put_tree("ws", tmp_path / "w")
    (tmp_path / "w" / "a.txt").write_bytes(b"only in b\n")
    with store.begin("b") as txn:
        txn.put_tree("ws", tmp_path / "w")
    edges = _sql(pg_dsn, pg_schema, "SELECT count(*) FROM tree_edges")[0][0]
    assert edges == 8 + 6  # the second snapshot added only its new objects' edges
    monkeypatch.setattr(pg_blobs, "GRACE", 0.0)
    store.delete_run("a")
    store.restore_tree("b", "ws", tmp_path / "out", at=1)  # b still reads all of its trees
    assert store.verify().ok
    store.delete_run("b")
    for table in ("blobs", "blob_chunks", "tree_edges"):
        assert _sql(pg_dsn, pg_schema, f"SELECT count(*) FROM {table}") == [(0,)], table


def test_copy_carries_trees_both_ways(pgstore: PostgresStore, tmp_path: Path) -> None:
    trees.build(str(tmp_path / "w"), SPEC)
    with agentwal.open(str(tmp_path / "src.awal"), durability="none") as local:
        with local.begin("r") as txn:
            txn.put_tree("ws", tmp_path / "w")
        (tmp_path / "w" / "a.txt").write_bytes(b"two\n")
        with local.begin("r") as txn:
            txn.put_tree("ws", tmp_path / "w")
        local.copy_runs(pgstore)
    assert pgstore.verify().ok
    pgstore.restore_tree("r", "ws", tmp_path / "pg", at=1)
    assert trees.read(str(tmp_path / "pg"))["a.txt"] == ("f", 0o644, b"alpha\n")
    with agentwal.open(str(tmp_path / "back.awal"), durability="none") as back:
        pgstore.copy_runs(back)
        assert back.verify().ok
        back.restore_tree("r", "ws", tmp_path / "back")
    assert trees.read(str(tmp_path / "back")) == trees.read(str(tmp_path / "w"))


def test_verify_finds_a_tree_edge_missing(pgstore: PostgresStore, pg_dsn: str, pg_schema: str,
                                          tmp_path: Path) -> None:
    trees.build(str(tmp_path / "w"), {"d/f.txt": b"f\n"})
    with pgstore.begin("r") as txn:
        txn.put_tree("ws", tmp_path / "w")
    assert pgstore.verify().ok and pgstore.verify().checked["trees"] == 1
    sha = hashlib.sha256(b"f\n").hexdigest()
    assert _sql(pg_dsn, pg_schema, f"DELETE FROM tree_edges WHERE child = '\\x{sha}' "
                "RETURNING 1") == [(1,)]
    report = pgstore.verify()
    assert not report.ok and [p.db for p in report.problems] == ["tree_edges"]
