"""Tier enospc: a child under RLIMIT_FSIZE commits until the disk is "full".

Default: every place of ``ENOSPC_PLACES`` (first segment, LMDB's files,
rotation in sync and async mode, a segment sized for one big value, a
background fold growing past the limit or starting at it, the fold in
``close()``) for two seeds: 16 cases.
``AGENTWAL_TORTURE_SECONDS`` adds seeds while time remains.

A file-size limit fails writes with ``EFBIG``, not ``ENOSPC``; the tier accepts
``DiskFullError`` or ``DurabilityError`` in the child and requires in both
cases that nothing acknowledged is lost and that the store takes commits
again once the limit is gone. The strict tests below require
``DiskFullError`` (the store keeps working in the same process) wherever the
errno says "no space for this write" (``ENOSPC``, ``EDQUOT``, ``EFBIG``),
as the engine does since it maps all three to a full disk.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

import agentwal
from agentwal.io import OsFileSystem
from agentwal.testing.proc import ENOSPC_PLACES, enospc_case, enospc_cases
from agentwal.testing.tiers import Result
from agentwal.testing.workload import Oracle, Workload, drive, read_all

SECONDS = float(os.environ.get("AGENTWAL_TORTURE_SECONDS", "0"))
SEEDS = 2

def failures(results: list[Result]) -> list[str]:
    return [f"{r.line()}  [{r.repro}]" for r in results if not r.ok]


def test_full_disk_at_every_place_loses_nothing(tmp_path: Path) -> None:
    results: list[Result] = []
    deadline = time.monotonic() + SECONDS * 0.8
    n = 0
    while n < SEEDS or time.monotonic() < deadline:
        results.extend(enospc_cases(str(tmp_path), f"e{n}", seeds=1))
        n += 1
    assert not failures(results), failures(results)
    assert len(results) >= 5
    assert {r.case.split("/")[0] for r in results} == set(ENOSPC_PLACES)


# Regression: EFBIG/EDQUOT used to stop the writer (DurabilityError) instead of
# being a full disk (DiskFullError, nothing acknowledged, the store keeps working).
@pytest.mark.parametrize("place", ["create-segment", "rotation", "big-value"])
def test_file_size_limit_on_the_wal_is_disk_full(tmp_path: Path, place: str) -> None:
    result = enospc_case(str(tmp_path), "strict", place, strict=True)
    assert result.ok, result.line()


def test_file_size_limit_on_lmdb_is_disk_full(tmp_path: Path) -> None:
    result = enospc_case(str(tmp_path), "strict", "create-lmdb", strict=True)
    assert result.ok, result.line()


class _FullDisk(OsFileSystem):
    """The OS file system, except that new segments fail with ``code`` while ``full``."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.full = False

    def pwrite(self, fd: int, offset: int, data: bytes) -> int:
        if self.full and os.readlink(f"/proc/self/fd/{fd}").endswith(".wal.tmp"):
            raise OSError(self.code, os.strerror(self.code))
        return super().pwrite(fd, offset, data)


def _fill_and_recover(path: str, code: int) -> None:
    """Commit until a new segment fails with ``code``; lift it; commit; reopen and judge."""
    w = Workload("full", big=0.0)
    fs = _FullDisk(code)
    acked = 0
    store = agentwal.open(path, fs=fs, segment_bytes=4096, wal_max_bytes=1 << 20)
    try:
        acked = drive(store, w, 0, 5)
        fs.full = True
        i = 5
        with pytest.raises(agentwal.DiskFullError):
            while True:
                acked += drive(store, w, i, 1)
                i += 1
        fs.full = False
        acked += drive(store, w, i, 4)  # the store keeps working once space returns
    finally:
        store.close()
    with agentwal.open(path) as again:
        states, history = read_all(again, w.runs)
    verdict = Oracle(w).check(states, history, acked, False)
    assert verdict.ok, verdict


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("code", [
    pytest.param(errno.ENOSPC, id="ENOSPC"),
    pytest.param(errno.EDQUOT, id="EDQUOT"),
    pytest.param(errno.EFBIG, id="EFBIG"),
])
def test_no_space_errnos_are_disk_full_and_the_store_recovers(path: str, code: int) -> None:
    _fill_and_recover(path, code)
