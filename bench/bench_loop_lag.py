#!/usr/bin/env python3
"""How late an asyncio event loop runs while a task commits: ``commit()`` vs ``acommit()``.

Usage::

    .venv/bin/python bench/bench_loop_lag.py                  # 5 rounds of 2 s per variant
    .venv/bin/python bench/bench_loop_lag.py --rounds 3 --seconds 1 --tasks 4

One store with ``durability="sync"`` (every commit waits for its fdatasync)
on a real disk (``benchlib.bench_root``). On one event loop, a *ticker*
task sleeps 1 ms at a time and records how late each sleep returns (its
lateness: the loop's lag as any other task would feel it), while ``--tasks``
committer tasks run a stream of one-key commits on their own runs:

- ``idle``: no committer (the floor: timer resolution and a busy machine).
- ``commit``: ``with store.begin(run) as txn: ...`` (sync ``txn.commit()``
  called on the loop; the committer yields to the loop between commits).
- ``acommit``: ``async with store.abegin(run) as txn: ...`` (the commit runs
  in the default executor).
- ``effect+commit`` / ``aeffect+acommit``: the same step with one
  ``at_least_once`` effect first (two more fdatasyncs: intent and outcome).

Variants are interleaved round by round so a change in the machine's load
hits them alike. Reported per variant: ticks, the lateness's p50, p99 and
max in milliseconds over every round's samples, and steps per second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

from benchlib import bench_root, fs_type, scratch_dir

import agentwal

Step = Callable[[agentwal.Store, str, int], Awaitable[None]]


async def _commit(store: agentwal.Store, run: str, i: int) -> None:
    with store.begin(run) as txn:
        txn["step"] = i
    await asyncio.sleep(0)  # a step yields to the loop between commits, as agents do


async def _acommit(store: agentwal.Store, run: str, i: int) -> None:
    async with store.abegin(run) as txn:
        txn["step"] = i


async def _effect(store: agentwal.Store, run: str, i: int) -> None:
    with store.begin(run) as txn:
        txn["r"] = txn.effect("tool", lambda ctx: {"ok": True}, mode="at_least_once",
                              args={"i": i})
        txn["step"] = i
    await asyncio.sleep(0)


async def _aeffect(store: agentwal.Store, run: str, i: int) -> None:
    async def tool(ctx: agentwal.EffectContext) -> dict[str, bool]:
        return {"ok": True}

    async with store.abegin(run) as txn:
        txn["r"] = await txn.aeffect("tool", tool, mode="at_least_once", args={"i": i})
        txn["step"] = i


VARIANTS: dict[str, Step | None] = {
    "idle": None,
    "commit": _commit,
    "acommit": _acommit,
    "effect+commit": _effect,
    "aeffect+acommit": _aeffect,
}


async def _slice(store: agentwal.Store, step: Step | None, seconds: float, tasks: int,
                 tag: str) -> tuple[list[float], int]:
    """Run the ticker (and ``tasks`` committers) for ``seconds``: (lateness samples, steps)."""
    stop = time.perf_counter() + seconds
    late: list[float] = []
    steps = 0

    async def ticker() -> None:
        while time.perf_counter() < stop:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            late.append(time.perf_counter() - t - 0.001)

    async def committer(k: int) -> None:
        nonlocal steps
        i = 0
        while time.perf_counter() < stop:
            assert step is not None
            await step(store, f"{tag}-{k}", i)
            i += 1
            steps += 1

    await asyncio.gather(ticker(), *(committer(k) for k in range(tasks if step else 0)))
    return late, steps


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="per variant per round")
    ap.add_argument("--tasks", type=int, default=1, help="committer tasks per variant")
    args = ap.parse_args(argv)

    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    steps = dict.fromkeys(VARIANTS, 0)
    with scratch_dir() as d:
        store = agentwal.open(os.path.join(d, "lag.awal"), durability="sync")
        try:
            for r in range(args.rounds):
                for name, step in VARIANTS.items():
                    late, n = asyncio.run(_slice(store, step, args.seconds, args.tasks,
                                                 f"{name}-{r}"))
                    samples[name] += late
                    steps[name] += n
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            store.close()

    total = args.rounds * args.seconds
    print(f"agentwal loop lag: {args.rounds} rounds x {args.seconds:g} s per variant, "
          f"{args.tasks} committer task(s), durability=sync, {fs_type(bench_root())} at "
          f"{bench_root()}, CPython {platform.python_version()}, {os.cpu_count()} CPUs")
    print()
    print("| variant | ticks | lateness p50 ms | p99 ms | max ms | steps/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in VARIANTS:
        xs = [max(0.0, x) * 1000 for x in samples[name]]
        print(f"| {name} | {len(xs):,} | {statistics.median(xs):.2f} | {_pct(xs, 0.99):.2f} "
              f"| {max(xs):.2f} | {steps[name] / total:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
