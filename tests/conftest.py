"""Shared fixtures: a fresh store directory per test, and failpoints always disarmed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import agentwal
from agentwal import failpoints


@pytest.fixture(autouse=True)
def _disarm_failpoints() -> Iterator[None]:
    failpoints.disarm()
    yield
    failpoints.disarm()


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "store.awal")


@pytest.fixture
def store(path: str) -> Iterator[agentwal.Store]:
    s = agentwal.open(path, durability="none", segment_bytes=65536, wal_max_bytes=1 << 20)
    yield s
    s.close()
