"""Salvage: a new, healthy store from what a damaged one still reads.

Theory of operation, in three steps:

1. *A shadow of the source.* The source is never opened as it is, and
   LMDB's C code never walks its damaged file: a temporary directory next
   to ``dest`` gets copies of ``CONTROL``, ``LOGMARK`` and the WAL segments,
   a link to the blob directory, and a *rebuilt* snapshot: every record of
   ``snapshot/data.mdb`` that the hand-written page reader
   (``snapshot/rescue.py``) can still vouch for (reachable once from the
   newest meta, in its parent's key range, not a free page, its CRC-32
   seal intact), written into a fresh LMDB file, with the ``versions``
   index made whole again from the deltas kept (a lost index entry would
   otherwise read a key's older value). A missing, empty or
   unreadable ``data.mdb`` gives an empty one. A damaged ``CONTROL`` is
   rebuilt with the store id the snapshot's sealed meta (else every segment
   header) holds. If the snapshot's applied LSN is lost while other records
   survive, the log cannot be joined to them (its records would be applied
   twice): the shadow then takes none of the log, and the report says so.
2. *The shadow is opened* with ``recover="prefix"`` (read-only, the log up to
   its first damage; ``Lost`` says what is past it). A damaged ``LOGMARK`` is
   left out of the shadow (and reported): the log is then read without it.
3. *Every run is copied*, forks after their origins, checkpoint by
   checkpoint under its own id: each readable checkpoint becomes one commit
   of the new store (under ``dest + ".tmp"``) with the checkpoint's
   metadata, writing what changed from the previous one (stored bytes as
   they are; blobs and trees streamed across); a fork's first commit keeps
   its origin. A checkpoint is read through history (manifest and deltas),
   value by value, so one damaged value costs that value, not the
   checkpoint. Ids the source no longer has (compaction dropped them) or
   cannot read are filled with placeholder commits that a compaction of
   the new store then drops, so every kept checkpoint keeps its id and the
   new store's history has the same gaps, marked as compaction marks them.
   A run whose earliest checkpoints were only in the damaged snapshot (its
   oldest readable checkpoint comes from the log and is not id 1) is not
   copied: its state there would lack what the snapshot held. Then the
   effects-ledger entries are copied as they are (their checkpoint
   positions still hold, since ids are kept). The new store is synced and
   closed (folded), renamed to ``dest``, its parent fsynced: ``dest`` is
   absent or whole.

What is not kept: hashes (they chain the new store's own history), commit
times (each commit is stamped now) and LSNs. Everything not copied is in
the report: the log past the damage (``lost``), damage found in the
snapshot, runs, checkpoints and values.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

import cbor2

from .. import history
from ..codec import CodecError, decode_value, is_blob_ref
from ..errors import CorruptionError, Error, PathExistsError, StoreNotFoundError
from ..format import BLOBS_DIR, LAYOUT4_VERSION, SNAPSHOT_DIR, SPARE_NAME, WAL_DIR
from ..io import OsFileSystem, writers_kept_out
from ..transfer import _origins_first
from ..types import BlobRef, Checkpoint, TreeRef
from .control import Control, create_control, raise_format, read_control
from .logmark import LOGMARK_FILE, read_mark
from .recovery import Lost, _lost_after
from .snapshot import env as snapshot_env
from .snapshot.layout import (
    DATA,
    HISTORY_INDEX,
    HISTORY_INDEX_VERSION,
    LAYOUT,
    LAYOUT_VERSION,
    U64,
    implied_versions,
    seal,
    unseal,
)
from .snapshot.rescue import rescue
from .wal import list_segments

__all__ = ["SalvageReport", "describe_lost", "salvage"]

#: The metadata of a placeholder commit (dropped again before salvage ends).
_FILLER = {"agentwal.salvage": "placeholder"}
#: A key no store holds: deleting it makes a commit that changes nothing.
_NO_KEY = "agentwal.salvage.unchanged"
#: An applied LSN past any log: the shadow replays none of it.
_NO_LOG = 1 << 62


@dataclass
class SalvageReport:
    """What ``salvage`` wrote and what it could not.

    Attributes:
        path: the new store.
        checkpoints: ``{run: checkpoints copied}``.
        effects: effects-ledger entries copied.
        lost: what the source's log holds past its intact prefix (None: it
            read to its end).
        snapshot: the damage found in ``snapshot/data.mdb`` (empty: none).
        lost_runs: ``{run: why}`` for each run known to exist of which nothing
            was copied.
        lost_checkpoints: ``{run: [ids]}`` the source's history holds (or its
            run record counts) that could not be read, so were not copied.
        lost_values: ``{run: {key: [checkpoint ids]}}``: values that did not
            read; the key is absent from those copied checkpoints.
        skipped: other things not copied, in words.
    """

    path: str
    checkpoints: dict[str, int] = field(default_factory=dict)
    effects: int = 0
    lost: Lost | None = None
    snapshot: list[str] = field(default_factory=list)
    lost_runs: dict[str, str] = field(default_factory=dict)
    lost_checkpoints: dict[str, list[int]] = field(default_factory=dict)
    lost_values: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True if everything the source held was copied."""
        return not (self.lost or self.snapshot or self.lost_runs or self.lost_checkpoints
                    or self.lost_values or self.skipped)


