"""Commands that read a store: inspect, runs, history, show, and wal (the raw log)."""

from __future__ import annotations

import os
import time
from typing import Any

import click
from rich.text import Text
from rich.tree import Tree

from .. import health, is_postgres_dsn
from ..errors import RunNotFoundError
from ..health import DEFAULT_WAL_MAX_BYTES, size
from ..types import TreeRef
from ..views import (
    age,
    checkpoint_row,
    command,
    fork_map,
    graph_rows,
    jsonable,
    problems_by_run,
    to_json,
    tree_file_line,
    tree_file_row,
    when,
)
from .app import main
from .common import (
    NotFound,
    checkpoint_table,
    clip,
    console,
    emit,
    examples,
    json_option,
    local_only,
    open_ro,
    print_renderable,
    reports_errors,
    store_argument,
    table,
)


@main.command(epilog=examples("agentwal inspect state.awal",
                              "agentwal inspect state.awal --json | jq .effects"))
@store_argument
@click.option("--wal-max-bytes", type=click.IntRange(min=1), default=None, metavar="N",
              help="The writer's wal_max_bytes: a log over twice this needs attention. "
                   "Default: what the writer recorded in the store's HEALTH file, else "
                   f"{DEFAULT_WAL_MAX_BYTES} (agentwal.open's default).")
@json_option
@reports_errors
def inspect(path: str, wal_max_bytes: int | None, as_json: bool) -> None:
    """Summarize a store: what needs attention first, then store, log, snapshot,
    history, effects and the last recovery.

    Needs attention: a broken writer, the last fold or retention pass
    failed (with when and the error), effects in doubt or failed, outbox
    entries not yet dispatched, a write-ahead log over twice wal_max_bytes
    (the writer is not folding), log records left unfolded by a writer that
    did not close, torn bytes at the log's end. Labels are the field names
    of --json, which prints every raw field (the per-process counters too:
    folds, retries ...). Opens the store read-only, so it works while a
    writer has it open: the writer's failures and settings come from the
    HEALTH file it keeps (a store no writer opened since HEALTH existed
    has none: "none recorded"). On PostgreSQL it shows the tables' rows and
    sizes instead of the log and snapshot.
    """
    with open_ro(path) as store:
        st = health.inspect(store, path, wal_max_bytes)
    emit(as_json, st, lambda: _inspect_human(st))


_SECTIONS: dict[str, tuple[str, ...]] = {
    "store": ("path", "store_id", "writer", "durability", "health_record", "last_commit_at"),
    "log": ("visible_lsn", "applied_lsn", "unfolded_records", "wal_bytes", "wal_max_bytes",
            "wal_segments", "memtable_commits", "memtable_bytes"),
    "snapshot": ("lmdb_bytes", "lmdb_page_size", "lmdb_last_page", "state_keys"),
    "history": ("runs", "checkpoints", "deltas", "manifests", "versions", "objects",
                "folded_runs"),
    "effects": ("effects", "effect_index_entries", "outbox_pending"),
}
#: Counters of the process that has the store open (a read-only open counts its own: 0),
#: and fields shown elsewhere: in --json only, or in their own section.
_NOT_A_ROW = {"attention", "recovery", "readonly", "folds", "segments_removed", "map_grows",
              "retention_passes", "retries", "wal_max_bytes_from"}


def _recorded(doc: dict[str, Any] | None) -> str:
    """The HEALTH row: what the writer recorded about its folds and retention passes."""
    if doc is None:
        return "none recorded (no writer has opened the store since HEALTH files existed)"
    if "unreadable" in doc:
        return f"unreadable: {doc['unreadable']}"
    failed = [f"last {job} failed at {when(doc[job]['at'])}" for job in ("fold", "retention")
              if doc.get(job)]
    written = f"written {when(doc['written_at'])}" if doc.get("written_at") else ""
    return "; ".join(failed or ["no failure recorded"]) + (f" ({written})" if written else "")


