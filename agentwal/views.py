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
import math
import shlex
import uuid
from collections.abc import Iterator
from typing import Any

from .effects import STATUSES, outstanding
from .types import BlobRef, TreeFile, TreeRef

#: Ledger statuses a person must look at: listed first, and counted as attention items.
PROBLEM_STATUSES = ("in_doubt", "failed")


#: The tags of :func:`jsonable`: a JSON object with exactly one of these keys is a tagged value.
TAGS = ("$bytes", "$datetime", "$decimal", "$uuid", "$float", "$set", "$map", "$dict",
        "$blob", "$tree")


def jsonable(value: Any) -> Any:
    """A JSON-friendly copy of a stored value that :func:`from_jsonable` turns back into it.

    JSON's own types stay as they are (a tuple becomes a list, as it reads
    back). Every other type the codec stores is an object with one ``$`` key:
    ``{"$bytes": base64}``, ``{"$datetime": ISO 8601 with its offset}``,
    ``{"$decimal": text}``, ``{"$uuid": text}``, ``{"$float": "nan" | "inf" |
    "-inf"}``, ``{"$set": [members]}`` (in the order of their JSON text),
    ``{"$map": [[key, value], ...]}`` (a dict with a key that is not text),
    ``{"$blob": {"sha256", "size", "media_type"}}``, ``{"$tree": {"sha256",
    "size"}}``; and ``{"$dict": {...}}`` escapes a dict whose only key starts
    with ``$``, so stored data never reads as a tag. Inside a ``$map`` key or a
    ``$set`` member a list is a tuple and a ``$set`` a frozenset.
    """
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return {"$map": [[jsonable(k), jsonable(v)] for k, v in value.items()]}
        out = {k: jsonable(v) for k, v in value.items()}
        if len(out) == 1 and next(iter(out)).startswith("$"):
            return {"$dict": out}
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        members = [jsonable(v) for v in value]
        return {"$set": sorted(members, key=lambda m: json.dumps(m, sort_keys=True))}
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, BlobRef):
        return {"$blob": {"sha256": value.sha256, "size": value.size,
                          "media_type": value.media_type}}
    if isinstance(value, TreeRef):
        return {"$tree": {"sha256": value.sha256, "size": value.size}}
    if isinstance(value, datetime.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": repr(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def from_jsonable(value: Any, *, hashable: bool = False) -> Any:
    """The stored value a :func:`jsonable` copy (parsed JSON) stands for.

    ``hashable`` is for dict keys and set members, where lists are tuples
    and sets frozensets.

    Raises:
        ValueError: an object with a single ``$`` key that is no tag, or a
            tag whose content is malformed (bad base64, a datetime without
            an offset ...).
    """
    if isinstance(value, list):
        items = [from_jsonable(v, hashable=hashable) for v in value]
        return tuple(items) if hashable else items
    if not isinstance(value, dict):
        return value
    if "$tree" in value and set(value) <= {"$tree", "files"}:
        tag = "$tree"  # `show` lists a tree's files beside it
    else:
        tag = next(iter(value)) if len(value) == 1 else ""
    if not tag.startswith("$"):
        return {k: from_jsonable(v) for k, v in value.items()}
    body = value[tag]
    try:
        return _untag(tag, body, hashable)
    except (KeyError, TypeError, AttributeError, IndexError, decimal.InvalidOperation) as exc:
        raise ValueError(f"malformed {tag} value: {exc}") from None


def _untag(tag: str, body: Any, hashable: bool) -> Any:
    if tag == "$dict":
        if not isinstance(body, dict):
            raise TypeError("$dict holds an object")
        return {k: from_jsonable(v) for k, v in body.items()}
    if tag == "$map":
        return {from_jsonable(k, hashable=True): from_jsonable(v) for k, v in body}
    if tag == "$set":
        members = {from_jsonable(v, hashable=True) for v in body}
        return frozenset(members) if hashable else members
    if tag == "$bytes":
        return base64.b64decode(body, validate=True)
    if tag == "$datetime":
        dt = datetime.datetime.fromisoformat(body)
        if dt.utcoffset() is None:
            raise ValueError(f"datetime {body!r} has no UTC offset")
        return dt
    if tag == "$decimal":
        return decimal.Decimal(body)
    if tag == "$uuid":
        return uuid.UUID(body)
    if tag == "$float":
        if body not in ("nan", "inf", "-inf"):
            raise ValueError(f"$float is 'nan', 'inf' or '-inf', not {body!r}")
        return float(body)
    if tag == "$blob":
        return BlobRef(body["sha256"], body["size"], body.get("media_type"))
    if tag == "$tree":
        return TreeRef(body["sha256"], body["size"])
    raise ValueError(f"unknown tag {tag!r} (tags: {', '.join(TAGS)}; a dict whose only key "
                     "starts with $ is written {\"$dict\": {...}})")


def to_json(value: Any) -> str:
    """One line of JSON for a stored value (keys sorted)."""
    return json.dumps(jsonable(value), sort_keys=True)


def when(ts: float) -> str:
    """A UNIX time as ISO 8601 in UTC, to the second."""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(
        timespec="seconds")


def age(seconds: float) -> str:
    """A short human age: 42s, 3m, 2h, 5d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


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


def command(name: str, *args: Any, options: tuple[str, ...] = ()) -> str:
    """An ``agentwal`` command line that a shell runs as printed.

    Each argument is shell-quoted (a store path with a space, a DSN with ``&``),
    and ``--`` goes before them when one starts with ``-`` (a run id may), so it
    is not taken for an option; ``options`` (already shell-safe) go before that.
    """
    words = [shlex.quote(str(a)) for a in args]
    if any(str(a).startswith("-") for a in args):
        return " ".join(["agentwal", name, *options, "--", *words])
    return " ".join(["agentwal", name, *words, *options])


def resolve_command(path: str, e: Any) -> str | None:
    """The ``agentwal resolve`` command that settles an unsettled entry, or None."""
    if e.status not in ("in_doubt", "failed", "pending"):
        return None
    return (command("resolve", path, e.effect_id, options=("--result", "'JSON'"))
            + "   # or --not-applied")


def first_checkpoint(store: Any, run: str, head: Any = None) -> Any:
    """The run's checkpoint 1 (a fork's carries its origin), or None if compaction dropped it.

    One seek (``history(before=2)``), not the whole history; ``head`` if known.
    """
    head = head if head is not None else store.head(run)
    if head is None or head.id == 1:
        return head
    first = store.history(run, limit=1, before=2)
    return first[0] if first else None


def fork_map(store: Any) -> dict[tuple[str, int], list[str]]:
    """(run, checkpoint) -> the runs forked from it, read from every run's first checkpoint."""
    forks: dict[tuple[str, int], list[str]] = {}
    for run in store.runs():
        first = first_checkpoint(store, run)
        if first is not None and first.origin:
            origin = (first.origin[0], int(first.origin[1]))
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
