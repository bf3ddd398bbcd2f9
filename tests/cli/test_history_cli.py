"""The CLI's history commands: diff, rollback, fork, history --before, show --at; verify; backup."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import agentwal
from agentwal.cli import main
from tests.stores import Raw


@pytest.fixture
def store(tmp_path: Path) -> str:
    """Run ``r`` with checkpoints 1..6: ``step`` = id; ``note`` from 3 on; ``gone`` until 4."""
    path = str(tmp_path / "s.awal")
    with agentwal.open(path, durability="none") as s:
        for i in range(1, 7):
            with s.begin("r") as txn:
                txn["step"] = i
                if i == 3:
                    txn["note"] = {"text": "hello", "raw": b"\x01"}
                if i <= 4:
                    txn["gone"] = [i]
                else:
                    txn.delete("gone")
                txn.meta(i=i)
    return path


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()  # click >= 8.2 keeps stderr apart


def run(*args: str) -> tuple[int, str, str]:
    """Exit code, standard output and standard error; never a traceback."""
    result = _runner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.stdout + result.stderr
    return result.exit_code, result.stdout, result.stderr


def js(out: str) -> Any:
    return json.loads(out)


# -- diff ---------------------------------------------------------------------------------


def test_diff(store: str) -> None:
    code, out, _ = run("diff", store, "r", "2", "6", "--json")
    assert code == 0
    assert js(out) == {"added": {"note": {"text": "hello", "raw": {"$bytes": "AQ=="}}},
                       "removed": {"gone": [2]}, "changed": {"step": {"from": 2, "to": 6}}}
    code, out, _ = run("diff", store, "r", "2", "6")
    assert code == 0
    assert out.splitlines() == ['+ note: {"raw": {"$bytes": "AQ=="}, "text": "hello"}',
                                "- gone: [2]", "~ step: 2 -> 6"]
    code, out, _ = run("diff", store, "r", "6", "2", "--json")  # backwards
    assert js(out)["removed"] == {"note": {"text": "hello", "raw": {"$bytes": "AQ=="}}}
    code, out, _ = run("diff", store, "r", "5", "5")
    assert code == 0 and out.strip() == "no change from checkpoint 5 to 5"


def test_diff_problems_and_usage(store: str) -> None:
    code, _, err = run("diff", store, "r", "1", "9")
    assert code == 2 and "checkpoint_not_found" in err
    code, _, err = run("diff", store, "nope", "1", "2")
    assert code == 2 and "run_not_found" in err
    assert run("diff", store, "r", "0", "2")[0] == 2
    assert run("diff", store, "r", "x", "2")[0] == 2
    assert run("diff", store, "r", "1")[0] == 2


# -- history --before, show --at ------------------------------------------------------------


def test_history_before(store: str) -> None:
    code, out, _ = run("history", store, "r", "--before", "4", "--json")
    assert code == 0 and [c["id"] for c in js(out)] == [3, 2, 1]
    code, out, _ = run("history", store, "r", "--before", "4", "--limit", "1", "--json")
    assert [c["id"] for c in js(out)] == [3]
    code, out, _ = run("history", store, "r", "--before", "3")
    assert code == 0 and out.splitlines()[2].split()[0] == "2"
    code, _, err = run("history", store, "r", "--before", "99")
    assert code == 2 and "checkpoint_not_found" in err
    assert run("history", store, "r", "--before", "0")[0] == 2


def test_show_at(store: str) -> None:
    code, out, _ = run("show", store, "r", "--at", "2", "--json")
    assert code == 0 and js(out) == {"step": 2, "gone": [2]}
    code, out, _ = run("show", store, "r", "--at", "3", "--key", "note")
    assert code == 0 and out.strip() == 'note: {"raw": {"$bytes": "AQ=="}, "text": "hello"}'
    code, out, _ = run("show", store, "r", "--json")
    assert js(out) == {"step": 6, "note": {"text": "hello", "raw": {"$bytes": "AQ=="}}}
    code, _, err = run("show", store, "r", "--at", "7")
    assert code == 2 and "checkpoint_not_found" in err
    assert run("show", store, "r", "--at", "-1")[0] == 2


# -- rollback, fork -------------------------------------------------------------------------


def test_rollback(store: str) -> None:
    code, out, _ = run("rollback", store, "r", "2", "--json")
    assert code == 0
    row = js(out)
    assert row["id"] == 7 and row["parent"] == 6 and row["meta"] == {"rollback_to": 2}
    assert len(row["hash"]) == 64
    with agentwal.open(store, readonly=True) as s:
        assert s.state("r") == s.state("r", at=2) == {"step": 2, "gone": [2]}
        assert len(s.history("r")) == 7
    code, out, _ = run("rollback", store, "r", "3")
    assert code == 0 and out.splitlines()[0].split()[:2] == ["id", "parent"]
    assert out.splitlines()[2].split()[:2] == ["8", "7"]
    code, _, err = run("rollback", store, "r", "42")
    assert code == 2 and "checkpoint_not_found" in err


def test_fork(store: str) -> None:
    code, out, _ = run("fork", store, "r", "4", "r2", "--json")
    assert code == 0
    row = js(out)
    assert row["id"] == 1 and row["parent"] is None and row["origin"] == ["r", 4]
    with agentwal.open(store, readonly=True) as s:
        assert s.state("r2") == s.state("r", at=4)
        assert s.head("r").id == 6  # type: ignore[union-attr]
    code, _, err = run("fork", store, "r", "4", "r2")
    assert code == 1 and "run_exists" in err
    code, _, err = run("fork", store, "nope", "1", "r3")
    assert code == 2 and "run_not_found" in err


def test_writing_commands_refuse_a_locked_store_and_a_missing_one(store: str,
                                                                   tmp_path: Path) -> None:
    with agentwal.open(store):
        code, _, err = run("rollback", store, "r", "2")
        assert code == 1 and "store_locked" in err
        code, _, err = run("fork", store, "r", "2", "x")
        assert code == 1 and "store_locked" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run("rollback", str(empty), "r", "1")
    assert code == 1 and "store_not_found" in err and not os.listdir(empty)


# -- verify ---------------------------------------------------------------------------------


def test_verify_ok(store: str) -> None:
    code, out, _ = run("verify", store, "--json")
    assert code == 0
    report = js(out)
    assert report["ok"] is True and report["problems"] == []
    assert report["checked"]["hashes"] == 6 and report["checked"]["wal_records"] == 6
    code, out, _ = run("verify", store)
    assert code == 0 and out.splitlines()[-1] == "ok" and "checked: " in out


def test_verify_reports_problems_and_exits_1(store: str) -> None:
    with Raw(store) as raw:
        k = raw.key("r", 3)
        rec = raw.load("ckpt", k)
        rec[3] += 1.0  # created_at: the hash no longer matches
        raw.dump("ckpt", k, rec)
    code, out, err = run("verify", store, "--json")
    assert code == 1 and "1 problem(s) found" in err
    (p,) = js(out)["problems"]
    assert p["db"] == "ckpt" and p["key"] == "'r'/3" and p["file"] == "snapshot/data.mdb"
    assert "hash chain broken" in p["what"] and p["where"] == "snapshot/data.mdb ckpt['r'/3]"
    code, out, _ = run("verify", store)
    assert code == 1 and "snapshot/data.mdb ckpt['r'/3]" in out
    assert out.splitlines()[-1] == "1 problem(s) found"


def test_verify_of_a_store_that_does_not_open_exits_1(store: str) -> None:
    control = Path(store, "CONTROL")
    data = control.read_bytes()
    control.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # (its last byte may be 0 already)
    code, _, err = run("verify", store)
    assert code == 1 and "corruption" in err


# -- backup ---------------------------------------------------------------------------------


def test_backup(store: str, tmp_path: Path) -> None:
    dest = str(tmp_path / "b")
    code, out, _ = run("backup", store, dest, "--json")
    assert code == 0
    rep = js(out)
    assert rep["path"] == dest and rep["lsn"] == 6 and rep["files"] == 3
    code, out, _ = run("verify", dest)
    assert code == 0
    code, out, _ = run("show", dest, "r", "--at", "3", "--json")
    assert js(out) == {"step": 3, "note": {"text": "hello", "raw": {"$bytes": "AQ=="}},
                       "gone": [3]}
    code, _, err = run("backup", store, dest)
    assert code == 1 and "path_exists" in err
    shutil.rmtree(dest)
    code, out, _ = run("backup", store, dest)
    assert code == 0 and out.startswith(f"backed up {store} to {dest}: 3 files")


def test_backup_while_an_agent_writes(store: str, tmp_path: Path) -> None:
    with agentwal.open(store) as s:  # the writer holds the lock: backup opens read-only
        with s.begin("r") as txn:
            txn["step"] = 7
        code, _, _ = run("backup", store, str(tmp_path / "b"))
        assert code == 0
    code, out, _ = run("show", str(tmp_path / "b"), "r", "--json")
    assert code == 0 and js(out)["step"] == 7
