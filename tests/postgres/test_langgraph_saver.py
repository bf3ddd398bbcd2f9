"""AgentWALSaver over a PostgreSQL store: list pools grow through ``txn.append``, which this
backend stores as whole values; every version, a branch, a second saver with cold caches,
prune and delete read back."""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("langgraph.checkpoint.base", reason="needs the langgraph extra")

from agentwal.integrations.langgraph import AgentWALSaver
from agentwal.postgres import PostgresStore
from tests.langgraph.test_saver import Chat, big, cfg, pools


def test_pools_on_postgres_read_back_across_a_branch_a_cold_saver_and_prune(
        open_pg: Callable[..., PostgresStore]) -> None:
    saver = AgentWALSaver(open_pg(worker_id="w1"))
    chat = Chat(saver, "t")
    configs = [chat.step(big(i), step=i) for i in range(8)]
    branch = Chat(saver, "t")  # time travel: on from step 3 with other messages
    branch.config, branch.messages, branch.version = configs[3], chat.messages[:4], "0"
    branch.step(big(100), step=4)
    other = AgentWALSaver(saver.store)  # a saver of its own: nothing cached
    chat.saver = other
    chat.step(big(8), step=8)
    for saver_ in (saver, other):
        got = {t.config["configurable"]["checkpoint_id"]: t.checkpoint["channel_values"]
               ["messages"] for t in saver_.list(cfg("t"))}
        assert got[configs[7]["configurable"]["checkpoint_id"]] == chat.messages[:8]
        assert got[branch.config["configurable"]["checkpoint_id"]] == branch.messages
        assert saver_.get_tuple(cfg("t")).checkpoint["channel_values"]["messages"] == \
            chat.messages
    (pool,) = pools(other.store, "t").values()
    assert len(pool) == 10  # m0..m8 and the branch's m100, each once
    other.prune(["t"])
    assert [t.checkpoint["channel_values"]["messages"] for t in saver.list(cfg("t"))] == [
        chat.messages]
    saver.delete_thread("t")
    assert saver.get_tuple(cfg("t")) is None and other.get_tuple(cfg("t")) is None
