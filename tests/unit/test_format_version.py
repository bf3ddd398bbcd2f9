"""Format versions: a store is version 1 until its log takes a form-2 record, then 2.

An agentwal that reads only version 1 would take the first form-2 frame
(``FLAG_APPENDS``) for the end of the log and drop what follows. So the
first form-2 record raises CONTROL to format 2 and goes into a new segment
whose header says 2: such an agentwal refuses the store instead. A store
that never logs one stays version 1, openable by it. The last test runs the
reader of the commit before the bump (``git archive``) on stores this one
wrote.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

import agentwal
from agentwal.errors import DiskFullError
from agentwal.format import (
    APPENDS_VERSION,
    FLAG_APPENDS,
    PLAIN_VERSION,
    REC_COMMIT,
    WAL_DIR,
    segment_name,
)
from agentwal.io import OsFileSystem
from agentwal.local.control import create_control, read_control
from agentwal.local.wal import PendingRecord, Writer, list_segments

FS = OsFileSystem()
STORE = uuid.UUID("5e9b3c1d-7a2f-4d6e-8b10-0c4d2e6f8a13")
#: The last commit whose reader accepts only format 1 (form-2 records, no version bump).
BEFORE_BUMP = "a819d6e^"
REPO = Path(__file__).resolve().parents[2]


def _rec(lsn: int, flags: int = 0, size: int = 40) -> PendingRecord:
    # The writer frames payloads without reading them: any bytes do here.
    return PendingRecord(lsn, REC_COMMIT, flags, bytes([lsn % 251 + 1]) * size)


def _versions(wal: Path) -> dict[int, int]:
    """Each segment's first LSN and header version."""
    out = {}
    for seg in list_segments(FS, str(wal)):
        assert seg.header is not None, seg.problem
        out[seg.first_lsn] = seg.header.version
    return out


def _control_format(store: Path) -> int:
    ctl = read_control(FS, str(store))
    assert ctl is not None
    return ctl.format


def _form2_in_v2_segments_only(store: Path) -> int:
    """How many form-2 frames the log holds; each must sit in a version-2 segment."""
    n = 0
    for seg in list_segments(FS, str(store / WAL_DIR)):
        assert seg.header is not None
        for f in seg.scan().frames:
            if f.flags & FLAG_APPENDS:
                assert seg.header.version == APPENDS_VERSION, (seg.name, f.lsn)
                n += 1
    return n


# -- the writer ------------------------------------------------------------------------------


def test_first_form2_batch_raises_the_version_then_starts_a_segment(tmp_path: Path) -> None:
    raised: list[int] = []
    w = Writer(FS, str(tmp_path), STORE, 4096, upgrade=raised.append)
    w.start(1)
    w.append([_rec(1)])
    w.append([_rec(2)])
    assert raised == [] and _versions(tmp_path) == {1: PLAIN_VERSION}
    w.append([_rec(3), _rec(4, FLAG_APPENDS)])
    assert raised == [APPENDS_VERSION]  # CONTROL first, then the segment that says so
    assert _versions(tmp_path) == {1: PLAIN_VERSION, 3: APPENDS_VERSION}
    w.append([_rec(5, FLAG_APPENDS)])
    w.append([_rec(6, size=3000)])
    w.append([_rec(7, size=3000)])  # rotates for room: the new segment stays version 2
    w.close()
    assert raised == [APPENDS_VERSION]
    assert _versions(tmp_path) == {1: PLAIN_VERSION, 3: APPENDS_VERSION, 7: APPENDS_VERSION}
    scans = {s.first_lsn: [f.lsn for f in s.scan().frames] for s in list_segments(FS,
                                                                                   str(tmp_path))}
    assert scans == {1: [1, 2], 3: [3, 4, 5, 6], 7: [7]}


def test_a_form2_first_record_takes_the_empty_segments_place(tmp_path: Path) -> None:
    raised: list[int] = []
    w = Writer(FS, str(tmp_path), STORE, 4096, upgrade=raised.append)
    w.start(1)
    w.append([_rec(1, FLAG_APPENDS)])
    w.close()
    assert raised == [APPENDS_VERSION]
    assert os.listdir(tmp_path) == [segment_name(1)]
    assert _versions(tmp_path) == {1: APPENDS_VERSION}


def test_a_failed_version_raise_writes_nothing(tmp_path: Path) -> None:
    def full(_version: int) -> None:
        raise OSError(28, "No space left on device")

    w = Writer(FS, str(tmp_path), STORE, 4096, upgrade=full)
    w.start(1)
    w.append([_rec(1)])
    with pytest.raises(DiskFullError):
        w.append([_rec(2, FLAG_APPENDS)])
    w.append([_rec(2)])  # the writer goes on: nothing of the refused batch was written
    w.close()
    assert _versions(tmp_path) == {1: PLAIN_VERSION}
    (seg,) = list_segments(FS, str(tmp_path))
    assert [(f.lsn, f.flags) for f in seg.scan().frames] == [(1, 0), (2, 0)]


