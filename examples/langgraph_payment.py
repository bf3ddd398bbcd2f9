#!/usr/bin/env python3
"""A LangGraph checkout that charges a card, then asks a human to confirm: charged once.

Run: ``.venv/bin/python examples/langgraph_payment.py [WORKDIR]`` (needs the
``langgraph`` extra). The ``checkout`` node charges the card and then calls
``interrupt()``. LangGraph re-runs an interrupted node from its first line when
it resumes, so with a plain tool call the card would be charged twice; with
``effect(...)`` the second run gets the recorded receipt back.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from agentwal.integrations.langgraph import AgentWALSaver, effect


class PaymentService:
    """A stand-in for a payment API that honours an Idempotency-Key."""

    def __init__(self) -> None:
        self.requests = 0
        self.charges: dict[str, int] = {}

    def charge(self, amount: int, idempotency_key: str) -> dict[str, Any]:
        self.requests += 1
        self.charges.setdefault(idempotency_key, amount)
        return {"charge_id": f"ch_{len(self.charges)}", "amount": amount}


class Order(TypedDict, total=False):
    amount: int
    receipt: dict[str, Any]
    confirmed: bool


def build(saver: AgentWALSaver, psp: PaymentService, runs: list[str]) -> Any:
    def checkout(state: Order) -> dict[str, Any]:
        runs.append("checkout")
        receipt = effect(
            "charge-card",
            lambda ctx: psp.charge(ctx.args["amount"], idempotency_key=ctx.key),
            mode="exactly_once", idempotent=True, args={"amount": state["amount"]})
        confirmed = interrupt({"charged": receipt, "question": "ship it?"})
        return {"receipt": receipt, "confirmed": confirmed}

    builder = StateGraph(Order)
    builder.add_node("checkout", checkout)
    builder.add_edge(START, "checkout")
    builder.add_edge("checkout", END)
    return builder.compile(checkpointer=saver)


def main(workdir: str) -> None:
    psp, runs = PaymentService(), []
    config = {"configurable": {"thread_id": "order-1017"}}
    with AgentWALSaver.from_path(str(Path(workdir) / "shop.awal")) as saver:
        graph = build(saver, psp, runs)
        first = graph.invoke({"amount": 4900}, config)
        print("paused at:", first["__interrupt__"][0].value["question"])
        done = graph.invoke(Command(resume=True), config)
        print("receipt:", done["receipt"], "confirmed:", done["confirmed"])
        print(f"checkout ran {len(runs)} times; payment API: {psp.requests} request, "
              f"{len(psp.charges)} charge")
        [entry] = saver.store.effects()
        print("ledger:", entry.name, entry.status, "attempts", entry.attempts)
        steps = [(h.metadata["step"], h.metadata["source"])
                 for h in graph.get_state_history(config)]
        print("checkpoints (step, source), newest first:", steps)
    assert len(runs) == 2 and psp.requests == 1 and len(psp.charges) == 1
    print("charged once across the interrupt")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
