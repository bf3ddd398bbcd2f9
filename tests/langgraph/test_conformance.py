"""LangGraph's own checkpointer conformance suite (PyPI: langgraph-checkpoint-conformance).

Run twice: through the saver's async methods, and through a bridge whose async
methods call the saver's sync methods from a worker thread, so both families
pass every test of every capability.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import agentwal

conformance = pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES  # noqa: E402

from agentwal.integrations.langgraph import AgentWALSaver  # noqa: E402


class SyncBridge(BaseCheckpointSaver[str]):
    """Async methods that call ``inner``'s sync methods in a worker thread."""

    def __init__(self, inner: AgentWALSaver) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    def get_next_version(self, current: Any, channel: None = None) -> str:
        return self.inner.get_next_version(current, channel)

    async def aget_tuple(self, config: Any) -> Any:
        return await asyncio.to_thread(self.inner.get_tuple, config)

    async def alist(self, config: Any, *, filter: Any = None, before: Any = None,
                    limit: Any = None) -> AsyncIterator[Any]:
        items = await asyncio.to_thread(
            lambda: list(self.inner.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return await asyncio.to_thread(self.inner.put, config, checkpoint, metadata,
                                       new_versions)

    async def aput_writes(self, config: Any, writes: Any, task_id: str,
                          task_path: str = "") -> None:
        await asyncio.to_thread(self.inner.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.inner.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.inner.delete_for_runs, run_ids)

    async def acopy_thread(self, source: str, target: str) -> None:
        await asyncio.to_thread(self.inner.copy_thread, source, target)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.inner.prune, thread_ids, strategy=strategy)


def _run_suite(tmp_path: Path, wrap: Any) -> Any:
    stores: list[agentwal.Store] = []

    async def factory() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        store = agentwal.open(str(tmp_path / f"s{len(stores)}.awal"), durability="none")
        stores.append(store)
        try:
            yield wrap(AgentWALSaver(store))
        finally:
            store.close()

    registered = conformance.checkpointer_test(name=f"AgentWALSaver-{wrap.__name__}")(factory)
    return asyncio.run(conformance.validate(registered))


def _failures(report: Any) -> dict[str, Any]:
    return {cap: res.failures for cap, res in report.results.items() if not res.passed}


def _direct(s: AgentWALSaver) -> AgentWALSaver:
    return s


@pytest.mark.parametrize("wrap", [_direct, SyncBridge], ids=["async", "sync-bridge"])
def test_conformance_every_capability(tmp_path: Path, wrap: Any) -> None:
    report = _run_suite(tmp_path, wrap)
    assert _failures(report) == {}
    assert {cap for cap, res in report.results.items() if res.detected} == {
        c.value for c in ALL_CAPABILITIES}
    assert all(res.tests_passed > 0 for res in report.results.values())
