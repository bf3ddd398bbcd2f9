"""The viewer lists the files of a checkpoint's tree values (txn.put_tree)."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

import agentwal
from agentwal.ui import create_app
from tests.trees import build


def test_a_checkpoint_lists_its_files(tmp_path: Path) -> None:
    path, ws = str(tmp_path / "s.awal"), tmp_path / "ws"
    build(str(ws), {"a.txt": b"hello", "bin/run": ("x", b"#!/bin/sh\n"), "l": ("l", b"a.txt")})
    with agentwal.open(path) as store:
        agentwal.Workspace(store, "agent", ws).checkpoint()
    with agentwal.open(path, readonly=True) as store:
        res = TestClient(create_app(store, path)).get("/api/runs/agent/checkpoints/1")
    assert res.status_code == 200, res.text
    node = dict(res.json()["state"]["workspace"]["items"])
    files = dict(node["files"]["items"])
    assert set(files) == {"a.txt", "bin/run", "l"}
    assert files["bin/run"]["value"] == "0755, 10 bytes"
    assert files["l"]["value"] == "-> a.txt"