def _field(name: str, value: Any, st: dict[str, Any]) -> str:
    if name == "health_record":
        return _recorded(value)
    if name == "wal_max_bytes":
        whence = {"given": "--wal-max-bytes", "recorded": "the writer's setting",
                  "default": "the default; the writer recorded none"}.get(
            st.get("wal_max_bytes_from", ""), "")
        return f"{size(value)} ({whence})"
    if name == "writer":
        if value["held"]:
            return f"open for writing by process {value['pid']}"
        if value["held"] is None:
            return "unknown (no lock table to read on this system)"
        return "none (no process has it open for writing)"
    if name == "effects":
        by_status = ", ".join(f"{n} {s}" for s, n in value.items() if s != "total" and n)
        return f"{value['total']} ledger entries" + (f" ({by_status})" if by_status else "")
    if value is None:
        return "(the writer's; not visible read-only)" if name == "durability" else "-"
    if name.endswith("_bytes"):
        return f"{size(value)} ({value:,} bytes)"
    if name.endswith("_at"):
        return f"{when(value)} ({age(time.time() - value)} ago)"
    return str(value)


def _inspect_human(st: dict[str, Any]) -> None:
    attention = st["attention"]
    out = console()
    if attention:
        out.print(Text("needs attention", style="bold red"))
        for a in attention:
            out.print(Text.assemble(("  ! ", "bold red"), a))
    else:
        out.print(Text.assemble("needs attention: ", ("nothing", "green")))
    placed = set(_NOT_A_ROW)
    for section, fields in _SECTIONS.items():
        rows = [(f, _field(f, st[f], st)) for f in fields if f in st]
        placed.update(fields)
        click.echo("")
        table(rows, (section, ""))
    rest = [(k, _field(k, v, st)) for k, v in sorted(st.items()) if k not in placed]
    if rest:
        click.echo("")
        table(rest, ("other", ""))
    if "recovery" not in st:
        return  # PostgreSQL: no log of its own to recover
    rec = st["recovery"]
    seconds = rec.get("seconds")
    click.echo("")
    table([("replayed", f"{rec.get('replayed')} record(s) after LSN {rec.get('applied_lsn')}"),
           ("torn_bytes", rec.get("torn_bytes")),
           ("seconds", "-" if seconds is None else f"{seconds:.3f} s"),
           ("actions", ", ".join(map(str, rec.get("actions") or [])) or "-")],
          ("last recovery", ""))


@main.command(epilog=examples("agentwal runs state.awal", "agentwal runs state.awal --json"))
@store_argument
@json_option
@reports_errors
def runs(path: str, as_json: bool) -> None:
    """List the runs with their head checkpoint, last commit time and effects in doubt.

    On PostgreSQL a "parked" column says why a poison run was set aside
    (its holders kept dying before a commit); `agentwal unpark` lets it go.
    """
    with open_ro(path) as store:
        doubt = problems_by_run(store.effects())
        parked = store.parked() if is_postgres_dsn(path) else None
        rows = []
        for run in store.runs():
            head = store.head(run)
            row = {"run": run, "head": head.id if head else None,
                   "lsn": head.lsn if head else None,
                   "updated": when(head.created_at) if head else None,
                   "in_doubt_or_failed": doubt.get(run, 0)}
            if parked is not None:
                row["parked"] = parked[run][1] if run in parked else None
            rows.append(row)
    headers = ("run", "head", "lsn", "updated", "in doubt/failed")
    emit(as_json, rows, lambda: table(
        [(r["run"], r["head"], r["lsn"], r["updated"], r["in_doubt_or_failed"])
         + ((r["parked"] or "-",) if parked is not None else ()) for r in rows],
        headers + (("parked",) if parked is not None else ())))


@main.command(epilog=examples("agentwal history state.awal run-42 --limit 20",
                              "agentwal history state.awal run-42 --graph",
                              "agentwal history state.awal run-42 --json | jq '.[0].meta'"))
@store_argument
@click.argument("run")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Show at most this many checkpoints (newest first).")
@click.option("--before", type=click.IntRange(min=1), default=None, metavar="ID",
              help="Only checkpoints older than checkpoint ID (to page back).")
@click.option("--graph", is_flag=True,
              help="Draw the checkpoint tree: forks with their origins, rollbacks, the head.")
