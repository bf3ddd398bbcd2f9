"""Commands that look after a store: verify, backup, copy, compact."""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from typing import Any

import click

from ..errors import DiskFullError, DurabilityError
from ..health import size
from ..views import command, when
from .app import main
from .common import (
    Failure,
    emit,
    examples,
    json_option,
    open_ro,
    open_rw,
    progress_bar,
    reports_errors,
    store_argument,
    table,
    usage,
)

# -- verify and backup ------------------------------------------------------------------


@main.command(epilog=examples("agentwal verify state.awal",
                              "agentwal verify state.awal --json | jq .problems"))
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
    with open_ro(path) as store, progress_bar("verify") as progress:
        report = store.verify(progress=progress)
    data = {"ok": report.ok, "problems": [dataclasses.asdict(p) for p in report.problems],
            "checked": report.checked, "notes": report.notes}

    def human() -> None:
        if report.problems:
            table([(p.where, p.what) for p in report.problems], ("where", "problem"))
            click.echo("")
        for note in report.notes:
            click.echo(f"note: {note}")
        counts = ", ".join(f"{n:,} {k}" for k, n in report.checked.items())
        click.echo(f"checked: {counts}")
        click.echo("ok" if report.ok else f"{len(report.problems)} problem(s) found")

    emit(as_json, data, human)
    if not report.ok:
        click.echo(f"{len(report.problems)} problem(s) found; the store is damaged. Restore "
                   "it from a backup, or copy out what still reads (agentwal salvage STORE "
                   "DEST, or agentwal show STORE RUN --key K).", err=True)
        sys.exit(1)


@main.command(epilog=examples("agentwal salvage state.awal rescued.awal",
                              "agentwal salvage state.awal rescued.awal --json"))
@store_argument
@click.argument("dest", type=click.Path(file_okay=False))
@json_option
@reports_errors
def salvage(path: str, dest: str, as_json: bool) -> None:
    """Write a new, healthy store DEST from everything a damaged store still reads.

    STORE is never changed, and its damaged snapshot is never handed to LMDB:
    every record of snapshot/data.mdb that still checks (reachable, in range,
    its CRC intact) is read by hand into a rebuilt copy, and the log is read
    up to its first damage (agentwal.open(path, recover="prefix")). Every run
    is then copied checkpoint by checkpoint under its own ids (gaps kept as
    compacted, fork origins kept), value by value, with blobs, trees and the
    effects ledger, into DEST.tmp, which is renamed to DEST. A missing,
    truncated or damaged data.mdb still gives what the log holds.

    The report names what was not copied: the log's LSN range past the
    damage, the damage found in the snapshot, and each run, checkpoint and
    value that did not read (a value that did not read is absent from those
    checkpoints in DEST). A damaged CONTROL is rebuilt from the store id the
    snapshot or the log's segment headers hold. Exits 1 if DEST (or
    DEST.tmp) exists, if nothing says whose files these are, or if a writer
    has the store open (store_locked: stop it first; `agentwal backup`
    copies a store in use); no writer can open the store while it runs.
    """
    from ..local.salvage import describe
    from ..local.salvage import salvage as salvage_store

    real_src, real_dest = os.path.realpath(path), os.path.realpath(dest)
    if os.path.commonpath([real_src, real_dest]) == real_src:
        raise usage(f"DEST {dest!r} is inside the store {path!r}; salvage to a directory "
                    "outside it.")
    with progress_bar(f"salvage {path} into {dest}"):
        rep = salvage_store(path, dest)
    data = dataclasses.asdict(rep)
    data["complete"] = rep.complete

    def human() -> None:
        total = sum(rep.checkpoints.values())
        click.echo(f"salvaged {path} into {rep.path}: {len(rep.checkpoints)} runs, {total} "
                   f"checkpoints, {rep.effects} effects-ledger entries")
        for run, n in sorted(rep.checkpoints.items()):
            click.echo(f"  {run}: {n} checkpoints")
        lines = describe(rep)
        for line in lines:
            click.echo(line)
        if not lines:
            click.echo("nothing lost: the log and the snapshot read to their end")

    emit(as_json, data, human)


@main.command(epilog=examples("agentwal backup state.awal /backups/state-$(date +%F).awal"))
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
    real_src, real_dest = os.path.realpath(path), os.path.realpath(dest)
    if os.path.commonpath([real_src, real_dest]) == real_src:
        raise usage(f"DEST {dest!r} is inside the store {path!r}; back up to a directory "
                    "outside it.")
    parent = os.path.dirname(real_dest)
    if not os.path.isdir(parent):
        raise usage(f"DEST's parent directory {parent!r} does not exist: create it first "
                    "(backup makes only DEST itself).")
    with open_ro(path) as store, progress_bar(f"backup to {dest}") as progress:
        try:
            rep = store.backup(dest, progress=progress)
        except (DiskFullError, DurabilityError) as exc:
            if not os.path.realpath(exc.path).startswith(real_dest):
                raise
            # The copy failed, not the store: the library's "reopen the store" does not apply.
            why = (exc.reason.removeprefix("cannot write the backup: ")
                   if isinstance(exc, DurabilityError)
                   else "no room to write it (the disk or a quota is full)")
            raise Failure(exc.code, f"cannot write the backup at {dest!r}: {why}. The "
                          "store is unchanged and nothing was published at DEST; remove "
                          f"{dest + '.tmp'!r} if it is there, then try again where the "
                          "backup can be written.") from None
    data = dataclasses.asdict(rep)
    emit(as_json, data, lambda: click.echo(
        f"backed up {path} to {rep.path}: {rep.files} files, {size(rep.bytes)}, every commit "
        f"up to LSN {rep.lsn}, in {rep.seconds:.2f} s"))


