"""Leases on runs: one writer per run across processes and hosts, fenced by an epoch.

Theory of operation: a run's lease lives on its ``runs`` row as
``(lease_owner, lease_epoch, lease_expires)``. Every acquisition, by anyone,
bumps ``lease_epoch`` (the fencing token) and sets the expiry from the
*server's* clock; the row is never deleted, so an epoch is never reused.
Every write of the backend checks owner and epoch and that the lease has not
expired in the same database transaction as the write (``backend``), so a
worker paused past its expiry (GC, SIGSTOP, a partition) cannot write once
someone else holds the run.

The holder also keeps a *local deadline* on its monotonic clock, from the
moment it sent the acquire or renewal: ``t_send + 0.9 * ttl``, always earlier
than the server's expiry. Past it the holder treats the lease as gone
(:meth:`Lease.live` is False: no effect function is called on it) until a
renewal succeeds. A heartbeat thread with its own session renews every held
lease every ``ttl / 3``; a renewal that finds the lease taken marks it lost
for good. A renewal gets ``Db.call_timeout`` (a quarter TTL) before its link
is taken for dead (``db.deadline``): the heartbeat then drops that session and
renews at once on a new one, so a link that died silently costs no lease.

Acquire waits at most ``lock_timeout`` for the run's row. If the row is held
longer and the lease has expired, the holder is stale (frozen inside a
transaction, perhaps in the middle of a pipeline, where the server's idle
timeout never fires): its sessions, found by ``application_name``, are ended,
which the fencing makes safe, and the acquire is tried once more.

Poison runs: ``steals`` counts the takeovers of a run's expired lease since
its last commit (a commit resets it). A run whose step kills every worker
that runs it would otherwise be handed around the fleet forever, one TTL and
one dead worker at a time. Once ``steals`` reaches ``max_steals``, the next
takeover (by ``acquire`` or ``claim``) parks the run instead: ``parked_at`` and
``parked_why`` are set, the lease is cleared with a new epoch, and no worker
takes it (:class:`~agentwal.errors.RunParkedError`) until :meth:`Leases.unpark`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import psycopg

from ..errors import LeaseHeldError, RunParkedError
from ..leases import Lease
from .db import Db, app_name, deadline, translate

__all__ = ["Lease", "Leases"]

_LOCK_TIMEOUT_MS = 500
#: ``max_steals`` when parking is off
_NEVER = 2**31 - 1

# Sets a poison run aside; the SET expressions see the row as it was.
_PARK_SET = """
SET parked_at = clock_timestamp(), lease_owner = NULL, lease_expires = NULL,
    lease_epoch = r.lease_epoch + 1,
    parked_why = 'the leases of its last ' || (r.steals + 1) || ' holders expired without '
                 || 'a commit (the last holder: worker ' || r.lease_owner || ')'
"""
# The takeover of an expired lease another worker held, when it would be one too many.
_PARK_ONE = "UPDATE runs r " + _PARK_SET + """
 WHERE run = %(run)s AND parked_at IS NULL AND lease_owner IS NOT NULL
   AND lease_owner <> %(me)s AND lease_expires < clock_timestamp() AND steals >= %(max)s
RETURNING r.steals, r.parked_why
"""
_PARK_EXPIRED = "UPDATE runs r " + _PARK_SET + """
  FROM (SELECT run FROM runs WHERE parked_at IS NULL AND lease_owner IS NOT NULL
          AND lease_expires < clock_timestamp() AND steals >= %(max)s
          FOR UPDATE SKIP LOCKED) p
 WHERE r.run = p.run
RETURNING r.run
"""

_ACQUIRE = """
UPDATE runs SET lease_owner = %(me)s, lease_epoch = lease_epoch + 1,
       lease_expires = clock_timestamp() + make_interval(secs => %(ttl)s),
       steals = steals + (lease_owner IS NOT NULL AND lease_owner <> %(me)s)::int
 WHERE run = %(run)s AND parked_at IS NULL
   AND (lease_owner IS NULL OR lease_owner = %(me)s OR lease_expires < clock_timestamp())
RETURNING lease_epoch
"""

_RENEW = """
UPDATE runs r SET lease_expires = clock_timestamp() + make_interval(secs => %(ttl)s)
  FROM unnest(%(runs)s::text[], %(epochs)s::bigint[]) AS h(run, epoch)
 WHERE r.run = h.run AND r.lease_owner = %(me)s AND r.lease_epoch = h.epoch
   AND r.lease_expires > clock_timestamp()
RETURNING r.run
"""

_CLAIM = """
WITH c AS (
    SELECT run FROM runs
     WHERE lease_owner IS NOT NULL AND lease_expires < clock_timestamp() AND parked_at IS NULL
     ORDER BY lease_expires LIMIT %(n)s FOR UPDATE SKIP LOCKED)
