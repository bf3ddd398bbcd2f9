"""What an effect costs: a step with one ``txn.effect`` against the same step without.

An effect makes two extra durable records (the intent before the call, the
outcome after it), each fsynced whatever the store's durability mode, so in
``sync`` mode a step with one effect makes three fdatasyncs instead of one, and
in ``none`` mode two instead of none. The recorded replay (a step re-run from
the same checkpoint, which gets the result without a call) costs one lookup.

``python bench/test_bench_effects.py`` prints the figures side by side (steps
per second, medians of several rounds, measured in one process);
``pytest bench/test_bench_effects.py --benchmark-only`` runs them under
pytest-benchmark.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import pytest

import agentwal


def _step(store: agentwal.Store, with_effect: bool, commit: bool = True) -> None:
    with store.begin("run-1") as txn:
        if with_effect:
            txn["r"] = txn.effect("call-tool", lambda ctx: {"ok": True}, mode="at_least_once",
                                  args={"q": "weather"})
        txn["step"] = txn.get("step", 0) + 1
        if not commit:
            txn.rollback()


@pytest.mark.parametrize("durability", ["sync", "none"])
@pytest.mark.parametrize("with_effect", [False, True], ids=["plain", "effect"])
def test_step(benchmark, scratch, durability, with_effect):
    store = agentwal.open(os.path.join(scratch, "s.awal"), durability=durability)
    try:
        benchmark.extra_info.update(durability=durability, with_effect=with_effect)
        benchmark(_step, store, with_effect)
    finally:
        store.close()


def test_recorded_replay(benchmark, scratch):
    """A step re-run from the same checkpoint: the recorded result, no call, no record."""
    store = agentwal.open(os.path.join(scratch, "s.awal"))
    try:
        _step(store, True, commit=False)
        benchmark(_step, store, True, False)
    finally:
        store.close()


def _rate(fn: Callable[..., None], seconds: float, *args: object) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(*args)
        n += 1
    return n / (time.perf_counter() - start)


def main(rounds: int = 5, seconds: float = 1.0) -> int:
    rows = []
    for durability in ("sync", "none"):
        rates: dict[str, list[float]] = {"plain": [], "effect": []}
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(rounds):
                for kind in ("plain", "effect"):
                    store = agentwal.open(os.path.join(tmp, f"{kind}{i}"), durability=durability)
                    try:
                        rates[kind].append(_rate(_step, seconds, store, kind == "effect"))
                    finally:
                        store.close()
        plain, eff = statistics.median(rates["plain"]), statistics.median(rates["effect"])
        rows.append((durability, plain, eff, eff / plain))
    with tempfile.TemporaryDirectory() as tmp:
        store = agentwal.open(os.path.join(tmp, "replay"))
        _step(store, True, commit=False)
        replay = statistics.median(_rate(_step, seconds, store, True, False)
                                   for _ in range(rounds))
        store.close()
    print(f"{'durability':<10} {'plain steps/s':>14} {'with 1 effect':>14} {'ratio':>6}")
    for d, p, e, r in rows:
        print(f"{d:<10} {p:>14,.0f} {e:>14,.0f} {r:>6.2f}")
    print(f"recorded replay (sync store, step rolled back): {replay:,.0f} steps/s")
    return 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0, help="per kind per round")
    args = ap.parse_args()
    sys.exit(main(args.rounds, args.seconds))
