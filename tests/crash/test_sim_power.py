"""Tier 1: simulated power cuts (strict, prefix, reorder) and the exhaustive sweep.

Default: 25 seeds x 3 models x 4 rounds = 300 judged power cuts in sync mode,
plus async rounds and a cut before every I/O operation of a 5-commit
workload. ``AGENTWAL_TORTURE_SECONDS`` turns the seed loop into a timed run.
The broken-variant tests prove the harness fails when a guarantee is removed.
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path
from typing import Any

import pytest

from agentwal.testing import SimulatedDisk, split_commits
from agentwal.testing.tiers import MODELS, Result, power_cut_rounds, sweep

SEEDS = 25
SECONDS = float(os.environ.get("AGENTWAL_TORTURE_SECONDS", "0"))


def failures(results: list[Result]) -> list[str]:
    return [r.line() for r in results if not r.ok]


@pytest.mark.parametrize("model", MODELS)
def test_power_cut_rounds_sync(tmp_path: Path, model: str) -> None:
    results: list[Result] = []
    deadline = time.monotonic() + SECONDS / 6
    seed = 0
    while seed < SEEDS or time.monotonic() < deadline:
        results.extend(power_cut_rounds(str(tmp_path), f"p{seed}", model, rounds=4))
        seed += 1
    assert not failures(results), failures(results)
    assert len(results) >= SEEDS * 4


def _every_model(tmp_path: Path, prefix: str, seeds: int, rounds: int,
                 **options: Any) -> list[Result]:
    """Power-cut rounds of ``seeds`` seeds under every crash model; none may fail."""
    results: list[Result] = []
    for seed in range(seeds):
        for model in MODELS:
            results.extend(power_cut_rounds(str(tmp_path), f"{prefix}{seed}", model,
                                            rounds=rounds, **options))
    assert not failures(results), failures(results)
    return results


@pytest.mark.parametrize("durability", ["async", "none"])
def test_power_cut_rounds_async_and_none_keep_a_prefix(tmp_path: Path, durability: str) -> None:
    _every_model(tmp_path, "a", 6, 3, durability=durability)


def test_exhaustive_sweep_of_a_five_commit_workload(tmp_path: Path) -> None:
    results = list(sweep(str(tmp_path), commits=5))
    assert not failures(results), failures(results)
    ops = {r.case.split("/")[1] for r in results}
    assert len(ops) >= 15  # every I/O operation index, from store creation on
    assert len(results) == len(ops) * len(MODELS)


# -- append records: a commit that logs only what it appended to a list --------------


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_power_cut_rounds_with_append_records(tmp_path: Path, durability: str) -> None:
    # Most operations grow their run's list (txn.append, or a re-put of the list read):
    # a cut lands between an append record and its base, or after a fold took the base.
    results = _every_model(tmp_path, "d", 8, 4, durability=durability, appends=0.8)
    assert len(results) == 8 * len(MODELS) * 4


def test_exhaustive_sweep_of_a_workload_of_append_records(tmp_path: Path) -> None:
    results = list(sweep(str(tmp_path), "sweep-appends", commits=5, appends=1.0))
    assert not failures(results), failures(results)
    assert len({r.case.split("/")[1] for r in results}) >= 15


# -- the harness can fail: deliberately broken engines ------------------------------


class _Proxy:
    """Forwards the FileSystem protocol to a SimulatedDisk, minus one guarantee.

    ``drop="wal_fsync"`` skips the commit path's fsyncs of WAL segments (a
    segment's first fsync, its preallocation, still happens, as does the
    control file's); ``drop="fsync_dir"`` skips every directory fsync.
    """

    def __init__(self, disk: SimulatedDisk, drop: str) -> None:
        self._disk = disk
        self._drop = drop
        self._paths: dict[int, str] = {}

    def open(self, path: str, create: bool = True) -> int:
        fd = self._disk.open(path, create)
        self._paths[fd] = path
        return fd

    def fsync(self, fd: int) -> None:
        path = self._paths.get(fd, "")
        if self._drop == "wal_fsync" and "/wal/" in path and not path.endswith(".tmp"):
            return
        self._disk.fsync(fd)

    def __getattr__(self, name: str) -> Any:
        if name == self._drop:
            return lambda *a, **k: None
        return getattr(self._disk, name)


def _classes(results: list[Result]) -> collections.Counter[str]:
    return collections.Counter(r.detail.split(":")[0] for r in results if not r.ok)


def _run_broken(tmp_path: Path, **hooks: Any) -> list[Result]:
    results: list[Result] = []
    for seed in range(8):
        results.extend(power_cut_rounds(str(tmp_path), f"b{seed}", "strict", rounds=3, **hooks))
    return results


def test_harness_catches_a_missing_wal_fsync(tmp_path: Path) -> None:
    results = _run_broken(tmp_path, fs_hook=lambda d: _Proxy(d, "wal_fsync"))
    assert "lost_ack" in _classes(results), _classes(results)


def test_harness_catches_a_missing_directory_fsync(tmp_path: Path) -> None:
    results = _run_broken(tmp_path, fs_hook=lambda d: _Proxy(d, "fsync_dir"))
    assert "lost_ack" in _classes(results), _classes(results)


def test_harness_catches_a_non_atomic_commit(tmp_path: Path) -> None:
    results = _run_broken(tmp_path, store_hook=split_commits)
    assert "partial_transaction" in _classes(results), _classes(results)