#: Why salvage refuses a store a writer holds: it reads the files by hand, and a fold
#: meanwhile would show it damage and lost checkpoints that are not there.
_LIVE_WRITER = ("Salvage reads the store's files by hand and cannot follow a writer's "
                "changes: stop the writer first. To copy a store that is in use, take a "
                "backup (store.backup(dest), agentwal backup STORE DEST).")


def salvage(src_path: str, dest: str) -> SalvageReport:
    """Copy everything that still reads from the store at ``src_path`` into a new store ``dest``.

    Raises:
        PathExistsError: ``dest`` or ``dest.tmp`` exists.
        StoreNotFoundError: no store at ``src_path``, or ``dest``'s parent is missing.
        StoreLockedError: a writer has the store open (it is held out until salvage ends).
        CorruptionError: the source's ``CONTROL`` is damaged and neither the
            snapshot nor the log's segment headers say whose files these are;
            or it is whole but of another format version.
    """
    from ..store import open as open_store

    tmp = dest + ".tmp"
    for p in (dest, tmp):
        if os.path.lexists(p):
            raise PathExistsError(p)
    parent = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(parent):
        raise StoreNotFoundError(dest, f"its parent directory {parent!r} does not exist",
                                 "Create it first.")
    fs = OsFileSystem()
    if not os.path.isdir(src_path):
        raise StoreNotFoundError(src_path, "no store here (the directory does not exist)",
                                 "Check the path.")
    report = SalvageReport(dest)
    try:
        control = read_control(fs, src_path)
        damaged_control = None
    except CorruptionError as exc:
        if exc.reason.startswith("store format"):  # whole, of another version: not damage
            raise
        control, damaged_control = None, exc
    if control is None and damaged_control is None:
        raise StoreNotFoundError(src_path, "no agentwal store here (no CONTROL file)",
                                 "Check the path: salvage needs the store's CONTROL file.")
    with writers_kept_out(src_path, _LIVE_WRITER):
        shadow = tempfile.mkdtemp(prefix=".agentwal-salvage-", dir=parent)
        done = False
        try:
            joined = _build_shadow(src_path, shadow, control, damaged_control, report)
            with open_store(shadow, recover="prefix") as src:
                if joined:
                    report.lost = _named(src.lost, shadow, src_path)
                with open_store(tmp, durability="none") as out:
                    _copy_runs(src, out, report)
                    for entry in src.effects():
                        out._engine.effectlog.write(entry)
                        report.effects += 1
                    out.sync()
            done = True
        finally:
            shutil.rmtree(shadow, ignore_errors=True)
            if not done:  # our own partial copy: a later salvage may start afresh
                shutil.rmtree(tmp, ignore_errors=True)
    fs.rename(tmp, dest)
    fs.fsync_dir(parent)
    return report


def _named(lost: Lost | None, shadow: str, src: str) -> Lost | None:
    """``lost`` with the shadow's paths replaced by the source's."""
    if lost is not None:
        lost.where = lost.where.replace(shadow, src)
        lost.reason = lost.reason.replace(shadow, src)
    return lost


