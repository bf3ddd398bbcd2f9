"""A store's background threads, started when there is work and ended when idle.

Theory of operation: a writer store has background work (folding, async
mode's flush, retention), but a process that keeps thousands of stores open
(one per user or session) must not hold a thread per idle store. A
:class:`Worker` owns at most one thread. :meth:`Worker.kick`, called under
the store's lock whenever work appears (a fold is wanted, a write is
unsynced), starts the thread if there is none, else wakes it. The thread
calls its step every ``interval`` seconds or when woken; the step answers
``BUSY`` (keep going), ``IDLE`` (nothing to do) or ``STOP`` (the store is
closing or gone). After ``idle_rounds`` idle answers in a row the thread
ends; the decision to end is taken under the store's lock, where ``kick``
also runs, so work that appears meanwhile always finds a thread that will
see it (``kicked`` is set and the thread goes on).

A thread that cannot be started (the process is out of threads) is not an
error of the commit that asked for it: the work waits for the next kick
(the next commit, or ``close()``, which folds itself).

The thread holds the store weakly, so a store dropped without ``close()``
is still collected and its finalizer releases the writer lock.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["BUSY", "IDLE", "STOP", "Worker"]

BUSY, IDLE, STOP = "busy", "idle", "stop"


class Worker:
    """One lazily started background thread of a store."""

    def __init__(self, store: Any, wake: threading.Condition, step: Callable[[Any], str],
                 interval: float, name: str, *, idle_rounds: int = 3) -> None:
        self._ref = weakref.ref(store)
        self._wake = wake
        self._step = step
        self._interval = interval
        self._name = name
        self._idle_rounds = idle_rounds
        self.thread: threading.Thread | None = None
        self._kicked = False
        #: set while no step runs (cleared before the thread takes the store strongly)
        self._between = threading.Event()
        self._between.set()
        self._halted = False

    def kick(self) -> None:
        """There is work: start the thread, or wake it. Call with the store's lock held."""
        self._kicked = True
        if self.thread is None:
            t = threading.Thread(target=self._run, name=self._name, daemon=True)
            self.thread = t
            try:
                t.start()
            except RuntimeError:  # no thread left in the process: the next kick tries again
                self.thread = None
        else:
            self._wake.notify_all()

    def running(self) -> bool:
        """Whether the thread exists now (for stats and tests)."""
        return self.thread is not None

    def halt(self) -> None:
        """End the thread after its step in progress (a dropped store's, so it can go); a
        later :meth:`kick` starts a new one."""
        with self._wake:
            if self.thread is not None:
                self._halted = True
                self._wake.notify_all()

    def wait_step(self, timeout: float) -> bool:
        """Wait until no step runs (False on timeout). A step holds the store strongly,
        so a store dropped without ``close()`` lives until its step in progress ends."""
        if self.thread is threading.current_thread():
            return True
        return self._between.wait(timeout)

    def join(self, timeout: float) -> None:
        """Wait for the thread to end (the store set its stop flag and notified)."""
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def _run(self) -> None:
        idle = 0
        while True:
            with self._wake:
                if not self._kicked and not self._halted:
                    self._wake.wait(self._interval)
                self._kicked = False
                if self._halted:
                    self._halted = False
                    self.thread = None
                    return
                self._between.clear()
            store = self._ref()
            try:
                answer = STOP if store is None else self._step(store)
            except BaseException:
                with self._wake:
                    self.thread = None  # the next kick starts a new thread
                raise
            finally:
                del store
                self._between.set()
            idle = idle + 1 if answer == IDLE else 0
            with self._wake:
                if answer == STOP or (idle >= self._idle_rounds and not self._kicked):
                    self.thread = None
                    return
