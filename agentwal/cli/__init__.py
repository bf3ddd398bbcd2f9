"""The ``agentwal`` command: inspect a store and its log, settle effects, torture a disk.

Theory of operation: every command is a thin shell over the public API (or,
for ``wal``, over the pure WAL reader), opening stores read-only unless it
must write. ``resolve``, ``rollback``, ``fork`` and ``compact`` write: they
open only an existing store and expire nothing (the ledger's retention is the
application's choice). Output is a human table by default and JSON with
``--json``. Exit codes: 0 ok, 1 a problem was found (an ``agentwal.Error``, a
failed torture case, an effect in doubt under ``effects --check``), 2 a usage
error (bad options, or a run, checkpoint, effect or key named on the command
line that the store does not hold). No traceback reaches the user: library
errors print their message, which ends with what to do.

Layout: :mod:`.app` holds the group, :mod:`.common` the shared options and
output helpers, and one module per group of commands registers them on import.
"""

from __future__ import annotations

from . import checkpoints, effects, maintenance, reading, torture, ui
from .app import main

__all__ = ["main"]

# Importing the command modules registers their commands on ``main``.
_COMMAND_MODULES = (reading, effects, checkpoints, maintenance, torture, ui)
