"""Tier ``corrupt``: damaged copies of a store open exactly, to a committed prefix, or refuse.

Default: 128 seeded cases over every kind of damage the engine is built to
catch (WAL segments, CONTROL, LMDB truncation/extension/removal, LMDB value
pages), each copy opened in a child interpreter; 0 failures. A further 160
cases damage LMDB's own structure (meta and B-tree pages), which LMDB does not
checksum. The engine's own checks (run key counts and digests, consecutive
checkpoint ids, database flags, meta versions) catch nearly all of it, but a
page whose node offsets point outside the file can still make LMDB read past
the end of the map (SIGBUS) or trip an assertion, about 1 case in 800: that
test stays ``xfail`` (not strict) and prints how often each outcome happens.
``AGENTWAL_TORTURE_SECONDS`` turns both into timed runs. The named tests pin
the most important cases one by one; the ``test_known_*`` ones reproduce each
weakness the random cases found (all but the SIGBUS one now fixed).
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from agentwal.local.snapshot.layout import object_entries
from agentwal.local.wal.frame import parse_header
from agentwal.local.wal.reader import scan_segment
from agentwal.testing.corrupt import (
    CHECKED_KINDS,
    DAMAGE_KINDS,
    LMDB_STRUCTURAL_KINDS,
    Base,
    Checker,
    Damage,
    apply_damage,
    build_base,
    corrupt_cases,
    judge,
    lmdb_pages,
)
from agentwal.testing.tiers import Result

SECONDS = float(os.environ.get("AGENTWAL_TORTURE_SECONDS", "0"))
COUNT = 128  # two of every (kind, variant) pair of the checked kinds
STRUCTURAL_COUNT = 160


def failures(results: list[Result]) -> list[str]:
    return [f"{r.line()}\n     repro: {r.repro}" for r in results if not r.ok]


def outcome(r: Result) -> str:
    """``exact``, ``prefix``, ``detected`` or the failure class of a result."""
    return r.detail.split("] ", 1)[-1].split(" ", 1)[0].rstrip(",:")


def summary(results: list[Result]) -> str:
    table = collections.Counter((r.case.split("/")[1], outcome(r)) for r in results)
    return "\n".join(f"  {kind:<24} {what:<16} {n}" for (kind, what), n in sorted(table.items()))


# -- the seeded run --------------------------------------------------------------------


def test_seeded_damage_is_detected_or_harmless(tmp_path: Path) -> None:
    deadline = time.monotonic() + SECONDS * 0.6 if SECONDS else None
    results = list(corrupt_cases(str(tmp_path), "corrupt", count=COUNT, deadline=deadline,
                                 kinds=CHECKED_KINDS))
    print(f"\n{len(results)} corrupt cases\n{summary(results)}")
    for line in failures(results):
        print(line)
    assert not failures(results), "\n".join(failures(results))
    assert len(results) >= COUNT
    assert {r.case.split("/")[1] for r in results} == set(CHECKED_KINDS)
    outcomes = collections.Counter(outcome(r) for r in results)
    assert outcomes["detected"] and outcomes["exact"] and outcomes["prefix"], outcomes


# A known limitation, tracked rather than asserted (it cannot fail the run): in the long
# runs only (`make test-all`, `make torture`), not in CI's `make test`.
@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="KNOWN: LMDB structural damage (a flipped bit in a "
                   "B-tree or meta page) can kill the interpreter (SIGBUS, abort), silently "
                   "hide keys or checkpoints, or be misreported as DurabilityError")
def test_lmdb_structural_damage(tmp_path: Path) -> None:
    deadline = time.monotonic() + SECONDS * 0.3 if SECONDS else None
    results = list(corrupt_cases(str(tmp_path), "structural", count=STRUCTURAL_COUNT,
                                 deadline=deadline, kinds=LMDB_STRUCTURAL_KINDS))
    bad = failures(results)
    print(f"\n{len(results)} structural cases, {len(bad)} failed "
          f"({100 * len(bad) / len(results):.1f}%)\n{summary(results)}")
    for line in bad:
        print(line)
    assert not bad, "\n".join(bad)


# -- named cases ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Base]:
    root = tmp_path_factory.mktemp("bases")
    return {v: build_base(str(root / v), "named-1", v) for v in ("sync-close", "sync-abandon")}


@pytest.fixture(scope="module")
def checker() -> Iterator[Checker]:
    with Checker(timeout=30) as c:
        yield c


def damaged(base: Base, tmp_path: Path, name: str, mutate: Callable[[str], None]) -> str:
    """A copy of ``base`` with ``mutate(copy)`` applied; returns the copy's path."""
    copy = str(tmp_path / name)
    shutil.copytree(base.path, copy)
    mutate(copy)
    return copy


