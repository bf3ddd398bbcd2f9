"""Format versions: a store is version 1 until its log takes a form-2 record (then 2)
and until its first fold (then 3: the snapshot holds layout 4).

An agentwal that reads only version 1 would take the first form-2 frame
(``FLAG_APPENDS``) for the end of the log and drop what follows. So the
first form-2 record raises CONTROL to format 2 and goes into a new segment
whose header says 2: such an agentwal refuses the store instead. An agentwal
that reads only versions 1 and 2 would read a layout-4 snapshot's history
wrong (a write-once key has no ``versions`` entry: missing from ``state(at=)``
and lost by ``rollback_to``), so the first fold raises CONTROL to 3 before it
writes the snapshot. A store that does neither stays version 1. The last tests
run the reader of the commit before each bump (``git archive``) on stores this
one wrote.
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
    LAYOUT4_VERSION,
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
#: The last commit whose reader accepts formats 1 and 2 only (it wrote snapshot layout 3).
BEFORE_LAYOUT4 = "48cb553"
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


def test_a_store_without_appends_or_folds_stays_version_1(tmp_path: Path) -> None:
    with agentwal.open(str(tmp_path / "s"), durability="none", wal_max_bytes=1 << 30) as store:
        for i in range(30):
            with store.begin("r") as txn:
                txn.put("messages", [{"n": j, "text": "x" * 100} for j in range(i)])
        shutil.copytree(tmp_path / "s", tmp_path / "crashed")  # as a crash leaves it: unfolded
    crashed = tmp_path / "crashed"
    assert _control_format(crashed) == PLAIN_VERSION
    assert set(_versions(crashed / WAL_DIR).values()) == {PLAIN_VERSION}
    with agentwal.open(str(crashed), readonly=True) as store:  # a read-only open writes nothing
        assert store.get("r", "messages")[-1]["n"] == 28
    assert _control_format(crashed) == PLAIN_VERSION
    assert _control_format(tmp_path / "s") == LAYOUT4_VERSION  # close folded


def test_the_first_fold_raises_the_store_to_version_3_before_it_writes(tmp_path: Path) -> None:
    with agentwal.open(str(tmp_path), durability="none", wal_max_bytes=1 << 30) as store:
        with store.begin("r") as txn:
            txn.put("step", 1)
        assert _control_format(tmp_path) == PLAIN_VERSION
        store.snapshot()
        assert _control_format(tmp_path) == LAYOUT4_VERSION
        with store.begin("r") as txn:
            txn.put("messages", ["a"])
        with store.begin("r") as txn:
            txn.append("messages", "b")  # form 2 in a version-3 store: never lowered to 2
        assert _control_format(tmp_path) == LAYOUT4_VERSION
        assert store.get("r", "messages") == ["a", "b"]
    with agentwal.open(str(tmp_path), durability="none") as store:
        with store.begin("r") as txn:
            txn.append("messages", "c")
        assert store.get("r", "messages") == ["a", "b", "c"] and store.verify().ok
    assert _control_format(tmp_path) == LAYOUT4_VERSION
    assert set(_versions(tmp_path / WAL_DIR).values()) <= {PLAIN_VERSION, APPENDS_VERSION,
                                                           LAYOUT4_VERSION}


def test_a_failed_raise_to_version_3_folds_nothing(tmp_path: Path) -> None:
    with agentwal.open(str(tmp_path), durability="none") as store:
        with store.begin("r") as txn:
            txn.put("step", 1)
        snap = store._engine._snap  # type: ignore[attr-defined]
        raise_to = snap.before_layout4

        def full() -> None:
            raise OSError(28, "No space left on device")
        snap.before_layout4 = full
        with pytest.raises(DiskFullError):
            store.snapshot()
        assert _control_format(tmp_path) == PLAIN_VERSION
        assert store.stats()["folds"] == 0 and store.get("r", "step") == 1
        snap.before_layout4 = raise_to
        store.snapshot()
        assert _control_format(tmp_path) == LAYOUT4_VERSION


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
    assert _control_format(crashed) == LAYOUT4_VERSION  # close folded: layout 4
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


def _old_agentwal(dest: Path, commit: str = BEFORE_BUMP) -> Path:
    """The package as of ``commit``, unpacked under ``dest``."""
    archive = dest / "old.tar"
    try:
        subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), commit,
                        "agentwal"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:  # a checkout without history
        pytest.skip(f"git cannot give {commit}: {exc}")
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
        # a store closed by this agentwal was folded into layout 4: version 3
        "refused store format 3, this agentwal reads format 1",
        # ... and so is one whose log took an append: closed (folded: 3) or not (2) ...
        "refused store format 3, this agentwal reads format 1",
        "refused store format 2, this agentwal reads format 1",
        # ... and, were CONTROL to say 1, at the segment holding the form-2 record
        "refused segment format version 2, this agentwal reads 1",
    ]


def test_the_agentwal_before_layout_4_refuses_a_folded_store_and_reads_an_unfolded_one(
        tmp_path: Path) -> None:
    """The agentwal of 48cb553 reads formats 1 and 2 and snapshot layout 3. Given a layout-4
    snapshot it would miss every write-once key in ``state(at=)`` and delete it in
    ``rollback_to``; CONTROL's format 3 makes it refuse the store instead."""
    old = _old_agentwal(tmp_path, BEFORE_LAYOUT4)
    folded, unfolded = tmp_path / "folded", tmp_path / "unfolded"
    with agentwal.open(str(folded), durability="none", wal_max_bytes=1 << 30) as store:
        with store.begin("r") as txn:
            txn.put("messages", ["a"])
        with store.begin("r") as txn:
            txn.append("messages", "b")
        shutil.copytree(folded, unfolded)  # a crash copy: CONTROL 2, the log unfolded
    assert (_control_format(folded), _control_format(unfolded)) == (LAYOUT4_VERSION,
                                                                    APPENDS_VERSION)
    assert _old_open(old, folded, unfolded) == [
        "refused store format 3, this agentwal reads formats 1 to 2",
        "read ['a', 'b']",
    ]


