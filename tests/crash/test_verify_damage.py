"""verify() reports a single flipped byte anywhere in the stored state and history.

A seeded sweep: copies of a closed store (every database holding entries:
state, checkpoints, deltas, versions, a manifest, large values, list nodes, reference
counts, object ids, the effects ledger) each get one byte flipped (XOR with a
random non-zero mask) at a random place, and a child interpreter opens the
copy read-only and verifies it (LMDB damage can kill a process; value bytes
should not, but the parent never risks it).

- **value bytes** (and their 4 CRC bytes) of every database: verify must name
  the database and the entry's key, with a checksum mismatch (or the open
  itself must refuse with ``CorruptionError``, which happens for ``meta``);
- **key bytes** of entries held inline in leaf pages: a problem in that
  database (the key text is the damaged key's);
- **WAL frames** of the live segment (records already folded; recovery starts
  after them, so the store opens): verify names the segment and the frame's
  offset.

``AGENTWAL_TORTURE_SECONDS`` multiplies the number of cases.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import cbor2
import pytest

import agentwal
from agentwal.local.wal.frame import parse_header
from agentwal.local.wal.reader import scan_segment
from agentwal.testing.corrupt import lmdb_pages
from tests.stores import U64, Built, Raw, build

ROOT = Path(__file__).resolve().parents[2]
SCALE = max(1, int(float(os.environ.get("AGENTWAL_TORTURE_SECONDS", "0")) // 20))
PER_DB = 20 * SCALE  # value-byte cases per database (fewer when it has fewer entries)
KEY_CASES = 30 * SCALE

CHILD = r"""
import json, os, shutil, sys
import agentwal
for line in sys.stdin:
    case = json.loads(line)
    copy = case["copy"]
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(case["base"], copy)
    target = os.path.join(copy, case["file"])
    with open(target, "r+b") as f:
        f.seek(case["offset"])
        byte = f.read(1)[0]
        f.seek(case["offset"])
        f.write(bytes([byte ^ case["mask"]]))
    out = {"opened": False}
    try:
        with agentwal.open(copy, readonly=True) as s:
            out["opened"] = True
            r = s.verify()
        out["problems"] = [[p.db, p.key, p.what, p.file, p.offset] for p in r.problems]
    except agentwal.Error as exc:
        out["error"] = [exc.code, str(exc)[:300]]
    shutil.rmtree(copy, ignore_errors=True)
    print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(str(tmp_path_factory.mktemp("sweep") / "base.awal"))


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The base store and a few more commits, folded, whose frames stay in the last segment.

    (How many of the base's own records its last segment holds depends on their sizes: an
    append record is small, a rollback's whole state is not.)
    """
    built = build(str(tmp_path_factory.mktemp("sweep") / "logged.awal"))
    with agentwal.open(built.path, durability="sync") as s:
        for j in range(8):
            with s.begin("chat") as txn:
                txn["step"] = 1000 + j
                txn.append("messages", {"role": "agent", "text": f"late {j}"})
    return built


def key_text(db: str, key: bytes, runs: dict[int, str]) -> str:
    """``Problem.key`` for an entry (the contract docs/history.md states)."""
    if db in ("ckpt", "delta", "manifest"):
        return f"{runs[U64.unpack_from(key)[0]]!r}/{U64.unpack_from(key, 8)[0]}"
    if db == "state":
        return f"{runs[U64.unpack_from(key)[0]]!r}/{key[8:].decode()!r}"
    if db == "versions":  # run number, key length (u16), key, id
        name = key[10:-8].decode()
        return (f"{runs[U64.unpack_from(key)[0]]!r}/{repr(name) if name else 'block start'}"
                f"@{U64.unpack_from(key, len(key) - 8)[0]}")
    if db in ("objects", "refs"):
        return f"@{U64.unpack(key)[0]}"
    if db == "oids":
        return key.hex()[:16]
    if db in ("meta", "runs"):
        return repr(key.decode())
    if key[:1] == b"k":
        return f"k {key[1:].decode()!r}"
    if key[:1] == b"q":
        return f"q {U64.unpack_from(key, 1)[0]}/{struct.unpack_from('>I', key, 9)[0]}"
    return key.hex()


def entries(b: Built) -> tuple[list[tuple[str, bytes, int, int]], dict[int, str]]:
    """``(db, key, offset of the sealed value in data.mdb, its length)`` of every live entry
    whose sealed value sits exactly once in the live pages of its database."""
    with Raw(b.path) as raw:
        found = {db: list(raw.entries(db)) for db in raw.dbs}
        runs = {int(cbor2.loads(v[4:])[0]): k.decode() for k, v in found["runs"]}
        raw.txn.abort()
        raw.txn = raw.env.begin()
    data = (Path(b.path) / "snapshot" / "data.mdb").read_bytes()
    psize = struct.unpack_from("<I", data, 40)[0]
    roles = lmdb_pages(data)
    out = []
    for db, items in found.items():
        pages = {p for p, r in roles.items() if r.split("/")[0] == db}
        for k, v in items:
            hits = []
            at = data.find(v)
            while at >= 0:
                if at // psize in pages:
                    hits.append(at)
                at = data.find(v, at + 1)
            if len(hits) == 1:
                out.append((db, k, hits[0], len(v)))
    return out, runs


def run_cases(base: Built, tmp: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Answers of the child for each case; a case that killed it fails the test, named."""
    lines = "".join(json.dumps({**c, "base": base.path, "copy": str(tmp / "case")}) + "\n"
                    for c in cases)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD], input=lines,
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    answers = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    assert len(answers) == len(cases), (
        f"the child died at case {cases[len(answers)]} (status {proc.returncode}):\n"
        f"{proc.stderr[-2000:]}")
    return answers


