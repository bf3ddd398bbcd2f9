"""The viewer's JSON API (docs/ui.md), through starlette's test client: no browser needed."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import agentwal
from agentwal.cli import main
from agentwal.cli.ui import is_loopback
from agentwal.ui import create_app, server
from agentwal.ui.encode import ITEMS, TEXT_CHARS, tree
from tests.stores import Raw

from .stores import HTML, fill


@pytest.fixture
def filled(tmp_path: Path) -> str:
    path = str(tmp_path / "ui.awal")
    fill(path)
    return path


@pytest.fixture
def client(filled: str) -> Iterator[TestClient]:
    with agentwal.open(filled, readonly=True) as store:
        yield TestClient(create_app(store, filled))


def get(client: TestClient, url: str, status: int = 200) -> Any:
    res = client.get(url)
    assert res.status_code == status, res.text
    assert res.headers["content-type"].startswith("application/json")
    return res.json()


def test_store_summary_counts_what_needs_attention(client: TestClient, filled: str) -> None:
    s = get(client, "/api/store")
    assert s["path"] == filled and s["runs"] == 2 and s["outbox"] == 1
    assert s["effects"]["in_doubt"] == 1 and s["effects"]["pending"] == 1
    assert "in_doubt" in s["statuses"] and set(s["effects"]) == {*s["statuses"], "total"}


def test_runs_list_and_search(client: TestClient) -> None:
    rows = {r["run"]: r for r in get(client, "/api/runs")}
    assert rows["run-a"]["head"] == 6 and rows["run-a"]["checkpoints"] == 6
    assert rows["run-b"]["origin"] == ["run-a", 3] and rows["run-b"]["in_doubt"] == 1
    assert [r["run"] for r in get(client, "/api/runs?q=B")] == ["run-b"]


def test_the_runs_page_counts_checkpoints_up_to_a_bound(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "long.awal")
    with agentwal.open(path, durability="none") as s:
        with s.begin("a") as txn:
            txn["i"] = 0
        s.fork("a", 1, "b")
        for i in range(12):
            with s.begin("b") as txn:
                txn["i"] = i
    monkeypatch.setattr(server, "COUNT_LIMIT", 5)
    with agentwal.open(path, readonly=True) as store:
        reads: list[int | None] = []
        history = store.history
        monkeypatch.setattr(store, "history", lambda run, **kw: (
            reads.append(kw.get("limit")), history(run, **kw))[1])
        rows = {r["run"]: r for r in get(TestClient(create_app(store, path)), "/api/runs")}
    assert rows["b"]["checkpoints"] == 5 and rows["b"]["checkpoints_more"] is True
    assert rows["b"]["origin"] == ["a", 1]  # its first checkpoint, found by one seek
    assert rows["a"]["checkpoints"] == 1 and rows["a"]["checkpoints_more"] is False
    assert reads and None not in reads and max(r for r in reads if r) <= 6  # never a whole history


def test_checkpoint_tree_has_forks_rollbacks_head_and_pages(client: TestClient) -> None:
    page = get(client, "/api/runs/run-a/checkpoints")
    rows = {r["id"]: r for r in page["rows"]}
    assert page["head"] == 6 and rows[6]["head"] and rows[6]["rollback_to"] == 2
    assert rows[3]["forks"] == ["run-b"] and page["next_before"] is None
    assert get(client, "/api/runs/run-b/checkpoints")["rows"][-1]["origin"] == ["run-a", 3]
    older = get(client, "/api/runs/run-a/checkpoints?before=3")
    assert [r["id"] for r in older["rows"]] == [2, 1]


def test_paging_a_long_run(tmp_path: Path) -> None:
    path = str(tmp_path / "long.awal")
    with agentwal.open(path, durability="none") as s:
        for i in range(120):
            with s.begin("r") as txn:
                txn["i"] = i
    with agentwal.open(path, readonly=True) as store:
        client = TestClient(create_app(store, path))
        first = get(client, "/api/runs/r/checkpoints")
        assert len(first["rows"]) == 50 and first["next_before"] == 71
        second = get(client, f"/api/runs/r/checkpoints?before={first['next_before']}")
        assert second["rows"][0]["id"] == 70


def test_checkpoint_state_is_a_bounded_tree(client: TestClient) -> None:
    data = get(client, "/api/runs/run-a/checkpoints/5")
    state = data["state"]
    assert data["checkpoint"]["id"] == 5 and data["checkpoint"]["meta"] == {"step": 4}
    assert state["html"] == {"type": "str", "value": HTML, "length": len(HTML),
                             "truncated": False}
    assert state["long"]["truncated"] and state["long"]["length"] == 5000
    assert len(state["long"]["value"]) == TEXT_CHARS
    assert state["messages"]["type"] == "list" and state["messages"]["length"] == 5
    blob = get(client, "/api/runs/run-b/checkpoints/2")["state"]["report"]
    assert blob["type"] == "blob" and blob["media_type"] == "application/pdf"
    res = client.get(blob["url"])
    assert res.status_code == 200 and res.content == b"%PDF-1.4 fake"
    assert res.headers["content-type"].startswith("application/pdf")
    assert hashlib.sha256(res.content).hexdigest() == blob["sha256"]
    assert "attachment" in res.headers["content-disposition"]


def test_tree_cuts_big_containers_and_says_how_big() -> None:
    node = tree(list(range(ITEMS + 5)), "")
    assert node["length"] == ITEMS + 5 and node["truncated"] and len(node["items"]) == ITEMS
    node = tree({"b": b"\x00" * 100}, "")
    assert node["items"][0][1] == {"type": "bytes", "length": 100, "truncated": True,
                                   "base64": "A" * 64}


def test_tree_shows_typed_values_readably() -> None:
    import datetime as dt
    import decimal
    import uuid

    when = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
    node = tree({"t": when, "d": decimal.Decimal("1.50"), "u": uuid.UUID(int=1),
                 "n": float("nan"), "s": {2, 1}, "m": {(1, 2): "x"}}, "")
    items = dict(node["items"])
    assert items["t"] == {"type": "other", "kind": "datetime",
                          "value": "2024-05-01T12:00:00+00:00"}
    assert items["d"]["value"] == "1.50" and items["d"]["kind"] == "Decimal"
    assert items["u"]["value"] == str(uuid.UUID(int=1))
    assert items["n"] == {"type": "float", "value": "nan"}
    assert items["s"]["kind"] == "set" and [i["value"] for i in items["s"]["items"]] == [1, 2]
    assert [k for k, _ in items["m"]["items"]] == ["[1, 2]"]


def test_a_langgraph_payload_shows_its_decoded_view() -> None:
    payload = {"t": "msgpack", "b": b"\x81\xa1a\x01", "view": {"a": 1}}
    node = tree({"v/root/x/1": payload, "plain": {"t": "msgpack", "b": b"", "other": 1}}, "")
    items = dict(node["items"])
    assert items["v/root/x/1"]["type"] == "dict"
    assert items["v/root/x/1"]["items"] == [["a", {"type": "int", "value": 1}]]
    assert items["v/root/x/1"]["serialized"] == {"kind": "msgpack", "length": 4}
    assert "serialized" not in items["plain"]  # another shape stays as it is


def test_diff_of_a_growing_list_is_the_appended_item(client: TestClient) -> None:
    d = get(client, "/api/runs/run-a/diff?a=4&b=5")
    [change] = d["changed"]["messages"]
    assert change["op"] == "appended" and change["at"] == 4 and change["items_total"] == 1
    assert "message 4" in change["items"][0]["json"]
    assert d["changed"]["step"][0]["op"] == "changed"


def test_effects_put_problems_first_with_the_resolve_command(client: TestClient,
                                                             filled: str) -> None:
    rows = get(client, "/api/effects")
    assert rows[0]["status"] == "in_doubt" and rows[0]["name"] == "charge-card"
    assert rows[0]["resolve"].startswith(f"agentwal resolve {filled} {rows[0]['effect_id']} ")
    assert HTML in rows[0]["args"]["json"]
    assert [r["status"] for r in get(client, "/api/effects?status=pending")] == ["pending"]
    assert get(client, "/api/effects?run=run-a") == []
    [entry] = get(client, "/api/outbox")
    assert entry["name"] == "send-email"


def test_health_says_what_needs_attention_first(client: TestClient, filled: str) -> None:
    h = get(client, "/api/health")
    assert h["attention"][0].startswith("1 effect(s) in doubt")
    assert any("outbox" in a for a in h["attention"])
    assert h["writer"]["held"] in (False, None) and h["unfolded_records"] == 0
    assert h["runs"] == 2 and h["effects"]["in_doubt"] == 1 and h["wal_bytes"] > 0


def test_verify_on_demand_ok_then_damage_found(filled: str) -> None:
    with agentwal.open(filled, readonly=True) as store:
        v = get(TestClient(create_app(store, filled)), "/api/verify")
    assert v["ok"] and v["problems"] == [] and v["checked"]["checkpoints"] == 8
    with Raw(filled) as raw:
        k = raw.key("run-a", 3)
        rec = raw.load("ckpt", k)
        rec[3] += 1.0  # created_at: the hash no longer matches
        raw.dump("ckpt", k, rec)
    with agentwal.open(filled, readonly=True) as store:
        v = get(TestClient(create_app(store, filled)), "/api/verify")
    assert not v["ok"] and "hash chain broken" in v["problems"][0]["what"]
    assert v["problems"][0]["where"].startswith("snapshot/data.mdb ckpt[")


def test_not_found_and_bad_requests(client: TestClient) -> None:
    assert get(client, "/api/runs/nope/checkpoints", 404)["error"]["code"] == "run_not_found"
    err = get(client, "/api/runs/run-a/checkpoints/99", 404)["error"]
    assert err["code"] == "checkpoint_not_found"
    assert get(client, "/api/runs/run-a/diff?a=x&b=2", 400)["error"]["code"] == "bad_request"
    assert get(client, "/api/runs/run-a/diff?a=1", 400)["error"]["code"] == "bad_request"
    assert get(client, "/api/runs/run-a/blob?key=step", 400)["error"]["code"] == "not_a_blob"


def test_it_only_reads(client: TestClient) -> None:
    for url in ("/api/store", "/api/runs", "/api/effects", "/api/runs/run-a/checkpoints"):
        assert client.post(url).status_code == 405
        assert client.delete(url).status_code == 405


def test_the_page_forbids_inline_script(client: TestClient) -> None:
    res = client.get("/")
    assert res.status_code == 200 and "app.js" in res.text
    assert "script-src 'self'" in res.headers["content-security-policy"]
    assert client.get("/static/app.js").status_code == 200


def test_it_follows_a_writer(filled: str) -> None:
    with agentwal.open(filled, readonly=True) as store:
        client = TestClient(create_app(store, filled, refresh_seconds=0))
        before = get(client, "/api/store")["visible_lsn"]
        with agentwal.open(filled) as writer, writer.begin("run-new") as txn:
            txn["x"] = 1
        assert get(client, "/api/store")["visible_lsn"] > before
        assert "run-new" in {r["run"] for r in get(client, "/api/runs")}


def test_loopback_only_unless_host_is_explicit(filled: str) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.1")
    result = CliRunner().invoke(main, ["ui", filled], env={"AGENTWAL_UI_HOST": "0.0.0.0"})
    assert result.exit_code == 2 and "not a loopback address" in result.output


def test_a_file_gone_under_a_read_is_a_503_the_page_retries(filled: str) -> None:
    class Vanishing:
        """A store whose refresh meets a segment a writer just removed."""

        def __init__(self, store: Any) -> None:
            self.store = store

        def refresh(self) -> None:
            raise FileNotFoundError(2, "No such file or directory", "wal/00000000000000000001.wal")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.store, name)

    with agentwal.open(filled, readonly=True) as store:
        client = TestClient(create_app(Vanishing(store), filled))
        assert get(client, "/api/store", 503)["error"]["code"] == "io"
