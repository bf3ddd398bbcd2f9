"""A network partition between a lease holder and the server, through a TCP proxy in the test.

The holder (a worker process) reaches the server only through :class:`Proxy`;
``cut()`` stops forwarding in both directions (the bytes wait, as TCP would
retransmit them) and ``heal()`` delivers them. While cut, the holder's
renewals do not arrive: its lease expires on the server, another worker
takes the run, and the holder, past its local deadline, must call no
effect function; once healed, its late writes (the stuck renewal, the
commit) are refused by the epoch. ``drop_links()`` models a link that dies
without a word: the connections open then carry nothing ever again (nothing
is closed either), while new ones go through.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from agentwal.postgres import PostgresStore
from tests.postgres.test_failover import TTL, Worker, _rows, _wait_for_lease


class Proxy:
    """Forwards TCP connections on 127.0.0.1 to the server of ``dsn`` (TCP or its socket)."""

    def __init__(self, dsn: str) -> None:
        params = conninfo.conninfo_to_dict(dsn)
        host = str(params.get("host") or "localhost")
        port = int(params.get("port") or 5432)
        if host.startswith("/"):
            self._target: tuple[int, object] = (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
        else:
            self._target = (socket.AF_INET, (host, port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.dsn = conninfo.make_conninfo(dsn, host="127.0.0.1",
                                          port=str(self._listener.getsockname()[1]),
                                          sslmode="disable")
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._socks: list[socket.socket] = []
        self._dead: set[int] = set()  # id() of the sockets whose link is dead
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Stop forwarding: what either side sends waits in the proxy."""
        self._open.clear()

    def heal(self) -> None:
        """Deliver what waited, and forward again."""
        self._open.set()

    def drop_links(self) -> None:
        """The connections open now go dead: what they carry is discarded, forever."""
        self._dead.update(id(s) for s in list(self._socks))

    def close(self) -> None:
        self._closed = True
        self._open.set()
        for s in [self._listener, *self._socks]:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            family, address = self._target
            server = socket.socket(family, socket.SOCK_STREAM)
            server.connect(address)  # type: ignore[arg-type]
            self._socks += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                self._open.wait()
                if id(src) not in self._dead:
                    dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxy(pg_dsn: str) -> Iterator[Proxy]:
    p = Proxy(pg_dsn)
    yield p
    p.close()


@pytest.fixture
def through(proxy: Proxy, pg_schema: str, open_pg: Callable[..., PostgresStore]
            ) -> Iterator[Callable[..., Worker]]:
    open_pg(worker_id="setup").close()  # the schema exists before the worker opens it
    workers: list[Worker] = []

    def make(name: str, *args: str) -> Worker:
        w = Worker(proxy.dsn, pg_schema, name, *args)
        workers.append(w)
        return w

    yield make
    for w in workers:
        w.stop()


def test_a_partitioned_holder_calls_nothing_and_its_late_writes_are_refused(
        through: Callable[..., Worker], proxy: Proxy, open_pg: Callable[..., PostgresStore],
        pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    a = through("A", "partition", "run", str(calls))
    epoch_a = a.event()["ready"]
    proxy.cut()
    a.send("go")  # A waits one TTL, then tries an effect and its commit
    b = open_pg(worker_id="B", lease_ttl=TTL)
    epoch_b = _wait_for_lease(b, "run")  # after A's lease expired on the server
    assert epoch_b == epoch_a + 1
    with b.begin("run") as txn:
        txn["who"] = "B"
        txn.effect("send", lambda ctx: ctx.fencing_token, mode="at_least_once")
    proxy.heal()
    assert a.event() == {"effect": "lease_lost", "token": []}
    assert a.event() == {"error": "lease_lost"}
    assert not calls.exists()  # A called nothing once its deadline had passed
    rows = _rows(pg_dsn, pg_schema, "SELECT id, lease_epoch FROM checkpoints WHERE run = %s "
                 "ORDER BY id", "run")
    assert rows == [(1, epoch_a), (2, epoch_b)]
    assert b.state("run") == {"who": "B"}
    [entry] = b.effects(run="run")
    assert entry.result == epoch_b and entry.committed_in == 2
    lease = _rows(pg_dsn, pg_schema, "SELECT lease_owner, lease_epoch FROM runs")
    assert lease == [("B", epoch_b)]  # A's stuck renewal, delivered late, changed nothing


def test_a_heartbeat_on_a_dead_link_renews_the_lease_on_a_new_one(
        through: Callable[..., Worker], proxy: Proxy, pg_dsn: str, pg_schema: str) -> None:
    """The holder's sessions die silently; its lease must not lapse, nor its next commit hang.

    Without a client-side deadline the heartbeat waits forever for the reply
    to a renewal on the dead link, and the lease expires under a live worker.
    """
    a = through("A", "hold", "run")
    epoch = a.event()["ready"]
    [(taken,)] = _rows(pg_dsn, pg_schema, "SELECT lease_expires FROM runs")
    while _rows(pg_dsn, pg_schema, "SELECT lease_expires FROM runs") == [(taken,)]:
        time.sleep(0.05)  # until the heartbeat's own session exists (its first renewal)
    [(cut_at,)] = _rows(pg_dsn, pg_schema, "SELECT clock_timestamp()")
    proxy.drop_links()
    while True:  # until the server shows a renewal sent after the links died
        [row] = _rows(pg_dsn, pg_schema, "SELECT lease_owner, lease_epoch, "
                      "lease_expires > clock_timestamp(), "
                      "lease_expires > %s + make_interval(secs => %s) FROM runs", cut_at, TTL)
        assert row[:3] == ("A", epoch, True)  # never expired meanwhile
        if row[3]:
            break
        time.sleep(0.05)
    a.send("commit")  # its pooled sessions are dead too: the pool's check drops them
    assert a.event() == {"committed": 1}
    assert _rows(pg_dsn, pg_schema, "SELECT lease_epoch FROM checkpoints") == [(epoch,)]


def test_the_proxy_forwards_and_holds(proxy: Proxy) -> None:
    """The harness itself: queries pass, wait while cut, and complete once healed."""
    with psycopg.connect(proxy.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        proxy.cut()
        done = threading.Event()
        got: list[object] = []

        def query() -> None:
            got.append(conn.execute("SELECT 2").fetchone())
            done.set()

        t = threading.Thread(target=query, daemon=True)
        t.start()
        assert not done.wait(0.5) and got == []
        proxy.heal()
        assert done.wait(30) and got == [(2,)]
        t.join()
