"""Blobs across crashes: no dangling reference, no lost acknowledged blob, garbage swept.

Two tiers. *Process kills*: a child puts blobs (multi-chunk, repeated
content, rolled-back puts, sweeps) and prints ``ACK n`` after each commit;
it is killed at the n-th hit of every blob failpoint (and of the commit's
own fsync), or at a random moment. *Power cuts*: the same kind of workload
runs on the simulated disk, with the power cut before every single I/O
operation, and each ``strict``/``prefix``/``reorder`` image is recovered.

After each crash the store must hold every acknowledged commit (and maybe
the one in flight), every blob reference must read back whole with its
SHA-256 (never missing, never torn), and a sweep must then remove exactly
the garbage, leaving every reference readable.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal.local import blobs
from agentwal.testing import SimulatedCrash, SimulatedDisk, blob_files, blob_references, sweep_blobs
from agentwal.testing import crash as crash_store
from tests.helpers import Generated

ROOT = str(Path(__file__).resolve().parents[2])

# -- tier 1: process kills --------------------------------------------------------------

# Step n puts blob f"b{n}" (content seed(n), size size(n)), and on some steps a
# rolled-back put first and a sweep after. Content repeats every few steps, so
# puts of existing content (dedup) are killed too.
CHILD = r"""
import sys
sys.path.insert(0, sys.argv[3])
import agentwal
from agentwal import failpoints
from agentwal.local import blobs
from agentwal.testing import sweep_blobs
from tests.helpers import Generated
from tests.crash.test_blob_crash import seed, size
blobs.CHUNK = 64 << 10
path = sys.argv[1]
if sys.argv[2] != "-":
    name, nth = sys.argv[2].split("@")
    failpoints.arm(name, "kill", nth=int(nth))
