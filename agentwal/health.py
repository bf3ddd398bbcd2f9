"""What `agentwal inspect` and the viewer's store page say about a store's health.

Theory of operation: :func:`inspect` gathers, from a store open in any mode
and from its directory, what a person on call needs: the store's own
``stats()``, the ledger's counts and outbox, the log's real size (bytes of
records, not the segments' preallocated length), whether a writer holds the
store now (the kernel's lock table, read without taking the lock), and how
many log records are not folded into the snapshot yet. :func:`attention`
turns those facts into sentences, most urgent first, each naming the command
to run. Nothing here writes.

What a read-only process cannot know: the writer's settings (durability,
``wal_max_bytes``) and whether its last fold failed (``fold_error`` lives
only in the writer's memory; a failed fold leaves nothing on disk). A log
that keeps growing past ``wal_max_bytes`` is the sign that shows on disk.
"""

from __future__ import annotations

import os
from typing import Any

from .format import WAL_DIR
from .io import OsFileSystem, writer_holder
from .local.wal import list_segments
from .views import effect_counts, outbox

__all__ = ["attention", "inspect", "size"]

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


def inspect(store: Any, path: str, wal_max_bytes: int = DEFAULT_WAL_MAX_BYTES) -> dict[str, Any]:
    """``store.stats()`` and the facts read from ``path``, with ``attention`` (a list of text).

    Added to the stats: ``runs``, ``effects`` (counts by status), ``outbox_pending``,
    ``wal_bytes`` and ``wal_segments`` (as on disk), ``last_commit_at``,
    ``unfolded_records`` (log records after the snapshot's LSN), ``writer``
    (``{"held": bool or None when unknown, "pid": the last holder's pid}``).
    """
    st: dict[str, Any] = store.stats()
    runs = store.runs()
    entries = store.effects()
    heads = [h for h in (store.head(r) for r in runs) if h is not None]
    st["runs"] = len(runs)
    st["effects"] = effect_counts(entries)
    st["outbox_pending"] = len(outbox(entries))
    st["wal_bytes"], st["wal_segments"] = _wal_size(path)
    st["last_commit_at"] = max((h.created_at for h in heads), default=None)
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
                    "until reopened)"}.get(field, f"the last {field.split('_')[0]} failed")
            out.append(f"{what}: {st[field]}")
    eff = st["effects"]
    if eff["in_doubt"] or eff["failed"]:
        parts = [f"{eff['in_doubt']} effect(s) in doubt"] if eff["in_doubt"] else []
        if eff["failed"]:
            parts.append(f"{eff['failed']} {'failed' if parts else 'effect(s) failed'}")
        out.append(f"{' and '.join(parts)}: check the downstream, then "
                   f"`agentwal effects {path} --check` and `agentwal resolve`")
    if st["outbox_pending"]:
        n = st["outbox_pending"]
        out.append(f"{n} outbox {'entry' if n == 1 else 'entries'} not yet dispatched: "
                   f"`agentwal effects {path} --status pending`")
    if st["wal_bytes"] > 2 * wal_max_bytes:
        out.append(f"the write-ahead log holds {size(st['wal_bytes'])}, over twice "
                   f"wal_max_bytes ({size(wal_max_bytes)}): the writer is not folding "
                   "(a failed fold, or a writer stuck or gone); its log says why")
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
