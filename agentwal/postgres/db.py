"""Connections to the server and the one place psycopg errors become agentwal errors.

Theory of operation: a :class:`Db` owns a ``psycopg_pool.ConnectionPool``
whose connections are autocommit (a statement outside an explicit
transaction commits by itself) and carry the store's session settings: the
schema as ``search_path``, ``idle_in_transaction_session_timeout`` (a worker
frozen inside a transaction loses its session, and with it its row locks, so
a takeover is not blocked forever), the durability mode as
``synchronous_commit`` and an ``application_name`` naming the worker (a new
lease holder ends a stale holder's stuck sessions by it, see ``leases``).
No PostgreSQL transaction is ever held open across user code.

A link that dies without a word (a partition, a NAT table or a proxy losing
the connection) leaves a client waiting for a reply that never comes. On a
real network the sessions' TCP keepalives and ``tcp_user_timeout`` (scaled to
the lease TTL) end such a session; a peer that still acknowledges the bytes
(a stuck proxy) defeats both, so the calls that must not hang carry a
client-side :func:`deadline` as well: past it, the session's socket is shut
down from a timer thread, the blocked call fails as a lost session, and the
caller retries on a new one. The lease heartbeat's renewals and the pool's
check of an idle session run under one.

:func:`translate` maps every psycopg error at the boundary: a session that
is gone (SQLSTATE class 08, 25P03, 57P0x, or a closed connection; psycopg
reports these with several exception classes, so they are classified by
state, not class) is :class:`~agentwal.errors.BackendUnavailableError`;
53100 is ``DiskFullError``; anything else the server refuses is a
``CorruptionError`` naming the SQLSTATE (the schema is not what this code
expects).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
from psycopg import conninfo

from ..errors import BackendUnavailableError, CorruptionError, DiskFullError

__all__ = ["Db", "app_name", "deadline", "redact", "session_gone", "translate"]

#: SQLSTATEs that mean the server ended the session (or is going away).
_GONE = frozenset({"25P03", "57P01", "57P02", "57P03", "57P05", "08000", "08003", "08006"})
#: A pooled session returned less than this many seconds ago is lent without a check.
_FRESH = 1.0
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def redact(dsn: str) -> str:
    """``dsn`` without its password, for messages."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    params.pop("password", None)
    host = params.get("host") or "localhost"
    port = f":{params['port']}" if params.get("port") else ""
    user = f"{params['user']}@" if params.get("user") else ""
    return f"postgresql://{user}{host}{port}/{params.get('dbname', '')}"


def check_schema(schema: object) -> str:
    """``schema`` if it is a plain lowercase identifier, else ValueError."""
    if not isinstance(schema, str) or not _SCHEMA.match(schema):
        raise ValueError(f"schema must be a lowercase identifier (a-z, 0-9, _; at most 63), "
                         f"not {schema!r}")
    return schema


def app_name(worker_id: str) -> str:
    """The ``application_name`` of a worker's sessions (short: the server cuts at 63)."""
    return "agentwal:" + hashlib.sha256(worker_id.encode()).hexdigest()[:20]


def session_gone(exc: BaseException, conn: psycopg.Connection[Any] | None = None) -> bool:
    """True if ``exc`` means the session is gone (the outcome of an open COMMIT is unknown)."""
    if conn is not None and conn.closed:
        return True
    if isinstance(exc, (psycopg_pool.PoolTimeout, psycopg.InterfaceError)):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    return state in _GONE or state.startswith("08")