# -- the shadow ---------------------------------------------------------------------------


def _build_shadow(src: str, shadow: str, control: Control | None,
                  damaged_control: CorruptionError | None, report: SalvageReport) -> bool:
    """Fill ``shadow`` (module doc, step 1). Returns False if the log is left out."""
    data = os.path.join(src, SNAPSHOT_DIR, DATA)
    found = rescue(data)
    if control is None:
        assert damaged_control is not None
        sid = _store_id(found.records, os.path.join(src, WAL_DIR))
        if sid is None:
            raise damaged_control
        create_control(OsFileSystem(), shadow, sid, LAYOUT4_VERSION)  # the snapshot is layout 4
        report.skipped.append(f"CONTROL is damaged ({damaged_control.reason}): the store id "
                              "was taken from the snapshot or the log's segment headers")
    else:
        sid = control.store_id
        # the same identity; the rebuilt snapshot is marked layout 4, so CONTROL says so
        raise_format(OsFileSystem(), shadow, control, max(control.format, LAYOUT4_VERSION))
    store_id = sid.bytes
    if os.path.isfile(os.path.join(src, LOGMARK_FILE)):
        try:
            read_mark(OsFileSystem(), src, sid)
        except CorruptionError as exc:
            report.skipped.append(f"LOGMARK is damaged ({exc.reason}): the log was read "
                                  "without it, so a missing or cut log may go unnoticed")
        else:
            shutil.copyfile(os.path.join(src, LOGMARK_FILE), os.path.join(shadow, LOGMARK_FILE))
    wal = os.path.join(src, WAL_DIR)
    os.mkdir(os.path.join(shadow, WAL_DIR))
    if os.path.isdir(wal):
        for name in sorted(os.listdir(wal)):
            if os.path.isfile(os.path.join(wal, name)) and name != SPARE_NAME:  # all zeros
                shutil.copyfile(os.path.join(wal, name), os.path.join(shadow, WAL_DIR, name))
    if os.path.isdir(os.path.join(src, BLOBS_DIR)):
        os.symlink(os.path.abspath(os.path.join(src, BLOBS_DIR)),
                   os.path.join(shadow, BLOBS_DIR))
    report.snapshot = [p.replace(shadow, src) for p in found.problems]
    records = found.records
    meta = dict(records.get("meta", []))
    joined = True
    if b"store_id" not in meta:
        meta[b"store_id"] = seal(b"store_id", store_id)
    held = any(records.get(db) for db in ("runs", "ckpt", "state", "delta", "manifest",
                                          "effects", "objects"))
    if b"applied_lsn" not in meta and held:
        meta[b"applied_lsn"] = seal(b"applied_lsn", U64.pack(_NO_LOG))
        meta.pop(b"log_pos", None)
        joined = False
        # What the log holds after the newest checkpoint the snapshot still has.
        why = CorruptionError(wal, None, "the snapshot's applied LSN is lost, so the log "
                              "cannot be joined to what the snapshot still holds: no log "
                              "record was used")
        segments = list_segments(OsFileSystem(), os.path.join(shadow, WAL_DIR))
        report.lost = _named(_lost_after(segments, _last_lsn(records) + 1, why), shadow, src)
    _rebuild_versions(records, meta)
    records["meta"] = sorted(meta.items())
    snapshot_env.write_records(os.path.join(shadow, SNAPSHOT_DIR), records)
    for number, ids in sorted(_unnamed(records).items()):
        report.lost_runs[f"#{number}"] = (
            f"the run record of run number {number} is lost, so its name is not known; "
            f"{len(ids)} of its checkpoints ({_ranges(ids)}) still read but cannot be copied")
    return joined


