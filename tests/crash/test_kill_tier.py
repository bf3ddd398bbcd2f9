"""Tier kill: SIGKILL a child running the seeded workload, recover, judge; many rounds.

Default: 4 sync stores and 2 async stores, 8 kill/recover rounds each (48 kills:
right after an acknowledgement, at a commit/rotation/fold failpoint, at a random
moment, and during recovery). ``AGENTWAL_TORTURE_SECONDS`` turns the count into
a timed run. The early-ack test proves the tier fails when an acknowledgement
is not backed by a commit.
"""

from __future__ import annotations

import collections
import os
import re
import time
from pathlib import Path

import pytest

from agentwal.testing.proc import KILL_KINDS, kill_cases, kill_rounds, parse_report
from agentwal.testing.tiers import Result

SECONDS = float(os.environ.get("AGENTWAL_TORTURE_SECONDS", "0"))


def failures(results: list[Result]) -> list[str]:
    return [f"{r.line()}  [{r.repro}]" for r in results if not r.ok]


def kind(result: Result) -> str:
    m = re.match(r"[a-z]+", result.case)
    return m.group(0) if m else ""


def run(tmp_path: Path, seed: str, durability: str, cases: int, share: float) -> list[Result]:
    """``cases`` kill rounds, or with AGENTWAL_TORTURE_SECONDS as many as ``share`` of it allows."""
    if SECONDS:
        deadline = time.monotonic() + SECONDS * share
        return list(kill_cases(str(tmp_path), seed, cases=None, deadline=deadline,
                               durabilities=(durability,)))
    return list(kill_cases(str(tmp_path), seed, cases=cases, durabilities=(durability,)))


def test_kill_rounds_sync_lose_no_acknowledged_commit(tmp_path: Path) -> None:
    results = run(tmp_path, "ks", "sync", 32, 0.6)
    assert not failures(results), failures(results)
    assert len(results) >= 32
    kinds = collections.Counter(kind(r) for r in results)
    assert set(kinds) == set(KILL_KINDS), kinds
    assert min(kinds.values()) >= 8, kinds
    points = {r.case.split("@")[1].split("#")[0] for r in results if kind(r) == "commit"}
    assert len(points) >= 5, points  # the seeds spread kills over many failpoints


def test_kill_rounds_async_keep_what_reached_the_os(tmp_path: Path) -> None:
    results = run(tmp_path, "ka", "async", 16, 0.3)
    assert not failures(results), failures(results)
    assert len(results) >= 16
    assert {kind(r) for r in results} == set(KILL_KINDS)


def test_a_line_cut_short_by_the_kill_is_no_acknowledgement() -> None:
    rep = parse_report(b"READY\nACK 0\nACK 2\nACK 3", returncode=-9)
    assert rep.acks() == [0, 2]
    assert rep.garbled == 1
    assert parse_report(b"READY\nACK 0\nACK\nAC 4\nACK x\n").acks() == [0]
    assert parse_report(b"").acks() == []
    rep = parse_report(b"ACK 1\nERR 2 DiskFullError disk_full wal\nLIFTED\nACK 2\n")
    assert rep.acks() == [1, 2] and rep.acks(after="LIFTED") == [2]
    assert rep.first("ERR") == ("ERR", "2", "DiskFullError", "disk_full", "wal")


def test_harness_catches_an_acknowledgement_before_the_commit(tmp_path: Path) -> None:
    """A child that prints ACK before committing, killed at commit/fold failpoints."""
    results: list[Result] = []
    for seed in range(4):
        results.extend(kill_rounds(str(tmp_path), f"early{seed}", kinds=("commit",), rounds=6,
                                   ack_early=True))
    classes = collections.Counter(r.detail.split(":")[0] for r in results if not r.ok)
    assert "lost_ack" in classes, [r.line() for r in results]


def test_kill_cases_need_a_bound(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        next(kill_cases(str(tmp_path), 1, cases=None, deadline=None))
