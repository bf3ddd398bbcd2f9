"""What `agentwal inspect` and the viewer's store page say about a store's health.

Theory of operation: :func:`inspect` gathers, from a store open in any mode
and from its directory, what a person on call needs: the store's own
``stats()``, the ledger's counts and outbox, the log's real size (bytes of
records, not the segments' preallocated length), whether a writer holds the
store now (the kernel's lock table, read without taking the lock), and how
many log records are not folded into the snapshot yet. :func:`attention`
turns those facts into sentences, most urgent first, each naming the command
to run. Nothing here writes.

What a read-only process learns from the writer: its ``HEALTH`` file
(``local/healthfile.py``) holds its settings (``wal_max_bytes``,
durability) and its last fold or retention failure with when and the error,
cleared by the next success. A store no writer has opened since that file
existed has none: "none recorded", and ``wal_max_bytes`` is then assumed to
be the default unless the caller says otherwise.
"""

from __future__ import annotations

import os
import time
from typing import Any

from . import is_postgres_dsn
from .format import WAL_DIR
from .io import OsFileSystem, writer_holder
from .local.healthfile import JOBS, read_health
from .local.wal import list_segments
from .views import age, command, effect_counts, outbox, when

__all__ = ["attention", "inspect", "size"]

#: A background job's name in a sentence.
_JOB = {"fold": "fold", "retention": "retention pass"}
#: The writer's default ``wal_max_bytes`` (``agentwal.open``), assumed when not told.
DEFAULT_WAL_MAX_BYTES = 64 << 20


def size(n: int | None) -> str:
    """Bytes for a person: 512 B, 60.0 KiB, 3.2 MiB."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    units = ("KiB", "MiB", "GiB", "TiB")
    value, step = n / 1024, 0
    while value >= 1024 and step < len(units) - 1:
        value, step = value / 1024, step + 1
    return f"{value:.1f} {units[step]}"


def inspect(store: Any, path: str, wal_max_bytes: int | None = None) -> dict[str, Any]:
    """``store.stats()`` and the facts read from ``path``, with ``attention`` (a list of text).

    Added to the stats: ``runs``, ``effects`` (counts by status), ``outbox_pending``,
    ``wal_bytes`` and ``wal_segments`` (as on disk), ``last_commit_at``,
    ``unfolded_records`` (log records after the snapshot's LSN), ``writer``
    (``{"held": bool or None when unknown, "pid": the last holder's pid}``),
    ``health_record`` (the writer's HEALTH document, None when there is none),
    ``wal_max_bytes`` and ``wal_max_bytes_from`` (``"given"``, ``"recorded"``
    by the writer, or ``"default"``).
    """
    st: dict[str, Any] = store.stats()
    runs = store.runs()
    entries = store.effects()
    heads = [h for h in (store.head(r) for r in runs) if h is not None]
    st["runs"] = len(runs)
    st["effects"] = effect_counts(entries)
    st["outbox_pending"] = len(outbox(entries))
    st["last_commit_at"] = max((h.created_at for h in heads), default=None)
    if is_postgres_dsn(path):  # no log, snapshot or lock file of its own: the tables' rows
        st["attention"] = attention(path, st, wal_max_bytes or DEFAULT_WAL_MAX_BYTES)
        return st
    record = read_health(path, st["store_id"])
    st["health_record"] = record
    settings = (record or {}).get("settings") or {}
    recorded_max = settings.get("wal_max_bytes")
    if wal_max_bytes is not None:
        st["wal_max_bytes_from"] = "given"
    elif isinstance(recorded_max, int) and recorded_max > 0:
        wal_max_bytes, st["wal_max_bytes_from"] = recorded_max, "recorded"
    else:
        wal_max_bytes, st["wal_max_bytes_from"] = DEFAULT_WAL_MAX_BYTES, "default"
    st["wal_max_bytes"] = wal_max_bytes
    if store.readonly and isinstance(settings.get("durability"), str):
        st["durability"] = settings["durability"]  # the last writer's, as it recorded it
    st["wal_bytes"], st["wal_segments"] = _wal_size(path)
    st["unfolded_records"] = max(0, st["visible_lsn"] - st["applied_lsn"])
    held, pid = writer_holder(path)
    if not store.readonly:
        held, pid = True, os.getpid()
    st["writer"] = {"held": held, "pid": pid}
    st["attention"] = attention(path, st, wal_max_bytes)
    return st


def _wal_size(path: str) -> tuple[int, int]:
    """Bytes of records in the log's segments (not their preallocated length), and segments."""
    segs = list_segments(OsFileSystem(), os.path.join(path, WAL_DIR))
    return sum(s.scan().end for s in segs if s.header is not None), len(segs)


def attention(path: str, st: dict[str, Any], wal_max_bytes: int) -> list[str]:
    """What a person should look at, most urgent first, each with the command to run."""
    out = []
    for field in ("writer_broken", "fold_error", "retention_error"):
        if st.get(field):
            what = {"writer_broken": "the writer is broken (it accepts no more commits "
                    "until reopened)"}.get(field, f"the last {_JOB[field.split('_')[0]]} failed")
            out.append(f"{what}: {st[field]}")
    record = st.get("health_record") or {}
    if st.get("readonly"):  # a writer's own failures are in its stats above
        for job in JOBS:
            entry = record.get(job)
            if entry:
                ago = max(0.0, time.time() - entry["at"])
                out.append(f"the last {_JOB[job]} failed {age(ago)} ago ({when(entry['at'])}), "
                           f"as the writer recorded it: {entry['error']}")
    eff = st["effects"]
    if eff["in_doubt"] or eff["failed"]:
        parts = [f"{eff['in_doubt']} effect(s) in doubt"] if eff["in_doubt"] else []
        if eff["failed"]:
            parts.append(f"{eff['failed']} {'failed' if parts else 'effect(s) failed'}")
        out.append(f"{' and '.join(parts)}: check the downstream, then "
                   f"`{command('effects', path, options=('--check',))}` and `agentwal resolve`")
    if st["outbox_pending"]:
        n = st["outbox_pending"]
        out.append(f"{n} outbox {'entry' if n == 1 else 'entries'} not yet dispatched: "
                   f"`{command('effects', path, options=('--status', 'pending'))}`")
    if st.get("wal_bytes", 0) > 2 * wal_max_bytes:
        whose = {"recorded": "the writer's", "default": "the default"}.get(
            st.get("wal_max_bytes_from", ""), "")
        out.append(f"the write-ahead log holds {size(st['wal_bytes'])}, over twice "
                   f"wal_max_bytes ({size(wal_max_bytes)}{', ' + whose if whose else ''}): "
                   "the writer is not folding (a failed fold, or a writer stuck or gone); "
                   "its log says why")
    writer = st.get("writer") or {}
    if writer.get("held") is False and st.get("unfolded_records"):
        out.append(f"no process has the store open, yet {st['unfolded_records']} log "
                   f"record(s) after LSN {st['applied_lsn']} are not folded: the last writer "
                   "did not close (killed or crashed); the next open replays them, nothing "
                   "acknowledged is lost")
    if st.get("recovery", {}).get("torn_bytes"):
        out.append(f"opening found {st['recovery']['torn_bytes']} torn bytes at the log's end "
                   "(a write cut short by a crash; nothing acknowledged was lost)")
    return out

