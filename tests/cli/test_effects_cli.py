"""The CLI's effects-ledger commands: `effects` (listing, --check) and `resolve`."""

from __future__ import annotations

import dataclasses
import datetime
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import agentwal
from agentwal.cli import main
from agentwal.effects import STATUSES
from agentwal.views import age as _age

WHEN = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc)
LONG_ERROR = "the card processor said no " + "because " * 20


def _interrupted(ctx: agentwal.EffectContext) -> Any:
    # Not an Exception: the ledger records no outcome, so the intent stays in doubt,
    # as after a crash while the call was on its way.
    raise KeyboardInterrupt


def _declined(ctx: agentwal.EffectContext) -> Any:
    raise ValueError(LONG_ERROR)


def _in_doubt(store: agentwal.Store, run: str, name: str, **kw: Any) -> None:
    with pytest.raises(KeyboardInterrupt), store.begin(run) as txn:
        txn.effect(name, _interrupted, mode="at_most_once", **kw)


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A store with one ledger entry in each status; returns its path and name -> effect id."""
    path = str(tmp_path / "s.awal")
    with agentwal.open(path, durability="none") as s:
        with s.begin("run-a") as txn:  # done, and pending (the outbox)
            txn["step"] = 1
            txn.effect("llm", lambda ctx: {"raw": b"\x00\x01", "at": WHEN},
                       mode="at_least_once", args={"prompt": "hi"})
            txn.defer("send-email", mode="at_least_once", args={"to": "a@example.com"})
        with pytest.raises(ValueError), s.begin("run-b") as txn:  # failed
            txn.effect("charge", _declined, mode="at_least_once", args={"amount": 4900})
        _in_doubt(s, "run-c", "pay", key="order-17-payment")  # in_doubt
        _in_doubt(s, "run-d", "ship")  # resolved below
        _in_doubt(s, "run-e", "refund")  # not_applied: a probe says so on the next attempt
        with pytest.raises(agentwal.EffectNotAppliedError), s.begin("run-e") as txn:
            txn.effect("refund", _interrupted, mode="at_most_once",
                       probe=lambda ctx: agentwal.NOT_APPLIED)
        with s.begin("run-f") as txn:  # retired: set aside after the step's code changed
            txn.effect("draft", lambda ctx: "v1", mode="at_least_once")
            txn.rollback()
        ids = {e.name: e.effect_id for e in s.effects()}
        s.resolve_effect(ids["ship"], result={"tracking": "T1"}, by="ops")
        s.retire_effect(ids["draft"], by="dev")
        assert {e.status for e in s.effects()} == set(STATUSES)
    return path, ids


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()  # click >= 8.2 keeps stderr apart


def run(*args: str) -> tuple[int, str, str]:
    """Exit code, standard output and standard error of one command."""
    result = _runner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout, result.stderr


def _by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in rows}


# -- effects ----------------------------------------------------------------------------


def test_effects_json_has_every_field(ledger: tuple[str, dict[str, str]]) -> None:
    path, ids = ledger
    code, out, _ = run("effects", path, "--json")
    assert code == 0
    rows = _by_name(json.loads(out))
    assert {r["status"] for r in rows.values()} == set(STATUSES)
    fields = {f.name for f in dataclasses.fields(agentwal.EffectRecord)}
    for r in rows.values():
        assert fields | {"age", "uncommitted"} == set(r), r["name"]
        assert r["effect_id"] == ids[r["name"]] and r["age"] >= 0
    llm = rows["llm"]
    assert llm["status"] == "done" and llm["mode"] == "at_least_once"
    assert llm["args"] == {"prompt": "hi"}
    assert llm["result"] == {"raw": {"$bytes": "AAE="},
                             "at": {"$datetime": "2024-05-01T12:00:00+00:00"}}
    assert llm["order"] is None and llm["ordinal"] == 0 and not llm["deferred"]
    assert len(llm["key"]) == 60  # in full, unlike the table
    email = rows["send-email"]
    assert email["status"] == "pending" and email["deferred"] and email["attempts"] == 0
    assert isinstance(email["order"], list) and len(email["order"]) == 2
    assert rows["charge"]["error"] == f"ValueError: {LONG_ERROR}"
    assert rows["pay"]["key"] == "order-17-payment" and rows["pay"]["status"] == "in_doubt"
    assert rows["ship"]["result"] == {"tracking": "T1"} and rows["ship"]["resolved_by"] == "ops"
    assert rows["refund"]["status"] == "not_applied"


def test_effects_table_shortens_keys_and_errors(ledger: tuple[str, dict[str, str]]) -> None:
    path, ids = ledger
    code, out, _ = run("effects", path)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["id", "run", "name", "mode", "status", "attempts", "age",
                                "committed", "key", "last", "error"]
    assert len(lines) == 2 + len(ids)
    charge = next(line for line in lines if "charge" in line)
    assert ids["charge"] in charge and "failed" in charge and "ValueError: the card" in charge
    assert LONG_ERROR not in charge and charge.endswith("...")
    llm = next(line for line in lines if " llm " in line)
    assert "awe-" in llm and "..." in llm  # the 60-character derived key, shortened
    assert "order-17-payment" in out  # a short business key stays whole
    assert "uncommitted" in charge  # the failed step rolled back: no commit holds it
    assert " 1 " in llm  # run-a's step committed it in checkpoint 1


def test_effects_filters(ledger: tuple[str, dict[str, str]]) -> None:
    path, ids = ledger
    code, out, _ = run("effects", path, "--status", "in_doubt", "--json")
    assert code == 0 and [r["effect_id"] for r in json.loads(out)] == [ids["pay"]]
    code, out, _ = run("effects", path, "--run", "run-a", "--json")
    assert code == 0 and {r["name"] for r in json.loads(out)} == {"llm", "send-email"}
    code, out, _ = run("effects", path, "--run", "run-a", "--status", "failed", "--json")
    assert code == 0 and json.loads(out) == []
    code, out, _ = run("effects", path, "--run", "no-such-run")
    assert code == 0 and len(out.splitlines()) == 2  # just the header


def test_effects_usage_and_problems(ledger: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    path, _ = ledger
    code, _, err = run("effects", path, "--status", "bogus")
    assert code == 2 and "bogus" in err
    assert run("effects", str(tmp_path / "missing"))[0] == 2
    assert run("effects")[0] == 2
    code, _, err = run("effects", path, "--run", "")
    assert code == 1 and "error [" in err and "Traceback" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run("effects", str(empty))
    assert code == 1 and "store_not_found" in err and not list(empty.iterdir())


def test_effects_check_exits_1_on_in_doubt_or_failed(
        ledger: tuple[str, dict[str, str]]) -> None:
    path, _ = ledger
    assert run("effects", path)[0] == 0  # listing alone never fails
    code, out, err = run("effects", path, "--check")
    assert code == 1 and "2 effect(s) in doubt or failed" in err and "pay" in out
    code, out, err = run("effects", path, "--check", "--json")
    assert code == 1 and len(json.loads(out)) == len(STATUSES)
    for status in STATUSES:
        code, _, _ = run("effects", path, "--check", "--status", status)
        assert code == (1 if status in ("in_doubt", "failed") else 0), status
    assert run("effects", path, "--check", "--run", "run-a")[0] == 0
    assert run("effects", path, "--check", "--run", "run-b")[0] == 1


def test_effects_on_a_store_without_effects(tmp_path: Path) -> None:
    path = str(tmp_path / "s.awal")
    with agentwal.open(path, durability="none") as s, s.begin("r") as txn:
        txn["k"] = 1
    code, out, _ = run("effects", path, "--json", "--check")
    assert code == 0 and json.loads(out) == []


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (59.9, "59s"), (60, "1m"), (180, "3m"), (3599, "59m"), (7200, "2h"),
    (86399, "23h"), (86400 * 3 + 5, "3d"),
])
def test_age(seconds: float, shown: str) -> None:
    assert _age(seconds) == shown


# -- resolve ----------------------------------------------------------------------------


def _entry(path: str, effect_id: str) -> agentwal.EffectRecord:
    with agentwal.open(path, readonly=True) as s:
        return next(e for e in s.effects() if e.effect_id == effect_id)


def test_resolve_with_a_result(ledger: tuple[str, dict[str, str]]) -> None:
    path, ids = ledger
    code, out, _ = run("resolve", path, ids["pay"], "--result",
                       '{"charge": "ch_1", "receipt": {"$bytes": "AAE="}, "n": [1, 2.5, null]}',
                       "--by", "alice", "--json")
    assert code == 0, out
    row = json.loads(out)
    assert row["effect_id"] == ids["pay"] and row["status"] == "resolved"
    assert row["resolved_by"] == "alice" and row["mode"] == "at_most_once"
    assert row["result"] == {"charge": "ch_1", "receipt": {"$bytes": "AAE="}, "n": [1, 2.5, None]}
    e = _entry(path, ids["pay"])
    assert e.status == "resolved" and e.resolved_by == "alice"
    assert e.result == {"charge": "ch_1", "receipt": b"\x00\x01", "n": [1, 2.5, None]}
    # The next attempt at that key returns the result without calling anything.
    with agentwal.open(path) as s, s.begin("run-c") as txn:
        assert txn.effect("pay", _interrupted, mode="at_most_once",
                          key="order-17-payment") == e.result


def test_resolve_not_applied_prints_a_table(ledger: tuple[str, dict[str, str]]) -> None:
    path, ids = ledger
    code, out, _ = run("resolve", path, ids["charge"], "--not-applied")
    assert code == 0
    fields = dict(line.split(None, 1) for line in out.splitlines()[2:])
    assert fields["effect_id"] == ids["charge"] and fields["status"] == "not_applied"
    assert fields["resolved_by"] not in ("", "-")  # user@host and pid by default
    assert fields["args"] == '{"amount": 4900}'
    assert fields["created_at"].endswith("+00:00")
    assert _entry(path, ids["charge"]).status == "not_applied"


def test_resolve_a_pending_outbox_entry(ledger: tuple[str, dict[str, str]]) -> None:
    path, ids = ledger
    code, out, _ = run("resolve", path, ids["send-email"], "--result", '"sent by hand"',
                       "--json")
    assert code == 0 and json.loads(out)["status"] == "resolved"
    with agentwal.open(path) as s:
        report = s.dispatch({"send-email": lambda ctx: pytest.fail("dispatched twice")})
    assert report.ok and not report.done


def test_resolve_problems_exit_1(ledger: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    path, ids = ledger
    code, out, err = run("resolve", path, "ef-nope", "--not-applied")
    assert code == 2 and "effect_not_found" in err and out == ""
    for settled in ("llm", "ship"):
        code, _, err = run("resolve", path, ids[settled], "--result", "1")
        assert code == 1 and "effect_settled" in err, settled
    code, _, err = run("resolve", path, ids["refund"], "--not-applied")
    assert code == 1 and "effect_settled" in err
    code, _, err = run("resolve", path, ids["pay"], "--result", "[" * 300 + "]" * 300)
    assert code == 1 and "unencodable_value" in err and "Traceback" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run("resolve", str(empty), ids["pay"], "--not-applied")
    assert code == 1 and "store_not_found" in err
    assert not list(empty.iterdir())  # a writing command never creates a store
    assert _entry(path, ids["pay"]).status == "in_doubt"  # nothing above changed it


def test_resolve_usage_errors_exit_2(ledger: tuple[str, dict[str, str]]) -> None:
    path, ids = ledger
    eid = ids["pay"]
    for args in ([], ["--result", "1", "--not-applied"], ["--result", "{oops"],
                 ["--result", ""], ["--result", '{"$bytes": "not base64!"}'],
                 ["--result", "[" * 100_000 + "]" * 100_000], ["--by", "me"]):
        code, _, err = run("resolve", path, eid, *args)
        assert code == 2 and "Usage" in err and "Traceback" not in err, args
    assert run("resolve", path)[0] == 2
    assert _entry(path, eid).status == "in_doubt"


def test_resolve_keeps_old_settled_entries(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI applies no retention of its own: the app may keep entries forever."""
    path = str(tmp_path / "s.awal")
    real = time.time
    with agentwal.open(path, effect_retention=None) as s:
        monkeypatch.setattr(time, "time", lambda: real() - 90 * 86400)
        with s.begin("old") as txn:
            txn.effect("e", lambda ctx: 1, mode="at_least_once", key="kept-forever")
        monkeypatch.undo()
        _in_doubt(s, "new", "n")
        target = next(e.effect_id for e in s.effects(status="in_doubt"))
    assert run("resolve", path, target, "--not-applied")[0] == 0
    out = run("effects", path, "--json")[1]
    assert "kept-forever" in {r["key"] for r in json.loads(out)}