@json_option
@reports_errors
def history(path: str, run: str, limit: int | None, before: int | None, graph: bool,
            as_json: bool) -> None:
    """List a run's checkpoints, newest first (or draw them as a tree with --graph).

    With --graph each checkpoint is a node on the run's line; a rollback
    says which checkpoint's state it restored, a checkpoint other runs were
    forked from lists them, and a fork's first checkpoint names its origin.
    With --graph --json the rows carry rollback_to, forks and head.
    """
    with open_ro(path) as store:
        hist = store.history(run, limit=limit, before=before)
        if not hist and run not in store.runs():
            raise RunNotFoundError(run)
        if not graph:
            rows = [checkpoint_row(c) for c in hist]
            emit(as_json, rows, lambda: checkpoint_table(rows))
            return
        head = store.head(run)
        grows = graph_rows(hist, fork_map(store), run, head.id if head else None)
    emit(as_json, grows, lambda: _draw_graph(run, grows))


def _draw_graph(run: str, rows: list[dict[str, Any]]) -> None:
    out = console()
    tree = Tree(Text(f"run {run}", style="bold"), guide_style="dim")
    for r in rows:
        label = Text(f"#{r['id']}", style="bold cyan" if r["head"] else "cyan")
        if r["head"]:
            label.append("  HEAD", style="bold green")
        label.append(f"  lsn {r['lsn']}  {r['created']}")
        if r["rollback_to"] is not None:
            label.append(f"  rollback to #{r['rollback_to']}", style="yellow")
        meta = {k: v for k, v in (r["meta"] or {}).items() if k != "rollback_to"} \
            if isinstance(r["meta"], dict) else r["meta"]
        if meta:
            label.append(f"  {clip(to_json(meta), 60)}", style="dim")
        node = tree.add(label)
        for f in r["forks"]:
            node.add(Text(f"fork -> run {f}", style="magenta"))
        if r["origin"]:
            node.add(Text(f"forked from run {r['origin'][0]} #{r['origin'][1]}",
                          style="magenta"))
    print_renderable(out, tree)


@main.command(epilog=examples("agentwal show state.awal run-42",
                              "agentwal show state.awal run-42 plan --at 7",
                              "agentwal show state.awal run-42 messages --json | jq length"))
@store_argument
@click.argument("run")
@click.argument("key", required=False)
@click.option("--key", "keys", multiple=True, help="Show only this key (repeatable).")
@click.option("--at", type=click.IntRange(min=1), default=None, metavar="ID",
              help="The state as of checkpoint ID instead of the latest.")
@json_option
@reports_errors
def show(path: str, run: str, key: str | None, keys: tuple[str, ...], at: int | None,
         as_json: bool) -> None:
    """Show a run's latest committed state, or its state at a checkpoint (values as JSON).

    With KEY, only that value: plain JSON (the value itself with --json). A
    KEY or --key the state does not hold is a usage error (exit 2). With KEY
    or --key only those keys are read, so a damaged value under another key
    does not stop them (copy out what still reads).
    """
    wanted = ([key] if key is not None else []) + list(keys)
    with open_ro(path) as store:
        if wanted:  # read only those keys: a damaged value elsewhere does not block them
            if at is None and store.head(run) is None:
                raise RunNotFoundError(run)
            absent = object()
            got = {k: store.get(run, k, absent, at=at) for k in dict.fromkeys(wanted)}
            state = {k: v for k, v in got.items() if v is not absent}
        else:
            state = store.state(run, at=at)
        trees = {k: store.list_tree(run, k, at=at) for k, v in state.items()
                 if isinstance(v, TreeRef)}
    for k, files in trees.items():  # a tree value shows as its file listing
        state[k] = {**jsonable(state[k]), "files": [tree_file_row(f) for f in files]}
    missing = [k for k in wanted if k not in state]
    if missing:
        where = f"checkpoint {at}" if at else "its latest commit"
        raise NotFound("missing_key", f"run {run!r} has no key {missing[0]!r} at {where}. "
                       "List its keys with "
                       f"`{command('show', path, run, options=('--at', str(at)) if at else ())}`.")
    if key is not None and not keys and key not in trees:
        value = state[key]
        emit(as_json, value, lambda: click.echo(to_json(value)))
        return
    if wanted:
        state = {k: state[k] for k in wanted}

    def human() -> None:
        for k, v in state.items():
            if k not in trees:
                click.echo(f"{k}: {to_json(v)}")
                continue
            files = trees[k]
            click.echo(f"{k}: tree {v['$tree']['sha256'][:12]}, {len(files)} files, "
                       f"{sum(f.size for f in files if f.kind == 'file')} bytes")
            for f in files:
                click.echo(f"  {tree_file_line(f)}")

    emit(as_json, state, human)