UPDATE runs r SET lease_owner = %(me)s, lease_epoch = r.lease_epoch + 1, steals = steals + 1,
       lease_expires = clock_timestamp() + make_interval(secs => %(ttl)s)
  FROM c WHERE r.run = c.run
RETURNING r.run, r.lease_epoch
"""


class Leases:
    """The leases one worker holds, and the heartbeat that renews them."""

    def __init__(self, db: Db, worker_id: str, ttl: float, max_steals: int | None = None
                 ) -> None:
        self.db = db
        self.me = worker_id
        self.ttl = float(ttl)
        self.max_steals = _NEVER if max_steals is None else int(max_steals)
        self._held: dict[str, Lease] = {}
        self._lock = threading.Lock()
        #: held while a lease is taken or renewed in place by ``ensure``
        self._acquiring = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hb_conn: psycopg.Connection[Any] | None = None

    # -- acquiring -------------------------------------------------------------------

    def held(self, run: str) -> Lease | None:
        """This worker's live lease on ``run``, or None."""
        with self._lock:
            lease = self._held.get(run)
        return lease if lease is not None and lease.live() else None

    def ensure(self, run: str) -> Lease:
        """The live lease on ``run``; renewed in place if only its local deadline passed
        (the heartbeat was late, the server still shows it ours), else acquired anew."""
        lease = self.held(run)
        if lease is not None:
            return lease
        with self._acquiring:  # threads of this worker: one acquires, the others find it held
            lease = self.held(run)
            if lease is not None:
                return lease
            with self._lock:
                late = self._held.get(run)
            if late is not None and late.lost is None:
                with self.db.connection() as conn:
                    self._extend(conn, [late])
                if late.live():
                    return late
            return self.acquire(run)

    def acquire(self, run: str) -> Lease:
        """Take the lease on ``run`` with a new epoch (free, expired, or ours).

        Raises:
            LeaseHeldError: another worker holds it and it has not expired.
            RunParkedError: the run is parked, or this takeover parked it.
        """
        for attempt in (1, 2):
            sent = time.monotonic()
            args = {"me": self.me, "ttl": self.ttl, "run": run, "max": self.max_steals}
            with self.db.connection() as conn:
                try:
                    with conn.transaction():
                        conn.execute(f"SET LOCAL lock_timeout = {_LOCK_TIMEOUT_MS}")
                        conn.execute("INSERT INTO runs (run) VALUES (%s) ON CONFLICT DO NOTHING",
                                     (run,))
                        parked = conn.execute(_PARK_ONE, args).fetchone()
                        row = None if parked else conn.execute(_ACQUIRE, args).fetchone()
                except psycopg.errors.LockNotAvailable:
                    if attempt == 1 and self._end_stale_holder(conn, run):
                        continue
                    holder = self._holder(conn, run)
                    raise LeaseHeldError(run, holder[0] if holder else None, None) from None
                if parked is not None:
                    raise RunParkedError(run, int(parked[0]), str(parked[1]))
                if row is None:
                    raise self._refusal(conn, run)
            lease = Lease(run, int(row[0]), sent + 0.9 * self.ttl)
            with self._lock:
                old = self._held.get(run)
                if old is not None and old.lost is None:
                    old.lost = "this worker took the run again with a new epoch"
                self._held[run] = lease
            self._start()
            return lease
        raise AssertionError("unreachable")  # the loop returns or raises

    def _refusal(self, conn: psycopg.Connection[Any], run: str) -> LeaseHeldError:
        """Why ``run``'s lease was not granted: it is parked, or another worker holds it."""
        row = conn.execute("SELECT steals, parked_why FROM runs WHERE run = %s "
                           "AND parked_at IS NOT NULL", (run,)).fetchone()
        if row is not None:
            return RunParkedError(run, int(row[0]), str(row[1]))
        holder = self._holder(conn, run)
        return LeaseHeldError(run, holder[0] if holder else None, holder[1] if holder else None)

    def _holder(self, conn: psycopg.Connection[Any], run: str) -> tuple[str, float] | None:
        row = conn.execute("SELECT lease_owner, extract(epoch FROM lease_expires)::float8 "
                           "FROM runs WHERE run = %s", (run,)).fetchone()
        if row is None or row[0] is None:
            return None
        return str(row[0]), float(row[1])

    def _end_stale_holder(self, conn: psycopg.Connection[Any], run: str) -> bool:
        """End the sessions of an expired holder that still locks ``run``'s row; True if any."""
        row = conn.execute("SELECT lease_owner FROM runs WHERE run = %s "
                           "AND lease_expires < clock_timestamp()", (run,)).fetchone()
        if row is None or row[0] is None:
            return False  # not expired: a live holder's commit is in flight
        ended = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid() "
            "AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')",
            (app_name(str(row[0])),)).fetchone()
        return bool(ended and ended[0])

    def claim(self, limit: int) -> list[str]:
        """Adopt up to ``limit`` runs whose holder's lease expired; their ids.

        ``FOR UPDATE SKIP LOCKED``: workers claiming at once never take the
        same run, and never queue behind each other. Expired runs whose
        takeovers reached ``max_steals`` are parked instead (module doc).
        """
        sent = time.monotonic()
        with self.db.connection() as conn, conn.transaction():
            conn.execute(_PARK_EXPIRED, {"max": self.max_steals})  # poison runs: set aside
            rows = conn.execute(_CLAIM, {"n": limit, "me": self.me, "ttl": self.ttl}).fetchall()
        with self._lock:
            for run, epoch in rows:
                old = self._held.get(run)
                if old is not None and old.lost is None:
                    old.lost = "the lease expired and this worker claimed the run again"
                self._held[run] = Lease(run, int(epoch), sent + 0.9 * self.ttl)
        if rows:
            self._start()
        return sorted(run for run, _ in rows)

    def release(self, run: str) -> bool:
        """Give up the lease on ``run`` (the next acquirer gets a new epoch); True if held."""
        with self._lock:
            lease = self._held.pop(run, None)
        if lease is None or lease.lost is not None:
            return False
        lease.lost = "this worker released the lease"
        with self.db.connection() as conn:
            cur = conn.execute("UPDATE runs SET lease_owner = NULL, lease_expires = NULL "
                               "WHERE run = %s AND lease_owner = %s AND lease_epoch = %s",
                               (run, self.me, lease.epoch))
        return cur.rowcount == 1

    def unpark(self, run: str) -> bool:
        """Let workers take ``run`` again (its steal count starts over); True if it was parked."""
        with self.db.connection() as conn:
            cur = conn.execute("UPDATE runs SET parked_at = NULL, parked_why = NULL, steals = 0 "
                               "WHERE run = %s AND parked_at IS NOT NULL", (run,))
        return cur.rowcount == 1

    def parked(self) -> dict[str, tuple[float, str]]:
        """``{run: (when it was parked, seconds since the epoch; why)}`` of the parked runs."""
        with self.db.connection() as conn:
            rows = conn.execute("SELECT run, extract(epoch FROM parked_at)::float8, parked_why "
                                "FROM runs WHERE parked_at IS NOT NULL ORDER BY run").fetchall()
        return {str(r): (float(t), str(why)) for r, t, why in rows}

    def forget(self, lease: Lease, why: str) -> None:
        """The server refused ``lease``: mark it lost for good."""
        lease.lost = lease.lost or why
        with self._lock:
            if self._held.get(lease.run) is lease:
                del self._held[lease.run]

    def release_all(self) -> None:
        for run in list(self._held):
            with contextlib.suppress(Exception):
                self.release(run)

    # -- the heartbeat ---------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._beat, name="agentwal-lease-heartbeat",
                                            daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            for _ in range(2):  # a renewal lost with its session is tried once more, at once
                try:
                    self.renew()
                    break
                except Exception:
                    continue

    def renew(self) -> None:
        """Extend every held lease once (the heartbeat's step); a lease found taken is lost."""
        with self._lock:
            leases = [lease for lease in self._held.values() if lease.lost is None]
        if not leases:
            return
        try:
            if self._hb_conn is None or self._hb_conn.closed:
                self._hb_conn = self.db.dedicated()
            with translate(self.db.where), deadline(self._hb_conn, self.db.call_timeout):
                self._extend(self._hb_conn, leases)
        except Exception:
            if self._hb_conn is not None:
                with contextlib.suppress(Exception):
                    self._hb_conn.close()
                self._hb_conn = None
            raise

    def _extend(self, conn: psycopg.Connection[Any], leases: list[Lease]) -> None:
        """Renew ``leases`` on ``conn`` (same epochs); those the server refuses are lost."""
        sent = time.monotonic()
        rows = conn.execute(_RENEW, {
            "ttl": self.ttl, "me": self.me, "runs": [lease.run for lease in leases],
            "epochs": [lease.epoch for lease in leases]}).fetchall()
        renewed = {r[0] for r in rows}
        for lease in leases:
            if lease.run in renewed:
                lease.deadline = sent + 0.9 * self.ttl
            else:
                self.forget(lease, "the lease expired or was taken before it was renewed")

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
        if self._hb_conn is not None:
            with contextlib.suppress(Exception):
                self._hb_conn.close()
