"""The test server itself: every way tests/pg.py knows starts a server that takes queries."""

from __future__ import annotations

import os

import psycopg
import pytest

from tests import pg


def test_session_server_answers(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        version = conn.execute("show server_version_num").fetchone()
    assert version is not None and int(version[0]) >= 120000


@pytest.mark.parametrize("way", ["system"])
def test_system_server_starts_and_stops(way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if pg._system_bindir() is None:
        if pg.required():
            pytest.fail("no system initdb/pg_ctl (.ci/run installs Debian's postgresql)")
        pytest.skip("no system initdb/pg_ctl")
    monkeypatch.setenv("AGENTWAL_PG", way)
    why_not: list[str] = []
    srv = pg.start(why_not)
    assert srv is not None, why_not
    try:
        with psycopg.connect(srv.dsn) as conn:
            assert conn.execute("show fsync").fetchone() == ("off",)
    finally:
        srv.stop()
    host = srv.dsn.split("host=")[1]
    assert not os.path.exists(host)


def test_a_killed_test_process_server_is_reaped() -> None:
    """A server whose test process died (no finalizer ran) is stopped by the next start."""
    import signal
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, '.'); from tests import pg; w = []; "
            "s = pg.start(w); print(s.root if s else '', flush=True); "
            "import time; time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "AGENTWAL_PG": os.environ.get("AGENTWAL_PG",
                                                                               "pgserver")})
    assert child.stdout is not None
    root = child.stdout.readline().strip()
    try:
        if not root:
            pytest.skip("the child could not start a server")
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert os.path.isdir(root)
        assert any(r == root for r in pg.reap())
        assert not os.path.exists(root)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
