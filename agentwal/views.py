"""Read-only views of a store for people: what the CLI prints and the web viewer shows.

Theory of operation: plain functions over an open store (any mode) or over
values read from it. They encode values for JSON (:func:`jsonable`), turn
checkpoints and ledger entries into rows, find which runs were forked from
which checkpoint, and describe a value change item by item
(:func:`value_changes`: a list that grew shows the appended items, not both
lists). Nothing here writes, prints or touches a file.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import difflib
import json
import uuid
from collections.abc import Iterator
from typing import Any

from .effects import STATUSES, outstanding
from .types import BlobRef, TreeFile, TreeRef

#: Ledger statuses a person must look at: listed first, and counted as attention items.
PROBLEM_STATUSES = ("in_doubt", "failed")


def jsonable(value: Any) -> Any:
    """A JSON-friendly copy of a stored value.

    ``bytes`` become ``{"$bytes": "<base64>"}``, a blob reference
    ``{"$blob": {"sha256", "size", "media_type"}}``, a tree reference
    ``{"$tree": sha256}``, datetimes ISO 8601 text,
    ``Decimal`` and ``UUID`` text, sets sorted lists, NaN and infinities text.
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, BlobRef):
        return {"$blob": {"sha256": value.sha256, "size": value.size,
                          "media_type": value.media_type}}
    if isinstance(value, TreeRef):
        return {"$tree": value.sha256}
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def to_json(value: Any) -> str:
    """One line of JSON for a stored value (keys sorted)."""
    return json.dumps(jsonable(value), sort_keys=True)


def when(ts: float) -> str:
    """A UNIX time as ISO 8601 in UTC, to the second."""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(
        timespec="seconds")


def checkpoint_row(c: Any) -> dict[str, Any]:
    """Every field of a ``Checkpoint``, the time in ISO 8601."""
    return {"id": c.id, "parent": c.parent, "lsn": c.lsn, "created": when(c.created_at),
            "meta": c.meta, "hash": c.hash,
            "origin": list(c.origin) if c.origin else None}


def effect_row(e: Any) -> dict[str, Any]:
    """Every field of an ``EffectRecord`` (mode as its string, order as a list), and its age."""
    row = {f.name: getattr(e, f.name) for f in dataclasses.fields(e)}
    row["mode"] = e.mode.value
    row["order"] = list(e.order) if e.order is not None else None
    row["age"] = round(e.age, 3)
    row["uncommitted"] = e.uncommitted
    return row


def effect_counts(entries: list[Any]) -> dict[str, int]:
    """Ledger entries by status (every status, zeros included) and in total."""
    counts = dict.fromkeys(STATUSES, 0)
    for e in entries:
        counts[e.status] = counts.get(e.status, 0) + 1
    counts["total"] = len(entries)
    return counts


def problems_by_run(entries: list[Any]) -> dict[str, int]:
    """How many in-doubt or failed ledger entries each run has (runs with none left out)."""
    counts: dict[str, int] = {}
    for e in entries:
        if e.status in PROBLEM_STATUSES:
            counts[e.run] = counts.get(e.run, 0) + 1
    return counts


def problems_first(entries: list[Any]) -> list[Any]:
    """Ledger entries with in-doubt and failed ones first, otherwise in their order."""
    return sorted(entries, key=lambda e: e.status not in PROBLEM_STATUSES)


def outbox(entries: list[Any]) -> list[Any]:
    """The outbox: deferred entries a dispatch may still call, in commit order."""
    return sorted((e for e in entries if e.deferred and outstanding(e)),
                  key=lambda e: e.order or (0, 0))


def resolve_command(path: str, e: Any) -> str | None:
    """The ``agentwal resolve`` command that settles an unsettled entry, or None."""
    if e.status not in ("in_doubt", "failed", "pending"):
        return None
    return (f"agentwal resolve {path} {e.effect_id} --result 'JSON'   "
            f"# or --not-applied")


def fork_map(store: Any) -> dict[tuple[str, int], list[str]]:
    """(run, checkpoint) -> the runs forked from it, read from every run's first checkpoint."""
    forks: dict[tuple[str, int], list[str]] = {}
    for run in store.runs():
        first = store.history(run)[-1:]
        if first and first[0].origin:
            origin = (first[0].origin[0], int(first[0].origin[1]))
            forks.setdefault(origin, []).append(run)
    return forks