def rewrite_lmdb(mutate: Callable[[bytearray], None]) -> Callable[[str], None]:
    """A mutation of a copy's ``data.mdb`` image."""

    def apply(copy: str) -> None:
        path = os.path.join(copy, "snapshot", "data.mdb")
        with open(path, "rb") as f:
            data = bytearray(f.read())
        mutate(data)
        with open(path, "wb") as f:
            f.write(data)

    return apply


def check(checker: Checker, base: Base, copy: str, scope: str = "lmdb") -> tuple[bool, str, Any]:
    answer = checker.check(copy, base.workload.runs)
    ok, detail = judge(base, Damage("named", scope, "", 0, "named"), answer)
    return ok, detail, answer.get("first", answer)


def corruption_at(first: dict[str, Any], stage: str) -> str:
    assert first["status"] == "error", first
    assert first["code"] == "corruption", first
    assert first["stage"] == stage, first
    return str(first["message"])


PSIZE = 4096


def leaf_nodes(data: bytes | bytearray, pgno: int) -> list[tuple[int, bytes]]:
    """``(offset of the node, key)`` of each node of an LMDB leaf page, in key order."""
    off = pgno * PSIZE
    (lower,) = struct.unpack_from("<H", data, off + 12)
    out = []
    for i in range((lower - 16) >> 1):
        node = off + struct.unpack_from("<H", data, off + 16 + 2 * i)[0]
        (ksize,) = struct.unpack_from("<H", data, node + 6)
        out.append((node, bytes(data[node + 8 : node + 8 + ksize])))
    return out


def live(data: bytes | bytearray, role: str) -> list[int]:
    return sorted(p for p, r in lmdb_pages(bytes(data)).items() if r == role)


@pytest.mark.parametrize("cut", ["one-byte-short", "half", "meta-pages-only", "inside-meta"])
def test_truncated_data_mdb_is_corruption_not_sigbus(bases: dict[str, Base], checker: Checker,
                                                     tmp_path: Path, cut: str) -> None:
    b = bases["sync-close"]
    size = os.path.getsize(os.path.join(b.path, "snapshot", "data.mdb"))
    at = {"one-byte-short": size - 1, "half": size // 2, "meta-pages-only": 2 * PSIZE,
          "inside-meta": PSIZE + 100}[cut]
    copy = damaged(b, tmp_path, cut, rewrite_lmdb(lambda d: d.__delitem__(slice(at, None))))
    ok, detail, first = check(checker, b, copy)
    assert ok, detail
    assert "truncated" in corruption_at(first, "open") or "shorter" in first["message"]


