"""Open (recovery) time: vs. the size of the unfolded WAL, and vs. folded history.

*WAL size*: a store is built with ``wal_max_bytes`` far above the target so
nothing is folded, then released with ``testing.crash()`` (handles closed,
nothing written: a crash). Every round opens it, which replays the whole WAL,
and releases it again the same way, so each round sees the same store.

*History*: a store with 1,000 or 100,000 folded checkpoints and an empty WAL;
open time should not depend on history length (the goal: within 1.3x).

Page cache is warm (the store was just written or opened); see
``bench/compare.py --cold`` for opens after evicting the store's pages.
"""

from __future__ import annotations

import os

import pytest
from benchlib import MIB, build_history_store, build_wal_store

import agentwal
from agentwal.testing import crash

_built: dict[str, dict] = {}


def _store(root: str, name: str, build) -> str:
    path = os.path.join(root, name)
    if name not in _built:
        _built[name] = build(path)
    return path


def _time_open(benchmark, path: str, rounds: int) -> None:
    holder: list[agentwal.Store] = []

    def release() -> None:
        while holder:
            crash(holder.pop())

    def open_store() -> None:
        holder.append(agentwal.open(path))

    try:
        benchmark.pedantic(open_store, teardown=release, rounds=rounds, warmup_rounds=1)
    finally:
        release()


@pytest.mark.parametrize("wal_mib", [1, 8, 64])
def test_open_vs_wal_size(benchmark, module_scratch, wal_mib):
    path = _store(
        module_scratch, f"wal-{wal_mib}.awal", lambda p: build_wal_store(p, wal_mib * MIB)
    )
    benchmark.extra_info.update(_built[f"wal-{wal_mib}.awal"])
    _time_open(benchmark, path, rounds=20 if wal_mib < 64 else 5)


@pytest.mark.parametrize("checkpoints", [1_000, 100_000])
def test_open_vs_history(benchmark, module_scratch, checkpoints):
    path = _store(
        module_scratch, f"hist-{checkpoints}.awal", lambda p: build_history_store(p, checkpoints)
    )
    benchmark.extra_info.update(_built[f"hist-{checkpoints}.awal"])
    _time_open(benchmark, path, rounds=30)