def _rebuild_versions(records: dict[str, list[tuple[bytes, bytes]]],
                      meta: dict[bytes, bytes]) -> None:
    """Make the ``versions`` index whole again from the deltas and checkpoints kept.

    The index only names which checkpoint changed which key: a read of a
    checkpoint takes each key's latest version at or before it, so a lost
    entry would silently give that key's older value, never an error. Every
    entry a kept delta (or a kept block start) implies is therefore written
    again; entries whose delta was lost are kept as found, so a read that
    needs that delta reports it missing instead of reading around it. A
    store with an index (format 3) also gets its marker back if that was lost.
    """
    kept = records.get("versions", [])
    if not kept and HISTORY_INDEX not in meta:
        return  # format 2: read through its regular manifests
    out = dict(kept)
    for k, raw in records.get("delta", []):
        data = unseal(k, raw)
        if data is None or len(k) != 16:
            continue
        try:
            refs = history.decode_refs(data, manifest=False)
        except (CodecError, ValueError, TypeError):
            continue
        for vk in implied_versions(k, refs):
            out[vk] = seal(vk, b"")
    for k, raw in records.get("ckpt", []):
        data = unseal(k, raw)
        if data is None or len(k) != 16:
            continue
        try:
            rec = cbor2.loads(data)
        except (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError):
            continue
        for vk in implied_versions(k, (), rec):  # a block start: its parent was compacted away
            out[vk] = seal(vk, b"")
    records["versions"] = sorted(out.items())
    if HISTORY_INDEX not in meta:
        meta[HISTORY_INDEX] = seal(HISTORY_INDEX, U64.pack(HISTORY_INDEX_VERSION))
    if LAYOUT not in meta:  # nodes that lost their oids entry are not damage from now on
        meta[LAYOUT] = seal(LAYOUT, U64.pack(LAYOUT_VERSION))


def _store_id(records: dict[str, list[tuple[bytes, bytes]]], wal: str) -> uuid.UUID | None:
    """The store id the snapshot's sealed meta, else every segment header, agrees on."""
    for k, v in records.get("meta", []):
        if k == b"store_id":
            data = unseal(k, v)
            if data is not None and len(data) == 16:
                return uuid.UUID(bytes=data)
    ids = {s.header.store_id for s in (list_segments(OsFileSystem(), wal)
                                       if os.path.isdir(wal) else []) if s.header is not None}
    return ids.pop() if len(ids) == 1 else None


def _last_lsn(records: dict[str, list[tuple[bytes, bytes]]]) -> int:
    """The highest LSN of a checkpoint record among ``records`` (0: none)."""
    top = 0
    for k, v in records.get("ckpt", []):
        try:
            rec = cbor2.loads(unseal(k, v) or b"")
        except (cbor2.CBORDecodeError, ValueError, TypeError, EOFError):
            continue
        if isinstance(rec, list) and len(rec) > 2 and isinstance(rec[2], int):
            top = max(top, rec[2])
    return top


def _unnamed(records: dict[str, list[tuple[bytes, bytes]]]) -> dict[int, list[int]]:
    """``{run number: [checkpoint ids]}`` of the checkpoints whose run record is lost."""
    named: set[int] = set()
    for k, v in records.get("runs", []):
        try:
            rec = cbor2.loads(unseal(k, v) or b"")
        except (cbor2.CBORDecodeError, ValueError, TypeError, EOFError):
            continue
        if isinstance(rec, list) and rec and isinstance(rec[0], int):
            named.add(rec[0])
    out: dict[int, list[int]] = {}
    for k, _v in records.get("ckpt", []):
        if len(k) == 16:
            number, cid = U64.unpack_from(k, 0)[0], U64.unpack_from(k, 8)[0]
            if number not in named:
                out.setdefault(number, []).append(cid)
    return out


# -- copying ------------------------------------------------------------------------------


