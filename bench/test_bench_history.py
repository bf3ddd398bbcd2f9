"""History: bytes on disk per checkpoint and ``state(at=)`` latency for a conversation.

The workload (DESIGN.md's issue #5 benchmark): one run, 200 steps; each step
appends one ~1 KiB message to the ``messages`` list (the whole list is put
under one key, as agents do) and sets a few small keys. Storing the whole
list at every step would cost about 100 KiB per checkpoint on average
(126 KiB at step 200); history shares the list's elements between versions.

Bytes on disk: after ``snapshot()`` at steps 50, 100 and 200 (the WAL is
then folded and its records dropped), the size of ``snapshot/data.mdb``
divided by the number of checkpoints. The WAL's preallocated segment files
are reported separately: they are a fixed cost (``segment_bytes`` each), not
history. Goal: at most 4 KiB per checkpoint at step 200.

Latency: ``state(run, at=50)`` and ``state(run, at=199)`` (rebuilt from a
manifest, deltas and shared objects) against ``state(run)`` of the head (the
``state`` database's fast path). Goal: within 3x.

Run as a script for the figures (``python bench/test_bench_history.py``) or
with pytest-benchmark (``pytest bench/test_bench_history.py --benchmark-only``).
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import timeit
from typing import Any

import pytest

import agentwal

STEPS = 200
MESSAGE_BYTES = 1024
MARKS = (50, 100, 200)
WAL_MAX = 4 << 20
_WORDS = ["agent", "tool", "call", "result", "plan", "step", "search", "answer", "user",
          "assistant", "memory", "state", "retry", "error", "value", "commit", "checkpoint",
          "model", "token", "budget", "context", "window"]


def message(rng: random.Random, step: int) -> dict[str, Any]:
    """A chat message whose encoding is about :data:`MESSAGE_BYTES` bytes."""
    words: list[str] = []
    size = 0
    while size < MESSAGE_BYTES - 60:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return {"role": "assistant" if step % 2 else "user", "step": step,
            "content": " ".join(words)}


def conversation(path: str, *, marks: tuple[int, ...] = MARKS,
                 steps: int = STEPS) -> tuple[agentwal.Store, dict[int, dict[str, int]]]:
    """Build the 200-step run in ``path``; returns the open store and sizes at each mark."""
    rng = random.Random(5)
    store = agentwal.open(path, durability="none", wal_max_bytes=WAL_MAX)
    messages: list[dict[str, Any]] = []
    sizes: dict[int, dict[str, int]] = {}
    for step in range(1, steps + 1):
        messages.append(message(rng, step))
        with store.begin("chat") as txn:
            txn["messages"] = messages
            txn["step"] = step
            txn["tokens"] = step * 250
            txn["last_tool"] = rng.choice(_WORDS)
        if step in marks:
            store.snapshot()
            st = store.stats()
            data = os.path.join(path, "snapshot", "data.mdb")
            sizes[step] = {"lmdb_file": os.path.getsize(data),
                           "lmdb_used": (st["lmdb_last_page"] + 1) * st["lmdb_page_size"],
                           "wal_files": st["wal_bytes"],
                           "whole_list": len(agentwal.codec.encode_value("m", messages))}
    return store, sizes


def best(fn: Any, number: int = 20, repeat: int = 7) -> float:
    """Best time of one call, in seconds."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


@pytest.fixture(scope="module")
def chat(module_scratch: str) -> Any:
    store, _sizes = conversation(os.path.join(module_scratch, "chat.awal"))
    yield store
    store.close()


@pytest.mark.parametrize("at", [None, 50, 199], ids=["head", "at-50", "at-199"])
def test_state_at(benchmark: Any, chat: agentwal.Store, at: int | None) -> None:
    benchmark.extra_info["at"] = at
    state = benchmark(chat.state, "chat", at=at)
    assert len(state["messages"]) == (at or STEPS)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from benchlib import bench_root, fs_type

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=STEPS, help=f"conversation steps (default "
                    f"{STEPS}; the sizes are taken at steps 50, 100 and 200 when reached)")
    steps = ap.parse_args(argv).steps
    if steps < 2:
        ap.error("--steps must be at least 2")
    marks = tuple(m for m in MARKS if m <= steps) or (steps,)
    root = tempfile.mkdtemp(prefix="agentwal-bench-", dir=bench_root())
    try:
        store, sizes = conversation(os.path.join(root, "chat.awal"), marks=marks, steps=steps)
        print(f"dir: {root} ({fs_type(root)}); {steps} steps, ~{MESSAGE_BYTES} B messages, "
              f"wal_max_bytes={WAL_MAX}")
        print("step  lmdb file  per ckpt  lmdb used  per ckpt  whole list  wal files")
        for step, s in sorted(sizes.items()):
            print(f"{step:4d}  {s['lmdb_file']:9d}  {s['lmdb_file'] / step / 1024:6.2f}K  "
                  f"{s['lmdb_used']:9d}  {s['lmdb_used'] / step / 1024:6.2f}K  "
                  f"{s['whole_list']:10d}  {s['wal_files']:9d}")
        head = best(lambda: store.state("chat"))
        print(f"state() head:        {head * 1e3:8.3f} ms")
        for at in sorted({1, min(50, steps - 1), steps - 1}):
            t = best(lambda at=at: store.state("chat", at=at))
            print(f"state(at={at:3d}):       {t * 1e3:8.3f} ms  ({t / head:.2f}x head)")
        at = min(50, steps - 1)
        t = best(lambda: store.get("chat", "step", at=at), number=200)
        print(f"get(at={at}) one key:  {t * 1e3:8.3f} ms")
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
