"""The fault-injection harness (torture) and the showcase (demo)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from .app import main
from .common import (
    console,
    emit,
    examples,
    json_option,
    reports_errors,
    table,
)

# -- torture ----------------------------------------------------------------------------

TIERS = ("sim", "sweep", "kill", "enospc", "corrupt")


def _seeds(seed: str) -> Iterator[str]:
    """The given seed first (so a printed seed reproduces its case), then derived ones."""
    yield seed
    n = 1
    while True:
        yield f"{seed}-{n}"
        n += 1


def _tier_runner(tier: str, directory: str, seed: str, opts: dict[str, Any],
                 deadline: float) -> Iterator[Any]:
    """Results of one tier until ``deadline`` (or, for ``--count``, until that many)."""
    from ..testing import corrupt, proc, tiers

    def until_deadline() -> Iterator[str]:
        for s in _seeds(seed):
            if time.monotonic() >= deadline:
                return
            yield s

    if tier == "sim":
        for s in until_deadline():
            for m in ([opts["model"]] if opts["model"] else tiers.MODELS):
                yield from tiers.power_cut_rounds(directory, s, m, durability=opts["durability"])
    elif tier == "sweep":
        for s in until_deadline():
            yield from tiers.sweep(directory, s)
    elif tier == "kill":
        for s in until_deadline():
            yield from proc.kill_rounds(directory, s, durability=opts["durability"],
                                        deadline=deadline)
    elif tier == "enospc":
        places = [opts["case"]] if opts["case"] else list(proc.ENOSPC_PLACES)
        for s in until_deadline():
            for place in places:
                yield proc.enospc_case(directory, s, place)
    elif tier == "corrupt":
        kinds = {"checked": corrupt.CHECKED_KINDS, "structural": corrupt.LMDB_STRUCTURAL_KINDS,
                 "all": corrupt.DAMAGE_KINDS}[opts["kinds"]]
        if opts["count"]:
            yield from corrupt.corrupt_cases(directory, seed, count=opts["count"], kinds=kinds)
        else:
            yield from corrupt.corrupt_cases(directory, seed, count=1, deadline=deadline,
                                             kinds=kinds)


@main.command(epilog=examples("agentwal torture /mnt/ssd/torture --seconds 600",
                              "agentwal torture /tmp/t --tier kill --seed 7 --seconds 30",
                              "agentwal torture /tmp/t --seconds 60 --json | jq .failed"))
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--seconds", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="How long to run, shared equally between the chosen tiers.")
@click.option("--seed", default="1", show_default=True,
              help="Seed of each tier's first case; later cases append -1, -2... to it.")
@click.option("--tier", "tiers", type=click.Choice([*TIERS, "all"]), multiple=True,
              default=("all",), show_default=True, help="Which tiers to run (repeatable).")
@click.option("--model", type=click.Choice(["strict", "prefix", "reorder"]), default=None,
              help="sim: only this power-cut model.")
@click.option("--durability", type=click.Choice(["sync", "async", "none"]), default="sync",
              show_default=True, help="sim and kill: the store's durability mode.")
@click.option("--case", default=None, help="enospc: only this place (e.g. rotation, fold).")
@click.option("--kinds", type=click.Choice(["checked", "structural", "all"]), default="checked",
              show_default=True, help="corrupt: which damage kinds.")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="corrupt: run exactly this many cases (reproduces case COUNT-1).")
@json_option
@reports_errors
def torture(directory: str, seconds: float, seed: str, tiers: tuple[str, ...],
            model: str | None, durability: str, case: str | None, kinds: str,
            count: int | None, as_json: bool) -> None:
    """Run the fault-injection harness against DIRECTORY (on the disk you want to test).

    \b
    Tiers:
      sim      simulated power cuts (strict, prefix, reorder), several rounds per seed
      sweep    a power cut before every I/O operation of a five-commit workload
      kill     SIGKILL a child after an ack, inside a commit, at random, in recovery
      enospc   a child under a file-size limit commits until the disk is "full"
      corrupt  damaged copies of stores (WAL, LMDB, CONTROL) opened in a child

    Every case is seeded and judged by an oracle; a failure prints its seed and
    a command that reproduces it. Ends with a table per tier and a last line
    "N passed, M failed"; exits 1 if any case failed. With --json the end is
    one document: {"passed", "failed", "tiers": {tier: {"passed", "failed"}},
    "results": [{"tier", "case", "seed", "ok", "detail", "repro"}]}.
    """
    from ..testing import proc

    if case is not None and case not in proc.ENOSPC_PLACES:
        raise click.BadParameter(f"choose from {', '.join(proc.ENOSPC_PLACES)}",
                                 param_hint="--case")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    chosen = list(TIERS) if "all" in tiers else list(dict.fromkeys(tiers))
    opts = {"model": model, "durability": durability, "case": case, "kinds": kinds,
            "count": count}
    share = seconds / len(chosen)
    results: list[Any] = []
    started = time.monotonic()
    err = console(err=True)
    with Progress(TextColumn("torture {task.description}"), BarColumn(), TextColumn(
            "{task.fields[cases]} case(s)"), TimeRemainingColumn(), console=err,
            disable=not err.is_terminal) as bar:
        task = bar.add_task("", total=seconds, cases=0)
        for i, tier in enumerate(chosen):
            deadline = started + share * (i + 1)
            bar.update(task, description=tier)
            for result in _tier_runner(tier, directory, seed, opts, deadline):
                results.append(result)
                if not result.ok:
                    bar.console.print(f"{result.line()}\n  seed {result.seed}; reproduce: "
                                      f"{result.repro.replace('DIR', directory)}")
                bar.update(task, completed=min(seconds, time.monotonic() - started),
                           cases=len(results))
        bar.update(task, completed=seconds)
    summary = _summary(results, directory)
    emit(as_json, summary, lambda: _print_summary(summary))
    if summary["failed"]:
        sys.exit(1)


def _summary(results: list[Any], directory: str) -> dict[str, Any]:
    tiers: dict[str, dict[str, int]] = {}
    for r in results:
        counts = tiers.setdefault(r.tier, {"passed": 0, "failed": 0})
        counts["passed" if r.ok else "failed"] += 1
    return {"passed": sum(c["passed"] for c in tiers.values()),
            "failed": sum(c["failed"] for c in tiers.values()), "tiers": tiers,
            "results": [{"tier": r.tier, "case": r.case, "seed": r.seed, "ok": r.ok,
                         "detail": r.detail, "repro": r.repro.replace("DIR", directory)}
                        for r in results]}


def _print_summary(summary: dict[str, Any]) -> None:
    table([(t, c["passed"], c["failed"]) for t, c in summary["tiers"].items()],
          ("tier", "passed", "failed"))
    click.echo(f"{summary['passed']} passed, {summary['failed']} failed")


@main.command(epilog=examples("agentwal demo", "agentwal demo /tmp/demo.awal"))
@click.argument("path", default="demo.awal", type=click.Path(file_okay=False))
def demo(path: str) -> None:
    """Run the showcase: an agent killed with SIGKILL resumes from its last checkpoint.

    PATH (default demo.awal) is deleted and recreated.
    """
    from ..demo import main as demo_main

    sys.exit(demo_main([path]))
