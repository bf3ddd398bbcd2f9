"""The CLI on tree values: restore, and show/diff as file listings."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import agentwal
from agentwal.cli import main
from tests.trees import build, read


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def make(tmp_path: Path) -> tuple[str, Path]:
    path, ws = str(tmp_path / "st"), tmp_path / "ws"
    build(str(ws), {"a.txt": b"hi\n", "sub/b": b"x\n", "l": ("l", b"a.txt")})
    with agentwal.open(path) as s:
        w = agentwal.Workspace(s, "agent", ws)
        w.checkpoint()
        (ws / "a.txt").write_text("hello there")
        w.checkpoint()
    return path, ws


def test_restore_writes_the_tree_and_reports(tmp_path: Path) -> None:
    path, ws = make(tmp_path)
    out = tmp_path / "out"
    code, text = run("restore", path, "agent", "workspace", str(out), "--at", "1")
    assert code == 0 and "3 written" in text
    assert (out / "a.txt").read_text() == "hi\n"
    code, text = run("restore", path, "agent", "workspace", str(out), "--json")
    assert code == 0 and json.loads(text) == {"files": 3, "written": 1, "removed": 0,
                                               "unchanged": 2}
    assert read(str(out)) == read(str(ws))


def test_restore_errors_exit_1_and_usage_errors_exit_2(tmp_path: Path) -> None:
    path, _ws = make(tmp_path)
    code, text = run("restore", path, "agent", "nokey", str(tmp_path / "o"))
    assert code == 2 and "missing_key" in text and "Traceback" not in text
    assert "agentwal show " in text and "txn.get" not in text  # the command, not the API
    code, text = run("restore", path, "nobody", "workspace", str(tmp_path / "o"))
    assert code == 2 and "run_not_found" in text
    code, _text = run("restore", path, "agent")
    assert code == 2
    code, _text = run("restore", path, "agent", "workspace", str(tmp_path / "o"), "--at", "0")
    assert code == 2


def test_show_and_diff_list_files(tmp_path: Path) -> None:
    path, _ws = make(tmp_path)
    code, text = run("show", path, "agent")
    assert code == 0 and "3 files" in text and "a.txt" in text and "-> a.txt" in text
    code, text = run("show", path, "agent", "--json")
    files = json.loads(text)["workspace"]["files"]
    assert [f["path"] for f in files] == ["a.txt", "l", "sub/b"]
    assert files[0]["mode"] == "0644" and files[1]["target"] == "a.txt"
    code, text = run("diff", path, "agent", "1", "2")
    assert code == 0 and "~ a.txt (3 -> 11 B)" in text
    code, text = run("diff", path, "agent", "1", "2", "--json")
    assert json.loads(text)["trees"]["workspace"]["modified"] == {"a.txt": {"from": 3,
                                                                            "to": 11}}
