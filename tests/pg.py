"""A real PostgreSQL server for the tests, started with nothing installed by hand.

``start()`` returns a running :class:`Server` found the first way that works:

1. ``pgserver`` (PyPI; in the ``dev`` extra where a wheel exists): PostgreSQL
   16 in the venv. As root it runs postgres as its own system user.
2. The system's ``initdb``/``pg_ctl`` (Debian's ``postgresql`` package, which
   ``.ci/run`` installs when missing): a throwaway cluster in a temporary
   directory, listening on a Unix socket there only, run as the ``postgres``
   user (or ``nobody``) when the tests run as root.
3. ``$AGENTWAL_PG_DSN``: a server someone already runs.

``AGENTWAL_PG=pgserver|system|dsn`` forces one of them. The throwaway servers
run with ``fsync=off``: durability against a server crash is PostgreSQL's own
business, and the tests check agentwal's logic, not the disk. ``why_not``
records why each way failed, for the skip or failure message. ``start`` first
reaps the servers of earlier test processes that were killed (``reap``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

import psycopg

__all__ = ["Server", "reap", "required", "start"]

_TEST_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
_PREFIX = "agentwal-pg-"
_OWNER = "owner.pid"  # the pid of the test process that started the server in this directory


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap() -> list[str]:
    """Stop the servers of test processes that died without stopping them; their dirs.

    A pytest killed by a signal runs neither the fixture's finalizer nor
    pgserver's atexit, so its server stays up. A directory is reaped only if
    the process named in its ``owner.pid`` is gone, and a postmaster only if
    its command line names that directory.
    """
    reaped = []
    for root in glob.glob(os.path.join(tempfile.gettempdir(), _PREFIX + "*")):
        try:
            with open(os.path.join(root, _OWNER)) as f:
                owner = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if _alive(owner):
            continue
        for pidfile in glob.glob(os.path.join(root, "*", "postmaster.pid")):
            with contextlib.suppress(OSError, ValueError):
                with open(pidfile) as f:
                    pid = int(f.readline().strip())
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().decode(errors="replace")
                if "postgres" in cmd and root in cmd:
                    os.kill(pid, signal.SIGQUIT)
        shutil.rmtree(root, ignore_errors=True)
        reaped.append(root)
    return reaped


def _mkroot() -> str:
    root = tempfile.mkdtemp(prefix=_PREFIX)
    with open(os.path.join(root, _OWNER), "w") as f:
        f.write(str(os.getpid()))
    return root


@dataclass
class Server:
    """A running server: ``dsn`` to connect, ``stop()`` when done."""

    dsn: str
    how: str
    _stop: Any = field(default=None, repr=False)
    root: str = ""  # the temporary directory it lives in (empty for $AGENTWAL_PG_DSN)
    _restart: Any = field(default=None, repr=False)

    def crash_restart(self) -> None:
        """Stop the server at once (``pg_ctl stop -m immediate``: like a crash of
        PostgreSQL, not of the machine) and start it again on the same data."""
        if self._restart is None:
            raise RuntimeError(f"a {self.how} server cannot be restarted by the tests")
        self._restart()

    def stop(self) -> None:
        if self._stop is not None:
            stop, self._stop = self._stop, None
            with contextlib.suppress(Exception):
                stop()


def required() -> bool:
    """True where a missing server is a failure, not a skip (CI)."""
    return (os.environ.get("AGENTWAL_REQUIRE_PG") == "1"
            or os.environ.get("CI", "").lower() in ("1", "true", "yes"))


def _check(dsn: str) -> None:
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        conn.execute("select 1").fetchone()


def _via_pgserver(why_not: list[str]) -> Server | None:
    try:
        import pgserver
    except ImportError as exc:
        why_not.append(f"pgserver: not installed ({exc})")
        return None
    root = _mkroot()
    try:
        srv = pgserver.get_server(os.path.join(root, "data"), cleanup_mode="delete")
        dsn = srv.get_uri()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for setting in _TEST_SETTINGS:
                name, value = setting.split("=")
                conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            conn.execute("select pg_reload_conf()")
        _check(dsn)
    except Exception as exc:
        why_not.append(f"pgserver: {type(exc).__name__}: {exc}")
        shutil.rmtree(root, ignore_errors=True)
        return None

    def stop() -> None:
        srv.cleanup()
        shutil.rmtree(root, ignore_errors=True)

    return Server(dsn, "pgserver", stop, root)


def _system_bindir() -> str | None:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                  key=lambda d: int(d.split("/")[-2]) if d.split("/")[-2].isdigit() else 0)
    for d in reversed(dirs):
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return d
    found = shutil.which("pg_ctl")
    return os.path.dirname(os.path.realpath(found)) if found else None


def _via_system(why_not: list[str]) -> Server | None:
    bindir = _system_bindir()
    if bindir is None:
        why_not.append("system: no initdb/pg_ctl (apt-get install postgresql)")
        return None
    user: pwd.struct_passwd | None = None
    if os.geteuid() == 0:
        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                user = pwd.getpwnam(name)
                break
        if user is None:
            why_not.append("system: running as root and no postgres or nobody user")
            return None
    root = _mkroot()
    os.chmod(root, 0o755)
    data = os.path.join(root, "data")
    as_user: dict[str, Any] = {}
    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    opts = " ".join(f"-c {s}" for s in _TEST_SETTINGS)
    try:
        subprocess.run([f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres",
                        "-E", "UTF8", "--no-sync", "--no-instructions"],
                       check=True, capture_output=True, cwd=root, **as_user)
        subprocess.run([f"{bindir}/pg_ctl", "-D", data, "-w", "-l", f"{root}/log",
                        "-o", f"-k {root} -c listen_addresses='' {opts}", "start"],
                       check=True, capture_output=True, cwd=root, **as_user)
    except (OSError, subprocess.CalledProcessError) as exc:
        err = getattr(exc, "stderr", b"") or b""
        why_not.append(f"system: {exc} {err.decode(errors='replace').strip()}")
        shutil.rmtree(root, ignore_errors=True)
        return None

    def stop() -> None:
        subprocess.run([f"{bindir}/pg_ctl", "-D", data, "-w", "-m", "immediate", "stop"],
                       capture_output=True, cwd=root, **as_user)
        shutil.rmtree(root, ignore_errors=True)

    def restart() -> None:
        subprocess.run([f"{bindir}/pg_ctl", "-D", data, "-w", "-m", "immediate", "stop"],
                       check=True, capture_output=True, cwd=root, **as_user)
        subprocess.run([f"{bindir}/pg_ctl", "-D", data, "-w", "-l", f"{root}/log",
                        "-o", f"-k {root} -c listen_addresses='' {opts}", "start"],
                       check=True, capture_output=True, cwd=root, **as_user)

    dsn = f"postgresql://postgres@/postgres?host={root}"
    try:
        _check(dsn)
    except Exception as exc:
        why_not.append(f"system: started but cannot connect: {exc}")
        stop()
        return None
    return Server(dsn, f"system ({bindir})", stop, root, restart)


def _via_dsn(why_not: list[str]) -> Server | None:
    dsn = os.environ.get("AGENTWAL_PG_DSN")
    if not dsn:
        why_not.append("dsn: AGENTWAL_PG_DSN is not set")
        return None
    try:
        _check(dsn)
    except Exception as exc:
        why_not.append(f"dsn: cannot connect to AGENTWAL_PG_DSN: {exc}")
        return None
    return Server(dsn, "AGENTWAL_PG_DSN")


_WAYS = {"pgserver": _via_pgserver, "system": _via_system, "dsn": _via_dsn}


def start(why_not: list[str]) -> Server | None:
    """The first server that starts (see the module docstring), or None; reasons in ``why_not``."""
    reap()
    forced = os.environ.get("AGENTWAL_PG")
    ways = [_WAYS[forced]] if forced in _WAYS else list(_WAYS.values())
    for way in ways:
        srv = way(why_not)
        if srv is not None:
            return srv
    return None
