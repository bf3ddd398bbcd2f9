"""What every ``agentwal`` command shares: options, output, opening a store, errors.

Theory of operation: commands are thin shells over the public API. Each one
takes its options from the decorators here (so ``--json`` and the store
argument read the same everywhere), prints through :func:`emit` (JSON with
``--json``, a rich table otherwise: colour only on a terminal, never with
``NO_COLOR``) and lets :func:`reports_errors` turn a library error into a
:class:`Failure` (exit status 1), or, when it says that a name given on the
command line is not there, a :class:`NotFound` (a usage error, exit status 2)
whose message names the command that lists what exists; :func:`usage` is
exit status 2 too. The group in
:mod:`.app` prints either, as JSON too under ``--json``. Nothing here writes
to a store.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import Progress as RichProgress
from rich.table import Table
from rich.text import Text

from .. import is_postgres_dsn
from ..errors import Error
from ..types import Progress
from ..views import command, jsonable

F = TypeVar("F", bound=Callable[..., Any])


def emit(as_json: bool, data: Any, human: Callable[[], None]) -> None:
    """Print ``data`` as JSON with ``--json``, else call ``human`` to print it for a person."""
    if as_json:
        click.echo(json.dumps(jsonable(data), indent=2, sort_keys=True))
    else:
        human()


def examples(*lines: str) -> str:
    """A command's epilog: real invocations, shown at the end of its ``--help``."""
    body = "\n".join(f"  {line}" for line in lines)
    return f"\b\nExamples:\n{body}"


def json_option(fn: F) -> F:
    """``--json``: machine-readable output (and errors as a JSON document)."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON instead of a table; errors too.")(fn)


_DIRECTORY = click.Path(exists=True, file_okay=False)


def _store_location(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A PostgreSQL URI as given, else a directory that must exist (else a usage error)."""
    if is_postgres_dsn(value):
        return value
    return str(_DIRECTORY.convert(value, param, ctx))


def store_argument(fn: F) -> F:
    """The store argument: a directory that exists, or a ``postgresql://`` URI."""
    return click.argument("path", metavar="STORE", callback=_store_location)(fn)


def local_only(path: str, command: str, why: str) -> None:
    """A usage error (exit 2) if ``path`` is a PostgreSQL URI: ``command`` reads local files."""
    if is_postgres_dsn(path):
        raise usage(f"agentwal {command} needs a local store directory: {why}")


class Failure(click.ClickException):
    """A problem the command found: printed with its code, exit status 1."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class NotFound(click.UsageError):
    """A run, checkpoint, effect or key named on the command line that the store lacks.

    A usage error (exit 2: the command line named something that is not
    there), printed with the command that lists what exists; under
    ``--json`` its document keeps the library's code (``run_not_found`` ...).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, click.get_current_context(silent=True))
        self.code = code


#: Library error codes that mean "the name given on the command line does not exist".
NOT_FOUND = frozenset({"run_not_found", "checkpoint_not_found", "effect_not_found",
                       "missing_key"})


def usage(message: str) -> click.UsageError:
    """A name on the command line that does not exist, or options that do not fit: exit 2."""
    return click.UsageError(message, click.get_current_context(silent=True))


#: The library's own "list them with store.x()" sentence, replaced by the CLI's command.
_API_HINT = re.compile(r"\s*List the [\w ]+ with store\.\w+\(\w*\)[^.]*\.$")


def _list_hint(exc: Error, params: dict[str, Any]) -> str:
    """The command that lists what a not-found error was looking for."""
    path = params.get("path", "STORE")
    if exc.code == "run_not_found":
        return f" List the runs with `{command('runs', path)}`."
    if exc.code == "checkpoint_not_found":
        run = getattr(exc, "run", params.get("run", "RUN"))
        return f" List its checkpoints with `{command('history', path, run)}`."
    if exc.code == "effect_not_found":
        return f" List the ledger with `{command('effects', path)}`."
    if exc.code == "missing_key":
        run = getattr(exc, "run", params.get("run", "RUN"))
        return f" List its keys with `{command('show', path, run)}`."
    return ""


#: Library advice that names a Python call, and what the CLI says in its place.
_API_ADVICE = {
    "store_locked": (" Close it there, or open this one with readonly=True.",
                     " Stop that process first, or use a command that only reads (inspect, "
                     "runs, history, show, diff, effects, wal, verify, backup, ui): they "
                     "work beside it."),
    "missing_key": (" Use txn.get(key, default) to supply a default.", ""),
    "schema_version": (" open it once without readonly=True.",
                       " open it once for writing: `agentwal compact PATH` with no option "
                       "does that and drops nothing."),
}


def cli_message(exc: Error, params: dict[str, Any]) -> str:
    """The error's message with its Python advice replaced by the command to run."""
    hint = _list_hint(exc, params)
    message = _API_HINT.sub("", str(exc)) if hint else str(exc)
    api, cli = _API_ADVICE.get(exc.code, ("", ""))
    if api and message.endswith(api):
        path = params.get("path", "PATH")
        message = (message[: -len(api)]
                   + cli.replace("`agentwal compact PATH`", f"`{command('compact', path)}`"))
    return message + hint