def graph_rows(history: list[Any], forks: dict[tuple[str, int], list[str]],
               run: str, head: int | None) -> list[dict[str, Any]]:
    """A run's checkpoints, newest first, each with what a tree drawing needs.

    ``rollback_to`` (the checkpoint whose state it restored), ``forks`` (runs
    started from it), ``origin`` (for a fork's first checkpoint) and ``head``.
    """
    rows = []
    for c in history:
        row = checkpoint_row(c)
        meta = c.meta if isinstance(c.meta, dict) else {}
        row["rollback_to"] = meta.get("rollback_to")
        row["forks"] = sorted(forks.get((run, c.id), []))
        row["head"] = c.id == head
        rows.append(row)
    return rows


# -- value changes ------------------------------------------------------------------------


def value_changes(old: Any, new: Any, path: str = "") -> Iterator[dict[str, Any]]:
    """What changed from ``old`` to ``new``, item by item.

    Dicts recurse into their keys (``path`` grows ``.key``); lists compare
    their common head and tail, so a list that grew by one message yields one
    ``appended`` change; text that grew yields ``appended`` text, other
    multi-line text a line diff. Each change: ``{"op", "path", ...}`` with
    ``op`` one of added, removed, changed, appended, removed_items,
    inserted_items, text_diff.
    """
    if isinstance(old, dict) and isinstance(new, dict):
        for k in old.keys() - new.keys():
            yield {"op": "removed", "path": f"{path}.{k}", "old": old[k]}
        for k in new.keys() - old.keys():
            yield {"op": "added", "path": f"{path}.{k}", "new": new[k]}
        for k in sorted(old.keys() & new.keys(), key=str):
            if not _same(old[k], new[k]):
                yield from value_changes(old[k], new[k], f"{path}.{k}")
        return
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        yield from _list_changes(list(old), list(new), path)
        return
    if isinstance(old, str) and isinstance(new, str):
        if new.startswith(old) and old:
            yield {"op": "appended", "path": path, "at": len(old), "new": new[len(old):]}
            return
        if old and ("\n" in old or "\n" in new):  # from nothing: the new text, whole
            lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(),
                                              lineterm="", n=1))[2:]
            yield {"op": "text_diff", "path": path, "lines": lines}
            return
    yield {"op": "changed", "path": path, "old": old, "new": new}


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _list_changes(old: list[Any], new: list[Any], path: str) -> Iterator[dict[str, Any]]:
    head = 0
    while head < min(len(old), len(new)) and _same(old[head], new[head]):
        head += 1
    tail = 0
    while (tail < min(len(old), len(new)) - head
           and _same(old[len(old) - 1 - tail], new[len(new) - 1 - tail])):
        tail += 1
    gone = old[head:len(old) - tail]
    came = new[head:len(new) - tail]
    if not gone and came:
        op = "appended" if tail == 0 else "inserted_items"
        yield {"op": op, "path": path, "at": head, "items": came}
    elif gone and not came:
        yield {"op": "removed_items", "path": path, "at": head, "items": gone}
    elif len(gone) == len(came):
        for i, (a, b) in enumerate(zip(gone, came, strict=True)):
            if not _same(a, b):
                yield from value_changes(a, b, f"{path}[{head + i}]")
    else:
        yield {"op": "removed_items", "path": path, "at": head, "items": gone}
        yield {"op": "inserted_items", "path": path, "at": head, "items": came}


def abbreviate(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters; --full shows all)"


def tree_file_row(f: TreeFile) -> dict[str, Any]:
    """One file or link of a stored tree (``store.list_tree``) as JSON."""
    out: dict[str, Any] = {"path": f.path, "kind": f.kind, "size": f.size}
    if f.kind == "file":
        out.update(mode=f"{f.mode:04o}", sha256=f.sha256)
    else:
        out["target"] = f.target
    return out


def tree_file_line(f: TreeFile) -> str:
    """One file or link of a stored tree, for people: mode (or "link"), path, size or target."""
    if f.kind == "link":
        return f"link {f.path}  -> {f.target}"
    return f"{f.mode:04o} {f.path}  {f.size} B"
