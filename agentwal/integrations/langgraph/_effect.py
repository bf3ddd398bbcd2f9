"""Exactly-once tools inside LangGraph nodes: agentwal effects keyed by the task's identity.

Theory of operation: a LangGraph task is identified by (thread, namespace,
the checkpoint it was prepared from, task id); a re-run of the same task
(after ``interrupt()`` + resume, after a crash and ``invoke(None, config)``,
under a ``RetryPolicy``) keeps that identity, and time travel makes a new one
(a fork checkpoint, so a new task id). The n-th ``effect`` call of one
*execution* of a task gets

- the key ``lge-`` + hash(thread, namespace, checkpoint, task id, n), unless
  the caller gives a business ``key=``. The name is not part of it, so a re-run
  that asks for a different effect (or other args) at the n-th call meets the
  recorded one and is a divergence (``EffectDivergenceError``), as with
  ``txn.effect``.

The call is a ``store.effect`` on the thread's run: an entry with no position
(its key is its identity) that belongs to no agentwal transaction, listed by
``store.effects(run=thread)`` and never reported ``uncommitted``.

``n`` counts per execution: each execution of a task has its own scratchpad
object (LangGraph builds one when it prepares the task and a new one for a
retry), so counting by that object makes a resume or a retry start again at 0.

Durability: under LangGraph's ``"async"`` durability the checkpoint a task
was prepared from may still be saving while the node runs. If a crash lost
it, the resume would prepare the task again from an older checkpoint with a
new task id and never meet this effect's record. So before recording an
intent the helper waits until that checkpoint is committed and synced.
Under ``"exit"`` nothing is saved before the run ends, so it does not wait
(interrupt/resume still meets the same keys: the checkpoint saved at exit
keeps its id; a crash mid-run does not).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cbor2
from langgraph.config import get_config

import agentwal
from agentwal.errors import Error

from . import _layout as L
from ._saver import AgentWALSaver

__all__ = ["NotInGraphError", "aeffect", "effect"]

#: How long an effect waits for its task's checkpoint to be saved.
CHECKPOINT_WAIT_SECONDS = 120.0
_MAX_EXECUTIONS = 100_000
_CHECKPOINTER = "__pregel_checkpointer"
_TASK_ID = "__pregel_task_id"
_SCRATCHPAD = "__pregel_scratchpad"
_DURABILITY = "__pregel_durability"
_NS_SEP, _NS_END = "|", ":"


class NotInGraphError(Error, RuntimeError):
    """``effect()`` was called outside a LangGraph node, or under another checkpointer.

    Call it from inside a node of a graph compiled with
    ``checkpointer=AgentWALSaver(store)``; elsewhere use ``txn.effect``.
    """

    code = "not_in_graph"


@dataclass(frozen=True)
class _Site:
    """Where one effect call is: the task, its checkpoint and the call's ordinal."""

    saver: AgentWALSaver
    thread: str
    ns: str
    parent_ns: str
    checkpoint_id: str
    task_id: str
    ordinal: int
    durability: str

    def fields(self) -> list[Any]:
        return [self.thread, self.ns, self.checkpoint_id, self.task_id, self.ordinal]

    def key(self) -> str:
        """The call's default key: the task's identity and the call's number in it."""
        body = cbor2.dumps(["agentwal-langgraph-effect", *self.fields()])
        return "lge-" + hashlib.sha256(body).hexdigest()[:56]