@pytest.mark.parametrize("where", ["inline", "overflow"])
def test_flipped_byte_in_a_stored_value_is_corruption_on_read(
        bases: dict[str, Base], checker: Checker, tmp_path: Path, where: str) -> None:
    b = bases["sync-close"]
    model = b.workload.model(b.commits)
    blobs = [cbor2.dumps(v) for st in model.values() for v in st.values()]
    blob = next(x for x in blobs if (len(x) < 1000) == (where == "inline"))
    # A value of 1 KiB or more is stored once, as an object in `objects` (its stored
    # form: compressed and in parts when that applies); the head names it by ref.
    db = "state" if where == "inline" else "objects"
    needle = blob if where == "inline" else object_entries(1, bytes([0]) + blob)[-1][1]

    def flip(data: bytearray) -> None:
        pages = set(live(data, f"{db}/leaf") + live(data, f"{db}/overflow"))
        hits = [i for i in _find_all(data, needle) if i // PSIZE in pages]
        assert hits, "the value is not in a live page"
        for i in hits:
            data[i + len(needle) // 2] ^= 0x10

    copy = damaged(b, tmp_path, where, rewrite_lmdb(flip))
    ok, detail, first = check(checker, b, copy)
    assert ok, detail
    assert ("checksum mismatch in value of key" if where == "inline" else
            "checksum mismatch in") in corruption_at(first, "read")


def test_flipped_byte_in_a_key_is_corruption_when_the_state_is_read(
        bases: dict[str, Base], checker: Checker, tmp_path: Path) -> None:
    b = bases["sync-close"]

    def flip(data: bytearray) -> None:
        page = live(data, "state/leaf")[0]
        nodes = leaf_nodes(data, page)
        # The last key of a run: raising its last character keeps the page sorted.
        node, key = next(n for n, nxt in zip(nodes, [*nodes[1:], (0, b"")], strict=True)
                         if nxt[1][:8] != n[1][:8])
        data[node + 8 + len(key) - 1] ^= 0x08

    copy = damaged(b, tmp_path, "key", rewrite_lmdb(flip))
    ok, detail, first = check(checker, b, copy)
    assert ok, detail
    assert "checksum mismatch in value of key" in corruption_at(first, "read")


def test_truncated_wal_tail_after_an_abandoned_store_is_detected(
        bases: dict[str, Base], checker: Checker, tmp_path: Path) -> None:
    """LOGMARK knows the segment's size and the synced LSN: a cut log is refused (issue #10).

    A store without LOGMARK (made before it existed) still opens to a committed prefix.
    """
    b = bases["sync-abandon"]
    assert b.applied < b.commits - 3

    def cut(copy: str) -> None:
        wal = os.path.join(copy, "wal")
        path = os.path.join(wal, sorted(n for n in os.listdir(wal) if n.endswith(".wal"))[-1])
        with open(path, "rb") as f:
            data = f.read()
        header = parse_header(data)
        assert not isinstance(header, str)
        frames = scan_segment(data, header).frames
        assert frames[-1].lsn == b.commits
        lost.append(min(3, len(frames)))
        with open(path, "r+b") as f:
            f.truncate(frames[-lost[0]].offset + 10)  # inside the k-th record from the end

    lost: list[int] = []
    copy = damaged(b, tmp_path, "tail", cut)
    ok, detail, first = check(checker, b, copy, scope="wal")
    assert ok, detail
    assert detail.startswith("detected at open") and "is truncated" in first["message"], first
    os.unlink(os.path.join(copy, "LOGMARK"))
    ok, detail, _ = check(checker, b, copy, scope="wal")
    assert ok, detail
    assert detail == f"prefix {b.commits - lost[0]}/{b.commits}", detail


def test_truncated_wal_segment_before_the_last_is_corruption(
        bases: dict[str, Base], checker: Checker, tmp_path: Path) -> None:
    b = bases["sync-abandon"]

    def cut(copy: str) -> None:
        wal = os.path.join(copy, "wal")
        names = sorted(n for n in os.listdir(wal) if n.endswith(".wal"))
        assert len(names) >= 2
        path = os.path.join(wal, names[0])
        with open(path, "rb") as f:
            data = f.read()
        header = parse_header(data)
        assert not isinstance(header, str)
        frames = scan_segment(data, header).frames
        assert frames[-1].lsn > b.applied  # the segment holds records the WAL must replay
        os.truncate(path, frames[-1].offset)  # its last frame and everything after it

    ok, detail, first = check(checker, b, damaged(b, tmp_path, "mid", cut), scope="wal")
    assert ok, detail
    corruption_at(first, "open")


@pytest.mark.parametrize("how", ["empty", "deleted"])
def test_lost_data_mdb_is_corruption_not_an_empty_store(
        bases: dict[str, Base], checker: Checker, tmp_path: Path, how: str) -> None:
    b = bases["sync-close"]

    def lose(copy: str) -> None:
        path = os.path.join(copy, "snapshot", "data.mdb")
        if how == "empty":
            os.truncate(path, 0)
        else:
            os.unlink(path)

    ok, detail, first = check(checker, b, damaged(b, tmp_path, how, lose))
    assert ok, detail
    said = corruption_at(first, "open")
    assert "folded into the snapshot" in said  # the snapshot named, not a removed segment
    assert ("is empty" if how == "empty" else "is missing") in said


def test_every_kind_applies_to_every_variant(tmp_path: Path) -> None:
    b = build_base(str(tmp_path / "base"), "kinds", "none-abandon")
    for i, kind in enumerate(DAMAGE_KINDS):
        copy = str(tmp_path / f"c{i}")
        shutil.copytree(b.path, copy)
        d = apply_damage(copy, kind, random.Random(i))
        assert d.kind == kind and d.scope in ("wal", "lmdb", "control") and d.what


# -- the harness itself -------------------------------------------------------------------


def test_judge_fails_every_outcome_outside_the_contract(bases: dict[str, Base]) -> None:
    b = bases["sync-abandon"]
    lmdb = Damage("k", "lmdb", "", 0, "")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"status": "crash", "signal": "SIGBUS", "stderr": ""}, "crash"),
        ({"status": "crash", "returncode": 1, "stderr": ""}, "crash"),
        ({"status": "hang", "returncode": 1, "stderr": "Timeout (0:00:30)!"}, "hang"),
        ({"first": {"status": "unexpected", "stage": "open", "type": "lmdb.Error",
                    "message": "x"}}, "escaped"),
        ({"first": {"status": "error", "stage": "open", "code": "durability",
                    "type": "DurabilityError", "message": "x"}}, "misreported"),
    ]
    for answer, why in cases:
        ok, detail = judge(b, lmdb, answer)
        assert not ok and detail.startswith(why), detail
    ok, detail = judge(b, lmdb, {"first": {"status": "error", "stage": "read",
                                            "code": "corruption", "type": "CorruptionError",
                                            "message": "x"}})
    assert ok and detail.startswith("detected"), detail


