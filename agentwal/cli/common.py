"""What every ``agentwal`` command shares: options, output, opening a store, errors.

Theory of operation: commands are thin shells over the public API. Each one
takes its options from the decorators here (so ``--json`` and the store
argument read the same everywhere), prints through :func:`emit` (JSON with
``--json``, a table otherwise) and lets :func:`reports_errors` turn a library
error into a message and exit status 1. Nothing here writes to a store.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import json
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..errors import Error

F = TypeVar("F", bound=Callable[..., Any])

def jsonable(value: Any) -> Any:
    """A JSON-friendly copy of a stored value (bytes as base64, datetimes as ISO 8601)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
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


def emit(as_json: bool, data: Any, human: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(jsonable(data), indent=2, sort_keys=True))
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


def open_ro(path: str) -> Any:
    from .. import open as open_store

    return open_store(path, readonly=True)


def open_rw(path: str) -> Any:
    """Open an existing store for writing; never creates one, never expires ledger entries."""
    from .. import open as open_store
    from ..errors import CorruptionError
    from ..format import CONTROL_FILE

    if not os.path.exists(os.path.join(path, CONTROL_FILE)):
        raise CorruptionError(path, None, "not an agentwal store (no CONTROL file)",
                              "Check the path; this command never creates a store.")
    return open_store(path, effect_retention=None)


def table(rows: list[tuple[Any, ...]], headers: tuple[str, ...]) -> None:
    cells = [tuple(str(c) for c in headers)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            click.echo("  ".join("-" * w for w in widths))


def when(ts: float) -> str:
    """A UNIX time as ISO 8601 in UTC, to the second."""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(
        timespec="seconds")


def clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with "..." when longer."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def age(seconds: float) -> str:
    """A short human age: 42s, 3m, 2h, 5d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def checkpoint_row(c: Any) -> dict[str, Any]:
    """Every field of a ``Checkpoint``, the time in ISO 8601."""
    return {"id": c.id, "parent": c.parent, "lsn": c.lsn, "created": when(c.created_at),
            "meta": c.meta, "hash": c.hash, "origin": c.origin}


def checkpoint_table(rows: list[dict[str, Any]]) -> None:
    table([(r["id"], r["parent"] or "-", r["lsn"], r["created"], r["hash"][:16],
             json.dumps(jsonable(r["meta"]), sort_keys=True)) for r in rows],
           ("id", "parent", "lsn", "created", "hash", "meta"))
