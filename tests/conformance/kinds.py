"""The backends the conformance suites run against, at both levels (today: the embedded one).

Each kind opens a store two ways: the facade (``agentwal.Store``, driven by the
store-against-a-dict state machines in ``tests/property/test_store_model.py``) and
the ``backend.Backend`` Protocol (``tests/conformance/test_backend.py``). A new
backend adds one entry to :data:`KINDS`; both suites then run against it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import agentwal
from agentwal.local.backend import LocalBackend
from agentwal.testing import crash


@dataclass(frozen=True)
class Kind:
    """How to open a fresh store of one backend."""

    name: str
    #: ``open_store(path, **options)``: the facade over the store at ``path``
    open_store: Callable[..., agentwal.Store]
    #: ``open_backend(directory)``: a fresh, empty store in ``directory`` as a Backend
    open_backend: Callable[[str], Any]
    #: what ``testing.crash`` does to a store of this kind, or None (no in-process crash)
    crash: Callable[[agentwal.Store], None] | None = None


def _local_backend(directory: str) -> Any:
    return LocalBackend(agentwal.open(os.path.join(directory, "store.awal"),
                                      durability="none")._engine)


KINDS: dict[str, Kind] = {
    "local": Kind("local", agentwal.open, _local_backend, crash),
}