# -- the store -------------------------------------------------------------------------------


def test_a_store_without_appends_stays_version_1(tmp_path: Path) -> None:
    with agentwal.open(str(tmp_path), durability="none", wal_max_bytes=1 << 30) as store:
        for i in range(30):
            with store.begin("r") as txn:
                txn.put("messages", [{"n": j, "text": "x" * 100} for j in range(i)])
        store.snapshot()
        with store.begin("r") as txn:
            txn.put("step", 31)
    with agentwal.open(str(tmp_path), durability="none") as store:
        assert store.get("r", "step") == 31
    assert _control_format(tmp_path) == PLAIN_VERSION
    assert set(_versions(tmp_path / WAL_DIR).values()) == {PLAIN_VERSION}


def test_the_first_append_raises_the_store_to_version_2(tmp_path: Path) -> None:
    with agentwal.open(str(tmp_path), durability="none", wal_max_bytes=1 << 30) as store:
        with store.begin("r") as txn:
            txn.put("messages", ["a"])
        assert _control_format(tmp_path) == PLAIN_VERSION
        with store.begin("r") as txn:
            txn.append("messages", "b")
        assert _control_format(tmp_path) == APPENDS_VERSION
        with store.begin("r") as txn:
            txn.append("messages", "c")
        assert _form2_in_v2_segments_only(tmp_path) == 2
        shutil.copytree(tmp_path, tmp_path.parent / "crashed")  # the log as a crash leaves it
    with agentwal.open(str(tmp_path.parent / "crashed"), durability="none") as store:
        assert store.get("r", "messages") == ["a", "b", "c"]
        assert store.verify().ok
        with store.begin("r") as txn:
            txn.append("messages", "d")
    crashed = tmp_path.parent / "crashed"
    assert _control_format(crashed) == APPENDS_VERSION
    assert set(_versions(crashed / WAL_DIR).values()) == {APPENDS_VERSION}  # sticky
    shutil.rmtree(crashed)


# -- what the agentwal before the bump makes of it ------------------------------------------

_OLD_OPEN = """
import sys, agentwal
for path in sys.argv[1:]:
    try:
        with agentwal.open(path, durability="none") as st:
            print("read", st.get("r", "messages"))
    except agentwal.errors.Error as e:
        print("refused", e.reason)
"""


def _old_agentwal(dest: Path) -> Path:
    """The package as of ``BEFORE_BUMP``, unpacked under ``dest``."""
    archive = dest / "old.tar"
    try:
        subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), BEFORE_BUMP,
                        "agentwal"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:  # a checkout without history
        pytest.skip(f"git cannot give {BEFORE_BUMP}: {exc}")
    with tarfile.open(archive) as tar:
        tar.extractall(dest / "old", filter="data")
    return dest / "old"


def _old_open(old: Path, *stores: Path) -> list[str]:
    """What the old agentwal says opening each store, one line each."""
    r = subprocess.run([sys.executable, "-c", _OLD_OPEN, *map(str, stores)],
                       cwd=str(old.parent), env={**os.environ, "PYTHONPATH": str(old)},
                       capture_output=True, text=True, timeout=120, check=True)
    return r.stdout.splitlines()


def test_the_agentwal_before_the_bump_refuses_a_version_2_store(tmp_path: Path) -> None:
    old = _old_agentwal(tmp_path)
    plain, appended = tmp_path / "plain", tmp_path / "appended"
    with agentwal.open(str(plain), durability="none") as store, store.begin("r") as txn:
        txn.put("messages", ["a"])
    with agentwal.open(str(appended), durability="none", wal_max_bytes=1 << 30) as store:
        with store.begin("r") as txn:
            txn.put("messages", ["a"])
        with store.begin("r") as txn:
            txn.append("messages", "b")
        shutil.copytree(appended, tmp_path / "crashed")  # unfolded: the log holds the append
        shutil.copytree(appended, tmp_path / "control1")
    ctl = read_control(FS, str(appended))
    assert ctl is not None
    create_control(FS, str(tmp_path / "control1"), ctl.store_id, PLAIN_VERSION)
    assert _old_open(old, plain, appended, tmp_path / "crashed", tmp_path / "control1") == [
        # a version-1 store's log stays acceptable to it, but a layout-4 fold wrote the
        # snapshot (format.md, section 7): its write-once entry is damage to it, not a value
        "refused value of key 'messages': malformed ref",
        # a version-2 store is refused at CONTROL, folded or not ...
        "refused store format 2, this agentwal reads format 1",
        "refused store format 2, this agentwal reads format 1",
        # ... and, were CONTROL to say 1, at the segment holding the form-2 record
        "refused segment format version 2, this agentwal reads 1",
    ]
