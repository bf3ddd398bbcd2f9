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


FOLD_FAILS = """
import os, resource, signal, sys, time
import agentwal
from agentwal.testing import fold_error
path = sys.argv[1]
s = agentwal.open(path, segment_bytes=16 << 10, wal_max_bytes=32 << 10)
sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs]
data = os.path.getsize(os.path.join(path, "snapshot", "data.mdb"))
limit = -(-(max(max(sizes), data + (48 << 10)) + 1) // 4096) * 4096
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))  # LMDB cannot grow past it
for i in range(3000):
    try:
        with s.begin("r") as txn:
            txn[f"k{i}"] = os.urandom(400)
    except agentwal.errors.Error:
        break  # LMDB's failed write stopped the writer (DurabilityError)
    if fold_error(s) is not None:
        break
for _ in range(1000):  # the fold thread records its error just after the writer stops
    if fold_error(s) is not None:
        break
    time.sleep(0.01)
print("FAILED" if fold_error(s) is not None else "NEVER", flush=True)
sys.stdin.readline()
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
s.close()  # a stopped writer folds nothing; a new one replays the log and folds it
s = agentwal.open(path, segment_bytes=16 << 10, wal_max_bytes=32 << 10)
s.snapshot()
print("FOLDED", flush=True)
sys.stdin.readline()
s.close()
"""


@linux_only
def test_a_writers_failed_fold_shows_in_inspect_from_another_process(tmp_path: Path) -> None:
    """A real full disk (a file-size limit on LMDB) fails a background fold in the writer;
    a read-only ``inspect`` here says when and why, and nothing once a fold succeeds."""
    path = str(tmp_path / "s.awal")
    agentwal.open(path).close()  # LMDB's files exist before the limit
    child = subprocess.Popen([sys.executable, "-c", FOLD_FAILS, path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "FAILED"
        data, human = _inspect(path)
        fold = data["health_record"]["fold"]  # type: ignore[index]
        # LMDB reports the refused write as EIO or as a full disk, by where it fell
        assert fold["code"] in ("disk_full", "durability"), fold
        assert "mdb" in fold["error"] or "no room" in fold["error"], fold
        assert data["wal_max_bytes"] == 32 << 10 and data["wal_max_bytes_from"] == "recorded"
        first = data["attention"][0]  # type: ignore[index]
        assert first.startswith("the last fold failed") and "as the writer recorded it" in first
        assert fold["error"][:40] in first
        assert "the last fold failed" in human.splitlines()[1]
        assert "last fold failed at" in human  # the store section's health_record row
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "FOLDED"
        data, human = _inspect(path)
        assert data["health_record"]["fold"] is None  # type: ignore[index]
        assert not any("fold failed" in a for a in data["attention"])  # type: ignore[union-attr]
        assert "no failure recorded" in human
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=120) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
