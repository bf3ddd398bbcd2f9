"""Opening what is not a store: a typed error that names the problem and says what to do.

Issue #10, case 5: a path that is a regular file, a missing parent, a
non-empty directory of other files, a missing store opened read-only. Each
is refused before anything is created (no LOCK, no CONTROL, no 17 MB store
in a project folder), with its own code, never ``DurabilityError`` advice
about the disk or ``CorruptionError``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import agentwal
from agentwal.cli import main
from agentwal.errors import CorruptionError, NotAStoreError, StoreNotFoundError


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("readonly", [False, True])
def test_a_regular_file_is_not_a_store(tmp_path: Path, readonly: bool) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("my notes\n")
    with pytest.raises(NotAStoreError) as info:
        agentwal.open(f, readonly=readonly)
    assert info.value.code == "not_a_store"
    assert "is a file" in str(info.value) and "directory" in str(info.value)
    assert f.read_text() == "my notes\n"
    assert _tree(tmp_path) == ["notes.txt"]


def test_a_missing_parent_is_named(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError) as info:
        agentwal.open(tmp_path / "no-such-dir" / "state.awal")
    assert info.value.code == "store_not_found"
    assert "no-such-dir" in str(info.value) and "Create the parent directory" in str(info.value)
    assert _tree(tmp_path) == []


def test_a_project_folder_is_never_turned_into_a_store(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "README.md").write_text("hello\n")
    before = _tree(project)
    with pytest.raises(NotAStoreError) as info:
        agentwal.open(project)
    assert "not an agentwal store" in str(info.value)
    assert "'README.md'" in str(info.value) and "'src'" in str(info.value)
    assert _tree(project) == before  # no LOCK, no CONTROL, no segment


def test_a_missing_store_opened_read_only(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError) as info:
        agentwal.open(tmp_path / "state.awal", readonly=True)
    assert "read-only open never creates a store" in str(info.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(StoreNotFoundError, match="no CONTROL file"):
        agentwal.open(empty, readonly=True)
    assert _tree(tmp_path) == ["empty"]


def test_an_empty_directory_and_a_store_still_open(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with agentwal.open(empty) as store, store.begin("r") as txn:
        txn["k"] = 1
    with agentwal.open(empty) as store:  # a store's own names are no foreign files
        assert store.get("r", "k") == 1


def test_a_store_that_lost_its_control_file_is_still_damage(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with agentwal.open(path) as store, store.begin("r") as txn:
        txn["k"] = 1
    (path / "CONTROL").unlink()
    for readonly in (True, False):
        with pytest.raises(CorruptionError, match="CONTROL"):
            agentwal.open(path, readonly=readonly)


def _folded_past_its_first_segment(path: Path) -> None:
    """A store whose log was cut after folds: LSN 1.. are only in LMDB."""
    with agentwal.open(path, wal_max_bytes=1 << 20) as store:
        for i in range(1500):
            with store.begin("r") as txn:
                txn["n"] = i
                txn["pad"] = bytes(range(256)) * 4
    assert min(int(n.split(".")[0]) for n in os.listdir(path / "wal")) > 1


@pytest.mark.parametrize("damage", ["rm data.mdb", "empty data.mdb", "rm snapshot/"])
@pytest.mark.parametrize("readonly", [False, True])
def test_a_store_whose_snapshot_is_gone_is_damage_not_a_removed_segment(
        tmp_path: Path, damage: str, readonly: bool) -> None:
    # It said "log records 1..N are missing (a segment was removed)", after making a new,
    # empty data.mdb (or snapshot/) in the store it claimed not to have changed.
    path = tmp_path / "s"
    _folded_past_its_first_segment(path)
    data = path / "snapshot" / "data.mdb"
    if damage == "rm data.mdb":
        data.unlink()
    elif damage == "empty data.mdb":
        os.truncate(data, 0)
    else:
        shutil.rmtree(path / "snapshot")
    before = _tree(path)
    with pytest.raises(CorruptionError, match=r"snapshot .*(missing|empty).* folded into") as info:
        agentwal.open(path, readonly=readonly)
    assert "backup" in str(info.value) and "segment was removed" not in str(info.value)
    assert sorted(set(_tree(path)) - {"LOCK"}) == sorted(set(before) - {"LOCK"})


def test_a_store_whose_log_still_starts_at_lsn_1_is_rebuilt_without_its_snapshot(
        tmp_path: Path) -> None:
    path = tmp_path / "s"
    with agentwal.open(path) as store:
        for i in range(20):
            with store.begin("r") as txn:
                txn["n"] = i
        store.snapshot()
    (path / "snapshot" / "data.mdb").unlink()
    with agentwal.open(path) as store:
        assert store.get("r", "n") == 19 and store.verify().ok


def test_the_cli_says_the_same(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("x")
    runner = CliRunner()
    result = runner.invoke(main, ["runs", str(f)])
    assert result.exit_code == 2 and "is a file" in result.output  # a usage error
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (["runs", str(empty)], ["verify", str(empty)]):
        result = runner.invoke(main, args)
        assert result.exit_code == 1, result.output
        assert "store_not_found" in result.output and "Traceback" not in result.output
