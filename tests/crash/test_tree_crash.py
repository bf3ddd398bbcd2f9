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
from agentwal.testing import sweep_blobs
from tests.trees import Spec, build, read

# each test with the C walk and with its pure-Python twin (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("walker")

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
            sweep_blobs(s)
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


COPY_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[4])
import agentwal
from agentwal import failpoints
from tests.crash.test_tree_crash import spec
from tests.trees import build
path, src = sys.argv[1], sys.argv[2]
store = agentwal.open(path, wal_max_bytes=256 << 10, segment_bytes=64 << 10)
if store.get("r", "ws") is None:
    build(src, spec(0))
    with store.begin("r") as txn:
        txn.put_tree("ws", src)
name, nth = sys.argv[3].split("@")
failpoints.arm(name, "kill", nth=int(nth))
n = store.get("r", "n", 0)
while True:
    with store.begin("r") as txn:  # a copy, or directory d{n % 3} re-rooted
        txn.put_tree(f"c{n}", txn.get("ws"), subdir=None if n % 4 == 3 else f"d{n % 3}")
        if n >= 2:
            txn.delete(f"c{n - 2}")
        txn["n"] = n + 1
    print("ACK", n, flush=True)
    store.compact(keep_last=1)  # the sweep it ends with removes only the dropped copies' root
    n += 1
"""

COPY_POINTS = {"blob_after_fsync": (1, 3), "blob_after_rename": (2, 4), "before_fsync": (1, 5),
               "blob_sweep_before_unlink": (1, 2)}


@pytest.mark.parametrize("point", COPY_POINTS)
def test_kill_put_tree_of_a_tree_ref_in_each_window(tmp_path: Path, point: str) -> None:
    """put_tree(tree_ref, subdir=...) killed while it stores the new root object, while the
    commit is synced, or while the sweep after it removes a dropped copy's root: every
    acknowledged copy restores whole, nothing it needs was swept."""
    path, src = str(tmp_path / "store"), str(tmp_path / "src")
    whole = expected(tmp_path, 0)
    acked = 0
    for nth in COPY_POINTS[point]:
        lines, code = run(COPY_CHILD, path, src, f"{point}@{nth}")
        assert code == 137, f"the child did not die at {point}@{nth}: {lines[-3:]}"
        acked = max([acked, *(int(x.split()[1]) + 1 for x in lines if x.startswith("ACK "))])
        with agentwal.open(path) as s:
            n = s.get("r", "n", 0)
            assert n in (acked, acked + 1)
            acked = n
            for k in (n - 2, n - 1):
                if k < 0:
                    continue
                dest = tmp_path / f"check-{n}-{k}"
                s.restore_tree("r", f"c{k}", dest)
                want = whole if k % 4 == 3 else read(str(tmp_path / "expected-0" / f"d{k % 3}"))
                assert read(str(dest)) == want
            sweep_blobs(s)
            assert s.verify().ok