@main.command(epilog=examples(
    "agentwal copy state.awal 'postgresql://app@db/agents?schema=team_a'",
    "agentwal copy 'postgresql://app@db/agents' local.awal --run run-42 --run run-43"))
@store_argument
@click.argument("dest", metavar="DEST")
@click.option("--run", "runs", multiple=True, metavar="RUN",
              help="Copy this run (repeat for more); default every run.")
@json_option
@reports_errors
def copy(path: str, dest: str, runs: tuple[str, ...], as_json: bool) -> None:
    """Copy runs with their whole history and effects ledger into DEST (store.copy_runs).

    Either side is a store directory or a PostgreSQL URI; DEST is created
    if it does not exist (a new directory, or a new schema), else opened
    for writing. Ids, parents, metadata, fork origins, the state at every
    checkpoint and the ledger entries are the source's; DEST stamps its own
    hashes (verify passes there) and, unless it is PostgreSQL, commit times.
    A run DEST already holds exits 1 (run_exists) before anything is
    written; blobs and trees are copied. Opens the source read-only.
    """
    from .. import is_postgres_dsn
    from .. import open as open_store

    if not is_postgres_dsn(dest) and os.path.exists(dest) and not os.path.isdir(dest):
        raise usage(f"DEST {dest!r} is a file: give a store directory or a PostgreSQL URI")
    if dest == path or (not is_postgres_dsn(dest) and not is_postgres_dsn(path)
                        and os.path.realpath(dest) == os.path.realpath(path)):
        raise usage(f"DEST {dest!r} is STORE itself: copy into another store")
    with open_ro(path) as src, open_store(dest) as out, \
            progress_bar(f"copy to {dest}") as progress:
        rep = src.copy_runs(out, runs=list(runs) or None, progress=progress)
    data = dataclasses.asdict(rep)
    emit(as_json, data, lambda: click.echo(
        f"copied {len(rep.runs)} run(s) ({', '.join(rep.runs) or 'none'}) to {dest}: "
        f"{rep.checkpoints} checkpoints, {rep.effects} ledger entries"
        + "".join(f"; {run} renumbered from {min(ids)} to 1 (compacted)"
                  for run, ids in rep.renumbered.items())))


@main.command(epilog=examples("agentwal unpark 'postgresql://app@db/agents' run-42"))
@store_argument
@click.argument("run")
@json_option
@reports_errors
def unpark(path: str, run: str, as_json: bool) -> None:
    """Let workers take a parked run again (PostgreSQL).

    A run is parked when its lease was taken over max_steals times in a row
    without a commit: its step keeps killing the workers that run it (a
    poison run), so no worker takes it (run_parked) until it is unparked.
    Look at its last checkpoint and effects first (`agentwal show`,
    `agentwal effects --run`), fix the cause, then unpark it: its takeover
    count starts over. Exits 1 if the run is not parked.
    """
    from .. import is_postgres_dsn

    if not is_postgres_dsn(path):
        raise usage("agentwal unpark needs a PostgreSQL store: a local store has one "
                    "writer process, so it parks no run")
    with open_rw(path) as store:
        was = store.parked().get(run)
        if not store.unpark(run):
            raise Failure("not_parked", f"run {run!r} is not parked; nothing was changed. "
                          f"`{command('runs', path)}` shows the parked runs.")
    data = {"run": run, "parked_at": when(was[0]) if was else None,
            "was": was[1] if was else None}
    emit(as_json, data, lambda: click.echo(f"unparked {run} (parked because {data['was']})"))


# -- compact ----------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _duration(_ctx: Any, _param: Any, value: str | None) -> Any:
    """``--older-than``: a number and a unit (s, m, h, d, w), e.g. ``30d`` or ``12h``."""

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
    try:
        return datetime.timedelta(seconds=n * unit)
    except OverflowError:
        raise click.BadParameter(f"{value!r} is longer than any date can reach; use at most "
                                 f"{datetime.timedelta.max.days}d") from None


@main.command(epilog=examples("agentwal compact state.awal --keep-last 50",
                              "agentwal compact state.awal --older-than 30d --run run-42 --vacuum"))
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
    shrinks on disk (on PostgreSQL: VACUUM (ANALYZE) of the store's tables).
    Prints what was dropped and freed. Opens the store for
    writing, so it fails with store_locked while an agent has it open (use
    agentwal.open(..., retain=agentwal.KeepLast(n)) there instead).
    """
    from .. import is_postgres_dsn

    with open_rw(path) as store, progress_bar("compact") as progress:
        rep = store.compact(keep_last=keep_last, older_than=older_than,
                            runs=list(runs) if runs else None, vacuum=vacuum,
                            keep_fork_origins=not drop_fork_origins, progress=progress)
    data = dataclasses.asdict(rep)

    def human() -> None:
        if rep.runs:
            table(sorted(rep.runs.items()), ("run", "dropped"))
        values, files = (("rows", "tables") if is_postgres_dsn(path)
                         else ("LMDB values", "data.mdb"))
        click.echo(f"{rep.checkpoints_dropped} checkpoint(s) dropped, {size(rep.bytes_freed)} "
                   f"of {values} freed, {rep.objects_freed} object(s) freed; {files} "
                   f"{size(rep.file_bytes_before)} -> {size(rep.file_bytes_after)}"
                   + (" (vacuumed)" if rep.vacuumed else ""))

    emit(as_json, data, human)