def test_a_flipped_value_byte_in_any_database_is_reported_at_its_entry(
        base: Built, tmp_path: Path) -> None:
    found, runs = entries(base)
    rng = random.Random("verify-values")
    cases, expect = [], []
    by_db: dict[str, list[tuple[str, bytes, int, int]]] = {}
    for e in found:
        by_db.setdefault(e[0], []).append(e)
    assert set(by_db) >= {"meta", "runs", "state", "ckpt", "delta", "manifest", "versions",
                          "objects", "refs", "oids", "effects"}, sorted(by_db)
    for _db, items in sorted(by_db.items()):
        for db_, key, offset, length in rng.sample(items, min(PER_DB, len(items))):
            at = offset + rng.randrange(length)  # the CRC's 4 bytes included
            cases.append({"file": "snapshot/data.mdb", "offset": at,
                          "mask": rng.randrange(1, 256)})
            expect.append((db_, key_text(db_, key, runs)))
    answers = run_cases(base, tmp_path, cases)
    bad = []
    for case, (db, key), a in zip(cases, expect, answers, strict=True):
        if not a["opened"]:
            if a["error"][0] != "corruption":
                bad.append(f"{db}[{key}] @ {case['offset']}: open failed with {a['error']}")
            continue
        hits = [p for p in a["problems"] if p[0] == db and p[1] == key
                and "checksum mismatch" in p[2]]
        if not hits:
            bad.append(f"{db}[{key}] @ {case['offset']}: not reported; problems: "
                       f"{a['problems'][:3]}")
    opened = sum(a["opened"] for a in answers)
    counts = sorted(len(a["problems"]) for a in answers if a["opened"])
    print(f"\n{len(cases)} value flips over {len(by_db)} databases: {opened} opened and "
          f"reported by verify, {len(cases) - opened} refused at open; problems per case: "
          f"{counts[0]}..{counts[-1]} (median {counts[len(counts) // 2]})")
    assert not bad, "\n".join(bad)
    assert opened >= len(cases) * 0.8
    # Every flip is reported at its own entry (above); the consequences stay a
    # handful. A flipped delta (or manifest) shows 3: its entry and the reference
    # counts of the objects it named (2 here). The blob check's scan of blob
    # references meets the same damaged record and skips it with a note, so the
    # damage is reported once.
    assert counts[-1] <= 3, "one flipped byte should not bury its report in consequences"


def test_a_flipped_key_byte_is_reported_in_its_database(base: Built, tmp_path: Path) -> None:
    found, _runs = entries(base)
    data = (Path(base.path) / "snapshot" / "data.mdb").read_bytes()
    inline = [(db, k, off) for db, k, off, _n in found
              if db != "meta" and data[off - len(k):off] == k]
    rng = random.Random("verify-keys")
    picked = rng.sample(inline, min(KEY_CASES, len(inline)))
    cases = [{"file": "snapshot/data.mdb", "offset": off - len(k) + rng.randrange(len(k)),
              "mask": rng.randrange(1, 256)} for _db, k, off in picked]
    answers = run_cases(base, tmp_path, cases)
    bad = []
    for (db, k, _off), case, a in zip(picked, cases, answers, strict=True):
        if not a["opened"]:
            if a["error"][0] != "corruption":
                bad.append(f"{db}[{k!r}]: open failed with {a['error']}")
        elif not any(p[0] == db for p in a["problems"]):
            bad.append(f"{db}[{k!r}] key byte @ {case['offset']}: not reported; "
                       f"{a['problems'][:3]}")
    assert not bad, "\n".join(bad)


def test_a_flipped_byte_in_any_wal_frame_is_reported_at_its_offset(
        logged: Built, tmp_path: Path) -> None:
    base = logged
    wal = Path(base.path) / "wal"
    name = sorted(n for n in os.listdir(wal) if n.endswith(".wal"))[-1]
    data = (wal / name).read_bytes()
    header = parse_header(data)
    assert not isinstance(header, str)
    found = scan_segment(data, header).frames
    assert len(found) >= 5
    # 40 flips or more over every frame (several per frame when records are large).
    frames = [(name, f) for f in found] * -(-40 // len(found))
    rng = random.Random("verify-wal")
    cases = [{"file": f"wal/{name}", "offset": f.offset + rng.randrange(f.end - f.offset),
              "mask": rng.randrange(1, 256)} for name, f in frames]
    answers = run_cases(base, tmp_path, cases)
    bad = []
    for (name, f), case, a in zip(frames, cases, answers, strict=True):
        if not a["opened"]:
            bad.append(f"{name} frame @ {f.offset}: open failed with {a['error']}")
        elif not any(p[3] == f"wal/{name}" and p[4] == f.offset for p in a["problems"]):
            bad.append(f"{name} frame @ {f.offset} (byte {case['offset']}): not reported; "
                       f"{a['problems'][:3]}")
    assert not bad, "\n".join(bad)


def test_the_sweep_copies_are_clean_without_the_flip(base: Built, tmp_path: Path) -> None:
    """Control: the same child, a flip XORed back (mask applied twice is no damage)."""
    answers = run_cases(base, tmp_path, [{"file": "CONTROL", "offset": 0, "mask": 0}])
    assert answers == [{"opened": True, "problems": []}]
    shutil.rmtree(tmp_path / "case", ignore_errors=True)
