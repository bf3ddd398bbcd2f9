"""put_tree from a TreeRef (a copy, or one directory re-rooted) and put_tree(rehash=True)."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentwal
from tests.trees import read
from tests.unit.test_store_trees import counting, files_read, put
from tests.unit.test_tree_stat_cache import src

__all__ = ["counting", "src"]  # fixtures, used by name

def sweep(store: agentwal.Store) -> None:
    store.compact(keep_last=1)
    store._engine.blobrefs.sweep()


def test_a_tree_ref_is_put_again_without_reading_a_file(store: agentwal.Store, src: str,
                                                        tmp_path: Path, counting: None) -> None:
    put(store, src, key="a")
    ref = store.get("r", "a")
    n = files_read()
    with store.begin("other") as txn:
        assert txn.put_tree("ws", ref) == ref
    assert files_read() == n
    with store.begin("r") as txn:  # the source goes; the copy keeps every file
        txn.delete("a")
    sweep(store)
    store.restore_tree("other", "ws", tmp_path / "out")
    assert read(str(tmp_path / "out")) == read(src)
    assert store.verify().ok


def test_a_directory_of_a_tree_ref_becomes_a_tree_of_its_own(store: agentwal.Store, src: str,
                                                             tmp_path: Path, counting: None
                                                             ) -> None:
    put(store, src, key="a")
    n = files_read()
    with store.begin("r") as txn:
        sub = txn.put_tree("sub", txn.get("a"), subdir="src")
        txn.delete("a")
    assert files_read() == n
    sweep(store)
    store.restore_tree("r", "sub", tmp_path / "out")
    assert read(str(tmp_path / "out")) == read(str(Path(src, "src")))
    files = store.list_tree("r", "sub")
    assert {f.path for f in files} == {"app.py", "pkg/__init__.py", "pkg/mod.py"}
    assert store.get("r", "sub") == sub
    assert store.verify().ok


@pytest.mark.parametrize("subdir", ["README.md", "nope", "src/app.py", "../x", "/src", ""])
def test_a_subdir_that_is_no_directory_of_the_tree_is_refused(store: agentwal.Store, src: str,
                                                              subdir: str) -> None:
    put(store, src, key="a")
    with store.begin("r") as txn:
        with pytest.raises(agentwal.TreePathError):
            txn.put_tree("sub", txn.get("a"), subdir=subdir)
        assert txn.get("sub") is None  # nothing buffered; the transaction goes on
        txn["note"] = "still usable"
    assert store.get("r", "note") == "still usable"


def test_exclude_with_a_tree_ref_and_subdir_with_a_path_are_type_errors(
        store: agentwal.Store, src: str) -> None:
    put(store, src, key="a")
    with store.begin("r") as txn:
        with pytest.raises(TypeError, match="exclude"):
            txn.put_tree("b", txn.get("a"), exclude="*.py")
        with pytest.raises(TypeError, match="subdir"):
            txn.put_tree("b", src, subdir="src")
        assert txn.get("b") is None


def test_a_tree_ref_of_another_store_is_a_tree_source_error(store: agentwal.Store, src: str,
                                                            tmp_path: Path) -> None:
    other = agentwal.open(tmp_path / "other.awal", durability="none")
    try:
        with other.begin("r") as txn:
            foreign = txn.put_tree("ws", src)
    finally:
        other.close()
    with store.begin("r") as txn:
        with pytest.raises(agentwal.TreeSourceError, match="no tree with that hash"):
            txn.put_tree("ws", foreign)
        txn["x"] = 1
    assert store.get("r", "ws") is None


def test_a_tree_ref_whose_files_were_swept_is_refused(store: agentwal.Store, src: str) -> None:
    put(store, src, key="a")
    ref = store.get("r", "a")
    with store.begin("r") as txn:
        txn.delete("a")
    sweep(store)
    with store.begin("r") as txn:
        with pytest.raises(agentwal.TreeSourceError):
            txn.put_tree("b", ref)
        txn["x"] = 1
    assert store.get("r", "b") is None


def test_rehash_reads_every_file_again_and_rebuilds_the_cache(store: agentwal.Store, src: str,
                                                              counting: None) -> None:
    put(store, src)
    n = files_read()
    put(store, src)
    assert files_read() == n  # the stat cache vouched for every file
    with store.begin("r") as txn:
        txn.put_tree("ws", src, rehash=True)
    assert files_read() == n + 5
    put(store, src)
    assert files_read() == n + 5  # the rebuilt cache vouches again
