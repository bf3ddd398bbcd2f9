from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import agentwal
from agentwal import failpoints

from .downstream import Downstream


@pytest.fixture
def store(tmp_path: Path) -> Iterator[agentwal.Store]:
    s = agentwal.open(tmp_path / "s", durability="none")
    yield s
    s.close()


@pytest.fixture
def down(tmp_path: Path) -> Downstream:
    return Downstream(str(tmp_path / "journal"))


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    yield
    failpoints.disarm()
