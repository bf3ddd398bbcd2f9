"""The ``agentwal`` command: inspect a store, dump its log, torture a disk, run the demo.

Theory of operation: every command is a thin shell over the public API (or,
for ``wal``, over the pure WAL reader), opening stores read-only unless it
must write. Output is a human table by default and JSON with ``--json``.
Exit codes: 0 ok, 1 a problem was found (an ``agentwal.Error``, a failed
torture case), 2 a usage error (click's own). No traceback reaches the user:
library errors print their message, which ends with what to do.
"""

from __future__ import annotations

import base64
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
    """Show a store's sizes, LSNs, counters and what its last recovery did.

    Opens the store read-only, so it works while a writer has it open.
    """
    with _open_ro(path) as store:
        st = store.stats()
        st["runs"] = len(store.runs())

    def human() -> None:
        rec = st.pop("recovery", {})
        _table(sorted((k, v) for k, v in st.items()), ("field", "value"))
        click.echo(f"\nrecovery: replayed {rec.get('replayed')} records after LSN "
                   f"{rec.get('applied_lsn')}, {rec.get('torn_bytes')} torn bytes, "
                   f"{rec.get('seconds')} s")

    _emit(as_json, st, human)


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
@json_option
@reports_errors
def history(path: str, run: str, limit: int | None, as_json: bool) -> None:
    """List a run's checkpoints, newest first."""
    with _open_ro(path) as store:
        hist = store.history(run, limit=limit)
    rows = [{"id": c.id, "parent": c.parent, "lsn": c.lsn, "created": _when(c.created_at),
             "meta": c.meta, "hash": c.hash, "origin": c.origin} for c in hist]
    _emit(as_json, rows, lambda: _table(
        [(r["id"], r["parent"] or "-", r["lsn"], r["created"], r["hash"][:16],
          json.dumps(_jsonable(r["meta"]), sort_keys=True)) for r in rows],
        ("id", "parent", "lsn", "created", "hash", "meta")))


@main.command()
@store_argument
@click.argument("run")
@click.option("--key", "keys", multiple=True, help="Show only this key (repeatable).")
@json_option
@reports_errors
def show(path: str, run: str, keys: tuple[str, ...], as_json: bool) -> None:
    """Show a run's latest committed state (values as JSON)."""
    with _open_ro(path) as store:
        state = store.state(run)
    if keys:
        state = {k: state[k] for k in keys if k in state}
    def human() -> None:
        for k, v in state.items():
            click.echo(f"{k}: {json.dumps(_jsonable(v), sort_keys=True)}")

    _emit(as_json, state, human)


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
        _table([(r["lsn"], r["segment"], r["offset"], r["run"], r["id"], r["size"],
                 ",".join(r["keys"])[:60]) for r in rows],
               ("lsn", "segment", "offset", "run", "ckpt", "bytes", "keys"))
        for n in notes:
            click.echo(n)

    _emit(as_json, {"records": rows, "notes": notes}, human)


def _wal_records(path: str, limit: int | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Decoded records of every segment, and notes about torn tails."""
    from .codec import CodecError, decode_commit, decode_delta
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
            try:
                rec = decode_commit(f.payload)
                delta = decode_delta(rec.delta, f.flags)
            except CodecError as exc:
                raise CorruptionError(seg.path, f.offset, str(exc)) from None
            rows.append({"lsn": f.lsn, "segment": seg.name, "offset": f.offset, "run": rec.run,
                         "id": rec.id, "size": len(f.payload), "synced_lsn": f.synced_lsn,
                         "keys": [k if v is not None else f"-{k}" for k, v in delta.items()]})
        if scan.state == "corrupt":
            raise CorruptionError(seg.path, scan.end, scan.reason)
        if scan.state == "torn":
            notes.append(f"{seg.name}: torn tail at offset {scan.end} ({scan.reason})")
    return rows, notes


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


if __name__ == "__main__":  # pragma: no cover
    main()
