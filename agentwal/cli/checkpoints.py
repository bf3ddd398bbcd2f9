"""Commands over a run's history: diff, rollback, fork."""

from __future__ import annotations

import json
from typing import Any

import click

from .app import main
from .common import (
    checkpoint_row,
    checkpoint_table,
    emit,
    json_option,
    jsonable,
    open_ro,
    open_rw,
    reports_errors,
    store_argument,
)

# -- history: diff, rollback, fork ----------------------------------------------------------


@main.command()
@store_argument
@click.argument("run")
@click.argument("a", type=click.IntRange(min=1), metavar="A")
@click.argument("b", type=click.IntRange(min=1), metavar="B")
@json_option
@reports_errors
def diff(path: str, run: str, a: int, b: int, as_json: bool) -> None:
    """Show what changed in RUN from checkpoint A to checkpoint B.

    Keys added (+), removed (-) and changed (~, old -> new), values as JSON.
    A may be newer than B: the diff then reads backwards. Exits 0 whether or
    not anything changed; 1 if the run or a checkpoint does not exist.
    """
    with open_ro(path) as store:
        d = store.diff(run, a, b)
    data = {"added": d.added, "removed": d.removed,
            "changed": {k: {"from": old, "to": new} for k, (old, new) in d.changed.items()}}

    def human() -> None:
        def js(v: Any) -> str:
            return json.dumps(jsonable(v), sort_keys=True)

        for k, v in d.added.items():
            click.echo(f"+ {k}: {js(v)}")
        for k, v in d.removed.items():
            click.echo(f"- {k}: {js(v)}")
        for k, (old, new) in d.changed.items():
            click.echo(f"~ {k}: {js(old)} -> {js(new)}")
        if not d:
            click.echo(f"no change from checkpoint {a} to {b}")

    emit(as_json, data, human)


@main.command()
@store_argument
@click.argument("run")
@click.argument("checkpoint", type=click.IntRange(min=1), metavar="ID")
@json_option
@reports_errors
def rollback(path: str, run: str, checkpoint: int, as_json: bool) -> None:
    """Make a new checkpoint of RUN whose state equals its state at checkpoint ID.

    History is kept: the new checkpoint's parent is the old head and its
    metadata is {"rollback_to": ID}. Prints the new checkpoint. Opens the
    store for writing, so it fails with store_locked while an agent has it
    open (call store.rollback_to from that process instead).
    """
    with open_rw(path) as store:
        c = store.rollback_to(run, checkpoint)
    row = checkpoint_row(c)
    emit(as_json, row, lambda: checkpoint_table([row]))


@main.command()
@store_argument
@click.argument("run")
@click.argument("checkpoint", type=click.IntRange(min=1), metavar="ID")
@click.argument("new_run")
@json_option
@reports_errors
def fork(path: str, run: str, checkpoint: int, new_run: str, as_json: bool) -> None:
    """Start NEW_RUN from the state of RUN at checkpoint ID.

    The new run's first checkpoint has origin (RUN, ID); from then on the two
    runs are independent. Prints that checkpoint. Exits 1 with run_exists if
    NEW_RUN has a checkpoint already. Opens the store for writing, so it
    fails with store_locked while an agent has it open.
    """
    with open_rw(path) as store:
        c = store.fork(run, checkpoint, new_run)
    row = checkpoint_row(c)
    emit(as_json, row, lambda: checkpoint_table([row]))
