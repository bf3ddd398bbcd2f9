"""verify() and backup(): how long they take on the history benchmark's conversations.

The stores: ``runs`` copies of the 200-step conversation of
``test_bench_history.py`` (each step appends a ~1 KiB message to a list put
whole, and sets three small keys), folded. ``verify()`` reads every LMDB
entry and rehashes every delta ever committed (each step's delta holds the
whole list, so a 200-step run's deltas add up to ~20 MB of value bytes);
``backup()`` copies the files (LMDB compacted by ``env.copy``).

Run as a script for the figures (``python bench/test_bench_verify.py``) or
with pytest-benchmark (``pytest bench/test_bench_verify.py --benchmark-only``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Any

import pytest
from test_bench_history import conversation

import agentwal


def stores(path: str, runs: int, steps: int = 200) -> agentwal.Store:
    """``runs`` conversations of ``steps`` steps in one store (copies of one, renamed)."""
    store, _ = conversation(path, marks=(), steps=steps)
    for i in range(1, runs):
        store.fork("chat", steps, f"chat-{i}")  # a run whose first checkpoint is the whole chat
        for step in range(1, steps):
            with store.begin(f"chat-{i}") as txn:
                txn["step"] = step
                txn["messages"] = [*txn["messages"], {"role": "user", "step": step,
                                                      "content": f"more {i}/{step} " * 80}]
    store.snapshot()
    return store


@pytest.fixture(scope="module")
def chat(module_scratch: str) -> Any:
    store = stores(os.path.join(module_scratch, "chat.awal"), 1)
    yield store
    store.close()


def test_verify(benchmark: Any, chat: agentwal.Store) -> None:
    report = benchmark(chat.verify)
    assert report.ok


def test_backup(benchmark: Any, chat: agentwal.Store, module_scratch: str) -> None:
    n = iter(range(1_000_000))

    def once() -> None:
        chat.backup(os.path.join(module_scratch, f"b{next(n)}"))

    benchmark.pedantic(once, rounds=5, iterations=1)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from benchlib import bench_root, fs_type

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    steps = ap.parse_args(argv).steps
    if steps < 2:
        ap.error("--steps must be at least 2")
    root = tempfile.mkdtemp(prefix="agentwal-bench-", dir=bench_root())
    try:
        print(f"dir: {root} ({fs_type(root)})")
        print("runs  checkpoints  lmdb bytes  verify s  hashed/s  backup s  backup bytes")
        for runs in (1, 4):
            store = stores(os.path.join(root, f"s{runs}.awal"), runs, steps)
            t0 = time.perf_counter()
            report = store.verify()
            tv = time.perf_counter() - t0
            assert report.ok, report.problems
            t0 = time.perf_counter()
            b = store.backup(os.path.join(root, f"b{runs}"))
            tb = time.perf_counter() - t0
            st = store.stats()
            print(f"{runs:4d}  {report.checked['checkpoints']:11d}  {st['lmdb_bytes']:10d}  "
                  f"{tv:8.3f}  {report.checked['hashes'] / tv:8.0f}  {tb:8.3f}  "
                  f"{b.bytes:12d}")
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
