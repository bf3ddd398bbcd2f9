"""The gate between naming blobs and sweeping them: a fair shared/exclusive lock.

Theory of operation: putting a blob names its file and pins its hash, and a
fork or rollback copies references; each holds the gate *shared*. A sweep
holds it *exclusive* while it reads the pins, computes what is referenced
and removes the rest (``blobs.py`` has the whole argument). So no blob is
named and loses its file to a sweep that started before it was pinned. The
gate knows nothing of files; it is only the ordering.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["Gate"]


class Gate:
    """A shared/exclusive lock: many holders share it, or one holds it alone.

    Fair both ways: an exclusive request waits for the shared holders to
    leave and makes newcomers wait behind it (a sweep is not starved by a
    stream of commits), and when it is released, every shared request
    waiting then goes before the next exclusive one (commits are not
    starved by a stream of sweeps). Not reentrant.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0  # holders sharing the gate
        self._exclusive = False  # held alone
        self._writers = 0  # exclusive requests waiting
        self._waiting = 0  # shared requests waiting
        self._passes = 0  # shared requests let in ahead of the waiting exclusive ones

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the gate with others (naming a blob, copying references)."""
        with self._cond:
            if self._exclusive or self._writers:
                self._waiting += 1
                try:
                    while self._exclusive or (self._writers and not self._passes):
                        self._cond.wait()
                except BaseException:  # interrupted: no pass may be left unused
                    self._waiting -= 1
                    self._passes = min(self._passes, self._waiting)
                    self._cond.notify_all()
                    raise
                self._waiting -= 1
                if self._passes:
                    self._passes -= 1
                    if not self._passes:
                        self._cond.notify_all()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the gate alone (a sweep)."""
        with self._cond:
            self._writers += 1
            try:
                while self._exclusive or self._shared or self._passes:
                    self._cond.wait()
            finally:
                self._writers -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._passes = self._waiting  # those waiting now go before the next sweep
                self._cond.notify_all()
