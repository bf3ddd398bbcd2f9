"""Issue #10, case 4: salvage. A damaged log opens read-only to its intact prefix on request,
and ``agentwal salvage`` writes a new healthy store from it.

For every kind of WAL damage of the corruption tier (seeded, on each variant
of base store), the copy is opened with ``recover="prefix"`` and salvaged;
the salvaged store is then judged like any opened copy: it must hold the
state after a prefix of the acknowledged commits (at least what LMDB had
folded), never wrong data, and must open again the same. Damage to the
snapshot and to CONTROL is salvaged in ``test_salvage_lmdb.py``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import agentwal
from agentwal.cli import main
from agentwal.errors import CorruptionError, PathExistsError
from agentwal.local.salvage import salvage
from agentwal.testing import crash
from agentwal.testing.corrupt import (
    VARIANTS,
    WAL_KINDS,
    Base,
    apply_damage,
    build_base,
    check_copy,
    judge,
)


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Base]:
    root = tmp_path_factory.mktemp("salvage-bases")
    return {v: build_base(str(root / v), "salvage-1", v) for v in VARIANTS}


@pytest.mark.parametrize("kind", WAL_KINDS)
def test_salvage_of_wal_damage_is_an_acknowledged_prefix(bases: dict[str, Base], kind: str,
                                                         tmp_path: Path) -> None:
    outcomes = []
    for n, (variant, b) in enumerate(sorted(bases.items())):
        copy, dest = str(tmp_path / f"copy-{variant}"), str(tmp_path / f"dest-{variant}")
        shutil.copytree(b.path, copy)
        damage = apply_damage(copy, kind, random.Random(f"salvage/{kind}/{n}"))
        before = sorted(os.listdir(os.path.join(copy, "wal")))
        report = salvage(copy, dest)
        assert sorted(os.listdir(os.path.join(copy, "wal"))) == before  # the source unchanged
        ok, detail = judge(b, damage, check_copy(dest, b.workload.runs))
        assert ok, f"{variant}: [{damage.what}] {detail}"
        assert not detail.startswith("detected"), detail  # the salvaged store opens
        try:
            agentwal.open(copy, readonly=True).close()
        except CorruptionError:  # a plain open refuses: the salvage must say what it lost
            assert report.lost is not None, (variant, damage.what, detail)
        outcomes.append(detail.split(" ")[0])
        with agentwal.open(dest) as store:  # healthy: writable, verifies clean
            assert store.verify().ok, store.verify().problems
    print(kind, outcomes)


def test_recover_prefix_says_what_was_lost(tmp_path: Path) -> None:
    from agentwal.local.wal.frame import parse_header
    from agentwal.local.wal.reader import scan_segment

    path = tmp_path / "s"
    store = agentwal.open(path)
    for i in range(20):
        with store.begin("a" if i % 2 else "b") as txn:
            txn["i"] = i
    crash(store)  # killed: never folded
    seg = sorted((path / "wal").glob("*.wal"))[-1]
    data = bytearray(seg.read_bytes())
    header = parse_header(bytes(data))
    assert not isinstance(header, str)
    frames = scan_segment(bytes(data), header).frames
    data[frames[10].offset + 30] ^= 0xFF  # LSN 11, in the middle of the log
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptionError):
        agentwal.open(path, readonly=True)
    with agentwal.open(path, recover="prefix") as ro:
        assert ro.readonly and ro.lost is not None
        assert ro.lost.first_lsn == 11 and ro.lost.last_lsn == 20
        assert ro.lost.checkpoints == {"a": [6, 7, 8, 9, 10], "b": [7, 8, 9, 10]}
        assert ro.get("b", "i") == 8 and ro.get("a", "i") == 9  # steps 0..9
    result = CliRunner().invoke(main, ["salvage", str(path), str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["checkpoints"] == {"a": 5, "b": 5} and doc["lost"]["first_lsn"] == 11
    human = CliRunner().invoke(main, ["salvage", str(path), str(tmp_path / "out2")])
    assert "lost LSN 11..20" in human.output and "run 'a' checkpoints 6..10" in human.output
    with agentwal.open(tmp_path / "out", readonly=True) as out:
        assert out.state("b") == {"i": 8} and out.head("a").id == 5  # type: ignore[union-attr]
    with pytest.raises(PathExistsError):
        salvage(str(path), str(tmp_path / "out"))
    with agentwal.open(path, recover="prefix") as again:  # the source was never changed
        assert again.lost is not None and again.lost.first_lsn == 11


def _tree_files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def test_recover_prefix_of_a_whole_store_loses_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "a.txt").write_text("alpha")
    (work / "sub" / "b.txt").write_text("beta")
    with agentwal.open(tmp_path / "s") as store:
        blob = tmp_path / "artifact.bin"
        blob.write_bytes(b"weights" * 1000)
        with store.begin("r") as txn:
            txn["k"] = 1
            txn.put_blob("model", str(blob))
            txn.put_tree("work", str(work))
        with store.begin("r") as txn:
            txn["k"] = 2
            txn.meta(node="second")
    before = _tree_files(tmp_path / "s")
    report = salvage(str(tmp_path / "s"), str(tmp_path / "copy"))
    assert _tree_files(tmp_path / "s") == before  # blobs/ is shared with the shadow: untouched
    assert report.complete and report.checkpoints == {"r": 2}
    with agentwal.open(tmp_path / "copy", readonly=True) as out:
        assert out.get("r", "k", at=1) == 1 and out.get("r", "k") == 2
        assert out.head("r").meta == {"node": "second"}  # type: ignore[union-attr]
        with out.open_blob("r", "model") as f:
            assert f.read() == b"weights" * 1000
        out.restore_tree("r", "work", tmp_path / "back")
    assert _tree_files(tmp_path / "back") == _tree_files(work)


def test_recover_argument(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        agentwal.open(tmp_path / "s", recover="everything")


def test_salvage_refuses_a_store_with_a_live_writer(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # salvage reads data.mdb and the log by hand, so a writer folding meanwhile made it
    # report snapshot damage and lost checkpoints that were not lost (seen against a live
    # agent). It must refuse, changing and creating nothing, and keep writers out while it runs.
    import agentwal.local.salvage as salvage_module

    src, dest = tmp_path / "s", tmp_path / "out"
    store = agentwal.open(src)
    with store.begin("r") as txn:
        txn["i"] = 1
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(agentwal.StoreLockedError) as info:
        salvage(str(src), str(dest))
    assert info.value.pid == os.getpid() and "backup" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == before  # no dest, dest.tmp or shadow left
    result = CliRunner().invoke(main, ["salvage", str(src), str(dest), "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["error"]["code"] == "store_locked"
    store.close()

    copy_runs = salvage_module._copy_runs
    refused = []

    def copy_and_try_a_writer(src_store: object, out: object, report: object) -> None:
        with pytest.raises(agentwal.StoreLockedError):
            agentwal.open(src)
        refused.append(True)
        copy_runs(src_store, out, report)

    monkeypatch.setattr(salvage_module, "_copy_runs", copy_and_try_a_writer)
    report = salvage(str(src), str(dest))
    assert refused and report.complete and report.checkpoints == {"r": 1}
    with agentwal.open(src) as again:  # released once salvage ends
        assert again.get("r", "i") == 1
