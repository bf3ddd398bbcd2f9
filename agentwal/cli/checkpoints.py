"""Commands over a run's history: diff, rollback, fork, restore."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from ..types import TreeRef
from ..views import abbreviate, checkpoint_row, effect_row, to_json, value_changes
from .app import main
from .common import (
    checkpoint_table,
    emit,
    examples,
    json_option,
    open_ro,
    open_rw,
    reports_errors,
    store_argument,
)
from .effects import effects_after_note

# -- history: diff, rollback, fork ----------------------------------------------------------


#: How many characters of a value the human diff shows before abbreviating it.
_VALUE_CHARS = 200


@main.command(epilog=examples("agentwal diff state.awal run-42 5 9",
                              "agentwal diff state.awal run-42 5 9 --full",
                              "agentwal diff state.awal run-42 9 5 --json"))
@store_argument
@click.argument("run")
@click.argument("a", type=click.IntRange(min=1), metavar="A")
@click.argument("b", type=click.IntRange(min=1), metavar="B")
@click.option("--full", is_flag=True, help="Print whole values instead of abbreviating them.")
@json_option
@reports_errors
def diff(path: str, run: str, a: int, b: int, full: bool, as_json: bool) -> None:
    """Show what changed in RUN from checkpoint A to checkpoint B.

    Keys added (+), removed (-) and changed (~), values as JSON. A changed
    list shows the items appended, inserted or removed, a changed dict the
    keys inside it, text that grew what was appended; long values are
    abbreviated (--full prints them whole; --json always does). A may be
    newer than B: the diff then reads backwards. Exits 0 whether or not
    anything changed; 1 if the run or a checkpoint does not exist.
    """
    with open_ro(path) as store:
        d = store.diff(run, a, b)
    data = {"added": d.added, "removed": d.removed,
            "changed": {k: {"from": old, "to": new} for k, (old, new) in d.changed.items()}}
    if d.trees:  # only then, so diffs of plain values read as before
        data["trees"] = {k: {"added": t.added, "removed": t.removed,
                             "modified": {p: {"from": o, "to": n} for p, (o, n)
                                          in t.modified.items()}} for k, t in d.trees.items()}
    limit = None if full else _VALUE_CHARS

    def human() -> None:
        for k, v in d.added.items():
            click.echo(f"+ {k}: {_js(v, limit)}")
        for k, v in d.removed.items():
            click.echo(f"- {k}: {_js(v, limit)}")
        for k, (old, new) in d.changed.items():
            if isinstance(old, TreeRef) or isinstance(new, TreeRef):
                click.echo(f"~ {k}: {_tree(old)} -> {_tree(new)}")
                continue
            changes = list(value_changes(old, new))
            if len(changes) == 1 and changes[0]["op"] == "changed" and not changes[0]["path"]:
                click.echo(f"~ {k}: {_js(old, limit)} -> {_js(new, limit)}")
                continue
            click.echo(f"~ {k}:")
            for c in changes:
                for line in _change_lines(c, limit):
                    click.echo(f"    {line}")
        for k, t in d.trees.items():
            click.echo(f"files of {k}: {len(t.added)} added, {len(t.removed)} removed, "
                       f"{len(t.modified)} modified")
            for p, size in t.added.items():
                click.echo(f"    + {p} ({size} B)")
            for p, size in t.removed.items():
                click.echo(f"    - {p} ({size} B)")
            for p, (o, n) in t.modified.items():
                click.echo(f"    ~ {p} ({o} -> {n} B)")
        if not d:
            click.echo(f"no change from checkpoint {a} to {b}")

    emit(as_json, data, human)


def _tree(value: Any) -> str:
    return f"tree {value.sha256[:12]}" if isinstance(value, TreeRef) else to_json(value)


def _js(value: Any, limit: int | None) -> str:
    text = to_json(value)
    return text if limit is None else abbreviate(text, limit)


def _change_lines(c: dict[str, Any], limit: int | None) -> list[str]:
    """One change inside a value, as lines of the human diff."""
    where, op = (f"{c['path']}: " if c["path"] else ""), c["op"]
    if op == "added":
        return [f"+ {where}{_js(c['new'], limit)}"]
    if op == "removed":
        return [f"- {where}{_js(c['old'], limit)}"]
    if op == "changed":
        return [f"~ {where}{_js(c['old'], limit)} -> {_js(c['new'], limit)}"]
    if op == "text_diff":
        return [f"~ {where}text lines"] + [f"  {_clip_text(x, limit)}" for x in c["lines"]]
    if op == "appended" and "items" not in c:
        return [f"+ {where}text appended at character {c['at']}: {_js(c['new'], limit)}"]
    sign, verb = ("-", "removed") if op == "removed_items" else ("+", op.split("_")[0])
    items = c["items"]
    lines = [f"{sign} {where}{len(items)} item(s) {verb} at [{c['at']}]"]
    shown = items if limit is None else items[:_ITEMS]
    lines += [f"  {sign} [{c['at'] + i}] {_js(v, limit)}" for i, v in enumerate(shown)]
    if len(shown) < len(items):
        lines.append(f"  ... {len(items) - len(shown)} more item(s); --full shows all")
    return lines


#: How many items of a list change the human diff shows before abbreviating.
_ITEMS = 10


def _clip_text(text: str, limit: int | None) -> str:
    return text if limit is None else abbreviate(text, limit)


def _print_made(c: Any, target: int, as_json: bool) -> None:
    """The checkpoint rollback or fork made, and the effects after ``target`` that stand."""
    row = checkpoint_row(c)
    row["effects_after"] = [effect_row(e) for e in c.effects_after]
    emit(as_json, row, lambda: checkpoint_table([row]))
    if not as_json:
        effects_after_note(c.effects_after, target)


@main.command(epilog=examples("agentwal rollback state.awal run-42 7",
                              "agentwal rollback state.awal run-42 7 --json | jq .id"))
@store_argument
@click.argument("run")
@click.argument("checkpoint", type=click.IntRange(min=1), metavar="ID")
@json_option
@reports_errors
def rollback(path: str, run: str, checkpoint: int, as_json: bool) -> None:
    """Make a new checkpoint of RUN whose state equals its state at checkpoint ID.

    History is kept: the new checkpoint's parent is the old head and its
    metadata is {"rollback_to": ID}. Prints the new checkpoint, and on stderr
    the effects made after ID that still stand in the outside world (state is
    rolled back, the world is not; --json lists them as effects_after). Opens the
    store for writing, so it fails with store_locked while an agent has it
    open (call store.rollback_to from that process instead).
    """
    with open_rw(path) as store:
        _print_made(store.rollback_to(run, checkpoint), checkpoint, as_json)


@main.command(epilog=examples("agentwal fork state.awal run-42 7 run-42-retry",
                              "agentwal fork state.awal run-42 7 run-42-retry --json"))
@store_argument
@click.argument("run")
@click.argument("checkpoint", type=click.IntRange(min=1), metavar="ID")
@click.argument("new_run")
@json_option
@reports_errors
def fork(path: str, run: str, checkpoint: int, new_run: str, as_json: bool) -> None:
    """Start NEW_RUN from the state of RUN at checkpoint ID.

    The new run's first checkpoint has origin (RUN, ID); from then on the two
    runs are independent. Prints that checkpoint (and, as rollback does, the
    effects made after ID that still stand). Exits 1 with run_exists if
    NEW_RUN has a checkpoint already. Opens the store for writing, so it
    fails with store_locked while an agent has it open.
    """
    with open_rw(path) as store:
        _print_made(store.fork(run, checkpoint, new_run), checkpoint, as_json)


@main.command(epilog=examples("agentwal restore state.awal agent workspace ./repo",
                              "agentwal restore state.awal agent workspace ./repo --at 12",
                              "agentwal restore state.awal agent workspace ./repo --json"))
@store_argument
@click.argument("run")
@click.argument("key")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--at", type=click.IntRange(min=1), default=None, metavar="ID",
              help="Restore the tree of checkpoint ID instead of the latest.")
@json_option
@reports_errors
def restore(path: str, run: str, key: str, dest: str, at: int | None, as_json: bool) -> None:
    """Make directory DEST exactly the tree KEY of RUN holds (stored with txn.put_tree).

    Changed files are written atomically, with their modes; links are
    recreated; files the tree lacks are removed, except paths its exclude
    rules match. Opens the store read-only, so it works while an agent has
    it open. Run it again to finish a restore that was interrupted. Exits 1
    with not_a_tree, unsafe_tree (nothing written), corruption or restore
    (DEST cannot be written); 2 with run_not_found, checkpoint_not_found or
    missing_key (the RUN, --at or KEY given is not there).
    """
    with open_ro(path) as store:
        report = store.restore_tree(run, key, dest, at=at)
    data = dataclasses.asdict(report)

    def human() -> None:
        click.echo(f"restored {report.files} files into {dest}: {report.written} written, "
                   f"{report.removed} removed, {report.unchanged} unchanged")

    emit(as_json, data, human)
