"""The ``agentwal`` command group itself; each module of this package adds its commands to it."""

from __future__ import annotations

import click

from .. import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentwal")
def main() -> None:
    """Inspect and test agentwal stores (an embedded, transactional store for agent state).

    Exit status: 0 ok, 1 a problem was found, 2 a usage error.
    """
