"""The ``agentwal`` command group itself; each module of this package adds its commands to it.

:class:`Group` runs every command the same way: a :class:`~.common.Failure`
or a usage error becomes a message on stderr (and, with ``--json``, a JSON
document on stdout) and its exit status; a closed stdout (``| head``) ends
quietly with status 0; anything else is a bug, reported in one line with
status 1 (``AGENTWAL_DEBUG=1`` shows its traceback).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from .. import __version__
from .common import Failure, examples, quiet_broken_pipe, report_failure


class Group(click.Group):
    """A click group whose errors never reach the user as a traceback."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        try:
            rv = super().main(argv, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            report_failure(exc, as_json="--json" in argv)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:  # Ctrl-C (or end of input at a prompt)
            click.echo("agentwal: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            _end_on_closed_pipe()
        except Exception as exc:
            if os.environ.get("AGENTWAL_DEBUG"):
                raise
            report_failure(_internal(exc), as_json="--json" in argv)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _end_on_closed_pipe() -> NoReturn:
    quiet_broken_pipe()
    sys.exit(0)


def _internal(exc: Exception) -> click.ClickException:
    return Failure("internal", f"{type(exc).__name__}: {exc}. This is a bug in agentwal; "
                   "run again with AGENTWAL_DEBUG=1 to see where, and report it.")


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=examples("agentwal inspect state.awal",
                             "agentwal history state.awal run-42 --graph",
                             "python -m agentwal effects state.awal --check"))
@click.version_option(__version__, prog_name="agentwal")
def main() -> None:
    """Inspect and test agentwal stores (an embedded, transactional store for agent state).

    Exit status: 0 ok, 1 a problem was found, 2 a usage error. With --json,
    data and errors are JSON on stdout; messages go to stderr.
    """
