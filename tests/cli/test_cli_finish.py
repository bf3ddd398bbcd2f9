"""The CLI as people and scripts use it: one value, the tree, log filters, errors, pipes."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import agentwal
from agentwal.cli import main
from agentwal.codec import decode_value, encode_value
from agentwal.views import from_jsonable, jsonable

from ..property.test_codec import same


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of one command; never a traceback."""
    result = _runner().invoke(main, list(args), env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.stdout + result.stderr
    return result.exit_code, result.stdout, result.stderr


def _interrupted(ctx: agentwal.EffectContext) -> Any:
    raise KeyboardInterrupt  # no outcome recorded: the intent stays in doubt, as after a crash


def in_doubt(path: str, run: str, name: str) -> None:
    """Leave one at-most-once effect of ``run`` in doubt."""
    with agentwal.open(path) as s, pytest.raises(KeyboardInterrupt), s.begin(run) as txn:
        txn.effect(name, _interrupted, mode="at_most_once")


@pytest.fixture
def forked(tmp_path: Path) -> str:
    """run-a: 5 checkpoints growing ``messages``, a rollback to 2; run-b forked from a#3."""
    path = str(tmp_path / "f.awal")
    with agentwal.open(path, durability="none") as s:
        for i in range(5):
            with s.begin("run-a") as txn:
                txn["messages"] = [f"message {j} " + "x" * 2048 for j in range(i + 1)]
                txn["step"] = i
                txn["when"] = b"\x00\xff"
        s.fork("run-a", 3, "run-b")
        s.rollback_to("run-a", 2)
    return path


def test_show_one_value(forked: str) -> None:
    code, out, _ = run("show", forked, "run-a", "step")
    assert code == 0 and out.strip() == "1"  # the rollback restored checkpoint 2's state
    code, out, _ = run("show", forked, "run-a", "step", "--at", "5", "--json")
    assert code == 0 and json.loads(out) == 4
    code, out, _ = run("show", forked, "run-a", "when", "--json")
    assert json.loads(out) == {"$bytes": "AP8="}


def test_show_a_missing_key_is_a_usage_error_naming_the_list_command(forked: str) -> None:
    code, out, err = run("show", forked, "run-a", "nope")
    assert code == 2 and out == "" and f"agentwal show {forked} run-a" in err
    code, out, _ = run("show", forked, "run-a", "nope", "--json")
    assert code == 2 and json.loads(out)["error"]["code"] == "missing_key"


def test_an_unknown_run_is_a_usage_error_with_the_list_command(forked: str) -> None:
    for args in (["show", forked, "nope"], ["history", forked, "nope"],
                 ["diff", forked, "nope", "1", "2"]):
        code, out, err = run(*args)
        assert out == ""
        assert code == 2 and "run_not_found" in err and f"agentwal runs {forked}" in err, args
        assert "store.runs()" not in err  # the library's hint is replaced by the command
    code, out, _ = run("show", forked, "nope", "--json")
    assert code == 2 and json.loads(out)["error"] == {
        "code": "run_not_found", "exit_code": 2, "message": json.loads(out)["error"]["message"]}
    code, _, err = run("history", forked, "run-a", "--before", "99")
    assert code == 2 and f"agentwal history {forked} run-a" in err


def _suggested(message: str) -> list[str]:
    """The command a message tells the user to run, split as a shell would."""
    start = message.index("`agentwal ") + 1
    words = shlex.split(message[start:message.index("`", start)])
    assert words[0] == "agentwal", message
    return words[1:]


def test_suggested_commands_run_as_printed_for_odd_paths_and_run_ids(tmp_path: Path) -> None:
    # A store path with a space and a run id that starts with "-" (both allowed) used to be
    # printed into the suggested command unquoted: pasted into a shell it failed ("No such
    # option '-x'", or the path split in two).
    path = str(tmp_path / "my store é")
    with agentwal.open(path, durability="none") as s:
        with s.begin("-x 1") as txn:
            txn["k"] = 1
        txn = s.begin("-x 1")
        with pytest.raises(KeyboardInterrupt):
            txn.effect("charge", lambda ctx: (_ for _ in ()).throw(KeyboardInterrupt()),
                       mode="at_most_once")
        txn.rollback()
    for args, code_expected in ((["show", "--", path, "-x 1", "nope"], "missing_key"),
                                (["show", "--", path, "nope"], "run_not_found"),
                                (["history", "--before", "9", "--", path, "-x 1"],
                                 "checkpoint_not_found"),
                                (["show", "--at", "9", "--", path, "-x 1"],
                                 "checkpoint_not_found"),
                                (["resolve", path, "ef-nope", "--not-applied"],
                                 "effect_not_found")):
        code, _, err = run(*args)
        assert code == 2 and code_expected in err, (args, err)
        again, _, err2 = run(*_suggested(err))
        assert again == 0, (args, err, err2)
    code, out, _ = run("inspect", path)
    assert code == 0 and "in doubt" in out
    line = next(x for x in out.splitlines() if "in doubt" in x)
    assert run(*_suggested(line))[0] == 1  # effects --check: the entry in doubt
    from agentwal.views import resolve_command

    with agentwal.open(path, readonly=True) as ro:
        (entry,) = ro.effects()
        command = resolve_command(path, entry)
    assert command is not None
    assert shlex.split(command)[:4] == ["agentwal", "resolve", path, entry.effect_id]


def test_history_graph_shows_forks_rollbacks_and_head(forked: str) -> None:
    code, out, _ = run("history", forked, "run-a", "--graph")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "run run-a"
    assert "#6" in lines[1] and "HEAD" in lines[1] and "rollback to #2" in lines[1]
    three = next(i for i, line in enumerate(lines) if "#3 " in line)
    assert "fork -> run run-b" in lines[three + 1]
    code, out, _ = run("history", forked, "run-b", "--graph")
    assert "forked from run run-a #3" in out
    code, out, _ = run("history", forked, "run-a", "--graph", "--json")
    rows = json.loads(out)
    assert [r["id"] for r in rows] == [6, 5, 4, 3, 2, 1]
    assert rows[0]["head"] and rows[0]["rollback_to"] == 2
    assert rows[3]["forks"] == ["run-b"] and not any(r["forks"] for r in rows if r["id"] != 3)


def test_wal_filters(forked: str) -> None:
    code, out, _ = run("wal", forked, "--json")
    every = json.loads(out)["records"]
    code, out, _ = run("wal", forked, "--from-lsn", "3", "--json")
    assert [r["lsn"] for r in json.loads(out)["records"]] == [r["lsn"] for r in every
                                                             if r["lsn"] >= 3]
    code, out, _ = run("wal", forked, "--run", "run-b", "--json")
    assert code == 0 and {r["run"] for r in json.loads(out)["records"]} == {"run-b"}


def test_diff_of_a_growing_list_shows_the_appended_item_abbreviated(forked: str) -> None:
    code, out, _ = run("diff", forked, "run-a", "4", "5")
    assert code == 0 and "~ messages:" in out and "1 item(s) appended at [4]" in out
    assert "message 4" in out and "message 0" not in out and "--full shows all" in out
    assert len(out) < 1500  # not both whole lists
    code, full, _ = run("diff", forked, "run-a", "4", "5", "--full")
    assert "x" * 2048 in full and "--full shows all" not in full
    code, out, _ = run("diff", forked, "run-a", "5", "4")
    assert "1 item(s) removed at [4]" in out


def test_inspect_puts_attention_first(forked: str) -> None:
    in_doubt(forked, "run-a", "pay")
    code, out, _ = run("inspect", forked)
    assert code == 0 and out.splitlines()[0].split() == ["needs", "attention"]
    assert out.splitlines()[1].startswith("  ! 1 effect(s) in doubt")
    for section in ("store", "log", "snapshot", "history", "effects", "last recovery"):
        assert any(line.strip() == section for line in out.splitlines()), section
    code, out, _ = run("inspect", forked, "--json")
    data = json.loads(out)
    assert data["effects"]["in_doubt"] == 1 and data["attention"] and "visible_lsn" in data


def test_errors_with_json_are_a_json_document(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = run("verify", str(empty), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["error"]["code"] == "store_not_found"
    assert doc["error"]["exit_code"] == 1 and "store_not_found" in err
    code, out, _ = run("verify", str(tmp_path / "missing"), "--json")
    assert code == 2 and json.loads(out)["error"]["code"] == "usage"


def test_escaping_tracebacks_are_gone(forked: str, tmp_path: Path) -> None:
    code, _, err = run("backup", forked, os.path.join(forked, "inside"))
    assert code == 2 and "inside the store" in err and not os.path.exists(
        os.path.join(forked, "inside"))
    code, _, err = run("compact", forked, "--older-than", "10000000000d")
    assert code == 2 and "--older-than" in err
    code, _, err = run("backup", forked, str(tmp_path / "no" / "such" / "b.awal"))
    assert code == 2 and "parent directory" in err and "create it first" in err
    code, _, err = run("copy", forked, forked)
    assert code == 2 and "is STORE itself" in err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_backup_that_cannot_be_written_blames_dest_not_the_store(forked: str) -> None:
    dest = "/proc/agentwal-no-such-backup"  # its parent exists; nothing can be made in it
    code, _, err = run("backup", forked, dest)
    assert code == 1 and f"cannot write the backup at {dest!r}" in err
    assert "The store is unchanged" in err and "reopen the store" not in err


def _cli(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "agentwal", *args], capture_output=True,
                          text=True, timeout=120, env=env, **kw)


def test_python_dash_m_is_the_console_script(forked: str) -> None:
    child = _cli("history", forked, "run-a", "--json")
    assert child.returncode == 0 and len(json.loads(child.stdout)) == 6
    assert _cli("--help").stdout.startswith("Usage: agentwal ")
    bad = _cli("histroy", forked)
    assert bad.returncode == 2 and "No such command" in bad.stderr
    script = Path(sys.executable).with_name("agentwal")
    if script.exists():  # the console script beside this interpreter prints the same
        for args in (["--help"], ["history", forked, "run-a"], ["show", forked, "nope"]):
            env = {**os.environ, "NO_COLOR": "1"}
            a = subprocess.run([str(script), *args], capture_output=True, text=True,
                               timeout=120, env=env)
            b = _cli(*args)
            assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


def test_a_closed_pipe_is_a_quiet_normal_end(forked: str) -> None:
    with agentwal.open(forked, durability="none") as s:
        for i in range(400):
            with s.begin("run-a") as txn:
                txn["step"] = i
    child = subprocess.Popen([sys.executable, "-m", "agentwal", "history", forked, "run-a"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.readline()
    child.stdout.close()  # like `| head -1`
    err = child.stderr.read()
    assert child.wait(timeout=120) == 0 and err == b""


def test_no_colour_into_a_pipe_or_with_no_color(forked: str) -> None:
    child = _cli("history", forked, "run-a", "--graph")
    assert child.returncode == 0 and "\x1b[" not in child.stdout


def test_json_round_trips_values_through_resolve(forked: str) -> None:
    in_doubt(forked, "run-a", "pay")
    code, out, _ = run("effects", forked, "--status", "in_doubt", "--json")
    eid = json.loads(out)[0]["effect_id"]
    value = {"receipt": {"$bytes": "AAE="}, "n": [1, 2.5, None], "s": "<b>"}
    code, out, _ = run("resolve", forked, eid, "--result", json.dumps(value), "--json")
    assert code == 0 and json.loads(out)["result"] == value
    with agentwal.open(forked, readonly=True) as s:
        assert next(e for e in s.effects() if e.effect_id == eid).result["receipt"] == b"\x00\x01"


def _on_a_terminal(args: list[str], env: dict[str, str], *, stream: str = "stdout") -> str:
    """What the command prints when its stdout (or stderr) is a terminal (a pseudo-terminal
    here); the other stream goes nowhere."""
    import pty

    leader, follower = pty.openpty()
    streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, stream: follower}
    child = subprocess.Popen([sys.executable, "-m", "agentwal", *args], env=env, **streams)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert child.wait(timeout=120) == 0
    return b"".join(chunks).decode(errors="replace")


def test_colour_on_a_terminal_but_never_with_no_color(forked: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm-256color"
    args = ["history", forked, "run-a", "--graph"]
    coloured = _on_a_terminal(args, env)
    assert "\x1b[" in coloured and "HEAD" in coloured
    plain = _on_a_terminal(args, {**env, "NO_COLOR": "1"})
    colour_codes = [c for c in ("\x1b[3", "\x1b[9", "\x1b[38;") if c in plain]
    assert "HEAD" in plain and not colour_codes


def test_sizes_for_people() -> None:
    from agentwal.cli.reading import size

    assert [size(n) for n in (None, 0, 1023, 1024, 53_248, 16 << 20, 5 << 40, 1 << 60)] == [
        "-", "0 B", "1023 B", "1.0 KiB", "52.0 KiB", "16.0 MiB", "5.0 TiB", "1048576.0 TiB"]


TYPED = {
    "when": dt.datetime(2024, 5, 1, 12, 30, 0, 250, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    "tags": {"a", 3, (1, "x"), frozenset({2})}, "raw": b"\x00\xff",
    "amount": decimal.Decimal("12.50"), "id": uuid.UUID(int=7), "nan": float("nan"),
    "pairs": {(1, 2): "x", 5: "five", "5": "text five"}, "tricky": {"$bytes": "not bytes"},
    "inf": [float("-inf"), -0.0, 2**70],
}


def test_show_json_round_trips_every_value_type(tmp_path: Path) -> None:
    path = str(tmp_path / "typed.awal")
    with agentwal.open(path) as s, s.begin("typed") as txn:
        for k, v in TYPED.items():
            txn[k] = v
        txn.put_blob("report", io.BytesIO(b"%PDF"), media_type="application/pdf")
    with agentwal.open(path, readonly=True) as s:
        state = s.state("typed")
    code, out, _ = run("show", path, "typed", "--json")
    assert code == 0
    assert same(state, from_jsonable(json.loads(out)))
    doc = json.loads(out)
    assert doc["when"] == {"$datetime": "2024-05-01T12:30:00.000250-05:00"}
    assert doc["tricky"] == {"$dict": {"$bytes": "not bytes"}}
    assert doc["report"]["$blob"]["media_type"] == "application/pdf"
    code, out, _ = run("show", path, "typed", "pairs")  # one value: the same JSON, one line
    assert code == 0 and same(state["pairs"], from_jsonable(json.loads(out)))


def test_resolve_stores_tagged_json_as_its_type(forked: str) -> None:
    in_doubt(forked, "run-a", "pay")
    code, out, _ = run("effects", forked, "--status", "in_doubt", "--json")
    eid = json.loads(out)[0]["effect_id"]
    value = {k: v for k, v in TYPED.items() if k != "nan"}  # NaN != NaN: compared below
    text = json.dumps(jsonable(value))
    code, out, _ = run("resolve", forked, eid, "--result", text, "--json")
    assert code == 0, out
    assert json.loads(out)["result"] == json.loads(text)  # printed back with the same tags
    with agentwal.open(forked, readonly=True) as s:
        stored = next(e for e in s.effects() if e.effect_id == eid).result
    assert same(decode_value(encode_value("k", value)), stored)


def test_resolve_refuses_an_unknown_tag(forked: str) -> None:
    in_doubt(forked, "run-a", "pay")
    code, out, _ = run("effects", forked, "--status", "in_doubt", "--json")
    eid = json.loads(out)[0]["effect_id"]
    code, _, err = run("resolve", forked, eid, "--result", '{"$when": "today"}')
    assert code == 2 and "unknown tag '$when'" in err and "$dict" in err


def _stderr_on_a_terminal(args: list[str]) -> str:
    """What the command writes to stderr when that is a terminal, escape codes removed."""
    import re

    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", _on_a_terminal(args, env, stream="stderr"))


def test_verify_backup_compact_copy_draw_progress_on_a_terminal_only(forked: str,
                                                                tmp_path: Path) -> None:
    # The bar redraws ten times a second and once at the end: the last phase always shows.
    err = _stderr_on_a_terminal(["verify", forked])
    assert "verify: log" in err and "100%" in err
    dest = str(tmp_path / "copy.awal")
    err = _stderr_on_a_terminal(["backup", forked, dest])
    assert f"backup to {dest}: snapshot" in err and "100%" in err
    err = _stderr_on_a_terminal(["compact", forked, "--keep-last", "2", "--vacuum"])
    assert "compact: vacuum" in err and "100%" in err
    other = str(tmp_path / "other.awal")
    err = _stderr_on_a_terminal(["copy", forked, other])
    assert f"copy to {other}: checkpoints" in err and "100%" in err
    for args in (["verify", forked], ["compact", dest, "--keep-last", "1"]):
        code, _, err = run(*args)  # not a terminal: nothing but the result
        assert code == 0 and err == "", (args, err)
