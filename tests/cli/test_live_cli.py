"""inspect, history and ui, each in its own process, while another process commits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

WRITER = """
import os, sys, time
import agentwal
path, stop = sys.argv[1], sys.argv[2]
with agentwal.open(path, durability="none", wal_max_bytes=1 << 20) as s:
    with s.begin("live") as txn:
        txn["i"] = 0
    print("ready", flush=True)
    for i in range(1, 50_000):  # bounded; the test stops it long before
        if os.path.exists(stop):
            break
        with s.begin("live") as txn:
            txn["i"] = i
            txn["note"] = "x" * 200
        time.sleep(0.002)
"""


def agentwal_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentwal", *args]


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[str]:
    """A child process committing to run ``live`` until the test ends."""
    path, stop = str(tmp_path / "live.awal"), tmp_path / "stop"
    child = subprocess.Popen([sys.executable, "-c", WRITER, path, str(stop)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield path
    finally:
        stop.touch()
        assert child.wait(timeout=120) == 0


def _json(*args: str) -> Any:
    out = subprocess.run(agentwal_cmd(*args), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return json.loads(out.stdout)


def _head(path: str) -> int:
    return int(_json("history", path, "live", "--limit", "1", "--json")[0]["id"])


def test_inspect_and_history_beside_a_writer(writer: str) -> None:
    first = _head(writer)
    stats = _json("inspect", writer, "--json")
    assert stats["readonly"] and stats["runs"] == 1 and stats["visible_lsn"] >= first
    graph = _json("history", writer, "live", "--graph", "--limit", "3", "--json")
    assert graph and graph[0]["id"] >= first
    assert _eventually(lambda: _head(writer) > first)  # a later run sees later commits
    human = subprocess.run(agentwal_cmd("inspect", writer), capture_output=True, text=True,
                           timeout=120)
    assert human.returncode == 0 and human.stdout.startswith("needs attention")


def _eventually(check: Callable[[], bool], tries: int = 600) -> bool:
    """True once ``check()`` is; False if it never was in ``tries`` attempts, 0.1 s apart
    (a ceiling for a slow machine, not a measurement)."""
    for _ in range(tries):
        if check():
            return True
        time.sleep(0.1)
    return False


def test_ui_follows_a_writer_in_another_process(writer: str, tmp_path: Path) -> None:
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser"  # stands in for the user's browser: notes the URL
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)
    ui = subprocess.Popen(agentwal_cmd("ui", writer, "--port", "0", "--open"),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "BROWSER": str(browser)})
    try:
        assert ui.stderr is not None
        url = ui.stderr.readline().rsplit(" at ", 1)[1].strip()

        def lsn() -> int:
            with urllib.request.urlopen(url + "api/store", timeout=60) as res:
                return int(json.load(res)["visible_lsn"])

        first = lsn()
        assert _eventually(lambda: lsn() > first)  # each request refreshes the view
        assert _eventually(lambda: opened.exists() and opened.read_text().strip() == url)
        with urllib.request.urlopen(url + "api/runs/live/checkpoints", timeout=60) as res:
            page = json.load(res)
        assert page["rows"][0]["head"] and page["head"] > 1
    finally:
        ui.send_signal(signal.SIGINT)  # Ctrl-C: how a person stops it
        code = ui.wait(timeout=60)
    assert code == 0 and ui.stderr.read().strip() == "agentwal ui: stopped"