def _copy_runs(src: Any, out: Any, report: SalvageReport) -> None:
    e = src._engine
    applied = int(src.stats()["applied_lsn"])
    plans: dict[str, list[Checkpoint]] = {}
    expect: dict[str, tuple[int, int]] = {}  # run -> (folded head, folded count)
    for run in src.runs():
        info = e._with_view(lambda v, r=run: e._reads(v).info(r))
        if info is not None:
            expect[run] = (info.head, info.count)
        why = "its run record names no checkpoint that reads"
        try:
            plans[run] = list(reversed(src.history(run)))
        except Error as exc:
            why = f"its history does not read: {_reason(exc)}"
        if not plans.get(run):
            found = _checkpoints_one_by_one(src, run, info)
            if not found:
                plans.pop(run, None)
                report.lost_runs[run] = why
                continue
            plans[run] = found
    keep: dict[str, list[int]] = {}
    for run in _origins_first(sorted(plans), plans):
        hist = plans[run]
        if hist[0].id > 1 and hist[0].lsn > applied:
            report.lost_runs[run] = (f"its checkpoints before {hist[0].id} were only in the "
                                     "damaged snapshot, so its state cannot be rebuilt")
            continue
        origin = hist[0].origin
        if origin is None:
            info = e._with_view(lambda v, r=run: e._reads(v).info(r))
            origin = None if info is None else info.origin
        kept = _copy_run(src, out, run, hist, origin, report)
        if kept:
            keep[run] = kept
        head = expect.get(run)
        have = {c.id for c in hist}
        if head is not None and head[1] == head[0]:  # never compacted: every id was there
            missing = [i for i in range(1, head[0] + 1) if i not in have]
            if missing:
                report.lost_checkpoints.setdefault(run, []).extend(missing)
        elif head is not None:  # compacted: the run record counts what LMDB kept
            folded = sum(1 for i in have if i <= head[0])
            if folded < head[1]:
                report.skipped.append(f"run {run!r}: {head[1] - folded} of the {head[1]} "
                                      "checkpoints its compacted history keeps do not read "
                                      "(their ids are not known)")
        for ids in report.lost_checkpoints.values():
            ids.sort()
    _drop_placeholders(out, keep)


def _checkpoints_one_by_one(src: Any, run: str, info: Any) -> list[Checkpoint]:
    """The run's folded checkpoints that read, id by id, then the log's (oldest first)."""
    e = src._engine
    out: list[Checkpoint] = []
    if info is not None:
        for cid in range(1, info.head + 1):
            try:
                c = e._with_view(lambda v, i=cid: e._reads(v).lmdb(
                    lambda r: r.checkpoint(run, info.number, i)))
            except Error:
                continue
            if c is not None:
                out.append(c)
    folded = info.head if info is not None else 0
    try:
        head = src.head(run)
        if head is not None and head.id > folded:
            out.extend(reversed(src.history(run, limit=head.id - folded)))
    except Error:
        pass
    return out


def _copy_run(src: Any, out: Any, run: str, hist: list[Checkpoint],
              origin: tuple[str, int] | None, report: SalvageReport) -> list[int]:
    """Commit ``run``'s readable checkpoints in ``out`` under their ids; returns those ids."""
    e = src._engine
    states: list[tuple[Checkpoint, dict[str, bytes]]] = []
    why: list[str] = []
    for c in hist:
        damaged: dict[str, str] = {}
        try:
            state = e._with_view(lambda v, i=c.id, d=damaged: e._reads(v).state_at(
                run, i, damaged=d))
        except Error as exc:
            report.lost_checkpoints.setdefault(run, []).append(c.id)
            why.append(_reason(exc))
            continue
        for key in damaged:
            report.lost_values.setdefault(run, {}).setdefault(key, []).append(c.id)
        states.append((c, state))
    if why:
        report.skipped.append(f"run {run!r}: {len(why)} checkpoints do not read (the first "
                              f"because {why[0]})")
    if not states:
        report.lost_runs[run] = "none of its checkpoints reads"
        return []
    prev: dict[str, bytes] = {}
    next_id = 1
    first = True
    for c, state in states:
        while next_id < c.id:  # an id the source dropped or cannot read
            _commit(src, out, run, c, None, prev, dict(_FILLER), origin if first else None,
                    report)
            first = False
            next_id += 1
        prev = _commit(src, out, run, c, state, prev, dict(c.meta),
                       (c.origin or origin) if first else None, report)
        first = False
        next_id = c.id + 1
    report.checkpoints[run] = len(states)
    return [c.id for c, _s in states]