# -- with a writer in another process ---------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, agentwal
    with agentwal.open(sys.argv[1]) as s:
        with s.begin("live") as txn:
            txn.effect("live-call", lambda ctx: "ok", mode="at_least_once")
        print("ready", flush=True)
        sys.stdin.readline()
""")


@pytest.fixture
def held(ledger: tuple[str, dict[str, str]]) -> Iterator[tuple[str, dict[str, str]]]:
    """The ledger store, open for writing by a child process until the test ends."""
    path, ids = ledger
    child = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield path, ids
    finally:
        if child.poll() is None:
            child.communicate("\n", timeout=30)
    assert child.returncode == 0


def test_effects_works_while_a_writer_holds_the_store(
        held: tuple[str, dict[str, str]]) -> None:
    path, ids = held
    code, out, _ = run("effects", path, "--json")
    assert code == 0
    rows = _by_name(json.loads(out))
    assert set(ids) < set(rows) and rows["live-call"]["status"] == "done"


def test_resolve_reports_the_writer_lock(held: tuple[str, dict[str, str]]) -> None:
    path, ids = held
    code, out, err = run("resolve", path, ids["pay"], "--not-applied")
    assert code == 1 and "store_locked" in err and "Traceback" not in err and out == ""
    assert _entry(path, ids["pay"]).status == "in_doubt"


# -- the other commands on a store with a ledger ----------------------------------------


def test_inspect_counts_effects(ledger: tuple[str, dict[str, str]]) -> None:
    path, _ = ledger
    code, out, _ = run("inspect", path, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["effects"] == {**dict.fromkeys(STATUSES, 1), "total": len(STATUSES)}
    assert data["effect_index_entries"] >= len(STATUSES)
    code, out, _ = run("inspect", path)
    assert code == 0 and "effect_index_entries" in out
    assert f"{len(STATUSES)} ledger entries (1 pending, 1 in_doubt" in out


def test_wal_dumps_effect_records(ledger: tuple[str, dict[str, str]]) -> None:
    path, ids = ledger
    code, out, _ = run("wal", path, "--json")
    assert code == 0, out
    records = json.loads(out)["records"]
    assert [r["lsn"] for r in records] == list(range(1, len(records) + 1))
    commits = [r for r in records if r["type"] == "commit"]
    assert [(c["run"], c["deferred"]) for c in commits] == [("run-a", ["send-email"])]
    effects = [r for r in records if r["type"] == "effect"]
    assert {(r["effect_id"], r["status"]) for r in effects} >= {
        (ids["llm"], "in_doubt"), (ids["llm"], "done"), (ids["ship"], "resolved")}
    code, out, _ = run("wal", path)
    assert code == 0 and "send-email" in out and "-> not_applied" in out


# -- retire, and what rollback and fork leave standing ---------------------------------------


def test_retire_sets_an_entry_aside_and_refuses_twice(tmp_path: Path) -> None:
    path = str(tmp_path / "r.awal")
    with agentwal.open(path) as s:
        with s.begin("run-a") as txn:
            txn.effect("charge", lambda ctx: "ch_1", mode="at_least_once", args={"amount": 1})
            txn.rollback()
        (e,) = s.effects()
    code, out, _ = run("retire", path, e.effect_id, "--by", "alice")
    assert code == 0
    rows = dict(line.split(None, 1) for line in out.splitlines()[2:] if line.strip())
    assert rows["status"].strip() == "retired" and rows["retired_status"].strip() == "done"
    assert rows["resolved_by"].strip() == "alice"
    with agentwal.open(path, readonly=True) as s:
        (retired,) = s.effects()
    assert retired.status == "retired" and retired.resolved_at is not None
    at = datetime.datetime.fromtimestamp(retired.resolved_at, datetime.timezone.utc)
    assert rows["resolved_at"].strip() == at.isoformat(timespec="seconds")  # as created_at
    code, out, err = run("retire", path, e.effect_id, "--json")
    assert code == 1 and json.loads(out)["error"]["code"] == "effect_not_retirable"
    assert "retired already" in err
    code, _, err = run("retire", path, "ef-nope")
    assert code == 2 and "effect_not_found" in err


def test_rollback_and_fork_say_which_effects_still_stand(tmp_path: Path) -> None:
    path = str(tmp_path / "b.awal")
    with agentwal.open(path) as s:
        with s.begin("run-a") as txn:
            txn["plan"] = 1
        with s.begin("run-a") as txn:
            txn.effect("charge", lambda ctx: "ch_1", mode="at_least_once")
        (e,) = s.effects()
    code, out, err = run("rollback", path, "run-a", "1")
    assert code == 0 and "1 effect(s) made after checkpoint 1 still stand" in err
    assert e.effect_id in err and "business key" in err
    code, out, err = run("fork", path, "run-a", "1", "run-b", "--json")
    assert code == 0 and not err
    doc = json.loads(out)
    assert [x["effect_id"] for x in doc["effects_after"]] == [e.effect_id]
    code, out, err = run("rollback", path, "run-a", "3")  # nothing made after 3
    assert code == 0 and "still stand" not in err
