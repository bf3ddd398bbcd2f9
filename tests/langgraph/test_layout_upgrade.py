"""Threads written in the saver's first layout (``tests/data/langgraph-v1.tar.gz``, made by
``tests/data/make_langgraph_v1.py`` with the code before list pools) read as they were
written, take new steps in the pool layout, and prune."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import agentwal
from agentwal.integrations.langgraph import AgentWALSaver
from agentwal.integrations.langgraph import _layout as L
from tests.data.make_langgraph_v1 import message, picture
from tests.langgraph.test_saver import Chat, cfg, pools

FIXTURE = Path(__file__).parent.parent / "data" / "langgraph-v1.tar.gz"


def test_a_layout_1_store_reads_as_written_then_grows_in_pools_and_prunes(
        tmp_path: Path) -> None:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    want: list[dict[str, Any]] = json.loads((tmp_path / "expected.json").read_text())
    path = str(tmp_path / "store.awal")
    with agentwal.open(path, durability="none") as store:
        saver = AgentWALSaver(store)
        assert store.get("chat", L.MARKER) == {"format": 1}
        assert picture(saver) == want
        head = saver.get_tuple(cfg("chat"))
        assert head is not None
        chat = Chat(saver, "chat")
        chat.config = head.config
        chat.messages = head.checkpoint["channel_values"]["messages"]
        chat.version = head.checkpoint["channel_versions"]["messages"]
        for i in range(3):
            chat.step(message(500 + i), step=10 + i)
        assert store.get("chat", L.MARKER) == {"format": L.FORMAT}
        (pool,) = pools(store, "chat").values()
        assert len(pool) == 8 + 3  # the old list once (its first pooled version), then one a step
        assert saver.get_tuple(cfg("chat")).checkpoint["channel_values"]["messages"] == \
            chat.messages
        now = {(p["thread"], p["ns"], p["id"]): p for p in picture(saver)}
        grown = head.config["configurable"]["checkpoint_id"]  # has the first step's write now
        assert [{**now[(p["thread"], p["ns"], p["id"])], "writes": p["writes"]}
                if p["id"] == grown else now[(p["thread"], p["ns"], p["id"])]
                for p in want] == want  # every old checkpoint reads as before
        small = Chat(saver, "small")
        small.config = saver.get_tuple(cfg("small")).config
        small.messages = [message(300)]  # the pending write applied
        small.step(message(301), step=3)
        assert saver.get_tuple(cfg("small")).checkpoint["channel_values"]["messages"] == \
            small.messages
        saver.prune(["chat"])
        state = store.state("chat")
        # the root's kept list is pooled; the subgraph's kept list is still format 1
        assert len([k for k in state if k.startswith("e/")]) == 3
        assert saver.get_tuple(cfg("chat")).checkpoint["channel_values"]["messages"] == \
            chat.messages
        sub = saver.get_tuple(cfg("chat", "agent:1"))
        assert sub is not None and [m.id for m in sub.checkpoint["channel_values"]["messages"]] \
            == ["m200", "m201", "m202"]
        assert store.verify().ok
