"""Checking the WAL: segment headers, frame CRCs, continuity, records, commit hashes.

Theory of operation: every segment file is scanned by the WAL reader
(``wal/reader.py``) from its header, so every frame's CRC is checked, folded
records included (recovery skips those). Segments must follow one another
from the snapshot's ``applied_lsn + 1`` on, as recovery requires (a segment
whose records are all folded may be stale). Every record must decode, and a
commit record's hash is recomputed from its own bytes and its parent's hash
(the previous record of its run in the log, else the snapshot's checkpoint);
a folded record must carry the hash the snapshot holds.

A run deletion (``REC_DELETE_RUN``) ends a run's chain in the log: the run
starts again at checkpoint 1 after it, and the snapshot holds the new run.
So the records of a run before its last deletion in the log are checked
against one another only, never against the snapshot (which has the new
run, or none, under that id); checkpoints compaction dropped have no record
in the snapshot either, and are not compared.

The end of the last segment is where a writer is writing: a torn tail whose
first missing record is after ``limit`` (the last LSN known acknowledged
when the log was read) is a note, not a problem.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

from ...codec import CodecError, append_base, array_head, array_header_size, checkpoint_hash
from ...format import REC_DELETE_RUN, WAL_DIR, parse_segment_name
from ...types import Progress
from ..records import Replayed, ReplayedDelete, decode_delete_run, decode_record
from ..wal import scan_segment
from ..wal.frame import parse_header
from .report import Problem, WalFile
from .snapshot_checks import SnapshotChecker

__all__ = ["check_wal"]

_ZERO_HASH = bytes(32)


def check_wal(v: SnapshotChecker, wal: list[WalFile], limit: int,
              progress: Progress | None = None) -> None:
    """Check every segment of ``wal``; problems and notes go into ``v``."""
    live = [w for w in wal if w.data is not None]
    for w in wal:
        if w.error:
            v.wal_problem(w.name, None, f"cannot be read: {w.error}")
        elif w.data is None:
            v.notes.append(f"{WAL_DIR}/{w.name} was removed while verifying (a fold)")
    firsts = [parse_segment_name(w.name) or 0 for w in live]
    if v.applied and not live and not any(w.data is None for w in wal):
        v.problems.append(Problem(WAL_DIR, f"the log is missing: the snapshot covers "
                                  f"LSN {v.applied} but no segment remains", WAL_DIR))
    hashes: dict[tuple[str, int], bytes] = {}
    bases: _Bases = {}
    deleted = _deletions(live)
    expected: int | None = None
    for i, w in enumerate(live):
        assert w.data is not None
        if progress is not None:
            progress("log", i, len(live))
        v.checked["wal_segments"] += 1
        v.checked["wal_bytes"] += len(w.data)
        stale = any(f <= v.applied + 1 for f in firsts[i + 1:])
        header = parse_header(w.data)
        if isinstance(header, str):
            v.wal_problem(w.name, 0, header)
            expected = None
            continue
        if header.first_lsn != firsts[i]:
            v.wal_problem(w.name, 40, f"header says first LSN {header.first_lsn}")
        if header.store_id != v.store_id:
            v.wal_problem(w.name, 16, f"segment belongs to store {header.store_id}")
        if not stale:
            start = v.applied + 1 if expected is None else max(expected, v.applied + 1)
            if header.first_lsn > start:
                v.wal_problem(w.name, 0, f"log records {start}..{header.first_lsn - 1} "
                              "are missing")
        scan = scan_segment(w.data, header)
        for f in scan.frames:
            _check_record(v, w.name, f, hashes, deleted, bases)
        expected = scan.next_lsn
        if scan.state == "clean":
            continue
        last = i == len(live) - 1
        if last and scan.next_lsn > limit:
            v.notes.append(f"{WAL_DIR}/{w.name}: torn tail at offset {scan.end} after the "
                           "last acknowledged record (a write in progress, or one a crash "
                           "interrupted; a writer's open zeroes it)")
        else:
            v.wal_problem(w.name, scan.end, scan.reason + (
                "" if last else " (the segment was complete before the next one began)"))
    if progress is not None:
        progress("log", len(live), len(live))


def _deletions(live: list[WalFile]) -> dict[str, int]:
    """Run id -> LSN of its last deletion record in the log (readable frames only)."""
    out: dict[str, int] = {}
    for w in live:
        assert w.data is not None
        header = parse_header(w.data)
        if isinstance(header, str):
            continue
        for f in scan_segment(w.data, header).frames:
            if f.type == REC_DELETE_RUN:
                with contextlib.suppress(CodecError):
                    out[decode_delete_run(f.payload)[0]] = f.lsn
    return out


#: (run, key) -> (item count, encoded length) of the key's value after the records read
#: so far (None: no value, or not a list): the base an append entry must find
_Bases = dict[tuple[str, str], "tuple[int, int] | None"]


def _check_bases(v: SnapshotChecker, name: str, f: Any, r: Replayed, bases: _Bases,
                 dead: bool) -> None:
    """Check each append entry of a record replay would apply against its key's base."""
    run = r.record.run
    for key, entry in r.delta.items():
        if not isinstance(entry, tuple):
            bases[(run, key)] = None if entry is None else append_base(entry)
            continue
        count, length, tail = entry
        slot = (run, key)
        if slot in bases or (run, "") in bases:
            base = bases.get(slot)
        elif f.lsn > v.applied and not dead:
            found = v.folded_value(run, key)
            base = None if found is None else append_base(found)
        else:  # folded already, or of a run deleted since: its base is not here to check
            base = (count, length)
        if base != (count, length):
            v.wal_problem(name, f.offset, f"record LSN {f.lsn} ({run!r}/{r.record.id}): "
                          f"appends to key {key!r}, whose base of {count} items ({length} "
                          f"bytes) is missing: the key holds "
                          + ("no list" if base is None else f"{base[0]} items ({base[1]} bytes)"))
        more = array_head(tail)
        assert more is not None  # decode_record checked the tail is an array
        joined = count + more[0]
        bases[slot] = (joined, array_header_size(joined) + length - array_header_size(count)
                       + len(tail) - more[1])


