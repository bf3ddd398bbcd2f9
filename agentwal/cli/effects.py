"""Commands over the effects ledger: effects (list), resolve (settle by hand), retire."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..effects import STATUSES
from ..views import PROBLEM_STATUSES, age, effect_row, from_jsonable, jsonable, when
from .app import main
from .common import (
    clip,
    emit,
    examples,
    json_option,
    open_ro,
    open_rw,
    reports_errors,
    store_argument,
    table,
    usage,
)

# -- the effects ledger -----------------------------------------------------------------


def _committed(r: dict[str, Any]) -> str:
    """Where an entry's step committed: a checkpoint id, "uncommitted", or "-"."""
    if r["uncommitted"]:
        return "uncommitted"
    return "-" if r["committed_in"] is None else str(r["committed_in"])


def _effects_table(rows: list[dict[str, Any]]) -> None:
    table([(r["effect_id"], r["run"], r["name"], r["mode"], r["status"], r["attempts"],
             age(r["age"]), _committed(r), clip(r["key"], 20), clip(r["error"] or "-", 40))
           for r in rows],
          ("id", "run", "name", "mode", "status", "attempts", "age", "committed", "key",
           "last error"))


def effects_after_note(entries: Any, checkpoint: int) -> None:
    """Tell the user (on stderr) which effects a rollback_to or fork leaves standing."""
    if not entries:
        return
    names = ", ".join(f"{e.name} ({e.effect_id}, {e.status})" for e in entries[:8])
    more = f" and {len(entries) - 8} more" if len(entries) > 8 else ""
    click.echo(f"note: {len(entries)} effect(s) made after checkpoint {checkpoint} still stand "
               f"in the outside world: {names}{more}. Steps re-run from here call them again "
               "unless they use a business key=; `agentwal effects` lists them.", err=True)


@main.command(epilog=examples("agentwal effects state.awal --status in_doubt",
                              "agentwal effects state.awal --run run-42 --json",
                              "agentwal effects state.awal --check || page-the-on-call"))
@store_argument
@click.option("--run", default=None, help="Only entries recorded by this run.")
@click.option("--status", type=click.Choice(STATUSES), default=None,
              help="Only entries with this status.")
@click.option("--check", is_flag=True,
              help="Exit 1 if any entry listed is in_doubt or failed (for scripts and "
                   "monitoring).")
@json_option
@reports_errors
def effects(path: str, run: str | None, status: str | None, check: bool,
            as_json: bool) -> None:
    """List the effects ledger: calls to the outside world and their status.

    Oldest first: id, run, name, mode, status, attempts, age, committed (the
    checkpoint whose commit included it, or "uncommitted" when the step that
    made it never committed), key, last error.
    Opens the store read-only, so it works while a writer has it open. The
    table shortens keys and last errors; --json prints every field. With
    --check the command exits 1 when an entry it lists is in_doubt or failed
    (settle those with `agentwal resolve`, or let the next attempt retry them).
    """
    with open_ro(path) as store:
        rows = [effect_row(e) for e in store.effects(run=run, status=status)]
    emit(as_json, rows, lambda: _effects_table(rows))
    if check:
        problems = [r for r in rows if r["status"] in PROBLEM_STATUSES]
        if problems:
            click.echo(f"{len(problems)} effect(s) in doubt or failed; check the downstream, "
                       "then settle them with `agentwal resolve` or let the next attempt "
                       "retry them.", err=True)
            sys.exit(1)


def _parse_result(text: str) -> Any:
    try:
        return from_jsonable(json.loads(text))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and bad base64 too
        raise click.BadParameter(f"not a JSON value ({exc})", param_hint="--result") from None


@main.command(epilog=examples(
    "agentwal resolve state.awal ef-3f2a --result '{\"charge\": \"ch_1\"}' --by alice",
    "agentwal resolve state.awal ef-3f2a --not-applied"))
@store_argument
@click.argument("effect_id")
@click.option("--result", "result_json", metavar="JSON", default=None,
              help='What the downstream did, as a JSON value (e.g. \'{"charge": "ch_1"}\'): '
                   "the entry becomes resolved and its next attempt returns this. Tagged "
                   'values as --json prints them ({"$bytes": ...}, {"$datetime": ...}, '
                   '{"$set": [...]} ...) are stored as their type.')
@click.option("--not-applied", is_flag=True,
              help="The call never reached the downstream: the entry becomes not_applied.")
@click.option("--by", default=None, metavar="NAME",
              help="Who decided (default: user@host and pid).")
@json_option
@reports_errors
def resolve(path: str, effect_id: str, result_json: str | None, not_applied: bool,
            by: str | None, as_json: bool) -> None:
    """Settle an effect by hand (in_doubt, failed or pending) and print it.

    Give exactly one of --result JSON or --not-applied. Opens the store for
    writing: if an agent has it open, this fails with store_locked (exit 1);
    stop it, or call store.resolve_effect from that process. Expires no
    ledger entries, whatever retention the store's own writer uses.
    """
    if (result_json is None) == (not not_applied):
        raise usage("give exactly one of --result JSON or --not-applied")
    kwargs: dict[str, Any] = {"not_applied": True}
    if result_json is not None:
        kwargs = {"result": _parse_result(result_json)}
    with open_rw(path) as store:
        settled = store.resolve_effect(effect_id, by=by, **kwargs)
    row = effect_row(settled)
    emit(as_json, row, lambda: table([(k, _field_text(k, v)) for k, v in row.items()],
                                       ("field", "value")))


@main.command(epilog=examples("agentwal retire state.awal ef-3f2a --by alice",
                              "agentwal retire state.awal ef-3f2a --json"))
@store_argument
@click.argument("effect_id")
@click.option("--by", default=None, metavar="NAME",
              help="Who decided (default: user@host and pid).")
@json_option
@reports_errors
def retire(path: str, effect_id: str, by: str | None, as_json: bool) -> None:
    """Set an effect aside, keeping it as history, and free its position.

    For a step whose code changed on purpose, which now fails with
    effect_divergence: the entry becomes retired (its old status kept) and
    the next run of the step calls afresh. Check the downstream first: the
    fresh call really runs. Outbox entries cannot be retired (use resolve).
    Opens the store for writing, so it fails with store_locked while an agent
    has it open (call store.retire_effect from that process instead).
    """
    with open_rw(path) as store:
        retired = store.retire_effect(effect_id, by=by)
    row = effect_row(retired)
    emit(as_json, row, lambda: table([(k, _field_text(k, v)) for k, v in row.items()],
                                       ("field", "value")))


def _field_text(name: str, value: Any) -> str:
    """One field of an effect entry for a table: times in ISO 8601, values as JSON."""
    if name in ("created_at", "updated_at", "resolved_at") and value is not None:
        return when(value)
    if name == "age":
        return age(value)
    if name in ("args", "result", "order"):
        return json.dumps(jsonable(value), sort_keys=True)
    return "-" if value is None else str(value)
