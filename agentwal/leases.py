"""Run leases that every backend shares: the lease value and the local store's leases.

Theory of operation: a *lease* is one worker's right to write one run,
named by an *epoch* (the fencing token) that grows with every acquisition.
:class:`Lease` is that value for every backend: the PostgreSQL backend
(``postgres/leases.py``) keeps its epochs and expiries on the server and
renews them from a heartbeat; this module also has the local store's
(:class:`LocalLeases`).

A local store has one writer process, holding the store's writer lock, and
that process is the one worker: it holds every run, so ``lease(run)``
always succeeds (no :class:`~agentwal.errors.LeaseHeldError`),
``claim_runs`` finds nothing orphaned (a crashed writer's runs passed to
whoever took the writer lock next) and a lease never expires. What is the
same as on PostgreSQL, so a fleet program runs unchanged on a laptop:

- ``begin(run)`` takes the run's lease when this worker does not hold it;
  ``lease(run)`` returns its epoch, the same one while it is held, and a
  new, larger one after ``release(run)``;
- a transaction begun under a lease that was released before it commits
  gets :class:`~agentwal.errors.LeaseLostError` at ``commit`` (or at its
  next effect) and nothing of it is applied;
- effects see the lease's epoch as ``ctx.fencing_token``.

Epochs come from one counter per process that starts at the wall clock in
microseconds and adds one per acquisition (``max(last + 1, now)``). The
writer lock lets one process at a time hand them out, so the tokens grow
across the store's successive writer processes too, as long as the clock
does not step back past the previous writer's last token (one per
microsecond of its life at most).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from .errors import LeaseLostError

__all__ = ["Lease", "LocalLeases", "default_worker_id"]


def default_worker_id() -> str:
    """``host/pid/random``: unique per process, readable in ``LeaseHeldError``."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


@dataclass(eq=False)
class Lease:
    """This worker's lease on one run: the fencing token and the local deadline."""

    run: str
    epoch: int
    deadline: float  # time.monotonic() past which the holder stops acting
    lost: str | None = None  # why the lease is gone for good (None: held)

    def live(self) -> bool:
        """True while this worker may act on the run (held and before the local deadline)."""
        return self.lost is None and time.monotonic() < self.deadline

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless :meth:`live`."""
        if self.lost is not None:
            raise LeaseLostError(self.run, self.epoch, self.lost)
        if time.monotonic() >= self.deadline:
            raise LeaseLostError(self.run, self.epoch,
                                 "the lease passed its local deadline without a renewal")


class LocalLeases:
    """The leases of a local store's one worker (module doc): never held by another."""

    def __init__(self, worker_id: str) -> None:
        self.me = worker_id
        self._held: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self._last = 0

    def ensure(self, run: str) -> Lease:
        """The lease on ``run``, taken with a new epoch if this worker does not hold it."""
        lease = self._held.get(run)
        if lease is not None and lease.lost is None:
            return lease
        with self._lock:
            lease = self._held.get(run)
            if lease is None or lease.lost is not None:
                self._last = max(self._last + 1, time.time_ns() // 1000)
                lease = self._held[run] = Lease(run, self._last, float("inf"))
            return lease

    def held(self, run: str) -> Lease | None:
        """The lease on ``run`` if this worker holds it, else None."""
        lease = self._held.get(run)
        return lease if lease is not None and lease.lost is None else None

    def release(self, run: str, why: str = "this worker released the lease") -> bool:
        """Give up the lease on ``run`` (transactions begun under it are fenced); True if held."""
        with self._lock:
            lease = self._held.pop(run, None)
        if lease is None or lease.lost is not None:
            return False
        lease.lost = why
        return True

    def release_all(self, why: str) -> None:
        """Give up every lease (the store is closing)."""
        for run in list(self._held):
            self.release(run, why)
