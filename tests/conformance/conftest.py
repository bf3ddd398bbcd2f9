"""A fixture per backend kind (``kinds.KINDS``) for the Protocol-level conformance suite, and
``open_store`` for the facade-level contract tests of both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import agentwal
from tests.conformance.kinds import KINDS


@pytest.fixture(params=["local", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``open_store(**options)``: the test's store (the same one each call), closed after."""
    opened: list[Any] = []
    if request.param == "local":
        target = str(tmp_path / "store.awal")
        defaults: dict[str, Any] = {}
    else:
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        target, defaults = dsn, {"schema": schema}

    def make(**options: Any) -> Any:
        store = agentwal.open(target, durability="none", **{**defaults, **options})
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        store.close()


@pytest.fixture(params=sorted(KINDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    kind = KINDS[request.param]
    b = kind.open_backend(str(tmp_path), **{f: request.getfixturevalue(f) for f in kind.fixtures})
    yield b
    b.close()
