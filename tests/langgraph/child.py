"""A LangGraph program the crash tests run in a child process and SIGKILL.

Usage: ``python -m tests.langgraph.child SCENARIO STORE WORKDIR PHASE [MODE]``

- ``SCENARIO`` ``steps``: three nodes; the middle one SIGKILLs its process the
  first time it runs (after the first node's step was saved). ``effect``: a
  ``prep`` node writes a large state value (so LangGraph's background save of
  the next checkpoint is still in flight when ``pay`` starts), then ``pay``
  runs ``effect("charge", ...)`` in ``MODE``; the downstream applies the
  charge, and the first time the process SIGKILLs itself inside ``fn``, after
  the application and before ``fn`` returns. ``aeffect``: the same with an
  async ``pay`` node calling ``aeffect`` with an async ``fn``, run by
  ``ainvoke``.
- ``PHASE`` ``start`` invokes the graph with an input; ``resume`` invokes
  ``graph.invoke(None, config)`` in a new process, as after a crash.

Prints one JSON line: the final state, or ``{"error": <agentwal error code>}``.
Every node appends its name to ``WORKDIR/nodes`` (fsynced) so the parent can
tell which nodes ran in which process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import agentwal
from agentwal.integrations.langgraph import AgentWALSaver, aeffect, effect
from tests.effects.downstream import Downstream

CONFIG = {"configurable": {"thread_id": "crash-thread"}}
MODES: dict[str, dict[str, Any]] = {
    "at_most_once": {"mode": "at_most_once"},
    "at_most_once_probe": {"mode": "at_most_once", "probe": True},
    "at_least_once": {"mode": "at_least_once"},
    "exactly_once_idempotent": {"mode": "exactly_once", "idempotent": True},
    "exactly_once_probe": {"mode": "exactly_once", "probe": True},
}


class State(TypedDict, total=False):
    blob: str
    a: int
    b: int
    c: int
    receipt: Any


def _log(workdir: str, what: str) -> None:
    fd = os.open(os.path.join(workdir, "nodes"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (what + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _first_time(workdir: str, name: str) -> bool:
    marker = os.path.join(workdir, name)
    if os.path.exists(marker):
        return False
    with open(marker, "w"):
        pass
    return True


def steps_graph(saver: AgentWALSaver, workdir: str) -> Any:
    def one(state: State) -> dict[str, Any]:
        _log(workdir, "one")
        return {"a": 1}

    def two(state: State) -> dict[str, Any]:
        _log(workdir, "two")
        if _first_time(workdir, "killed"):
            os.kill(os.getpid(), signal.SIGKILL)
        return {"b": state["a"] + 1}

    def three(state: State) -> dict[str, Any]:
        _log(workdir, "three")
        return {"c": state["b"] + 1}

    b = StateGraph(State)
    for name, fn in (("one", one), ("two", two), ("three", three)):
        b.add_node(name, fn)
    b.add_edge(START, "one")
    b.add_edge("one", "two")
    b.add_edge("two", "three")
    b.add_edge("three", END)
    return b.compile(checkpointer=saver)


def effect_graph(saver: AgentWALSaver, workdir: str, mode: str, *,
                 asynchronous: bool = False) -> Any:
    options = dict(MODES[mode])
    downstream = Downstream(os.path.join(workdir, "journal"), dedup=True)
    if options.pop("probe", False):
        options["probe"] = downstream.probe

    def prep(state: State) -> dict[str, Any]:
        _log(workdir, "prep")
        return {"blob": "x" * (4 << 20)}

    def charge(ctx: agentwal.EffectContext) -> Any:
        result = downstream.call(ctx)
        if _first_time(workdir, "killed"):
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    def pay(state: State) -> dict[str, Any]:
        _log(workdir, "pay")
        return {"receipt": effect("charge", charge, args={"amount": 4900}, **options)}

    async def charge_async(ctx: agentwal.EffectContext) -> Any:
        await asyncio.sleep(0)
        return charge(ctx)

    async def apay(state: State) -> dict[str, Any]:
        _log(workdir, "pay")
        return {"receipt": await aeffect("charge", charge_async, args={"amount": 4900},
                                         **options)}

    b = StateGraph(State)
    b.add_node("prep", prep)
    b.add_node("pay", apay if asynchronous else pay)
    b.add_edge(START, "prep")
    b.add_edge("prep", "pay")
    b.add_edge("pay", END)
    return b.compile(checkpointer=saver)


def main(argv: list[str]) -> None:
    scenario, store_path, workdir, phase = argv[:4]
    with AgentWALSaver.from_path(store_path) as saver:
        graph = (steps_graph(saver, workdir) if scenario == "steps"
                 else effect_graph(saver, workdir, argv[4], asynchronous=scenario == "aeffect"))
        arg = {} if phase == "start" else None
        try:
            if scenario == "aeffect":
                out = asyncio.run(graph.ainvoke(arg, CONFIG))
            else:
                out = graph.invoke(arg, CONFIG)
        except agentwal.Error as exc:
            print(json.dumps({"error": exc.code}), flush=True)
            return
        out.pop("blob", None)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