def _commit(src: Any, out: Any, run: str, c: Checkpoint, state: dict[str, bytes] | None,
            prev: dict[str, bytes], meta: dict[str, Any], origin: tuple[str, int] | None,
            report: SalvageReport) -> dict[str, bytes]:
    """One commit of ``out``: ``state`` (None: a placeholder, the state unchanged)."""
    now = dict(prev)
    with out.begin(run) as txn:
        for k in prev.keys() - (state or prev).keys():
            txn.delete(k)
            del now[k]
        for k, raw in (state or {}).items():
            if prev.get(k) == raw:
                continue
            try:
                _put(src, txn, run, c.id, k, raw)
            except Error as exc:
                report.lost_values.setdefault(run, {}).setdefault(k, []).append(c.id)
                report.skipped.append(f"run {run!r} checkpoint {c.id} key {k!r}: "
                                      f"{_reason(exc)}")
                if k in prev:
                    txn.delete(k)
                    del now[k]
                continue
            now[k] = raw
        if meta:
            txn.meta(**meta)
        elif now == prev:  # no change and no metadata: still one checkpoint for it
            txn.delete(_NO_KEY)
        txn._origin = origin
    return now


def _reason(exc: Error) -> str:
    """What an error says is wrong, without the shadow's path or advice."""
    return str(getattr(exc, "reason", None) or exc)


def _put(src: Any, txn: Any, run: str, cid: int, key: str, raw: bytes) -> None:
    if not is_blob_ref(raw):
        txn._writes[key] = raw
        return
    value = decode_value(raw)
    if isinstance(value, BlobRef):
        with src.open_blob(run, key, at=cid) as f:
            txn.put_blob(key, f, media_type=value.media_type)
    elif isinstance(value, TreeRef):
        with tempfile.TemporaryDirectory(prefix="agentwal-salvage-") as d:
            target = os.path.join(d, "tree")
            src.restore_tree(run, key, target, at=cid)
            txn.put_tree(key, target)
    else:
        txn._writes[key] = raw


def _drop_placeholders(out: Any, keep: dict[str, list[int]]) -> None:
    """Compact away every id of ``out`` not in ``keep`` (placeholders), keeping the rest."""
    gaps = [run for run, ids in keep.items() if ids != list(range(1, ids[-1] + 1))]
    if not gaps:
        return
    e = out._engine
    e.folder.fold()
    protect = {(run, c) for run in gaps for c in keep[run]}
    with e._fold_lock:
        e.maintenance.compact_locked(gaps, 1, None, False, protect=protect)
        e.blobrefs.sweep()


def describe_lost(lost: Lost) -> str:
    """One paragraph saying what ``lost`` is, for people."""
    span = (f"LSN {lost.first_lsn}..{lost.last_lsn}" if lost.last_lsn is not None
            else f"LSN {lost.first_lsn} on (how far is not known)")
    parts = [f"lost {span}: {lost.reason} ({lost.where})"]
    if lost.checkpoints:
        parts.append("intact records after the damage, not copied: " + ", ".join(
            f"run {r!r} checkpoints {min(ids)}..{max(ids)}" for r, ids in
            sorted(lost.checkpoints.items())))
    if lost.effects:
        parts.append(f"{lost.effects} effects-ledger records after the damage")
    return "; ".join(parts)


def _ranges(ids: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``"1..3, 7"``."""
    out: list[str] = []
    for i in sorted(set(ids)):
        if out and out[-1].split("..")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('..')[0]}..{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def describe(report: SalvageReport) -> list[str]:
    """What ``report`` says was not copied, one line each, for people."""
    lines: list[str] = []
    if report.lost is not None:
        lines.append(describe_lost(report.lost))
    if report.snapshot:
        shown = report.snapshot[:8]
        more = len(report.snapshot) - len(shown)
        lines.append("snapshot damage: " + "; ".join(shown)
                     + (f"; and {more} more" if more > 0 else ""))
    for run, why in sorted(report.lost_runs.items()):
        lines.append(f"run {run!r} not copied: {why}")
    for run, ids in sorted(report.lost_checkpoints.items()):
        lines.append(f"run {run!r}: checkpoints {_ranges(ids)} not readable, not copied")
    for run, keys in sorted(report.lost_values.items()):
        for key, ids in sorted(keys.items()):
            lines.append(f"run {run!r}: key {key!r} not readable at checkpoints "
                         f"{_ranges(ids)} (absent there in the copy)")
    lines.extend(f"skipped: {s}" for s in report.skipped)
    return lines

