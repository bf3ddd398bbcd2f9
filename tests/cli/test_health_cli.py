"""`agentwal inspect` reads health facts from disk: who holds the store, what is not folded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentwal
from agentwal.io import writer_holder

from .test_cli_finish import run

linux_only = pytest.mark.skipif(not os.path.exists("/proc/locks"),
                                reason="the writer probe reads Linux's /proc/locks")

KILLED_WRITER = """
import os, signal, sys
import agentwal
s = agentwal.open(sys.argv[1])
for i in range(3):
    with s.begin("r") as txn:
        txn["i"] = i
os.kill(os.getpid(), signal.SIGKILL)
"""


def _inspect(path: str) -> tuple[dict[str, object], str]:
    code, out, _ = run("inspect", path, "--json")
    assert code == 0, out
    code, human, _ = run("inspect", path)
    assert code == 0
    return json.loads(out), human


@linux_only
def test_a_killed_writer_leaves_unfolded_records_that_need_attention(tmp_path: Path) -> None:
    path = str(tmp_path / "s.awal")
    child = subprocess.run([sys.executable, "-c", KILLED_WRITER, path], timeout=120)
    assert child.returncode == -9
    data, human = _inspect(path)
    assert data["writer"]["held"] is False  # type: ignore[index]
    assert data["unfolded_records"] == 3
    assert any("did not close" in a for a in data["attention"])  # type: ignore[union-attr]
    assert "did not close" in human.splitlines()[1]
    assert "none (no process has it open for writing)" in human


@linux_only
def test_a_live_writer_is_named_and_its_unfolded_log_is_normal(tmp_path: Path) -> None:
    path = str(tmp_path / "s.awal")
    with agentwal.open(path) as s:
        with s.begin("r") as txn:
            txn["x"] = 1
        data, human = _inspect(path)
        assert data["writer"] == {"held": True, "pid": os.getpid()}
        assert data["unfolded_records"] == 1
        assert data["attention"] == []
        assert f"open for writing by process {os.getpid()}" in human
    data, human = _inspect(path)  # closed cleanly: folded, nobody holds it
    assert data["writer"] == {"held": False, "pid": os.getpid()}
    assert data["unfolded_records"] == 0 and data["attention"] == []
    assert human.startswith("needs attention: nothing")


def test_writer_holder_of_a_store_never_opened_for_writing(tmp_path: Path) -> None:
    assert writer_holder(str(tmp_path)) == (False, None)


def test_a_locked_store_says_what_to_run_not_what_to_call(tmp_path: Path) -> None:
    path = str(tmp_path / "s.awal")
    with agentwal.open(path) as s:
        with s.begin("r") as txn:
            txn["x"] = 1
        code, _, err = run("rollback", path, "r", "1")
    assert code == 1 and "store_locked" in err
    assert "readonly=True" not in err and "Stop that process first" in err


def test_library_advice_becomes_the_command_to_run() -> None:
    from agentwal.cli.common import cli_message
    from agentwal.errors import SchemaVersionError

    text = cli_message(SchemaVersionError("'s.awal'", 1, 2), {"path": "s.awal"})
    assert "readonly=True" not in text and text.endswith(
        "open it once for writing: `agentwal compact s.awal` with no option does that and "
        "drops nothing.")


def test_ctrl_c_is_exit_130_without_a_traceback(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import agentwal.cli.maintenance as maintenance

    def interrupted(path: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(maintenance, "open_ro", interrupted)
    code, out, err = run("verify", str(tmp_path))
    assert code == 130 and "interrupted" in err and out == ""


@linux_only
def test_the_writer_is_found_by_its_open_lock_file_too(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /proc/locks names the file by other numbers (some file systems), the pid in
    LOCK that still has the file open is the writer."""
    import agentwal.io as io_module

    path = str(tmp_path / "s.awal")
    real_open = open

    def no_locks(file: object, *args: object, **kw: object) -> object:
        if file == "/proc/locks":
            return real_open(os.devnull, *args, **kw)  # type: ignore[call-overload]
        return real_open(file, *args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", no_locks)
    with agentwal.open(path):
        assert io_module.writer_holder(path) == (True, os.getpid())
    assert io_module.writer_holder(path) == (False, os.getpid())