store = agentwal.open(path, wal_max_bytes=256 << 10, segment_bytes=64 << 10)
n = store.get("r", "n", 0)
print("START", n, flush=True)
while True:
    if n % 4 == 1:
        with store.begin("r") as bad:
            bad.put_blob("doomed", Generated(size(n) // 2 + 1, seed=10_000 + n))
            bad.rollback()
    with store.begin("r") as txn:
        txn.put_blob(f"b{n}", Generated(size(n), seed=seed(n)))
        txn["n"] = n + 1
    print("ACK", n, flush=True)
    if n % 5 == 4:
        sweep_blobs(store)
    n += 1
"""


def seed(n: int) -> int:
    return n % 7  # repeats: a later step puts content already stored


def size(n: int) -> int:
    return (seed(n) * 37 % 11) * (23 << 10) + 1  # 1 B .. ~230 KiB: 1 to 4 chunks of 64 KiB


_DIGESTS: dict[int, str] = {}


def digest(n: int) -> str:
    s = seed(n)
    if s not in _DIGESTS:
        _DIGESTS[s] = Generated.digest(size(n), seed=s)
    return _DIGESTS[s]


def run_child(path: str, arm: str, kill_after: int, delay: float) -> tuple[int, int, int]:
    """Run a child until it dies at ``arm`` or acks ``kill_after`` commits (then SIGKILL).

    Returns ``(start, last ack, exit status)``.
    """
    child = subprocess.Popen([sys.executable, "-c", CHILD, path, arm, ROOT],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    watchdog = threading.Timer(120, child.kill)  # a point never reached must not hang the suite
    watchdog.start()
    start, last = -1, -1
    try:
        for line in child.stdout:
            parts = line.split()
            if not line.endswith("\n") or len(parts) != 2:
                continue
            if parts[0] == "START":
                start = int(parts[1])
                last = start - 1
            elif parts[0] == "ACK":
                last = int(parts[1])
                if last - start + 1 >= kill_after:
                    break
        time.sleep(delay)
    finally:
        watchdog.cancel()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    for line in child.stdout.read().splitlines(keepends=True):
        if line.startswith("ACK ") and line.endswith("\n"):
            last = int(line.split()[1])
    return start, last, child.returncode


def check_store(path: str, acked: int) -> int:
    """Every reference reads back whole; a sweep leaves exactly the referenced files.

    Returns the number of commits the store holds (acked or acked + 1).
    """
    with agentwal.open(path) as s:
        n = s.get("r", "n", 0)
        assert n in (acked, acked + 1), (n, acked)
        state = s.state("r") if n else {}
        assert sorted(k for k in state if k != "n") == sorted(f"b{i}" for i in range(n))
        for i in range(n):
            ref = state[f"b{i}"]
            assert ref == agentwal.BlobRef(digest(i), size(i)), i
            with s.open_blob("r", f"b{i}") as f:
                h = hashlib.sha256()
                while chunk := f.read(100_000):
                    h.update(chunk)
            assert h.hexdigest() == ref.sha256
        sweep_blobs(s)
        files = blob_files(s)
        assert set(files) == {digest(i) for i in range(n)}, "garbage left, or a blob lost"
        tmp = os.path.join(path, "blobs", "tmp")
        assert not os.path.isdir(tmp) or not os.listdir(tmp)
        for i in range(n):
            with s.open_blob("r", f"b{i}") as f:
                f.verify()
    return n


# Windows of put_blob, of a sweep, and of the commit that names the blob.
KILL_POINTS = ["blob_after_write", "blob_after_fsync", "blob_after_rename", "blob_after_sync",
               "blob_sweep_before_unlink", "after_wal_append", "before_fsync"]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_in_each_blob_window(tmp_path: Path, point: str) -> None:
    rng = random.Random(point)
    path = str(tmp_path / "store")
    acked = 0
    for _ in range(2):
        nth = rng.randint(1, 2 if "sweep" in point else 6)
        start, last, code = run_child(path, f"{point}@{nth}", 10_000, 0.0)
        assert code == 137, f"the child did not die at {point}"
        assert start == -1 or start >= acked
        acked = max(acked, last + 1)
        acked = check_store(path, acked)


def test_kill_at_random_moments(tmp_path: Path) -> None:
    rng = random.Random("blob-kill")
    path = str(tmp_path / "store")
    acked = 0
    for _ in range(int(os.environ.get("AGENTWAL_KILL_ROUNDS", "4"))):
        start, last, _code = run_child(path, "-", rng.randint(1, 12),
                                       rng.choice([0.0, 0.002, 0.02]))
        assert start >= acked
        acked = check_store(path, last + 1)


# -- tier 2: power cuts on the simulated disk -----------------------------------------

A, B, C, D, E = (bytes([65 + i]) * (2500 + 300 * i) for i in range(5))

# Each step: ("commit", {key: content}) | ("rollback", {key: content}) | ("sweep",)
STEPS: list[tuple[Any, ...]] = [
    ("commit", {"b0": A}),
    ("commit", {"b1": A, "b2": B}),  # A again: stored once
    ("rollback", {"x": C}),          # C: garbage
    ("commit", {"b3": C}),           # ... until it is put again
    ("rollback", {"x": E}),
    ("sweep",),                      # removes E
    ("commit", {"b0": D}),           # overwrite: A still named by b1 and by history
]


def expected(commits: int) -> dict[str, bytes]:
    state: dict[str, bytes] = {}
    done = 0
    for step in STEPS:
        if step[0] == "commit":
            if done == commits:
                break
            state.update(step[1])
            done += 1
    return state


def refs_of(contents: dict[str, bytes]) -> dict[str, agentwal.BlobRef]:
    return {k: agentwal.BlobRef(hashlib.sha256(v).hexdigest(), len(v))
            for k, v in contents.items()}


def drive(store: agentwal.Store, on_ack: Any) -> None:
    for step in STEPS:
        if step[0] == "sweep":
            sweep_blobs(store)
            continue
        txn = store.begin("r")
        for k, v in step[1].items():
            txn.put_blob(k, io.BytesIO(v))
        if step[0] == "rollback":
            txn.rollback()
        else:
            txn.commit()
            on_ack()


def open_sim(path: str, disk: SimulatedDisk, durability: str = "sync") -> agentwal.Store:
    return agentwal.open(path, fs=disk, segment_bytes=64 << 10, durability=durability)


def judge(path: str, image: SimulatedDisk, acked: int, in_flight: bool,
          durability: str) -> str | None:
    """Recover ``image``; a description of what is wrong, or None.

    In ``sync`` mode every acknowledged commit must be there; in ``async``
    and ``none`` a prefix of them. In every mode, each reference reads back.
    """
    store = open_sim(path, image)
    try:
        state = store.state("r") if store.head("r") else {}
        least = acked if durability == "sync" else 0
        allowed = [refs_of(expected(n)) for n in range(least, acked + 1 + in_flight)]
        if state not in allowed:
            return f"state {state} is none of {allowed} (acked {acked})"
        for k, ref in state.items():
            with store.open_blob("r", k) as f:  # raises on a missing or torn blob
                data = f.read()
            if hashlib.sha256(data).hexdigest() != ref.sha256:
                return f"{k} reads back wrong"
        sweep_blobs(store)
        left = blob_files(store)
        if left != blob_references(store) or not {r.sha256 for r in state.values()} <= left:
            return f"after a sweep the blob files are {left}"
        for k in state:
            with store.open_blob("r", k) as f:
                f.verify()
        return None
    finally:
        crash_store(store)


def count_ops(base: Path) -> int:
    disk = SimulatedDisk()
    path = str(base / "count")
    os.makedirs(path)
    store = open_sim(path, disk)
    drive(store, lambda: None)
    crash_store(store)
    return disk.op_count


@pytest.mark.parametrize("durability", ["sync", "async", "none"])
def test_power_cut_before_every_operation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          durability: str) -> None:
    monkeypatch.setattr(blobs, "CHUNK", 1024)  # several writes per blob, to tear
    total = count_ops(tmp_path)
    assert total > 60
    problems: list[str] = []
    cases = 0
    for k in range(total):
        disk = SimulatedDisk()
        disk.crash_at(k)
        path = str(tmp_path / f"op{k}")
        os.makedirs(path)
        acked = 0
        in_flight = True

        def ack() -> None:
            nonlocal acked
            acked += 1

        try:
            store = open_sim(path, disk, durability)
            try:
                drive(store, ack)
                in_flight = False
            finally:
                crash_store(store)
        except (SimulatedCrash, agentwal.Error):
            pass
        for model in ("strict", "prefix", "reorder"):
            image = disk.crash_image(model, seed=k)
            try:
                problem = judge(path, image, acked, in_flight, durability)
            except agentwal.Error as exc:
                problem = f"{type(exc).__name__}: {exc}"
            cases += 1
            if problem:
                problems.append(f"op {k} {model}: {problem}")
    assert not problems, problems[:10]
    assert cases == 3 * total, (cases, total)
