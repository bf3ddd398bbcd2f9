"""Fixtures for the pytest-benchmark files: scratch stores on a real disk.

Run with ``.venv/bin/python -m pytest bench --benchmark-only`` (``make bench``).
``make test`` runs ``pytest tests`` and never collects this directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from benchlib import bench_root, fs_type


def pytest_report_header(config: pytest.Config) -> str:
    root = bench_root()
    return f"agentwal bench dir: {root} ({fs_type(root)}); cpus: {os.cpu_count()}"


@pytest.fixture
def scratch() -> Iterator[str]:
    """A fresh directory on the benchmark disk, removed after the test."""
    d = tempfile.mkdtemp(prefix="agentwal-bench-", dir=bench_root())
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def module_scratch() -> Iterator[str]:
    """A directory shared by one module's tests (for stores that are slow to build)."""
    d = tempfile.mkdtemp(prefix="agentwal-bench-", dir=bench_root())
    yield d
    shutil.rmtree(d, ignore_errors=True)
