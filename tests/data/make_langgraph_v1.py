"""Write ``langgraph-v1.tar.gz``: a store of LangGraph threads in the saver's first layout.

Usage (from the repository root, with the code of a commit before list pools,
e.g. ``a819d6e``)::

    git archive a819d6e agentwal | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old .venv/bin/python tests/data/make_langgraph_v1.py

Layout 1 (``langgraph`` marker ``{"format": 1}``) stores each element of a
list channel under ``e/<digest>`` and each list version as a chain of
digest records; a task's written message list names its elements the same
way. The store holds thread ``chat`` (12 steps of ~1 KiB messages, each
with the node's write, then a branch from step 5 with two steps of its own),
thread ``small`` (a list that stays under the saver's sharing threshold) and
a subgraph namespace of ``chat``. ``expected.json`` beside the store holds
what that code read back for every checkpoint (:func:`picture`), which
``tests/langgraph/test_layout_upgrade.py`` compares with what this version
reads, before and after it writes more steps.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

import agentwal
from agentwal.integrations.langgraph import AgentWALSaver

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "langgraph-v1.tar.gz")
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from tests.data.make_history_v2 import pack  # noqa: E402 - needs the repository root
from tests.langgraph.test_saver import Chat  # noqa: E402


def message(i: int) -> AIMessage:
    return AIMessage(content=f"message {i} " + "x" * 1000, id=f"m{i}")


def fill(saver: AgentWALSaver) -> None:
    chat = Chat(saver, "chat")
    configs = []
    for i in range(12):
        configs.append(chat.step(message(i), step=i))
    branch = Chat(saver, "chat")  # time travel: from step 5, another conversation
    branch.config = configs[5]
    branch.messages = list(chat.messages[:6])
    branch.version = chat.version
    for i in range(2):
        branch.step(message(100 + i), step=6 + i)
    sub = Chat(saver, "chat", ns="agent:1")
    for i in range(3):
        sub.step(message(200 + i), step=i)
    small = Chat(saver, "small")
    for i in range(3):
        small.step(AIMessage(content=f"hi {i}", id=f"s{i}"), step=i)
    saver.put_writes(small.config, [("messages", [message(300)])], "pending-task")


def _plain(value: Any) -> Any:
    if isinstance(value, BaseMessage):
        return [type(value).__name__, value.id, value.content]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return repr(value)


def picture(saver: AgentWALSaver) -> list[Any]:
    """Every checkpoint of every thread as plain data, in list order."""
    out = []
    for tup in saver.list(None):
        conf = tup.config["configurable"]
        out.append({
            "thread": conf["thread_id"], "ns": conf["checkpoint_ns"],
            "id": conf["checkpoint_id"],
            "parent": tup.parent_config["configurable"]["checkpoint_id"]
            if tup.parent_config else None,
            "values": {k: _plain(v) for k, v in tup.checkpoint["channel_values"].items()},
            "versions": tup.checkpoint["channel_versions"],
            "metadata": {k: repr(v) for k, v in tup.metadata.items()},
            "writes": [[t, c, _plain(v)] for t, c, v in tup.pending_writes or []],
        })
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store.awal")
        with agentwal.open(path, durability="none") as store:
            saver = AgentWALSaver(store)
            fill(saver)
            want = picture(saver)
            store.snapshot()
            store.compact(vacuum=True)  # a compacted file: no stale pages in the fixture
        pack(TARGET, path, want)


if __name__ == "__main__":
    main()