@contextlib.contextmanager
def translate(where: str) -> Iterator[None]:
    """Turn psycopg errors raised inside the block into agentwal errors."""
    try:
        yield
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        if session_gone(exc):
            raise BackendUnavailableError(where, _brief(exc)) from None
        state = getattr(exc, "sqlstate", None)
        if state == "53100":
            raise DiskFullError(where, f"the server's disk is full ({_brief(exc)}); nothing "
                                "was applied. Free space on the server and retry.") from None
        raise CorruptionError(where, None, f"the server refused a statement "
                              f"(SQLSTATE {state}: {_brief(exc)})",
                              "Check that the schema belongs to agentwal and was not changed "
                              "by hand.") from None


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def deadline(conn: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Sever ``conn`` if the block still runs after ``seconds`` (its link is taken for dead).

    The block then fails as a lost session (``session_gone``) and ``conn`` is
    broken: close it, or let the pool discard it. A block that ends in time
    leaves ``conn`` alone, even if the timer fires at that same moment.
    """
    lock = threading.Lock()
    running = [True]

    def sever() -> None:
        with lock:
            if running[0]:
                _shut_down(conn)

    timer = threading.Timer(seconds, sever)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            running[0] = False
        timer.cancel()


def _shut_down(conn: psycopg.Connection[Any]) -> None:
    """Shut ``conn``'s socket down: a call blocked on it returns at once, as if the peer left.

    Only the socket is touched (through a duplicate of its descriptor), never
    the libpq connection another thread is using.
    """
    with contextlib.suppress(OSError, psycopg.Error):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        with contextlib.closing(sock):
            sock.shutdown(socket.SHUT_RDWR)


class Db:
    """A pool of sessions configured for one store; ``connection()`` lends one."""

    def __init__(self, dsn: str, schema: str, *, worker_id: str, pool_size: int,
                 lease_ttl: float, synchronous: bool, connect_timeout: float = 10.0) -> None:
        self.where = redact(dsn) + f" (schema {schema})"
        self.dsn = dsn
        idle_timeout = lease_ttl / 2
        options = (f"-c search_path={schema} "
                   f"-c idle_in_transaction_session_timeout={max(1, int(idle_timeout * 1000))}")
        # Set either way: "sync" must not inherit a server or role default of off.
        options += f" -c synchronous_commit={'on' if synchronous else 'off'}"
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "options": options,
            "application_name": app_name(worker_id),
            "connect_timeout": max(1, int(connect_timeout)),
            # A dead TCP link ends the session within about half a TTL (ignored on a
            # Unix socket): idle, the keepalive probes go unanswered; with bytes in
            # flight, they stay unacknowledged past tcp_user_timeout.
            "keepalives": 1,
            "keepalives_idle": max(1, int(lease_ttl / 4)),
            "keepalives_interval": max(1, int(lease_ttl / 12)),
            "keepalives_count": 3,
            "tcp_user_timeout": max(1000, int(lease_ttl * 500)),
        }
        #: seconds a renewal or the check of an idle session may take before its
        #: link is taken for dead (``deadline``)
        self.call_timeout = max(0.25, lease_ttl / 4)
        self._connect_timeout = connect_timeout
        self._used: dict[int, float] = {}  # id(pooled session) -> when it was last returned
        self.pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = (
            psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=pool_size,
                                        kwargs=self._kwargs, open=False,
                                        check=self._check,
                                        timeout=connect_timeout, name="agentwal"))

    def _check(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's check on lending ``conn``: a round trip, unless it was used just now.

        A session idle for a while may have been ended by the server or a
        proxy; one used within the last second almost never was, and checking
        it would double the round trips of a busy worker.
        """
        if time.monotonic() - self._used.get(id(conn), 0.0) > _FRESH:
            with deadline(conn, self.call_timeout):  # a dead link: the pool takes another
                psycopg_pool.ConnectionPool.check_connection(conn)

    def open(self) -> None:
        """Open the pool and check the server answers.

        Raises:
            BackendUnavailableError: it does not, within the connect timeout.
        """
        with translate(self.where):
            # One direct attempt first: a refused or misspelt server fails now, with its
            # reason (the pool would retry until its timeout, then hide why).
            psycopg.connect(self.dsn, **self._kwargs).close()
            self.pool.open(wait=True, timeout=self._connect_timeout)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled session, errors translated; a broken one is dropped by the pool."""
        with translate(self.where), self.pool.connection() as conn:
            try:
                yield conn
            finally:
                self._used[id(conn)] = time.monotonic()

    def dedicated(self) -> psycopg.Connection[Any]:
        """A session of its own, outside the pool (the lease heartbeat's)."""
        with translate(self.where):
            conn = psycopg.connect(self.dsn, **self._kwargs)
            conn.execute("SET synchronous_commit = on")
            conn.execute(f"SET statement_timeout = {max(1, int(self.call_timeout * 1000))}")
            return conn

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pool.close(timeout=5)