@main.command(epilog=examples("agentwal wal state.awal --limit 20",
                              "agentwal wal state.awal --from-lsn 1200 --run run-42 --json"))
@store_argument
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Show at most this many records (oldest first).")
@click.option("--from-lsn", type=click.IntRange(min=0), default=None, metavar="N",
              help="Only records with LSN N or later.")
@click.option("--run", default=None, help="Only records of this run.")
@json_option
@reports_errors
def wal(path: str, limit: int | None, from_lsn: int | None, run: str | None,
        as_json: bool) -> None:
    """Dump the records of the write-ahead log (those not yet folded into LMDB, and older).

    Reads the segments directly; changes nothing. A torn tail is reported,
    damage in the middle of the log exits with status 1. --from-lsn and
    --run are filters: a run with no records lists none. A commit's keys
    read KEY (a whole value), -KEY (deleted) or KEY+N (N items appended to
    the list KEY held: the record carries only them).
    """
    local_only(path, "wal", "it reads the segment files of a local write-ahead log; on "
               "PostgreSQL, `agentwal history` lists the commits")
    rows, notes = _wal_records(path, limit, from_lsn, run)

    def human() -> None:
        table([(r["lsn"], r["type"], r["segment"], r["offset"], r["run"],
                 "-" if r["id"] is None else r["id"], r["size"], _wal_what(r)) for r in rows],
               ("lsn", "type", "segment", "offset", "run", "ckpt", "bytes", "what"))
        for n in notes:
            click.echo(n, err=True)

    emit(as_json, {"records": rows, "notes": notes}, human)


def _wal_what(r: dict[str, Any]) -> str:
    """The table's summary of a record: keys written (and outbox), or the effect entry."""
    if r["type"] == "delete_run":
        return f"run deleted (its head was checkpoint {r['id']})"
    if r["type"] == "effect":
        return clip(f"{r['name']} {r['effect_id']} -> {r['status']} "
                     f"(attempt {r['attempts']})", 60)
    what = ",".join(r["keys"])
    if r["deferred"]:
        what += f" +outbox {','.join(r['deferred'])}"
    return clip(what, 60)


def _wal_records(path: str, limit: int | None, from_lsn: int | None = None,
                 run: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Decoded records of every segment (those the filters keep), and notes about torn tails."""
    from ..errors import CorruptionError
    from ..format import WAL_DIR
    from ..io import OsFileSystem
    from ..local.wal import list_segments

    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for seg in list_segments(OsFileSystem(), os.path.join(path, WAL_DIR)):
        if seg.header is None:
            raise CorruptionError(seg.path, 0, seg.problem)
        scan = seg.scan()
        for f in scan.frames:
            if limit is not None and len(rows) >= limit:
                break
            if from_lsn is not None and f.lsn < from_lsn:
                continue
            row = {"lsn": f.lsn, "segment": seg.name, "offset": f.offset,
                   "size": len(f.payload), "synced_lsn": f.synced_lsn}
            row.update(_wal_record(seg.path, f))
            if run is None or row["run"] == run:
                rows.append(row)
        if scan.state == "corrupt":
            raise CorruptionError(seg.path, scan.end, scan.reason)
        if scan.state == "torn":
            notes.append(f"{seg.name}: torn tail at offset {scan.end} ({scan.reason})")
    return rows, notes


def _wal_record(seg_path: str, f: Any) -> dict[str, Any]:
    """The type-specific columns of one frame: a commit, a ledger entry or a deletion."""
    from ..codec import CodecError
    from ..errors import CorruptionError
    from ..local.records import ReplayedDelete, ReplayedEffect, decode_record

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
            "keys": [_key_label(k, v) for k, v in r.delta.items()],
            "deferred": [d[0] for d in r.deferred or []]}


def _key_label(key: str, entry: Any) -> str:
    """A commit's key as the dump names it: ``-key`` deleted, ``key+N`` N items appended."""
    from ..codec import array_head

    if entry is None:
        return f"-{key}"
    if isinstance(entry, tuple):  # an append entry (base count, base length, tail)
        head = array_head(entry[2])
        return f"{key}+{head[0] if head is not None else 0}"
    return key
