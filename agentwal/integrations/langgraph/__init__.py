"""LangGraph integration: a drop-in checkpointer and exactly-once tools inside nodes.

``AgentWALSaver(store)`` is a LangGraph ``BaseCheckpointSaver`` (sync and
async) that keeps each thread as an agentwal run; ``effect`` / ``aeffect``
run an agentwal effect inside a node, keyed by LangGraph's task identity, so
a node re-run after an ``interrupt()`` or a crash does not repeat a side
effect that completed. Needs the ``langgraph`` extra::

    pip install 'agentwal[langgraph]'

Example::

    from agentwal.integrations.langgraph import AgentWALSaver, effect

    def pay(state):
        receipt = effect("charge", lambda ctx: psp.charge(4900, key=ctx.key),
                         mode="exactly_once", idempotent=True)
        return {"receipt": receipt}

    with AgentWALSaver.from_path("graph.awal") as saver:
        graph = builder.compile(checkpointer=saver)
"""

from __future__ import annotations

try:
    import langgraph.checkpoint.base
    import langgraph.config  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "agentwal.integrations.langgraph needs LangGraph, which is not installed: "
        "pip install 'agentwal[langgraph]'") from exc

from ._effect import NotInGraphError, aeffect, effect
from ._saver import AgentWALSaver

__all__ = ["AgentWALSaver", "NotInGraphError", "aeffect", "effect"]