def test_judge_allows_a_prefix_only_for_wal_damage(bases: dict[str, Base], checker: Checker,
                                                    tmp_path: Path) -> None:
    b = bases["sync-abandon"]

    def cut(copy: str) -> None:
        wal = os.path.join(copy, "wal")
        path = os.path.join(wal, sorted(n for n in os.listdir(wal) if n.endswith(".wal"))[-1])
        with open(path, "rb") as f:
            data = f.read()
        header = parse_header(data)
        assert not isinstance(header, str)
        os.truncate(path, scan_segment(data, header).frames[-1].offset)
        os.unlink(os.path.join(copy, "LOGMARK"))  # as a store made before LOGMARK: a prefix

    answer = checker.check(damaged(b, tmp_path, "tail", cut), b.workload.runs)
    ok, detail = judge(b, Damage("k", "wal", "", 0, ""), answer)
    assert ok and detail.startswith("prefix"), detail
    ok, detail = judge(b, Damage("k", "lmdb", "", 0, ""), answer)
    assert not ok and detail.startswith("lost_ack"), detail
    states = answer["first"]["states"]
    run = next(r for r in states if states[r])
    states[run][sorted(states[run])[0]] = {"$b": ""}
    ok, detail = judge(b, Damage("k", "wal", "", 0, ""), answer)
    assert not ok, detail


def test_checker_charges_a_hang_to_its_case_and_starts_afresh(
        bases: dict[str, Base], tmp_path: Path) -> None:
    b = bases["sync-close"]
    copy = damaged(b, tmp_path, "plain", lambda c: None)
    with Checker(timeout=0.001) as c:
        answer = c.check(copy, b.workload.runs)
        assert answer["status"] == "hang", answer
        c.timeout = 30
        ok, detail = judge(b, Damage("k", "lmdb", "", 0, ""), c.check(copy, b.workload.runs))
        assert ok and detail == "exact", detail
        assert c.spawned == 2


