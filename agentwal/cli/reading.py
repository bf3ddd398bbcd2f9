"""Commands that read a store: inspect, runs, history, show, and wal (the raw log)."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from ..effects import STATUSES
from .app import main
from .common import (
    checkpoint_row,
    checkpoint_table,
    clip,
    emit,
    json_option,
    jsonable,
    open_ro,
    reports_errors,
    store_argument,
    table,
    when,
)


@main.command()
@store_argument
@json_option
@reports_errors
def inspect(path: str, as_json: bool) -> None:
    """Show a store's sizes, LSNs, counters, effects and last recovery.

    Opens the store read-only, so it works while a writer has it open.
    """
    with open_ro(path) as store:
        st = store.stats()
        st["runs"] = len(store.runs())
        st["effects"] = _effect_counts(store.effects())

    def human() -> None:
        rec = st.pop("recovery", {})
        eff = st.pop("effects")
        table(sorted((k, v) for k, v in st.items()), ("field", "value"))
        click.echo(f"\nrecovery: replayed {rec.get('replayed')} records after LSN "
                   f"{rec.get('applied_lsn')}, {rec.get('torn_bytes')} torn bytes, "
                   f"{rec.get('seconds')} s")
        by_status = ", ".join(f"{n} {s}" for s, n in eff.items() if s != "total" and n)
        click.echo(f"effects: {eff['total']} ledger entries" + (f" ({by_status})"
                                                                 if by_status else ""))

    emit(as_json, st, human)


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
    with open_ro(path) as store:
        rows = []
        for run in store.runs():
            head = store.head(run)
            rows.append({"run": run, "head": head.id if head else None,
                         "lsn": head.lsn if head else None,
                         "updated": when(head.created_at) if head else None})
    emit(as_json, rows, lambda: table([tuple(r.values()) for r in rows],
                                        ("run", "head", "lsn", "updated")))


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
    with open_ro(path) as store:
        hist = store.history(run, limit=limit, before=before)
    rows = [checkpoint_row(c) for c in hist]
    emit(as_json, rows, lambda: checkpoint_table(rows))


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
    with open_ro(path) as store:
        state = store.state(run, at=at)
    if keys:
        state = {k: state[k] for k in keys if k in state}
    def human() -> None:
        for k, v in state.items():
            click.echo(f"{k}: {json.dumps(jsonable(v), sort_keys=True)}")

    emit(as_json, state, human)


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
        table([(r["lsn"], r["type"], r["segment"], r["offset"], r["run"],
                 "-" if r["id"] is None else r["id"], r["size"], _wal_what(r)) for r in rows],
               ("lsn", "type", "segment", "offset", "run", "ckpt", "bytes", "what"))
        for n in notes:
            click.echo(n)

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


def _wal_records(path: str, limit: int | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Decoded records of every segment, and notes about torn tails."""
    from ..errors import CorruptionError
    from ..format import WAL_DIR
    from ..io import OsFileSystem
    from ..wal import list_segments

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
    """The type-specific columns of one frame: a commit or an effects-ledger entry."""
    from ..codec import CodecError, decode_commit, decode_delta, unpack_payload
    from ..effects import decode_entry, decode_outbox
    from ..errors import CorruptionError
    from ..format import REC_COMMIT, REC_DELETE_RUN, REC_EFFECT
    from ..retention import decode_delete_run

    try:
        if f.type == REC_DELETE_RUN:
            run, head = decode_delete_run(f.payload)
            return {"type": "delete_run", "run": run, "id": head, "keys": [], "deferred": []}
        if f.type == REC_EFFECT:
            e = decode_entry(unpack_payload(f.payload, f.flags))
            return {"type": "effect", "run": e.run, "id": None, "keys": [],
                    "effect_id": e.effect_id, "name": e.name, "status": e.status,
                    "attempts": e.attempts}
        if f.type != REC_COMMIT:
            raise CorruptionError(seg_path, f.offset,
                                  f"record LSN {f.lsn} has unknown type {f.type}")
        rec = decode_commit(f.payload)
        delta = decode_delta(rec.delta, f.flags)
        deferred = decode_outbox(rec.deferred) if rec.deferred is not None else []
    except CodecError as exc:
        raise CorruptionError(seg_path, f.offset, f"record LSN {f.lsn}: {exc}") from None
    return {"type": "commit", "run": rec.run, "id": rec.id,
            "keys": [k if v is not None else f"-{k}" for k, v in delta.items()],
            "deferred": [d[0] for d in deferred]}