def reports_errors(fn: F) -> F:
    """Turn agentwal errors (and OS errors) into a :class:`Failure`, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            raise
        except Error as exc:
            if exc.code in NOT_FOUND:
                raise NotFound(exc.code, cli_message(exc, kwargs)) from None
            raise Failure(exc.code, cli_message(exc, kwargs)) from None
        except OSError as exc:  # e.g. a segment removed by a writer while we read
            raise Failure("io", f"{exc.strerror or exc}: {exc.filename or ''}. Check the "
                          "path, or retry if a writer was folding.") from None

    return wrapper  # type: ignore[return-value]


def report_failure(exc: click.ClickException, as_json: bool) -> None:
    """Print a failure: the message on stderr; with ``--json`` also a JSON document on stdout."""
    code = getattr(exc, "code", "usage" if isinstance(exc, click.UsageError) else "error")
    if as_json:
        doc = {"error": {"code": code, "message": exc.format_message(),
                         "exit_code": exc.exit_code}}
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    if isinstance(exc, (Failure, NotFound)):
        click.echo(f"error [{code}]: {exc.format_message()}", err=True)
    else:
        exc.show()


def quiet_broken_pipe() -> None:
    """The reader of our stdout went away (``| head``): a normal end, with nothing more said."""
    try:
        with open(os.devnull, "w") as devnull:  # so the exit's flush has somewhere to go
            os.dup2(devnull.fileno(), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test runner's buffer)
        pass


def open_ro(path: str) -> Any:
    """Open a store read-only (works beside a live writer, or beside the fleet's workers)."""
    from .. import open as open_store

    return open_store(path, readonly=True)


def open_rw(path: str) -> Any:
    """Open an existing store for writing; never creates one, never expires ledger entries.

    On PostgreSQL this process is one more worker: a run another worker holds
    gives ``LeaseHeldError`` (exit 1), and its own leases end when it exits.
    """
    from .. import open as open_store
    from ..errors import StoreNotFoundError
    from ..format import CONTROL_FILE

    if is_postgres_dsn(path):
        return open_store(path, create=False)
    if not os.path.exists(os.path.join(path, CONTROL_FILE)):
        raise StoreNotFoundError(path, "no agentwal store here (no CONTROL file)",
                                 "Check the path; this command never creates a store.")
    return open_store(path, effect_retention=None)


def console(*, err: bool = False) -> Console:
    """A rich console on stdout (data) or stderr (diagnostics).

    Colour only on a terminal and never with ``NO_COLOR`` (rich honours it);
    into a pipe or file lines are never wrapped, so scripts see whole rows.
    """
    stream = sys.stderr if err else sys.stdout
    tty = stream.isatty()
    no_color = bool(os.environ.get("NO_COLOR"))
    return Console(file=stream, markup=False, highlight=False, emoji=False,
                   width=None if tty else 100_000,
                   color_system="auto" if tty and not no_color else None,
                   no_color=no_color or not tty, force_terminal=tty, soft_wrap=not tty)


def table(rows: list[tuple[Any, ...]], headers: tuple[str, ...], *,
          title: str | None = None) -> None:
    """A table on stdout: a header, a rule under it, then one line per row."""
    out = console()
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title=title,
              title_justify="left", header_style="bold", title_style="bold")
    for h in headers:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*(Text(str(c)) for c in r))
    print_renderable(out, t)


def print_renderable(out: Console, thing: Any) -> None:
    """Print a rich table or tree; into a pipe, without trailing spaces."""
    if out.is_terminal:
        out.print(thing)
        return
    with out.capture() as cap:
        out.print(thing)
    click.echo("\n".join(line.rstrip() for line in cap.get().splitlines()))




def clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with "..." when longer."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def checkpoint_table(rows: list[dict[str, Any]]) -> None:
    table([(r["id"], r["parent"] or "-", r["lsn"], r["created"], r["hash"][:16],
             json.dumps(jsonable(r["meta"]), sort_keys=True)) for r in rows],
           ("id", "parent", "lsn", "created", "hash", "meta"))


@contextlib.contextmanager
def progress_bar(what: str) -> Iterator[Progress | None]:
    """A progress bar on stderr, driven by the ``progress=`` callback this yields.

    Only on a terminal: elsewhere it yields None (no callback, nothing drawn).
    The bar shows the phase the store reports, how far it is (a pulse when
    the total is not known) and the elapsed time, and is gone when done.
    """
    err = console(err=True)
    if not err.is_terminal:
        yield None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TaskProgressColumn(), TimeElapsedColumn())
    with RichProgress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(what, total=None)

        def update(phase: str, done: int, total: int | None) -> None:
            bar.update(task, description=f"{what}: {phase}", completed=done, total=total)

        yield update
