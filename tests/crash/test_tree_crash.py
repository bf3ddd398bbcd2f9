"""Trees across process kills: put_tree and restore_tree killed in each of their windows.

*put_tree*: a child snapshots version n of a generated directory and commits
it with ``n``, printing ``ACK n`` after each commit; it is killed at the
k-th hit of a tree, blob or commit failpoint. The store must then hold every
acknowledged tree (and maybe the one in flight), each restoring to exactly
its version, with nothing half-read; a sweep leaves it verifiable.

*restore_tree*: a child restores checkpoint B into a directory holding
checkpoint A and is killed at the k-th hit of a restore failpoint. Every
path must then hold A's or B's version (whole, never a mix), and running the
restore again must leave exactly B, with no temp files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import agentwal
from tests.trees import Spec, build, read

ROOT = str(Path(__file__).resolve().parents[2])


def spec(v: int) -> Spec:
    """Version ``v`` of the generated directory: files change, appear, vanish, swap kinds."""
    out: Spec = {}
    for i in range(12):
        content = f"{i}:{v // (i + 1)}|".encode() * (i * 40 + 1)
        out[f"d{i % 3}/f{i}.txt"] = ("x", content) if i == v % 5 else content
    out[f"only{v % 4}.txt"] = b"only in some versions %d" % v
    out["big.bin"] = bytes([v % 251]) * (150 << 10)  # three 64 KiB chunks
    out["lnk"] = ("l", f"d0/f{v % 3}.txt".encode())
    if v % 2:
        out["swap"] = b"a file in odd versions"
    else:
        out["swap/inner.txt"] = b"a directory in even versions"
    out[f"empty{v % 2}"] = ("d",)
    return out


def expected(tmp: Path, v: int) -> dict[str, object]:
    d = tmp / f"expected-{v}"
    if not d.exists():
        build(str(d), spec(v))
    return read(str(d))


PUT_CHILD = r"""
import shutil, sys
sys.path.insert(0, sys.argv[4])
import agentwal
from agentwal import failpoints
from agentwal.local import blobs
from tests.crash.test_tree_crash import spec
from tests.trees import build
blobs.CHUNK = 64 << 10
path, src = sys.argv[1], sys.argv[2]
if sys.argv[3] != "-":
    name, nth = sys.argv[3].split("@")
    failpoints.arm(name, "kill", nth=int(nth))
store = agentwal.open(path, wal_max_bytes=256 << 10, segment_bytes=64 << 10)
n = store.get("r", "n", 0)
print("START", n, flush=True)
while True:
    shutil.rmtree(src, ignore_errors=True)
    build(src, spec(n))
    with store.begin("r") as txn:
        txn.put_tree("ws", src)
        txn["n"] = n + 1
    print("ACK", n, flush=True)
    if n % 3 == 2:
        store.compact(keep_last=2)  # drops old trees: the sweep it ends with has garbage
    n += 1
"""


def run(code: str, *args: str) -> tuple[list[str], int]:
    child = subprocess.run([sys.executable, "-c", code, *args, ROOT], capture_output=True,
                           text=True, timeout=60)
    return child.stdout.splitlines(), child.returncode


# Each point and the hits to die at: one early, one a few versions in (about 16 files are
# read per version, so the file points are hit often; tree_after_dirs once per version).
PUT_POINTS = {"tree_after_file": (7, 40), "tree_after_dirs": (1, 3),
              "blob_after_fsync": (5, 60), "blob_after_rename": (5, 60),
              "before_fsync": (2, 4), "blob_sweep_before_unlink": (1, 3)}


@pytest.mark.parametrize("point", PUT_POINTS)
def test_kill_put_tree_in_each_window(tmp_path: Path, point: str) -> None:
    path, src = str(tmp_path / "store"), str(tmp_path / "src")
    acked = 0
    for nth in PUT_POINTS[point]:
        lines, code = run(PUT_CHILD, path, src, f"{point}@{nth}")
        assert code == 137, f"the child did not die at {point}@{nth}: {lines[-3:]}"
        acks = [int(x.split()[1]) for x in lines if x.startswith("ACK ")]
        acked = max([acked, *(a + 1 for a in acks)])
        with agentwal.open(path) as s:
            n = s.get("r", "n", 0)
            assert n in (acked, acked + 1)
            acked = n
            if n:
                dest = tmp_path / f"check-{n}"
                s.restore_tree("r", "ws", dest)
                assert read(str(dest)) == expected(tmp_path, n - 1)
                if n > 1:
                    s.restore_tree("r", "ws", dest, at=s.head("r").id - 1)  # type: ignore[union-attr]
                    assert read(str(dest)) == expected(tmp_path, n - 2)
            s._engine._sweep_blobs()
            assert s.verify().ok
    assert acked >= 1


RESTORE_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[4])
import agentwal
from agentwal import failpoints
from agentwal.local import blobs
blobs.CHUNK = 64 << 10
path, dest = sys.argv[1], sys.argv[2]
name, nth = sys.argv[3].split("@")
failpoints.arm(name, "kill", nth=int(nth))
with agentwal.open(path) as store:
    store.restore_tree("r", "ws", dest, at=2)
print("DONE", flush=True)
"""


@pytest.mark.parametrize("point", ["restore_after_write", "restore_after_rename",
                                   "restore_after_remove"])
def test_kill_restore_tree_in_each_window(tmp_path: Path, point: str) -> None:
    path, src, dest = str(tmp_path / "store"), str(tmp_path / "src"), tmp_path / "dest"
    a, b = 0, 7  # versions far enough apart that most paths differ
    with agentwal.open(path, durability="sync") as s:
        for v in (a, b):
            shutil.rmtree(src, ignore_errors=True)
            build(src, spec(v))
            with s.begin("r") as txn:
                txn.put_tree("ws", src)
        s.restore_tree("r", "ws", dest, at=1)
    old, new = expected(tmp_path, a), expected(tmp_path, b)
    assert read(str(dest)) == old
    for nth in (1, 4):
        lines, code = run(RESTORE_CHILD, path, str(dest), f"{point}@{nth}")
        assert code == 137, f"the child did not die at {point}@{nth}: {lines}"
        now = read(str(dest))
        for rel, what in now.items():
            if os.path.basename(rel).startswith(".awtmp-"):
                continue  # a temp file of the killed restore
            assert what in (old.get(rel), new.get(rel)), f"{rel} is neither A's nor B's"
        with agentwal.open(path) as s:
            s.restore_tree("r", "ws", dest, at=2)
            assert read(str(dest)) == new
            assert s.verify().ok
        with agentwal.open(path) as s:  # back to A for the next round
            s.restore_tree("r", "ws", dest, at=1)
        assert read(str(dest)) == old