def _check_record(v: SnapshotChecker, name: str, f: Any,
                  hashes: dict[tuple[str, int], bytes], deleted: dict[str, int],
                  bases: _Bases) -> None:
    """Decode one frame, recompute a commit's hash and check its appends' bases."""
    v.checked["wal_records"] += 1
    try:
        r = decode_record(f.lsn, f.type, f.flags, f.payload, keep_raw=True)
    except CodecError as exc:
        v.wal_problem(name, f.offset, f"record LSN {f.lsn}: {exc}")
        return
    if isinstance(r, ReplayedDelete):
        for k in [k for k in hashes if k[0] == r.run]:  # the run starts again at 1
            del hashes[k]
        for b in [b for b in bases if b[0] == r.run]:  # and with no values
            bases[b] = None
        bases[(r.run, "")] = None  # ("" is never a key): LMDB's values are not its now
        return
    if not isinstance(r, Replayed):
        return
    rec, raw = r.record, r.raw_delta
    assert raw is not None
    if rec.id != (rec.parent or 0) + 1:
        v.wal_problem(name, f.offset, f"record LSN {f.lsn}: checkpoint {rec.id} has "
                      f"parent {rec.parent}")
    # Before the run's last deletion: the snapshot holds another run under this id.
    dead = f.lsn < deleted.get(rec.run, 0)
    _check_bases(v, name, f, r, bases, dead)
    parent_hash: bytes | None = _ZERO_HASH
    if rec.parent is not None:
        parent_hash = hashes.get((rec.run, rec.parent)) or (
            None if dead else v.folded_hash(rec.run, rec.parent))
    if parent_hash is None:
        v.checked["wal_hashes_unchecked"] += 1
    else:
        v.checked["wal_hashes"] += 1
        want = checkpoint_hash(parent_hash, rec.run, rec.id, rec.parent, rec.created_at,
                               rec.meta, rec.origin, hashlib.sha256(raw).digest(),
                               rec.deferred)
        if want != rec.hash:
            v.wal_problem(name, f.offset, f"record LSN {f.lsn} ({rec.run!r}/{rec.id}): "
                          "hash chain broken: its hash is not that of its parent, fields "
                          "and delta")
    if f.lsn <= v.applied and not dead:
        folded = v.folded_hash(rec.run, rec.id)
        if folded is not None and folded != rec.hash:
            v.wal_problem(name, f.offset, f"record LSN {f.lsn} ({rec.run!r}/{rec.id}) "
                          "differs from the checkpoint the snapshot holds")
    hashes[(rec.run, rec.id)] = rec.hash
