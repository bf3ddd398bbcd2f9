"""effect()/aeffect() inside LangGraph nodes: one call per task position across an
interrupt, a retry, parallel tasks and time travel; in doubt after a SIGKILL inside fn,
each mode does what docs/effects.md says; and a SIGKILLed graph resumes in a new process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt

import agentwal
from agentwal.integrations.langgraph import AgentWALSaver, NotInGraphError, aeffect, effect
from agentwal.integrations.langgraph import _layout as L
from tests.effects.downstream import Downstream

REPO = Path(__file__).resolve().parents[2]
MODES = {
    "at_most_once": {"mode": "at_most_once"},
    "at_least_once": {"mode": "at_least_once"},
    "exactly_once_idempotent": {"mode": "exactly_once", "idempotent": True},
    "exactly_once_probe": {"mode": "exactly_once", "probe": True},
}


def _merge(a: list[Any], b: list[Any]) -> list[Any]:
    return a + b


class Pay(TypedDict, total=False):
    receipts: Annotated[list[Any], _merge]
    answer: str


def conf(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def options(mode: str, downstream: Downstream) -> dict[str, Any]:
    opts = dict(MODES[mode])
    if opts.pop("probe", False):
        opts["probe"] = downstream.probe
    return opts


@pytest.mark.parametrize("mode", list(MODES))
def test_an_effect_before_an_interrupt_is_not_repeated_on_resume(
        saver: AgentWALSaver, tmp_path: Path, mode: str) -> None:
    downstream = Downstream(str(tmp_path / "journal"))
    runs: list[int] = []

    def pay(state: Pay) -> dict[str, Any]:
        runs.append(1)
        receipt = effect("charge", downstream.call, args={"amount": 4900},
                         **options(mode, downstream))
        answer = interrupt("charged; confirm?")
        return {"receipts": [receipt], "answer": answer}

    b = StateGraph(Pay)
    b.add_node("pay", pay)
    b.add_edge(START, "pay")
    b.add_edge("pay", END)
    graph = b.compile(checkpointer=saver)
    graph.invoke({"receipts": []}, conf("t"))
    out = graph.invoke(Command(resume="ok"), conf("t"))
    assert len(runs) == 2  # LangGraph re-ran the node from its first line
    assert downstream.calls() == 1 and downstream.applications() == 1
    assert out["receipts"][0]["args"] == {"amount": 4900} and out["answer"] == "ok"
    [entry] = saver.store.effects()
    assert entry.status == "done" and entry.name == "charge"
    # listed under the thread, and not an uncommitted attempt: it belongs to the task
    assert saver.store.effects(run="t") == [entry] and not entry.uncommitted


def test_effects_in_one_node_parallel_tasks_and_time_travel(saver: AgentWALSaver,
                                                            tmp_path: Path) -> None:
    downstream = Downstream(str(tmp_path / "journal"))

    def branch(tag: str) -> Any:
        def node(state: Pay) -> dict[str, Any]:
            first = effect("email", downstream.call, mode="at_least_once", args={"to": tag})
            second = effect("email", downstream.call, mode="at_least_once", args={"to": tag})
            interrupt(f"{tag}?")
            return {"receipts": [first["key"], second["key"]]}
        return node

    b = StateGraph(Pay)
    b.add_node("left", branch("left"))
    b.add_node("right", branch("right"))
    b.add_edge(START, "left")
    b.add_edge(START, "right")
    b.add_edge("left", END)
    b.add_edge("right", END)
    graph = b.compile(checkpointer=saver)
    graph.invoke({"receipts": []}, conf("p"))
    interrupts = graph.get_state(conf("p")).interrupts
    out = graph.invoke(Command(resume={i.id: "go" for i in interrupts}), conf("p"))
    keys = out["receipts"]
    assert len(keys) == 4 and len(set(keys)) == 4  # two tasks x two calls: four positions
    assert downstream.calls() == 4

    # time travel from the input checkpoint: a fork, new task ids, the effects really re-run
    first = list(graph.get_state_history(conf("p")))[-1]
    graph.invoke(None, first.config)
    assert downstream.calls() == 8
    assert not set(downstream.per_key("call")) - set(downstream.per_key("call"))
    assert len(downstream.per_key("call")) == 8


def test_a_different_effect_at_the_same_position_is_a_divergence(saver: AgentWALSaver,
                                                                 tmp_path: Path) -> None:
    downstream = Downstream(str(tmp_path / "journal"))
    names = iter(["charge", "refund"])

    def pay(state: Pay) -> dict[str, Any]:
        effect(next(names), downstream.call, mode="at_most_once")
        interrupt("?")
        return {}

    b = StateGraph(Pay)
    b.add_node("pay", pay)
    b.add_edge(START, "pay")
    b.add_edge("pay", END)
    graph = b.compile(checkpointer=saver)
    graph.invoke({}, conf("d"))
    with pytest.raises(agentwal.EffectDivergenceError):
        graph.invoke(Command(resume="x"), conf("d"))
    assert downstream.calls() == 1


def test_a_retry_meets_the_recorded_result(saver: AgentWALSaver, tmp_path: Path) -> None:
    downstream = Downstream(str(tmp_path / "journal"))
    attempts: list[int] = []

    def pay(state: Pay) -> dict[str, Any]:
        receipt = effect("charge", downstream.call, mode="at_most_once")
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("the next call failed")
        return {"receipts": [receipt]}

    b = StateGraph(Pay)
    b.add_node("pay", pay, retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.01,
                                                    jitter=False))
    b.add_edge(START, "pay")
    b.add_edge("pay", END)
    out = b.compile(checkpointer=saver).invoke({"receipts": []}, conf("r"))
    assert len(attempts) == 2 and downstream.calls() == 1 and len(out["receipts"]) == 1


def test_the_task_checkpoint_is_saved_before_the_intent(path: str, tmp_path: Path) -> None:
    """Under durability="async" the step's checkpoint is saved in the background while the
    node runs; the effect must not record its intent before that checkpoint is committed."""
    store = agentwal.open(path, durability="none")

    class SlowSaver(AgentWALSaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            if metadata.get("step") == 1:
                time.sleep(0.3)
            return super().put(config, checkpoint, metadata, new_versions)

    saver = SlowSaver(store)
    seen: list[bool] = []

    def prep(state: Pay) -> dict[str, Any]:
        return {"answer": "ready"}

    def pay(state: Pay) -> dict[str, Any]:
        def fn(ctx: agentwal.EffectContext) -> str:
            cid = saver.get_tuple(conf("w")).checkpoint["id"]
            seen.append(store.get("w", L.checkpoint_key("root", cid)) is not None)
            return "done"
        effect("charge", fn, mode="at_most_once")
        return {}

    b = StateGraph(Pay)
    b.add_node("prep", prep)
    b.add_node("pay", pay)
    b.add_edge(START, "prep")
    b.add_edge("prep", "pay")
    b.add_edge("pay", END)
    b.compile(checkpointer=saver).invoke({}, conf("w"), durability="async")
    head = list(saver.list(conf("w")))
    assert seen == [True]
    assert [t.metadata["step"] for t in head][-3:] == [1, 0, -1]
    store.close()


def test_aeffect_in_an_async_node_across_an_interrupt(saver: AgentWALSaver) -> None:
    calls: list[str] = []

    async def charge(ctx: agentwal.EffectContext) -> dict[str, Any]:
        await asyncio.sleep(0)
        calls.append(ctx.key)
        return {"paid": True}

    async def pay(state: Pay) -> dict[str, Any]:
        receipt = await aeffect("charge", charge, mode="at_most_once")
        answer = interrupt("?")
        return {"receipts": [receipt], "answer": answer}

    b = StateGraph(Pay)
    b.add_node("pay", pay)
    b.add_edge(START, "pay")
    b.add_edge("pay", END)
    graph = b.compile(checkpointer=saver)

    async def main() -> dict[str, Any]:
        await graph.ainvoke({"receipts": []}, conf("a"))
        return await graph.ainvoke(Command(resume="yes"), conf("a"))

    out = asyncio.run(main())
    assert len(calls) == 1 and out["receipts"] == [{"paid": True}]


def test_aeffects_gathered_in_one_node_keep_their_positions(saver: AgentWALSaver) -> None:
    calls: list[str] = []

    async def call(ctx: agentwal.EffectContext) -> str:
        await asyncio.sleep(0.01 if ctx.args == "slow" else 0)
        calls.append(ctx.args)
        return str(ctx.args)

    def sync_call(ctx: agentwal.EffectContext) -> str:  # a plain function works too
        calls.append(ctx.args)
        return str(ctx.args)

    async def tools(state: Pay) -> dict[str, Any]:
        got = await asyncio.gather(aeffect("tool", call, mode="at_least_once", args="slow"),
                                   aeffect("tool", call, mode="at_least_once", args="fast"))
        last = await aeffect("tool", sync_call, mode="at_least_once", args="sync")
        interrupt("?")
        return {"receipts": [*got, last]}

    b = StateGraph(Pay)
    b.add_node("tools", tools)
    b.add_edge(START, "tools")
    b.add_edge("tools", END)
    graph = b.compile(checkpointer=saver)

    async def main() -> dict[str, Any]:
        await graph.ainvoke({"receipts": []}, conf("g"))
        return await graph.ainvoke(Command(resume="go"), conf("g"))

    out = asyncio.run(main())
    assert out["receipts"] == ["slow", "fast", "sync"]
    assert sorted(calls) == ["fast", "slow", "sync"]  # each once, across the re-run


def test_outside_a_graph_or_with_another_checkpointer_is_refused() -> None:
    with pytest.raises(NotInGraphError, match="outside a LangGraph node"):
        effect("x", lambda ctx: 1, mode="at_most_once")

    def node(state: Pay) -> dict[str, Any]:
        effect("x", lambda ctx: 1, mode="at_most_once")
        return {}

    b = StateGraph(Pay)
    b.add_node("n", node)
    b.add_edge(START, "n")
    b.add_edge("n", END)
    with pytest.raises(NotInGraphError, match="InMemorySaver"):
        b.compile(checkpointer=InMemorySaver()).invoke({}, conf("m"))
    with pytest.raises(NotInGraphError, match="no checkpointer"):
        b.compile().invoke({})


# -- in a child process, killed with SIGKILL ---------------------------------------------


def child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.langgraph.child", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_graph_killed_mid_step_resumes_in_a_new_process(tmp_path: Path) -> None:
    store = str(tmp_path / "g.awal")
    killed = child("steps", store, str(tmp_path), "start")
    assert killed.returncode == -9, killed.stderr
    resumed = child("steps", store, str(tmp_path), "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1]) == {"a": 1, "b": 2, "c": 3}
    assert (tmp_path / "nodes").read_text().split() == ["one", "two", "two", "three"]


EXPECT = {
    # mode: (downstream calls, applications, what the resumed run returns)
    "at_most_once": (1, 1, {"error": "effect_in_doubt"}),
    "at_most_once_probe": (1, 1, "receipt"),
    "at_least_once": (2, 1, "receipt"),
    "exactly_once_idempotent": (2, 1, "receipt"),
    "exactly_once_probe": (1, 1, "receipt"),
}


@pytest.mark.parametrize(("scenario", "mode"), [
    *(("effect", mode) for mode in EXPECT),
    ("aeffect", "at_most_once"), ("aeffect", "exactly_once_idempotent"),
])
def test_sigkill_inside_fn_after_the_downstream_applied(tmp_path: Path, scenario: str,
                                                        mode: str) -> None:
    store = str(tmp_path / "e.awal")
    killed = child(scenario, store, str(tmp_path), "start", mode)
    assert killed.returncode == -9, killed.stderr
    resumed = child(scenario, store, str(tmp_path), "resume", mode)
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout.splitlines()[-1])
    downstream = Downstream(str(tmp_path / "journal"))
    calls, applications, result = EXPECT[mode]
    assert (downstream.calls(), downstream.applications()) == (calls, applications)
    assert len(downstream.per_key("call")) == 1  # every attempt used the same key
    if result == "receipt":
        assert out["receipt"]["args"] == {"amount": 4900}
    else:
        assert out == result
    assert (tmp_path / "nodes").read_text().split() == ["prep", "pay", "pay"]