class _Executions:
    """Effect counters per task execution, keyed by the execution's scratchpad object."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # id -> (the scratchpad, pinned so its id is not reused; calls so far)
        self._seen: OrderedDict[int, tuple[Any, int]] = OrderedDict()

    def next_ordinal(self, scratchpad: Any) -> int:
        with self._lock:
            held = self._seen.get(id(scratchpad))
            n = held[1] if held is not None and held[0] is scratchpad else 0
            self._seen[id(scratchpad)] = (scratchpad, n + 1)
            self._seen.move_to_end(id(scratchpad))
            while len(self._seen) > _MAX_EXECUTIONS:
                self._seen.popitem(last=False)
            return n


_executions = _Executions()


def _parent_ns(ns: str) -> str:
    """The namespace of the graph a task runs in: its own namespace minus the last part."""
    return ns.rpartition(_NS_SEP)[0] if _NS_SEP in ns else ""


def _site() -> _Site:
    try:
        config = get_config()
    except RuntimeError:
        raise NotInGraphError(
            "effect() was called outside a LangGraph node: call it inside a node of a graph "
            "compiled with checkpointer=AgentWALSaver(store), or use txn.effect") from None
    conf = config.get("configurable") or {}
    saver = conf.get(_CHECKPOINTER)
    if not isinstance(saver, AgentWALSaver):
        what = "no checkpointer" if saver is None else type(saver).__name__
        raise NotInGraphError(
            f"effect() needs the graph to be compiled with checkpointer=AgentWALSaver(store), "
            f"and this one has {what}: its task identity is what keys the effect")
    ns = str(conf.get("checkpoint_ns") or "")
    parent = _parent_ns(ns)
    checkpoint_id = (conf.get("checkpoint_map") or {}).get(parent)
    task_id = conf.get(_TASK_ID)
    scratchpad = conf.get(_SCRATCHPAD)
    if checkpoint_id is None or task_id is None or scratchpad is None:
        raise NotInGraphError(
            "effect() found no LangGraph task in its config (checkpoint_map, task id); call it "
            "from the node's own thread or coroutine, not from a thread the node started")
    return _Site(saver, str(conf["thread_id"]), ns, parent, str(checkpoint_id), str(task_id),
                 _executions.next_ordinal(scratchpad), str(conf.get(_DURABILITY) or "async"))


def _await_checkpoint(site: _Site, effect_key: str) -> None:
    """Return once the checkpoint the task was prepared from is committed and synced."""
    if site.durability == "exit":
        return
    store, shared = site.saver.store, site.saver._shared
    key = L.checkpoint_key(L.ns_id(site.parent_ns), site.checkpoint_id)
    deadline = time.monotonic() + CHECKPOINT_WAIT_SECONDS
    while store.get(site.thread, key) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise agentwal.EffectError(
                None, effect_key,
                f"effect(): checkpoint {site.checkpoint_id} of thread {site.thread!r}, "
                f"which this task was prepared from, was not saved within "
                f"{CHECKPOINT_WAIT_SECONDS:.0f} s, so no intent was recorded; nothing was "
                "called. Check that the graph's checkpointer can write to its store.")
        with shared.saved:  # woken by every put; re-checked at least every 50 ms
            shared.saved.wait(min(left, 0.05))
    store.sync()


def _run(site: _Site, name: str, fn: Callable[[agentwal.EffectContext], Any], mode: Any,
         args: Any, key: str | None, probe: Any, idempotent: bool, retries: int) -> Any:
    effect_key = site.key() if key is None else key
    _await_checkpoint(site, effect_key)
    return site.saver.store.effect(site.thread, name, fn, key=effect_key, mode=mode, args=args,
                                   probe=probe, idempotent=idempotent, retries=retries)


def effect(name: str, fn: Callable[[agentwal.EffectContext], Any], *, mode: Any,
           args: Any = None, key: str | None = None,
           probe: Callable[[agentwal.EffectContext], Any] | None = None,
           idempotent: bool = False, retries: int = 0) -> Any:
    """Run ``fn(ctx)`` once per LangGraph task position, under agentwal's effect contract.

    Call it inside a node of a graph compiled with an :class:`AgentWALSaver`. The
    arguments and the modes are those of ``txn.effect`` (``docs/effects.md``); the
    default key comes from the task's identity (thread, namespace, checkpoint, task
    id, the n-th call in this execution of the node, name), so a node re-run after
    ``interrupt()``/resume or after a crash gets the recorded result back instead
    of calling ``fn`` again.

    Returns:
        ``fn``'s result, or the one recorded by an earlier run of the same task.

    Raises:
        NotInGraphError: outside a node, or the graph's checkpointer is not an
            AgentWALSaver.
        ValueError, EffectInDoubtError, EffectNotAppliedError, EffectDivergenceError,
            UnencodableValueError, DiskFullError, DurabilityError: as ``txn.effect``.

    Example::

        def pay(state):
            receipt = effect("charge", lambda ctx: psp.charge(4900, idempotency_key=ctx.key),
                             mode="exactly_once", idempotent=True)
            return {"receipt": receipt}
    """
    return _run(_site(), name, fn, mode, args, key, probe, idempotent, retries)


async def aeffect(name: str, fn: Callable[[agentwal.EffectContext], Any], *, mode: Any,
                  args: Any = None, key: str | None = None,
                  probe: Callable[[agentwal.EffectContext], Any] | None = None,
                  idempotent: bool = False, retries: int = 0) -> Any:
    """:func:`effect` for an async node; ``fn`` and ``probe`` may be coroutine functions.

    Built on ``txn.aeffect``: ``fn(ctx)`` runs on the node's event loop (awaited
    when it returns an awaitable) and every ledger write runs off the loop, as
    does the wait for the task's checkpoint, so no fsync stalls the loop.

    Example::

        async def pay(state):
            receipt = await aeffect("charge", charge_async, mode="exactly_once",
                                    idempotent=True)
            return {"receipt": receipt}
    """
    site = _site()
    effect_key = site.key() if key is None else key
    await asyncio.to_thread(_await_checkpoint, site, effect_key)  # reads and an fsync
    return await site.saver.store.aeffect(site.thread, name, fn, key=effect_key, mode=mode,
                                          args=args, probe=probe, idempotent=idempotent,
                                          retries=retries)
