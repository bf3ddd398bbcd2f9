"""Salvage: a new, healthy store from what a damaged one still reads.

Theory of operation: the source is opened with ``recover="prefix"``
(read-only, up to the last intact record before the damage in its log).
Every run's retained history is replayed into a new store under
``dest + ".tmp"``, oldest checkpoint first: each checkpoint's state
(``state(at=)``) becomes one commit with the checkpoint's metadata, writing
only the keys that changed and deleting the ones that went; blob values are
streamed across (``open_blob`` into ``put_blob``), tree values restored into
a temporary directory and stored again (``put_tree``). A checkpoint whose
state does not read (a damaged value in LMDB) ends its run's copy there: what
was copied is a prefix of the run's history. Then the effects-ledger entries
are copied as they are. The new store is closed (folded), renamed to
``dest`` and its parent fsynced, so ``dest`` is either absent or whole.

What is not kept: checkpoint ids start at 1 in the new store (they equal the
old ones only when the old history was never compacted), forks are copied as
runs of their own (no ``origin``), and hashes are new (they chain the new
history). The report says what was copied, what was lost (the log past the
damage: ``Lost``), and what was skipped.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..errors import Error, PathExistsError
from ..io import OsFileSystem
from ..types import BlobRef, TreeRef
from .recovery import Lost

__all__ = ["SalvageReport", "describe_lost", "salvage"]


@dataclass
class SalvageReport:
    """What ``salvage`` wrote and what it could not.

    Attributes:
        path: the new store. checkpoints: ``{run: checkpoints copied}``.
        effects: effects-ledger entries copied. lost: what the source's log
            holds past its intact prefix (None: its log was whole).
        skipped: each run whose copy stopped early, and why.
        renumbered: runs whose first retained checkpoint was not 1 (their ids
            in the new store start at 1).
    """

    path: str
    checkpoints: dict[str, int] = field(default_factory=dict)
    effects: int = 0
    lost: Lost | None = None
    skipped: list[str] = field(default_factory=list)
    renumbered: list[str] = field(default_factory=list)


def salvage(src_path: str, dest: str) -> SalvageReport:
    """Copy everything that still reads from the store at ``src_path`` into a new store ``dest``.

    Raises:
        PathExistsError: ``dest`` or ``dest.tmp`` exists.
        StoreNotFoundError, NotAStoreError, CorruptionError: the source cannot
            be opened at all (its CONTROL or LMDB is damaged).
    """
    from ..store import open as open_store

    tmp = dest + ".tmp"
    for p in (dest, tmp):
        if os.path.lexists(p):
            raise PathExistsError(p)
    report = SalvageReport(dest)
    with open_store(src_path, recover="prefix") as src:
        report.lost = src.lost
        with open_store(tmp) as out:
            for run in src.runs():
                _copy_run(src, out, run, report)
            for entry in src.effects():
                out._engine.effectlog.write(entry)
                report.effects += 1
    fs = OsFileSystem()
    fs.rename(tmp, dest)
    fs.fsync_dir(os.path.dirname(os.path.abspath(dest)))
    return report


def _copy_run(src: Any, out: Any, run: str, report: SalvageReport) -> None:
    history = list(reversed(src.history(run)))
    if history and history[0].id != 1:
        report.renumbered.append(run)
    prev: dict[str, Any] = {}
    copied = 0
    for c in history:
        try:
            state = src.state(run, at=c.id)
        except Error as exc:
            report.skipped.append(f"run {run!r} from checkpoint {c.id} on: {exc}")
            break
        with out.begin(run) as txn:
            for k in prev.keys() - state.keys():
                txn.delete(k)
            for k, v in state.items():
                if k in prev and type(prev[k]) is type(v) and prev[k] == v:
                    continue
                _put(src, txn, run, c.id, k, v)
            if state == prev and state:  # nothing changed: still one checkpoint for it
                k = next(iter(state))
                _put(src, txn, run, c.id, k, state[k])
            txn.meta(**c.meta)
        prev = state
        copied += 1
    report.checkpoints[run] = copied


def _put(src: Any, txn: Any, run: str, cid: int, key: str, value: Any) -> None:
    if isinstance(value, BlobRef):
        with src.open_blob(run, key, at=cid) as f:
            txn.put_blob(key, f, media_type=value.media_type)
    elif isinstance(value, TreeRef):
        with tempfile.TemporaryDirectory(prefix="agentwal-salvage-") as d:
            target = os.path.join(d, "tree")
            src.restore_tree(run, key, target, at=cid)
            txn.put_tree(key, target)
    else:
        txn[key] = value


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
