"""The torture tiers: each a generator of judged cases, bounded by count or time.

Theory of operation: a *case* runs the seeded :class:`~.workload.Workload`
against a real store, breaks something (a simulated power cut, a SIGKILL,
a full disk, damaged bytes), reopens the store with a fresh process or
handle, and lets the :class:`~.workload.Oracle` judge what survived. Each
tier function yields one :class:`Result` per case so that pytest modules
(``tests/crash/``), ``make torture`` and ``agentwal torture DIR`` share the
same code and the same seeds; a failing result carries the command that
reproduces it.

Tier ``sim`` (this module): the WAL and control file live on a
:class:`~.disk.SimulatedDisk` while LMDB and the lock use a real directory
(LMDB syncs every fold, so it is durable by construction); a round commits,
the power is cut at a seeded operation, and the image a ``strict``,
``prefix`` or ``reorder`` power cut leaves is recovered and judged, several
rounds per seed on the same image. :func:`sweep` cuts the power before every
single I/O operation of a short workload, one case per operation index.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .. import open as open_store
from ..errors import Error
from .disk import SimulatedCrash, SimulatedDisk
from .hooks import crash as crash_store
from .workload import Oracle, Workload, drive, read_all

__all__ = ["MODELS", "Result", "power_cut_rounds", "sim_cases", "sweep"]

MODELS = ("strict", "prefix", "reorder")

#: Store options of the simulated tiers: small segments and WAL, so rotation,
#: folds and segment removal happen within a few commits.
SIM_OPTIONS: dict[str, Any] = {"segment_bytes": 32 << 10, "wal_max_bytes": 96 << 10}


@dataclass(frozen=True)
class Result:
    """One judged case."""

    tier: str
    case: str
    seed: str
    ok: bool
    detail: str = ""
    repro: str = ""

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        return f"{mark} {self.tier:<8} {self.case:<36} {self.detail}"


def _workload(seed: str, *, big: float = 0.01, appends: float = 0.0) -> Workload:
    return Workload(seed, big=big, appends=appends)


def power_cut_rounds(base: str, seed: str, model: str, *, rounds: int = 4,
                     ops_per_round: int = 12, durability: str = "sync",
                     big: float = 0.01, fs_hook: Any = None,
                     store_hook: Any = None, appends: float = 0.0) -> Iterator[Result]:
    """Commit, cut the power at a seeded operation, recover, judge; ``rounds`` times.

    Yields one result per round (a case is ``model/seed/round``). To test the
    harness itself, ``fs_hook(disk)`` may wrap the disk the workload writes
    through, and ``store_hook(store)`` may break the store it drives.
    ``appends`` (a probability per operation) grows a list per run, so the log
    holds append records whose bases are earlier records or folded values.
    """
    rng = random.Random(f"{seed}/{model}/{durability}")
    w = _workload(seed, big=big, appends=appends)
    oracle = Oracle(w)
    path = os.path.join(base, f"sim-{model}-{durability}-{seed}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    disk = SimulatedDisk()
    commits = 0
    for rnd in range(rounds):
        case = f"{model}/{durability}/{seed}/round{rnd}"
        repro = (f"agentwal torture DIR --tier sim --seed {seed} --model {model} "
                 f"--durability {durability}")
        fs = fs_hook(disk) if fs_hook else disk
        acked, in_flight = 0, False
        try:
            store = open_store(path, fs=fs, durability=durability, **SIM_OPTIONS)
        except SimulatedCrash:
            store = None
        except Error as exc:
            yield Result("sim", case, seed, False, f"reopen failed: {exc}", repro)
            return
        if store is not None:
            if store_hook is not None:
                store_hook(store)
            disk.crash_at(disk.op_count + rng.randint(0, 3 * ops_per_round))

            def ack(_i: int) -> None:
                nonlocal acked
                acked += 1

            try:
                drive(store, w, w.resume_index(commits), ops_per_round, on_ack=ack)
            except SimulatedCrash:
                in_flight = True
            except Error as exc:  # a poisoned writer after the crash hit a sync
                in_flight = True
                if not disk.crashed:
                    yield Result("sim", case, seed, False, f"unexpected {exc!r}", repro)
                    crash_store(store)
                    return
            crash_store(store)
        disk = disk.crash_image(model, seed=rng.randrange(1 << 30))
        durable = commits if durability != "sync" else None
        verdict, recovered = _judge(path, disk, oracle, w, commits + acked, in_flight, durable,
                                    durability)
        yield Result("sim", case, seed, verdict.ok, str(verdict), repro)
        if not verdict.ok:
            return
        commits = recovered


def _judge(path: str, disk: Any, oracle: Oracle, w: Workload, acked: int, in_flight: bool,
           durable: int | None, durability: str) -> tuple[Any, int]:
    """Reopen on ``disk`` (this also repairs it), read everything, ask the oracle."""
    from .workload import Verdict

    try:
        store = open_store(path, fs=disk, durability=durability, **SIM_OPTIONS)
    except Error as exc:
        return Verdict(False, -1, "unrecoverable", f"recovery failed: {exc}"), 0
    try:
        states, history = read_all(store, w.runs)
    except Error as exc:
        crash_store(store)
        return Verdict(False, -1, "unrecoverable", f"reading failed: {exc}"), 0
    crash_store(store)
    verdict = oracle.check(states, history, acked, in_flight, durable=durable)
    return verdict, verdict.commits


def sim_cases(base: str, seed: int, *, seeds: int = 8, rounds: int = 4,
              durabilities: tuple[str, ...] = ("sync",)) -> Iterator[Result]:
    """Power-cut rounds for ``seeds`` seeds derived from ``seed``, for every model."""
    for s in range(seeds):
        for model in MODELS:
            for durability in durabilities:
                yield from power_cut_rounds(base, f"{seed}-{s}", model, rounds=rounds,
                                            durability=durability)


def _count_ops(path: str, w: Workload, commits: int) -> int:
    disk = SimulatedDisk()
    store = open_store(path, fs=disk, **SIM_OPTIONS)
    drive(store, w, 0, _ops_for(w, commits))
    crash_store(store)
    return disk.op_count


def _ops_for(w: Workload, commits: int) -> int:
    return w.commit_op(commits - 1) + 1


def sweep(base: str, seed: str = "sweep", *, commits: int = 5,
          models: tuple[str, ...] = MODELS, appends: float = 0.0) -> Iterator[Result]:
    """Cut the power before every I/O operation of a ``commits``-transaction workload.

    The workload opens a new store (so store creation is swept too) and runs
    until ``commits`` commits; one case per operation index and model.
    ``appends``: as for :func:`power_cut_rounds`.
    """
    w = _workload(seed, big=0.0, appends=appends)
    oracle = Oracle(w)
    os.makedirs(base, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="sweep-count-", dir=base)
    total = _count_ops(scratch, w, commits)
    shutil.rmtree(scratch, ignore_errors=True)
    for k in range(total):
        for model in models:
            path = os.path.join(base, f"sweep-{seed}-{model}-{k}")
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
            disk = SimulatedDisk()
            disk.crash_at(k)
            acked, in_flight = 0, True

            def ack(_i: int) -> None:
                nonlocal acked
                acked += 1

            try:
                store = open_store(path, fs=disk, **SIM_OPTIONS)
                try:
                    drive(store, w, 0, _ops_for(w, commits), on_ack=ack)
                    in_flight = False
                finally:
                    crash_store(store)
            except (SimulatedCrash, Error):
                pass
            image = disk.crash_image(model, seed=k)
            verdict, _ = _judge(path, image, oracle, w, acked, in_flight, None, "sync")
            yield Result("sweep", f"{model}/op{k}/{total}", seed, verdict.ok, str(verdict),
                         f"agentwal torture DIR --tier sweep --seed {seed}")
            shutil.rmtree(path, ignore_errors=True)