# -- known engine weaknesses (reproduced one by one; see the structural test for rates) -----


@pytest.mark.xfail(strict=False, reason="KNOWN: a damaged node offset in an LMDB leaf page "
                   "makes LMDB read past the end of data.mdb: SIGBUS kills the interpreter")
def test_known_damaged_node_offset_is_corruption_not_sigbus(
        bases: dict[str, Base], checker: Checker, tmp_path: Path) -> None:
    b = bases["sync-close"]

    def point_past_the_end(data: bytearray) -> None:
        pages = lmdb_pages(bytes(data))
        last = max(p for p, r in pages.items() if r.endswith("/leaf") and r != "free/leaf")
        assert (last + 9) * PSIZE > len(data)
        data[last * PSIZE + 17] |= 0x80  # node 0 now 32 KiB further on: past the end

    ok, detail, _ = check(checker, b, damaged(b, tmp_path, "ptr", rewrite_lmdb(
        point_past_the_end)))
    assert ok, detail


# Regression (was: a checkpoint key damaged so that it sorts outside its run ends the history
# scan early, unchecked: history silently loses checkpoints)
def test_known_damaged_checkpoint_key_is_corruption(
        bases: dict[str, Base], checker: Checker, tmp_path: Path) -> None:
    b = bases["sync-close"]

    def move_to_run_zero(data: bytearray) -> None:
        nodes = leaf_nodes(data, live(data, "ckpt/leaf")[0])
        node, _ = nodes[len(nodes) // 2]
        data[node + 8 + 7] = 0  # run number -> 0, the checkpoint id is kept

    ok, detail, _ = check(checker, b, damaged(b, tmp_path, "ckpt", rewrite_lmdb(
        move_to_run_zero)))
    assert ok, detail


# Regression (was: a state key damaged so that it sorts before its run is never visited by the
# run's scan: the key silently vanishes)
def test_known_damaged_state_key_is_corruption(
        bases: dict[str, Base], checker: Checker, tmp_path: Path) -> None:
    b = bases["sync-close"]

    def move_to_run_zero(data: bytearray) -> None:
        nodes = leaf_nodes(data, live(data, "state/leaf")[0])
        first = next(n for n, k in nodes if k[:8] == nodes[-1][1][:8])
        data[first + 8 + 7] = 0  # the first key of the last run now sorts before it

    ok, detail, _ = check(checker, b, damaged(b, tmp_path, "key0", rewrite_lmdb(
        move_to_run_zero)))
    assert ok, detail


# Regression (was: a flipped flag in a named database's record (MDB_REVERSEKEY) is trusted by
# LMDB: lookups silently miss keys)
def test_known_damaged_database_flags_are_corruption(
        bases: dict[str, Base], checker: Checker, tmp_path: Path) -> None:
    b = bases["sync-close"]

    def reverse_keys(data: bytearray) -> None:
        for node, key in leaf_nodes(data, live(data, "main/leaf")[0]):
            if key == b"state":
                data[node + 8 + len(key) + 4] ^= 0x02  # MDB_db.md_flags |= MDB_REVERSEKEY

    ok, detail, _ = check(checker, b, damaged(b, tmp_path, "dbflags", rewrite_lmdb(
        reverse_keys)))
    assert ok, detail


# Regression (was: a flipped bit in an LMDB meta page's version field is reported as
# DurabilityError (a disk failure), not CorruptionError)
def test_known_damaged_lmdb_version_is_corruption(
        bases: dict[str, Base], checker: Checker, tmp_path: Path) -> None:
    b = bases["sync-close"]

    def flip_version(data: bytearray) -> None:
        data[16 + 7] ^= 0x01  # high byte of mm_version in meta page 0

    ok, detail, _ = check(checker, b, damaged(b, tmp_path, "version", rewrite_lmdb(
        flip_version)))
    assert ok, detail


def _find_all(data: bytes | bytearray, needle: bytes) -> Iterator[int]:
    i = data.find(needle)
    while i >= 0:
        yield i
        i = data.find(needle, i + 1)