_WRITER_FOLDS = """
import sys, agentwal
with agentwal.open(sys.argv[1], durability="none", wal_max_bytes=1 << 30) as store:
    for i in range(10, 20):
        with store.begin("r") as txn:
            txn.put(f"once{i}", i)           # write-once keys (layout 4: no versions entry)
            txn.put("step", i)
    store.snapshot()                          # the first layout-4 fold: CONTROL goes to 3
"""


def test_a_read_only_store_open_across_the_first_layout4_fold_reads_every_checkpoint(
        tmp_path: Path) -> None:
    """A reader opened on a format-1 store keeps reading right while a writer process
    makes the store's first layout-4 fold (write-once keys get no ``versions`` entry)."""
    path = tmp_path / "s"
    with agentwal.open(str(path), durability="none", wal_max_bytes=1 << 30) as store:
        for i in range(10):
            with store.begin("r") as txn:
                txn.put(f"once{i}", i)
                txn.put("step", i)
        shutil.copytree(path, tmp_path / "crashed")  # as a crash leaves it: unfolded
    crashed = tmp_path / "crashed"
    assert _control_format(crashed) == PLAIN_VERSION

    def expected(ckpt: int) -> dict[str, int]:  # checkpoint ids count from 1
        return {"step": ckpt - 1, **{f"once{i}": i for i in range(ckpt)}}

    with agentwal.open(str(crashed), readonly=True) as reader:
        assert reader.state("r") == expected(10)
        subprocess.run([sys.executable, "-c", _WRITER_FOLDS, str(crashed)], check=True,
                       timeout=120, cwd=REPO)
        assert _control_format(crashed) == LAYOUT4_VERSION
        head = reader.head("r")  # its view is still the one of its open
        assert head is not None and head.id == 10
        assert reader.state("r", at=5) == expected(5) and reader.state("r") == expected(10)
        reader.refresh()  # now the folded, layout-4 snapshot and the writer's commits
        head = reader.head("r")
        assert head is not None and head.id == 20
        for ckpt in (1, 5, 10, 11, 15, 20):
            assert reader.state("r", at=ckpt) == expected(ckpt), ckpt
            assert reader.get("r", "once3", at=ckpt) == (3 if ckpt > 3 else None), ckpt
        assert reader.diff("r", 10, 20).changed.keys() >= {"step"}
    with agentwal.open(str(crashed), readonly=True) as again:
        assert again.state("r") == expected(20) and again.verify().ok
