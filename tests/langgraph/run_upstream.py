#!/usr/bin/env python3
"""LangGraph's own checkpointer-parametrised tests, with AgentWALSaver injected.

Usage (``make test-langgraph-upstream`` runs the first form)::

    .venv/bin/python tests/langgraph/run_upstream.py              # AgentWALSaver only
    .venv/bin/python tests/langgraph/run_upstream.py --savers agentwal,sqlite
    .venv/bin/python tests/langgraph/run_upstream.py -- -k interrupt   # extra pytest args

Store creation is shielded from tests that replace ``uuid.uuid4`` with a
deterministic sequence (agentwal draws the new store's id from it; SqliteSaver
draws none). It downloads the sdist of the installed ``langgraph`` version (it ships
``tests/``) into ``.langgraph-upstream/``, installs what those tests import
(pytest-mock, syrupy, redis, psycopg, the Postgres saver: imported by their
conftest even when unused), and appends to the copy of their ``conftest.py``
a ``sync_checkpointer`` and an ``async_checkpointer`` fixture whose params are
the savers named by ``--savers``: ``agentwal`` (an ``AgentWALSaver`` on a fresh
store per test, as the sync and as the async checkpointer), and LangGraph's
own ``sqlite`` / ``memory`` for comparison. Then it runs every test file that
uses those fixtures with ``NO_DOCKER=true`` (no Postgres, no Redis).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / ".langgraph-upstream"
DEPS = ["pytest-mock", "syrupy", "redis", "psycopg[binary]", "psycopg-pool",
        "langgraph-checkpoint-postgres", "httpx", "pycryptodome", "pytest-xdist", "anyio"]
MARK = "# --- agentwal: checkpointer fixtures appended by tests/langgraph/run_upstream.py ---"

OVERRIDE = MARK + '''
import tempfile as _aw_tempfile
import uuid as _aw_uuid
from contextlib import contextmanager as _aw_contextmanager
from unittest import mock as _aw_mock

import agentwal as _aw
from agentwal.integrations.langgraph import AgentWALSaver as _AgentWALSaver

_AW_SAVERS = os.environ["AGENTWAL_UPSTREAM_SAVERS"].split(",")


_AW_REAL_UUID4 = _aw_uuid.uuid4


@_aw_contextmanager
def _checkpointer_agentwal():
    with _aw_tempfile.TemporaryDirectory() as d:
        # creating a store draws its id from uuid4, which some tests replace with a
        # deterministic sequence for the graph's own ids: do not consume one of those
        with _aw_mock.patch("uuid.uuid4", _AW_REAL_UUID4):
            store = _aw.open(d + "/lg.awal", durability="none")
        try:
            yield _AgentWALSaver(store)
        finally:
            store.close()


@pytest.fixture(scope="function", params=_AW_SAVERS)
def sync_checkpointer(request):
    makers = {"agentwal": _checkpointer_agentwal, "sqlite": _checkpointer_sqlite,
              "memory": _checkpointer_memory}
    with makers[request.param]() as checkpointer:
        yield checkpointer


@pytest.fixture(scope="function",
                params=[{"sqlite": "sqlite_aio"}.get(s, s) for s in _AW_SAVERS])
async def async_checkpointer(request):
    if request.param == "sqlite_aio":
        async with _checkpointer_sqlite_aio() as checkpointer:
            yield checkpointer
        return
    makers = {"agentwal": _checkpointer_agentwal, "memory": _checkpointer_memory}
    with makers[request.param]() as checkpointer:
        yield checkpointer
'''


def fetch() -> Path:
    version = importlib.metadata.version("langgraph")
    root = WORK / f"langgraph-{version}"
    if not (root / "tests").is_dir():
        WORK.mkdir(exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", ":all:", f"langgraph=={version}", "-d", str(WORK)],
                       check=True)
        with tarfile.open(WORK / f"langgraph-{version}.tar.gz") as tar:
            tar.extractall(WORK, filter="data")
    return root


def prepare(root: Path) -> list[str]:
    conftest = root / "tests" / "conftest.py"
    text = conftest.read_text()
    if MARK in text:
        text = text[: text.index(MARK)]
    conftest.write_text(text + "\n\n" + OVERRIDE)
    # the package under test is the installed langgraph, not the sdist's copy
    shutil.rmtree(root / "langgraph", ignore_errors=True)
    files = [p for p in sorted((root / "tests").glob("test_*.py"))
             if "sync_checkpointer" in (t := p.read_text()) or "async_checkpointer" in t]
    return [str(p.relative_to(root)) for p in files]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--savers", default="agentwal",
                    help="comma-separated: agentwal, sqlite, memory (default: agentwal)")
    ap.add_argument("--no-install", action="store_true", help="skip installing test deps")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    if not args.no_install:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *DEPS], check=True)
    root = fetch()
    files = prepare(root)
    env = {**os.environ, "NO_DOCKER": "true", "AGENTWAL_UPSTREAM_SAVERS": args.savers,
           "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", "-n", os.environ.get("UPSTREAM_WORKERS", "2"),
           *args.pytest_args]
    print("running:", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=root, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
