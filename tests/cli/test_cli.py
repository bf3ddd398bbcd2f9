"""The CLI: exit codes, --json output, help text, and docs/cli.md covering every command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import agentwal
from agentwal.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.fixture
def filled(tmp_path: Path) -> str:
    path = str(tmp_path / "s.awal")
    with agentwal.open(path, durability="none") as s:
        for i in range(3):
            with s.begin("run-a") as txn:
                txn["step"] = i
                txn["blob"] = b"\x00\x01"
                txn.meta(node="n", i=i)
        with s.begin("run-b") as txn:
            txn["x"] = {"y": [1, 2]}
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_every_command_has_help_and_is_documented() -> None:
    docs = DOCS.read_text()
    for name, cmd in main.commands.items():
        code, _ = run(name, "--help")
        assert code == 0, name
        assert cmd.help and len(cmd.help) > 20, name
        assert f"agentwal {name}" in docs, f"docs/cli.md does not document {name}"


def test_inspect(filled: str) -> None:
    code, out = run("inspect", filled, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["runs"] == 2 and data["visible_lsn"] == 4
    code, out = run("inspect", filled)
    assert code == 0 and "visible_lsn" in out


def test_runs_history_show(filled: str) -> None:
    code, out = run("runs", filled, "--json")
    assert code == 0
    assert [r["run"] for r in json.loads(out)] == ["run-a", "run-b"]
    code, out = run("history", filled, "run-a", "--json", "--limit", "2")
    hist = json.loads(out)
    assert code == 0 and [c["id"] for c in hist] == [3, 2] and hist[0]["meta"]["i"] == 2
    code, out = run("show", filled, "run-a", "--json")
    assert code == 0
    assert json.loads(out) == {"step": 2, "blob": {"$bytes": "AAE="}}
    code, out = run("show", filled, "run-b", "--key", "x")
    assert code == 0 and '"y": [1, 2]' in out


def test_wal_dump(filled: str) -> None:
    code, out = run("wal", filled, "--json")
    assert code == 0
    records = json.loads(out)["records"]
    assert [r["lsn"] for r in records] == [1, 2, 3, 4]
    assert records[0]["run"] == "run-a" and "step" in records[0]["keys"]


def test_problems_exit_1_without_traceback(filled: str, tmp_path: Path) -> None:
    code, out = run("show", filled, "no-such-run")
    assert code == 2 and "run_not_found" in out and "Traceback" not in out
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out = run("inspect", str(empty))
    assert code == 1 and "Traceback" not in out


def test_damaged_wal_exits_1(filled: str) -> None:
    seg = next((Path(filled) / "wal").glob("*.wal"))
    data = bytearray(seg.read_bytes())
    data[0] ^= 0xFF  # segment magic
    seg.write_bytes(bytes(data))
    code, out = run("wal", filled)
    assert code == 1 and "corruption" in out


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert run("inspect", str(tmp_path / "missing"))[0] == 2
    assert run("history")[0] == 2
    assert run("no-such-command")[0] == 2
    assert run("torture", str(tmp_path), "--tier", "bogus")[0] == 2


def test_torture_runs_and_summarises(tmp_path: Path) -> None:
    code, out = run("torture", str(tmp_path / "t"), "--seconds", "2", "--tier", "sim")
    assert code == 0, out
    assert "passed, 0 failed" in out.splitlines()[-1]


def test_torture_json_lists_every_case_and_a_bad_directory_is_no_traceback(
        tmp_path: Path) -> None:
    code, out = run("torture", str(tmp_path / "t"), "--seconds", "1", "--tier", "sim",
                    "--json")
    doc = json.loads(out)
    assert code == 0 and doc["failed"] == 0 and doc["passed"] == len(doc["results"]) > 0
    assert doc["tiers"] == {"sim": {"passed": doc["passed"], "failed": 0}}
    assert doc["results"][0]["repro"].startswith(f"agentwal torture {tmp_path / 't'} ")
    (tmp_path / "file").write_text("")
    res = CliRunner().invoke(main, ["torture", str(tmp_path / "file" / "t"), "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["error"]["code"] == "io"
    assert "Traceback" not in res.output


def test_compact(tmp_path: Path) -> None:
    path = str(tmp_path / "c.awal")
    with agentwal.open(path, durability="none") as s:
        for i in range(40):
            with s.begin("run-a") as txn:
                txn["step"] = i
        s.fork("run-a", 3, "run-b")
    code, out = run("compact", path, "--keep-last", "5", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["checkpoints_dropped"] == 34 and data["runs"] == {"run-a": 34}  # 3 is kept
    code, out = run("compact", path, "--keep-last", "5", "--drop-fork-origins", "--run",
                    "run-a", "--vacuum")
    assert code == 0 and "1 checkpoint(s) dropped" in out and "(vacuumed)" in out, out
    code, out = run("compact", path, "--older-than", "0s", "--json")
    assert code == 0 and json.loads(out)["checkpoints_dropped"] == 4
    with agentwal.open(path, readonly=True) as s:
        assert [c.id for c in s.history("run-a")] == [40]
    assert run("compact", path, "--older-than", "soon")[0] == 2
    assert run("compact", path, "--keep-last", "0")[0] == 2
    code, out = run("compact", path, "--run", "nope")
    assert code == 2 and "run_not_found" in out
    with agentwal.open(path):  # a writer holds the store
        code, out = run("compact", path, "--keep-last", "1")
    assert code == 1 and "store_locked" in out


def test_show_key_reads_only_that_key_past_a_damaged_value(tmp_path: Path) -> None:
    """Issue #10, case 4: `show --key` reads one key, so one damaged value does not block it."""
    from tests.stores import Raw

    path = str(tmp_path / "s")
    with agentwal.open(path) as store, store.begin("r") as txn:
        txn["good"] = {"plan": "ok"}
        txn["bad"] = "x" * 50
    with Raw(path) as raw:
        k, v = next((k, v) for k, v in raw.entries("state") if k.endswith(b"bad"))
        raw.put_raw("state", k, v[:-1] + bytes([v[-1] ^ 0xFF]))  # the seal now fails
    runner = CliRunner()
    whole = runner.invoke(main, ["show", path, "r"])
    assert whole.exit_code == 1 and "corruption" in whole.output
    one = runner.invoke(main, ["show", path, "r", "--key", "good", "--json"])
    assert one.exit_code == 0, one.output
    assert json.loads(one.output) == {"good": {"plan": "ok"}}
    again = runner.invoke(main, ["show", path, "r", "good"])
    assert again.exit_code == 0 and '"plan"' in again.output
