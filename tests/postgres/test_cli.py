"""The CLI on a PostgreSQL URI: the reading and writing commands, and typed refusals."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from agentwal.cli import main
from agentwal.postgres import PostgresStore


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()  # click >= 8.2 keeps stderr apart


def run(*args: str) -> tuple[int, str]:
    """Exit code and standard output of one command (with --json, errors too)."""
    result = _runner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.stderr
    return result.exit_code, result.stdout


def error_of(out: str) -> dict[str, Any]:
    """The JSON error document of a ``--json`` failure."""
    return dict(json.loads(out)["error"])




@pytest.fixture
def filled(open_pg: Callable[..., PostgresStore]) -> PostgresStore:
    store = open_pg(worker_id="filler")
    for i in range(3):
        with store.begin("run-a") as txn:
            txn["step"] = i
            txn.meta(node="n", i=i)
    with store.begin("run-b") as txn:
        txn["x"] = {"y": [1, 2]}
        txn.effect("charge", lambda ctx: "ok", mode="at_most_once")
    with store.begin("run-b") as txn:
        txn.defer("notify", mode="at_least_once", args={"to": "ops"})
    store.release("run-a")
    store.release("run-b")
    return store


def test_reading_commands_take_a_url(filled: PostgresStore, url: str) -> None:
    code, out = run("runs", url, "--json")
    assert code == 0, out
    assert [(r["run"], r["head"]) for r in json.loads(out)] == [("run-a", 3), ("run-b", 2)]
    code, out = run("history", url, "run-a", "--json", "--limit", "2")
    assert code == 0, out
    assert [(c["id"], c["meta"]["i"]) for c in json.loads(out)] == [(3, 2), (2, 1)]
    code, out = run("show", url, "run-b", "--json")
    assert code == 0 and json.loads(out) == {"x": {"y": [1, 2]}}, out
    code, out = run("show", url, "run-a", "--at", "1", "--json")
    assert code == 0 and json.loads(out) == {"step": 0}, out
    code, out = run("diff", url, "run-a", "1", "3", "--json")
    assert code == 0 and json.loads(out)["changed"]["step"] == {"from": 0, "to": 2}, out
    code, out = run("effects", url, "--json")
    assert code == 0, out
    assert sorted(e["status"] for e in json.loads(out)) == ["done", "pending"]
    code, out = run("inspect", url, "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["runs"] == 2 and data["checkpoints_rows"] == 5
    assert data["outbox_pending"] == 1 and "wal_bytes" not in data
    code, out = run("inspect", url)
    assert code == 0 and "checkpoints_rows" in out and "1 outbox entry" in out, out
    code, out = run("history", url, "run-a", "--graph")
    assert code == 0 and "run-a" in out, out


def test_not_found_names_the_url_in_its_hint(filled: PostgresStore, url: str) -> None:
    code, out = run("history", url, "nope", "--json")
    assert code == 2 and error_of(out)["code"] == "run_not_found"  # a name not there: usage
    # shell-quoted: the URL's "&" would otherwise end the command when pasted
    assert f"agentwal runs {shlex.quote(url)}" in error_of(out)["message"]


def test_writing_commands_are_one_more_worker(filled: PostgresStore, url: str) -> None:
    code, out = run("rollback", url, "run-a", "1", "--json")
    assert code == 0, out
    assert filled.head("run-a").id == 4 and filled.state("run-a") == {"step": 0}  # type: ignore[union-attr]
    code, out = run("fork", url, "run-a", "2", "run-c", "--json")
    assert code == 0, out
    assert filled.state("run-c") == {"step": 1}
    [pending] = filled.effects(status="pending")
    code, out = run("resolve", url, pending.effect_id, "--not-applied", "--json")
    assert code == 0, out
    assert filled.effects(status="pending") == []
    [done] = filled.effects(status="done")
    code, out = run("retire", url, done.effect_id, "--by", "ops", "--json")
    assert code == 0, out
    assert [e.status for e in filled.effects(run="run-b") if e.name == "charge"] == ["retired"]


def test_a_run_another_worker_holds_is_refused(filled: PostgresStore, url: str) -> None:
    filled.lease("run-a")
    code, out = run("rollback", url, "run-a", "1", "--json")
    assert code == 1 and error_of(out)["code"] == "lease_held", out
    assert "filler" in error_of(out)["message"]
    assert filled.head("run-a").id == 3  # type: ignore[union-attr]


def test_a_tree_is_shown_and_restored_on_a_url(filled: PostgresStore, url: str,
                                               tmp_path: Any) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "f.txt").write_bytes(b"hi\n")
    with filled.begin("run-t") as txn:
        txn.put_tree("ws", tmp_path / "w")
    filled.release("run-t")
    code, out = run("restore", url, "run-t", "ws", str(tmp_path / "out"), "--json")
    assert code == 0 and json.loads(out)["written"] == 1, out
    assert (tmp_path / "out" / "f.txt").read_bytes() == b"hi\n"
    code, out = run("show", url, "run-t", "--json")
    assert code == 0 and "f.txt" in out, out


@pytest.mark.parametrize("args", [("backup", "{tmp}/copy.awal")])
def test_what_the_backend_cannot_do_is_a_typed_error(filled: PostgresStore, url: str,
                                                     args: tuple[str, ...],
                                                     tmp_path: Any) -> None:
    command, *rest = (a.format(tmp=tmp_path) for a in args)
    before = filled.stats()["checkpoints_rows"]
    code, out = run(command, url, *rest, "--json")
    assert code == 1, out
    err = error_of(out)
    assert err["code"] == "backend_unsupported" and "PostgreSQL" in err["message"]
    assert filled.stats()["checkpoints_rows"] == before


def test_the_log_dump_is_a_usage_error_on_a_url(filled: PostgresStore, url: str) -> None:
    code, out = run("wal", url, "--json")
    assert code == 2 and error_of(out)["code"] == "usage", out
    assert "agentwal history" in error_of(out)["message"]


def test_a_missing_store_is_never_created(pg_dsn: str, pg_schema: str, url: str) -> None:
    for args in (("runs", url), ("rollback", url, "run-a", "1")):
        code, out = run(*args, "--json")
        assert code == 1 and error_of(out)["code"] == "store_not_found", out
        assert "no store here" in error_of(out)["message"]
    with psycopg.connect(pg_dsn) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                             (pg_schema,)).fetchone()
    assert found is None


def test_an_unreachable_server_is_a_typed_error() -> None:
    code, out = run("runs", "postgresql://nobody@127.0.0.1:1/nothing", "--json")
    assert code == 1 and error_of(out)["code"] == "backend_unavailable", out


def test_a_path_that_does_not_exist_is_still_a_usage_error(tmp_path: Any) -> None:
    code, out = run("runs", str(tmp_path / "nope.awal"), "--json")
    assert code == 2 and "does not exist" in error_of(out)["message"]
