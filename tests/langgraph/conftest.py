"""Fixtures for the LangGraph integration tests (skipped when the extra is not installed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import agentwal

pytest.importorskip("langgraph.checkpoint.base", reason="needs the langgraph extra")

from agentwal.integrations.langgraph import AgentWALSaver


@pytest.fixture
def saver(path: str) -> Iterator[AgentWALSaver]:
    store = agentwal.open(path, durability="none")
    yield AgentWALSaver(store)
    store.close()
