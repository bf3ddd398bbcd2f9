"""The ``agentwal`` command: inspect a store and its log, settle effects, torture a disk.

Theory of operation: every command is a thin shell over the public API (or,
for ``wal``, over the pure WAL reader), opening stores read-only unless it
must write. ``resolve`` alone writes: it opens only an existing store and
expires nothing (the ledger's retention is the application's choice).
Output is a human table by default and JSON with ``--json``. Exit codes:
0 ok, 1 a problem was found (an ``agentwal.Error``, a failed torture case,
an effect in doubt under ``effects --check``), 2 a usage error (click's
own). No traceback reaches the user: library errors print their message,
which ends with what to do.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import functools
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from . import __version__
from .effects import STATUSES
from .errors import Error

F = TypeVar("F", bound=Callable[..., Any])


# -- shared plumbing -------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """A JSON-friendly copy of a stored value (bytes as base64, datetimes as ISO 8601)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _emit(as_json: bool, data: Any, human: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(_jsonable(data), indent=2, sort_keys=True))
    else:
        human()


def json_option(fn: F) -> F:
    """``--json``: machine-readable output."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON instead of a table.")(fn)


def store_argument(fn: F) -> F:
    """The store directory argument (must exist)."""
    return click.argument("path", type=click.Path(exists=True, file_okay=False))(fn)


def reports_errors(fn: F) -> F:
    """Turn agentwal errors into a message and exit status 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Error as exc:
            click.echo(f"error [{exc.code}]: {exc}", err=True)
            sys.exit(1)
        except OSError as exc:  # e.g. a segment removed by a writer while we read
            click.echo(f"error [io]: {exc.strerror or exc}: {exc.filename or ''}. Check the "
                       "path, or retry if a writer was folding.", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def _open_ro(path: str) -> Any:
    from . import open as open_store

    return open_store(path, readonly=True)


def _open_rw(path: str) -> Any:
    """Open an existing store for writing; never creates one, never expires ledger entries."""
    from . import open as open_store
    from .errors import CorruptionError
    from .format import CONTROL_FILE

    if not os.path.exists(os.path.join(path, CONTROL_FILE)):
        raise CorruptionError(path, None, "not an agentwal store (no CONTROL file)",
                              "Check the path; this command never creates a store.")
    return open_store(path, effect_retention=None)


def _table(rows: list[tuple[Any, ...]], headers: tuple[str, ...]) -> None:
    cells = [tuple(str(c) for c in headers)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            click.echo("  ".join("-" * w for w in widths))


# -- commands ---------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentwal")
def main() -> None:
    """Inspect and test agentwal stores (an embedded, transactional store for agent state).

    Exit status: 0 ok, 1 a problem was found, 2 a usage error.
    """


@main.command()
@store_argument
@json_option
@reports_errors
def inspect(path: str, as_json: bool) -> None:
    """Show a store's sizes, LSNs, counters, effects and last recovery.

    Opens the store read-only, so it works while a writer has it open.
    """
    with _open_ro(path) as store:
        st = store.stats()
        st["runs"] = len(store.runs())
        st["effects"] = _effect_counts(store.effects())

    def human() -> None:
        rec = st.pop("recovery", {})
        eff = st.pop("effects")
        _table(sorted((k, v) for k, v in st.items()), ("field", "value"))
        click.echo(f"\nrecovery: replayed {rec.get('replayed')} records after LSN "
                   f"{rec.get('applied_lsn')}, {rec.get('torn_bytes')} torn bytes, "
                   f"{rec.get('seconds')} s")
        by_status = ", ".join(f"{n} {s}" for s, n in eff.items() if s != "total" and n)
        click.echo(f"effects: {eff['total']} ledger entries" + (f" ({by_status})"
                                                                 if by_status else ""))

    _emit(as_json, st, human)


def _effect_counts(entries: list[Any]) -> dict[str, int]:
    """Ledger entries by status (every status, zeros included) and in total."""
    counts = dict.fromkeys(STATUSES, 0)
    for e in entries:
        counts[e.status] = counts.get(e.status, 0) + 1
    counts["total"] = len(entries)
    return counts


@main.command()
@store_argument
@json_option
@reports_errors
def runs(path: str, as_json: bool) -> None:
    """List the runs with their head checkpoint."""
    with _open_ro(path) as store:
        rows = []
        for run in store.runs():
            head = store.head(run)
            rows.append({"run": run, "head": head.id if head else None,
                         "lsn": head.lsn if head else None,
                         "updated": _when(head.created_at) if head else None})
    _emit(as_json, rows, lambda: _table([tuple(r.values()) for r in rows],
                                        ("run", "head", "lsn", "updated")))


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(
        timespec="seconds")


@main.command()
@store_argument
@click.argument("run")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Show at most this many checkpoints (newest first).")
@click.option("--before", type=click.IntRange(min=1), default=None, metavar="ID",
              help="Only checkpoints older than checkpoint ID (to page back).")
@json_option
@reports_errors
def history(path: str, run: str, limit: int | None, before: int | None, as_json: bool) -> None:
    """List a run's checkpoints, newest first."""
    with _open_ro(path) as store:
        hist = store.history(run, limit=limit, before=before)
    rows = [_checkpoint_row(c) for c in hist]
    _emit(as_json, rows, lambda: _checkpoint_table(rows))


def _checkpoint_row(c: Any) -> dict[str, Any]:
    """Every field of a ``Checkpoint``, the time in ISO 8601."""
    return {"id": c.id, "parent": c.parent, "lsn": c.lsn, "created": _when(c.created_at),
            "meta": c.meta, "hash": c.hash, "origin": c.origin}


def _checkpoint_table(rows: list[dict[str, Any]]) -> None:
    _table([(r["id"], r["parent"] or "-", r["lsn"], r["created"], r["hash"][:16],
             json.dumps(_jsonable(r["meta"]), sort_keys=True)) for r in rows],
           ("id", "parent", "lsn", "created", "hash", "meta"))


@main.command()
@store_argument
@click.argument("run")
@click.option("--key", "keys", multiple=True, help="Show only this key (repeatable).")
@click.option("--at", type=click.IntRange(min=1), default=None, metavar="ID",
              help="The state as of checkpoint ID instead of the latest.")
@json_option
@reports_errors
def show(path: str, run: str, keys: tuple[str, ...], at: int | None, as_json: bool) -> None:
    """Show a run's latest committed state, or its state at a checkpoint (values as JSON)."""
    with _open_ro(path) as store:
        state = store.state(run, at=at)
    if keys:
        state = {k: state[k] for k in keys if k in state}
    def human() -> None:
        for k, v in state.items():
            click.echo(f"{k}: {json.dumps(_jsonable(v), sort_keys=True)}")

    _emit(as_json, state, human)


# -- the effects ledger -----------------------------------------------------------------

#: Statuses ``effects --check`` treats as a problem.
PROBLEM_STATUSES = ("in_doubt", "failed")


def _clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with "..." when longer."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _age(seconds: float) -> str:
    """A short human age: 42s, 3m, 2h, 5d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _effect_row(e: Any) -> dict[str, Any]:
    """Every field of an ``EffectRecord`` (mode as its string, order as a list), and its age."""
    row = {f.name: getattr(e, f.name) for f in dataclasses.fields(e)}
    row["mode"] = e.mode.value
    row["order"] = list(e.order) if e.order is not None else None
    row["age"] = round(e.age, 3)
    return row


def _effects_table(rows: list[dict[str, Any]]) -> None:
    _table([(r["effect_id"], r["run"], r["name"], r["mode"], r["status"], r["attempts"],
             _age(r["age"]), _clip(r["key"], 20), _clip(r["error"] or "-", 40)) for r in rows],
           ("id", "run", "name", "mode", "status", "attempts", "age", "key", "last error"))


@main.command()
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

    Oldest first: id, run, name, mode, status, attempts, age, key, last error.
    Opens the store read-only, so it works while a writer has it open. The
    table shortens keys and last errors; --json prints every field. With
    --check the command exits 1 when an entry it lists is in_doubt or failed
    (settle those with `agentwal resolve`, or let the next attempt retry them).
    """
    with _open_ro(path) as store:
        rows = [_effect_row(e) for e in store.effects(run=run, status=status)]
    _emit(as_json, rows, lambda: _effects_table(rows))
    if check:
        problems = [r for r in rows if r["status"] in PROBLEM_STATUSES]
        if problems:
            click.echo(f"{len(problems)} effect(s) in doubt or failed; check the downstream, "
                       "then settle them with `agentwal resolve` or let the next attempt "
                       "retry them.", err=True)
            sys.exit(1)


def _from_json(value: Any) -> Any:
    """A JSON value as it should be stored: ``{"$bytes": "<base64>"}`` becomes bytes."""
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("$bytes"), str):
            return base64.b64decode(value["$bytes"], validate=True)
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _parse_result(text: str) -> Any:
    try:
        return _from_json(json.loads(text))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and bad base64 too
        raise click.BadParameter(f"not a JSON value ({exc})", param_hint="--result") from None


@main.command()
@store_argument
@click.argument("effect_id")
@click.option("--result", "result_json", metavar="JSON", default=None,
              help='What the downstream did, as a JSON value (e.g. \'{"charge": "ch_1"}\'): '
                   "the entry becomes resolved and its next attempt returns this.")
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
        raise click.UsageError("give exactly one of --result JSON or --not-applied")
    kwargs: dict[str, Any] = {"not_applied": True}
    if result_json is not None:
        kwargs = {"result": _parse_result(result_json)}
    with _open_rw(path) as store:
        settled = store.resolve_effect(effect_id, by=by, **kwargs)
    row = _effect_row(settled)
    _emit(as_json, row, lambda: _table([(k, _field_text(k, v)) for k, v in row.items()],
                                       ("field", "value")))


def _field_text(name: str, value: Any) -> str:
    """One field of an effect entry for a table: times in ISO 8601, values as JSON."""
    if name in ("created_at", "updated_at"):
        return _when(value)
    if name == "age":
        return _age(value)
    if name in ("args", "result", "order"):
        return json.dumps(_jsonable(value), sort_keys=True)
    return "-" if value is None else str(value)


@main.command()
@store_argument
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Show at most this many records (oldest first).")
@json_option
@reports_errors
def wal(path: str, limit: int | None, as_json: bool) -> None:
    """Dump the records of the write-ahead log (those not yet folded into LMDB, and older).

    Reads the segments directly; changes nothing. A torn tail is reported,
    damage in the middle of the log exits with status 1.
    """
    rows, notes = _wal_records(path, limit)

    def human() -> None:
        _table([(r["lsn"], r["type"], r["segment"], r["offset"], r["run"],
                 "-" if r["id"] is None else r["id"], r["size"], _wal_what(r)) for r in rows],
               ("lsn", "type", "segment", "offset", "run", "ckpt", "bytes", "what"))
        for n in notes:
            click.echo(n)

    _emit(as_json, {"records": rows, "notes": notes}, human)


def _wal_what(r: dict[str, Any]) -> str:
    """The table's summary of a record: keys written (and outbox), or the effect entry."""
    if r["type"] == "delete_run":
        return f"run deleted (its head was checkpoint {r['id']})"
    if r["type"] == "effect":
        return _clip(f"{r['name']} {r['effect_id']} -> {r['status']} "
                     f"(attempt {r['attempts']})", 60)
    what = ",".join(r["keys"])
    if r["deferred"]:
        what += f" +outbox {','.join(r['deferred'])}"
    return _clip(what, 60)


def _wal_records(path: str, limit: int | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Decoded records of every segment, and notes about torn tails."""
    from .errors import CorruptionError
    from .format import WAL_DIR
    from .io import OsFileSystem
    from .wal import list_segments

    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for seg in list_segments(OsFileSystem(), os.path.join(path, WAL_DIR)):
        if seg.header is None:
            raise CorruptionError(seg.path, 0, seg.problem)
        scan = seg.scan()
        for f in scan.frames:
            if limit is not None and len(rows) >= limit:
                break
            row = {"lsn": f.lsn, "segment": seg.name, "offset": f.offset,
                   "size": len(f.payload), "synced_lsn": f.synced_lsn}
            row.update(_wal_record(seg.path, f))
            rows.append(row)
        if scan.state == "corrupt":
            raise CorruptionError(seg.path, scan.end, scan.reason)
        if scan.state == "torn":
            notes.append(f"{seg.name}: torn tail at offset {scan.end} ({scan.reason})")
    return rows, notes


def _wal_record(seg_path: str, f: Any) -> dict[str, Any]:
    """The type-specific columns of one frame: a commit, a ledger entry or a deletion."""
    from .codec import CodecError
    from .errors import CorruptionError
    from .local.records import ReplayedDelete, ReplayedEffect, decode_record

    try:
        r = decode_record(f.lsn, f.type, f.flags, f.payload)
    except CodecError as exc:
        raise CorruptionError(seg_path, f.offset, f"record LSN {f.lsn}: {exc}") from None
    if isinstance(r, ReplayedDelete):
        return {"type": "delete_run", "run": r.run, "id": r.head, "keys": [], "deferred": []}
    if isinstance(r, ReplayedEffect):
        e = r.entry
        return {"type": "effect", "run": e.run, "id": None, "keys": [],
                "effect_id": e.effect_id, "name": e.name, "status": e.status,
                "attempts": e.attempts}
    return {"type": "commit", "run": r.record.run, "id": r.record.id,
            "keys": [k if v is not None else f"-{k}" for k, v in r.delta.items()],
            "deferred": [d[0] for d in r.deferred or []]}


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
    from .testing import corrupt, proc, tiers

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


@main.command()
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
def torture(directory: str, seconds: float, seed: str, tiers: tuple[str, ...],
            model: str | None, durability: str, case: str | None, kinds: str,
            count: int | None) -> None:
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
    "N passed, M failed"; exits 1 if any case failed.
    """
    from .testing import proc

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
    with click.progressbar(length=int(seconds), label="torture", show_eta=True,
                           file=sys.stderr) as bar:
        for i, tier in enumerate(chosen):
            deadline = started + share * (i + 1)
            for result in _tier_runner(tier, directory, seed, opts, deadline):
                results.append(result)
                if not result.ok:
                    click.echo(f"\n{result.line()}\n  seed {result.seed}; reproduce: "
                               f"{result.repro.replace('DIR', directory)}", err=True)
                bar.update(min(int(seconds), int(time.monotonic() - started)) - bar.pos)
        bar.update(int(seconds) - bar.pos)
    _summary(results)
    if any(not r.ok for r in results):
        sys.exit(1)


def _summary(results: list[Any]) -> None:
    tiers: dict[str, list[int]] = {}
    for r in results:
        counts = tiers.setdefault(r.tier, [0, 0])
        counts[0 if r.ok else 1] += 1
    _table([(t, p, f) for t, (p, f) in tiers.items()], ("tier", "passed", "failed"))
    passed = sum(p for p, _ in tiers.values())
    failed = sum(f for _, f in tiers.values())
    click.echo(f"{passed} passed, {failed} failed")


@main.command()
@click.argument("path", default="demo.awal", type=click.Path(file_okay=False))
def demo(path: str) -> None:
    """Run the showcase: an agent killed with SIGKILL resumes from its last checkpoint.

    PATH (default demo.awal) is deleted and recreated.
    """
    from .demo import main as demo_main

    sys.exit(demo_main([path]))


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
    with _open_ro(path) as store:
        d = store.diff(run, a, b)
    data = {"added": d.added, "removed": d.removed,
            "changed": {k: {"from": old, "to": new} for k, (old, new) in d.changed.items()}}

    def human() -> None:
        def js(v: Any) -> str:
            return json.dumps(_jsonable(v), sort_keys=True)

        for k, v in d.added.items():
            click.echo(f"+ {k}: {js(v)}")
        for k, v in d.removed.items():
            click.echo(f"- {k}: {js(v)}")
        for k, (old, new) in d.changed.items():
            click.echo(f"~ {k}: {js(old)} -> {js(new)}")
        if not d:
            click.echo(f"no change from checkpoint {a} to {b}")

    _emit(as_json, data, human)


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
    with _open_rw(path) as store:
        c = store.rollback_to(run, checkpoint)
    row = _checkpoint_row(c)
    _emit(as_json, row, lambda: _checkpoint_table([row]))


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
    with _open_rw(path) as store:
        c = store.fork(run, checkpoint, new_run)
    row = _checkpoint_row(c)
    _emit(as_json, row, lambda: _checkpoint_table([row]))


# -- verify and backup ------------------------------------------------------------------


@main.command()
@store_argument
@json_option
@reports_errors
def verify(path: str, as_json: bool) -> None:
    """Check every checksum, hash chain and cross-reference of a store; exit 1 on a problem.

    Reads every LMDB entry and WAL frame, recomputes each run's checkpoint
    hashes, and compares the head state, manifests and reference counts with
    the history. Lists each problem with its place (database and key, or file
    and offset), then what was checked. Opens the store read-only, so it works
    while an agent writes to it; changes nothing.
    """
    with _open_ro(path) as store:
        report = store.verify()
    data = {"ok": report.ok, "problems": [dataclasses.asdict(p) for p in report.problems],
            "checked": report.checked, "notes": report.notes}

    def human() -> None:
        if report.problems:
            _table([(p.where, p.what) for p in report.problems], ("where", "problem"))
            click.echo("")
        for note in report.notes:
            click.echo(f"note: {note}")
        counts = ", ".join(f"{n} {k}" for k, n in report.checked.items())
        click.echo(f"checked: {counts}")
        click.echo("ok" if report.ok else f"{len(report.problems)} problem(s) found")

    _emit(as_json, data, human)
    if not report.ok:
        click.echo(f"{len(report.problems)} problem(s) found; the store is damaged. Restore "
                   "it from a backup, or copy out what still reads (agentwal show).", err=True)
        sys.exit(1)


@main.command()
@store_argument
@click.argument("dest", type=click.Path(file_okay=False))
@json_option
@reports_errors
def backup(path: str, dest: str, as_json: bool) -> None:
    """Copy a store to DEST (a new directory) consistently, while agents keep writing.

    The copy holds every commit acknowledged before the command started, with
    the whole history and effects ledger, and opens as the same store. It is
    written to DEST.tmp and renamed to DEST once every file is on disk. Opens
    the store read-only. Exits 1 if DEST (or DEST.tmp) exists.
    """
    with _open_ro(path) as store:
        rep = store.backup(dest)
    data = dataclasses.asdict(rep)
    _emit(as_json, data, lambda: click.echo(
        f"backed up {path} to {rep.path}: {rep.files} files, {rep.bytes} bytes, every commit "
        f"up to LSN {rep.lsn}, in {rep.seconds:.2f} s"))


# -- compact ----------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _duration(_ctx: Any, _param: Any, value: str | None) -> Any:
    """``--older-than``: a number and a unit (s, m, h, d, w), e.g. ``30d`` or ``12h``."""
    import datetime

    if value is None:
        return None
    text = value.strip().lower()
    try:
        n = float(text[:-1])
        unit = _UNITS[text[-1:]]
    except (ValueError, KeyError):
        raise click.BadParameter(f"{value!r} is not a duration such as 30d, 12h, 90m or 45s"
                                 ) from None
    if n < 0:
        raise click.BadParameter("a duration is not negative")
    return datetime.timedelta(seconds=n * unit)


@main.command()
@store_argument
@click.option("--keep-last", type=click.IntRange(min=1), default=None, metavar="N",
              help="Keep each run's last N checkpoints.")
@click.option("--older-than", callback=_duration, default=None, metavar="AGE",
              help="Drop only checkpoints older than AGE (30d, 12h, 90m, 45s).")
@click.option("--run", "runs", multiple=True, metavar="RUN",
              help="Compact only this run (repeatable; default: every run).")
@click.option("--vacuum", is_flag=True, help="Also rewrite the LMDB file so it shrinks.")
@click.option("--drop-fork-origins", is_flag=True,
              help="Allow dropping checkpoints that forks started from.")
@json_option
@reports_errors
def compact(path: str, keep_last: int | None, older_than: Any, runs: tuple[str, ...],
            vacuum: bool, drop_fork_origins: bool, as_json: bool) -> None:
    """Drop old checkpoints and free the history only they used (store.compact).

    Keeps each run's head, its last N checkpoints (--keep-last) and those
    younger than AGE (--older-than): a checkpoint either keeps is kept; with
    neither, nothing is dropped. Checkpoints forks started from are kept
    unless --drop-fork-origins. --vacuum then rewrites the LMDB file so it
    shrinks on disk. Prints what was dropped and freed. Opens the store for
    writing, so it fails with store_locked while an agent has it open (use
    agentwal.open(..., retain=agentwal.KeepLast(n)) there instead).
    """
    with _open_rw(path) as store:
        rep = store.compact(keep_last=keep_last, older_than=older_than,
                            runs=list(runs) if runs else None, vacuum=vacuum,
                            keep_fork_origins=not drop_fork_origins)
    data = dataclasses.asdict(rep)

    def human() -> None:
        if rep.runs:
            _table(sorted(rep.runs.items()), ("run", "dropped"))
        click.echo(f"{rep.checkpoints_dropped} checkpoint(s) dropped, {rep.bytes_freed} bytes "
                   f"of LMDB values freed, {rep.objects_freed} object(s) freed; data.mdb "
                   f"{rep.file_bytes_before} -> {rep.file_bytes_after} bytes"
                   + (" (vacuumed)" if rep.vacuumed else ""))

    _emit(as_json, data, human)


if __name__ == "__main__":  # pragma: no cover
    main()
