"""Issue #10, salvage of snapshot damage, and salvage fidelity.

``agentwal salvage`` never hands a damaged ``data.mdb`` to LMDB: it reads
the file's pages by hand (``snapshot/rescue.py``), keeps every record that
still checks, and copies every run, checkpoint and value that then reads.
Each damage kind of the corruption tier's LMDB and CONTROL sets (a seeded
sweep, flipped and zeroed pages included) is salvaged and judged against the
undamaged store: never a wrong value, metadata or origin under any checkpoint id, and
everything missing is named in the report (``salvage_judge.py``). Fidelity:
ids survive compaction (gaps stay gaps), fork origins survive, even once the
fork's first checkpoint was compacted away.
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
from agentwal.local.salvage import salvage
from agentwal.local.snapshot.rescue import rescue
from agentwal.testing import crash, run_origin
from agentwal.testing.corrupt import (
    CONTROL_KINDS,
    LMDB_KINDS,
    VARIANTS,
    Base,
    apply_damage,
    build_base,
    lmdb_pages,
)

from .salvage_judge import judge_salvage

#: Cases per (kind, variant): the flips and zeroed pages get more, as they vary most;
#: the slow sweep runs many more of those.
_SEEDS = {"lmdb-flip-btree": 2, "lmdb-flip-anywhere": 2, "lmdb-zero-page": 2}
_SWEEP = ("lmdb-flip-btree", "lmdb-flip-anywhere", "lmdb-zero-page", "lmdb-truncate",
          "lmdb-flip-meta")


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Base]:
    root = tmp_path_factory.mktemp("salvage-lmdb-bases")
    return {v: build_base(str(root / v), "salvage-lmdb", v) for v in VARIANTS}


def _files(path: str) -> dict[str, bytes]:
    out = {}
    for d, _dirs, names in os.walk(path):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), path)] = f.read()
    return out


def _sweep(bases: dict[str, Base], kind: str, seeds: range, tmp_path: Path) -> list[str]:
    """Salvage ``seeds`` damaged copies of each base; judge each; returns the outcomes."""
    outcomes = []
    for variant, b in sorted(bases.items()):
        for seed in seeds:
            copy, dest = str(tmp_path / "copy"), str(tmp_path / "dest")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(b.path, copy)
            damage = apply_damage(copy, kind, random.Random(f"salvage-lmdb/{kind}/{variant}/"
                                                            f"{seed}"))
            before = _files(copy)
            report = salvage(copy, dest)
            assert _files(copy) == before, "the source changed"
            bad = judge_salvage(b.path, dest, report)
            assert not bad, f"{variant}/{seed} [{damage.what}]: {bad[:5]}"
            # healthy: verifies clean, and (once per sweep, for time) opens writable
            with agentwal.open(dest, readonly=bool(outcomes)) as store:
                assert store.verify().ok, store.verify().problems
            copied = sum(report.checkpoints.values())
            if not report.complete:  # whatever was lost is said, never an empty silence
                assert report.snapshot or report.lost or report.lost_runs or report.skipped
            outcomes.append("complete" if report.complete else f"partial {copied}")
    return outcomes


@pytest.mark.parametrize("kind", LMDB_KINDS + CONTROL_KINDS)
def test_salvage_of_snapshot_damage_never_lies(bases: dict[str, Base], kind: str,
                                               tmp_path: Path) -> None:
    outcomes = _sweep(bases, kind, range(_SEEDS.get(kind, 1)), tmp_path)
    if kind in ("lmdb-append-zeros", "lmdb-append-garbage"):  # LMDB's tree is whole
        assert all(o == "complete" for o in outcomes), outcomes
    if kind in CONTROL_KINDS:  # the store id comes from the snapshot: everything is copied
        assert all(o == "partial 118" for o in outcomes), outcomes
    print(kind, outcomes)


@pytest.mark.slow
@pytest.mark.parametrize("kind", _SWEEP)
def test_salvage_sweep_of_damaged_pages(bases: dict[str, Base], kind: str,
                                        tmp_path: Path) -> None:
    print(kind, _sweep(bases, kind, range(2, 14), tmp_path))


def test_a_damaged_value_costs_that_value_only(tmp_path: Path) -> None:
    src = tmp_path / "s"
    big = random.Random(7).randbytes(20_000)  # incompressible: stored as it is, on overflow pages
    with agentwal.open(src) as store:
        with store.begin("r") as txn:
            txn["small"] = 1
            txn["big"] = big  # a history object, on overflow pages
        with store.begin("r") as txn:
            txn["small"] = 2
        with store.begin("other") as txn:
            txn["x"] = [1, 2, 3]
    data = src / "snapshot" / "data.mdb"
    raw = bytearray(data.read_bytes())
    roles = lmdb_pages(bytes(raw))
    psize = 4096
    at = raw.find(big[:200])
    while roles.get(at // psize) != "objects/overflow":  # the one copy: the head refers to it
        at = raw.find(big[:200], at + 1)
        assert at > 0
    raw[at + 100] ^= 0x01
    data.write_bytes(bytes(raw))
    with agentwal.open(src, readonly=True) as ro, pytest.raises(agentwal.CorruptionError):
        ro.state("r", at=1)
    report = salvage(str(src), str(tmp_path / "out"))
    # the value is stored once (the head table refers to the history's object), so it is
    # lost at both checkpoints; everything else of both still reads
    assert report.lost_values == {"r": {"big": [1, 2]}}
    assert report.checkpoints == {"r": 2, "other": 1} and not report.lost_checkpoints
    assert any("objects" in p for p in report.snapshot), report.snapshot
    with agentwal.open(tmp_path / "out", readonly=True) as out:
        assert out.state("r", at=1) == {"small": 1}
        assert out.state("r") == {"small": 2}
        assert out.state("other") == {"x": [1, 2, 3]}
    result = CliRunner().invoke(main, ["salvage", str(src), str(tmp_path / "out2")])
    assert result.exit_code == 0, result.output
    assert "key 'big' not readable at checkpoints 1..2 (absent there" in result.output
    assert "snapshot damage" in result.output


def test_a_lost_versions_entry_never_reads_an_older_value(tmp_path: Path) -> None:
    """The ``versions`` index says which checkpoint changed which key; a read of an older
    checkpoint takes each key's latest version at or before it. An entry lost to damage
    must not make that read fall back to the key's previous value: salvage rebuilds the
    index from the deltas it kept."""
    src = tmp_path / "s"
    with agentwal.open(src) as store:
        for i in range(1, 7):
            with store.begin("r") as txn:
                txn["k"] = f"value-{i}"
                txn["n"] = i
    data = src / "snapshot" / "data.mdb"
    raw = bytearray(data.read_bytes())
    roles = lmdb_pages(bytes(raw))
    # the versions entry of ("k", checkpoint 4): (run number,) key length, key, id
    entry = len(b"k").to_bytes(2, "big") + b"k" + (4).to_bytes(8, "big")
    at = raw.find(entry)
    while at >= 0 and roles.get(at // 4096) != "versions/leaf":
        at = raw.find(entry, at + 1)
    assert at >= 0, "the versions entry is not on a versions leaf"
    raw[at + len(entry) - 1] ^= 0x04  # now names checkpoint 0: its seal no longer checks
    data.write_bytes(bytes(raw))
    report = salvage(str(src), str(tmp_path / "out"))
    with agentwal.open(tmp_path / "out", readonly=True) as out:
        for i in range(1, 7):
            assert out.state("r", at=i) == {"k": f"value-{i}", "n": i}, (i, report)


def test_a_missing_snapshot_of_a_never_folded_store_loses_nothing(tmp_path: Path) -> None:
    src = tmp_path / "s"
    store = agentwal.open(src)
    for i in range(12):
        with store.begin(f"r{i % 3}") as txn:
            txn["i"] = i
            txn.meta(step=i)
    crash(store)  # killed: nothing folded, everything in the log
    os.unlink(src / "snapshot" / "data.mdb")
    report = salvage(str(src), str(tmp_path / "out"))
    assert report.checkpoints == {"r0": 4, "r1": 4, "r2": 4}
    assert report.lost is None and not report.lost_runs and report.snapshot
    with agentwal.open(tmp_path / "out", readonly=True) as out:
        assert out.state("r2") == {"i": 11} and out.head("r2").meta == {"step": 11}  # type: ignore[union-attr]


def test_a_deleted_snapshot_of_a_folded_store_is_reported_not_silent(tmp_path: Path) -> None:
    src = tmp_path / "s"
    with agentwal.open(src, segment_bytes=4096) as store:
        for i in range(60):
            with store.begin("r") as txn:
                txn["i"] = i
                txn["pad"] = "p" * 200
    os.unlink(src / "snapshot" / "data.mdb")
    result = CliRunner().invoke(main, ["salvage", str(src), str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["complete"] is False
    assert any("missing" in p for p in doc["snapshot"])
    assert doc["lost"] is not None  # the log's first records went with the fold


def test_rescue_reads_a_whole_file_as_lmdb_does(tmp_path: Path) -> None:
    import lmdb

    from agentwal.local.snapshot.layout import DB_KEYS

    with agentwal.open(tmp_path / "s") as store:
        for i in range(200):
            with store.begin(f"r{i % 5}") as txn:
                txn["i"] = i
                txn["text"] = "t" * (i * 40)
                txn.append("log", {"n": i})
    found = rescue(str(tmp_path / "s" / "snapshot" / "data.mdb"))
    assert found.problems == []
    env = lmdb.open(str(tmp_path / "s" / "snapshot"), readonly=True, max_dbs=16, lock=False)
    try:
        for name in DB_KEYS:
            db = env.open_db(name, create=False)
            with env.begin() as txn:
                want = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]
            assert found.records[name.decode()] == want, name
            assert found.expected[name.decode()] == len(want)
    finally:
        env.close()


def test_salvage_keeps_ids_gaps_and_fork_origins(tmp_path: Path) -> None:
    src, dest = tmp_path / "s", tmp_path / "out"
    with agentwal.open(src) as store:
        for i in range(30):
            with store.begin("a") as txn:
                txn["i"] = i
                txn.meta(step=i)
        store.fork("a", 10, "f")
        for i in range(6):
            with store.begin("f") as txn:
                txn["j"] = i
        store.fork("f", 4, "g")
        with store.begin("g") as txn:
            txn["k"] = "g"
        store.compact(keep_last=3)  # keeps a: 10 (f's origin), 28..30; f: 4 (g's), 5..7
    report = salvage(str(src), str(dest))
    assert report.complete, report
    with agentwal.open(src, readonly=True) as want, agentwal.open(dest, readonly=True) as got:
        assert got.runs() == want.runs()
        for run in want.runs():
            wh, gh = want.history(run), got.history(run)
            assert [c.id for c in gh] == [c.id for c in wh], run
            assert [(c.meta, c.origin) for c in gh] == [(c.meta, c.origin) for c in wh]
            for c in wh:
                assert got.state(run, at=c.id) == want.state(run, at=c.id)
        assert [c.id for c in got.history("a")] == [30, 29, 28, 10]
        assert got.history("g")[-1].origin == ("f", 4)

        # f's first checkpoint (which held the origin) was compacted away in both
        assert run_origin(got, "f") == run_origin(want, "f") == ("a", 10)
        assert got.verify().ok
    assert not judge_salvage(str(src), str(dest), report)


def test_a_damaged_logmark_does_not_stop_salvage(tmp_path: Path) -> None:
    src = tmp_path / "s"
    store = agentwal.open(src)
    for i in range(5):
        with store.begin("r") as txn:
            txn["i"] = i
    crash(store)
    mark = src / "LOGMARK"
    raw = bytearray(mark.read_bytes())
    raw[-1] ^= 0xFF  # in the segment list: the whole mark is refused
    mark.write_bytes(bytes(raw))
    with pytest.raises(agentwal.CorruptionError):
        agentwal.open(src, recover="prefix")
    report = salvage(str(src), str(tmp_path / "out"))
    assert report.checkpoints == {"r": 5}
    assert any("LOGMARK is damaged" in s for s in report.skipped), report.skipped
