"""A store does not cross a fork: a child process refuses the stores it inherited.

Theory of operation: an open store's handles belong to the process that opened
it (the local engine's LMDB environment, log offsets and writer lock; the
PostgreSQL backend's sessions and leases). A child forked after the open
(``multiprocessing``'s ``fork`` start method, ``os.fork``) that used them wrote
records the parent overwrote, or spoke on the parent's sockets. Each backend
registers itself with :func:`register` at open, naming how it closes itself in
a child; an ``os.register_at_fork`` hook calls that in every child, before any
of the child's own code runs. Closing there touches nothing shared (no file, no
session, no lock): the child's exit closes its copies of the descriptors.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["register", "why"]

#: ``{id: (weak reference, pid that opened it, how it closes in a child)}``
_OPEN: dict[int, tuple[weakref.ref[Any], int, Callable[[Any, int], None]]] = {}


def register(obj: Any, close_in_child: Callable[[Any, int], None]) -> None:
    """Have ``close_in_child(obj, opener)`` called in a child forked while ``obj`` lives
    (``opener``: the pid that registered it, for :func:`why`).

    ``close_in_child`` must not refer to ``obj`` (pass the class's function): the
    registry holds ``obj`` weakly, and forgets it when ``obj`` is collected.
    """
    _OPEN[id(obj)] = (weakref.ref(obj), os.getpid(), close_in_child)
    weakref.finalize(obj, _OPEN.pop, id(obj), None).atexit = False


def why(opener: int, advice: str) -> str:
    """The reason a child's inherited store gives for being closed."""
    return (f"it was opened by process {opener}, which this process was forked from, and "
            f"a store does not cross a fork. {advice}")


def _in_child() -> None:
    for ref, opener, close_in_child in list(_OPEN.values()):
        obj = ref()
        if obj is not None:
            close_in_child(obj, opener)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
