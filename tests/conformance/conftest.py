"""The backends the conformance suite runs against (today: the embedded engine).

A new backend adds an entry to ``BACKENDS``: a function that opens a fresh,
empty store in a temporary directory (or database) and returns it as a
``backend.Backend`` that is also a ``backend.Maintenance``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal.local.backend import LocalBackend


def _local(tmp: Path) -> Any:
    return LocalBackend(agentwal.open(str(tmp / "store.awal"), durability="none"))


BACKENDS: dict[str, Callable[[Path], Any]] = {"local": _local}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    b = BACKENDS[request.param](tmp_path)
    yield b
    b.close()
