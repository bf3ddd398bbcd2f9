"""The layered reader: one view's walk over the memtables, newest first, then LMDB.

Theory of operation: a view (:class:`View`) is everything with LSN <= its
snapshot LSN: the memtable layers it took at begin (the active table, and a
frozen one while a fold runs), newest first, over an LMDB read transaction
from before any fold that could have moved their records into LMDB. Every
read of a view walks the same way, and this is the one place that walk is
written:

1. each layer, newest first, answers if it holds a version of the key at or
   below the snapshot (a deletion answers None);
2. a layer with a tombstone of the run at or below the snapshot (a
   ``delete_run``) masks every older layer and LMDB: the walk stops there;
3. else LMDB answers (its run record found once per view, :meth:`info`).

While a fold commits, LMDB may already hold the frozen table's checkpoints:
history reads take from the layers only checkpoints after LMDB's head
(:meth:`state_at`). A read-only store's views share one LMDB transaction,
so its reads take the view's lock. The reader writes nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..codec import CodecError, Value, whole
from ..errors import CheckpointNotFoundError, CorruptionError, RunNotFoundError
from ..types import Checkpoint
from .memtable import Memtable
from .snapshot import RunInfo, Snapshot, SnapshotReader
from .snapshot.layout import DATA

__all__ = ["LayeredReader", "Pin", "View", "epoch_at", "in_txn"]

T = TypeVar("T")


@dataclass
class Pin:
    """A read-only store's LMDB read transaction, shared by the views taken on it.

    ``refresh()`` retires it; it ends when its last view is released.
    """

    txn: Any
    users: int = 0
    retired: bool = False


@dataclass
class View:
    """A consistent read view: everything with LSN <= ``snap``."""

    snap: int
    layers: tuple[Memtable, ...]  # newest first
    ltxn: Any
    lock: threading.Lock | None  # read-only stores share one LMDB txn
    pin: Pin | None = None
    infos: dict[str, RunInfo | None] = field(default_factory=dict)
    live: bool = True


def in_txn(view: View, fn: Callable[[Any], T]) -> T:
    """``fn(the view's LMDB transaction)``, under the view's lock if it has one."""
    if view.lock is None:
        return fn(view.ltxn)
    with view.lock:
        return fn(view.ltxn)


class LayeredReader:
    """The reads of one view: the memtables newest first, then LMDB."""

    __slots__ = ("snap", "view")

    def __init__(self, snap: Snapshot, view: View) -> None:
        self.snap = snap
        self.view = view

    def lmdb(self, fn: Callable[[SnapshotReader], T]) -> T:
        """``fn(reader)`` with the view's LMDB transaction."""
        return in_txn(self.view, lambda t: fn(self.snap.reader(t)))

    def info(self, run: str) -> RunInfo | None:
        """LMDB's record of ``run`` in ``view``; None if none, or if a deletion hides it."""
        if run not in self.view.infos:
            if any(layer.masks(run, self.view.snap) for layer in self.view.layers):
                self.view.infos[run] = None
            else:
                self.view.infos[run] = self.lmdb(lambda r: r.run_info(run))
        return self.view.infos[run]

    def layers(self, run: str) -> tuple[Memtable, ...]:
        """The memtables ``view`` reads ``run`` from, newest first: none below a deletion."""
        for i, layer in enumerate(self.view.layers):
            if layer.masks(run, self.view.snap):
                return self.view.layers[: i + 1]
        return self.view.layers

    def value(self, run: str, key: str) -> bytes | None:
        """The stored bytes of ``key`` in ``run`` (None: absent or deleted)."""
        return whole(self.stored(run, key))

    def stored(self, run: str, key: str) -> Value | None:
        """:meth:`value`, with an append's value left a ``codec.Joined`` (joined when read)."""
        for layer in self.view.layers:
            found, value = layer.lookup_value(run, key, self.view.snap)
            if found:
                return value
        info = self.info(run)
        if info is None:
            return None
        view = self.view
        if view.lock is None:
            return self.snap.value_in(view.ltxn, info.number, key)
        with view.lock:
            return self.snap.value_in(view.ltxn, info.number, key)

    def items(self, run: str, prefix: str) -> dict[str, bytes | None]:
        """``{key: bytes | None}`` under ``prefix`` (None: deleted in a memtable)."""
        out: dict[str, bytes | None] = {}
        info = self.info(run)
        if info is not None:
            out.update(self.lmdb(lambda r: r.items(info, prefix)))
        for layer in reversed(self.layers(run)):
            for key, value in layer.visible(run, self.view.snap).items():
                if key.startswith(prefix):
                    out[key] = value
        return out

    def head(self, run: str) -> Checkpoint | None:
        """The run's newest checkpoint in the view, or None."""
        for layer in self.view.layers:
            rm = layer.runs.get(run)
            if rm is not None:
                found = rm.head(self.view.snap)
                if found is not None:
                    return found
                if rm.floor(self.view.snap):  # deleted, and nothing committed since
                    return None
        info = self.info(run)
        if info is None:
            return None
        head = self.lmdb(lambda r: r.checkpoint(run, info.number, info.head))
        if head is None:
            raise CorruptionError(os.path.join(self.snap.directory, DATA), None,
                                  f"run {run!r} names head checkpoint {info.head}, which is "
                                  "missing")
        return head

    def check_at(self, run: str, cid: int) -> Checkpoint:
        """The run's head in ``view``, once ``cid`` is known to be one of its checkpoints."""
        head = self.head(run)
        if head is None:
            raise RunNotFoundError(run)
        if not 1 <= cid <= head.id:
            raise CheckpointNotFoundError(run, cid)
        info = self.info(run)
        # Compaction leaves LMDB with fewer checkpoints than the head's id.
        if (info is not None and cid < info.head and info.count < info.head
                and not self.lmdb(lambda r: r.retained(run, info.number, cid))):
            raise CheckpointNotFoundError(run, cid)
        return head

    def state_at(self, run: str, cid: int, key: str | None = None,
                 damaged: dict[str, str] | None = None) -> dict[str, bytes]:
        """``{key: value bytes}`` of ``run`` at checkpoint ``cid`` (checked), or of ``key`` only.

        A folded checkpoint older than LMDB's head is rebuilt from history;
        a newer one is LMDB's head state plus the memtables' deltas up to it.
        With ``damaged`` (salvage), LMDB's part is always rebuilt from history
        (an entry missing from the head table is then not read as absent), and
        a value that does not read is named there instead of failing the state.
        """
        info = self.info(run)
        folded = info.head if info is not None else 0
        if info is not None and cid < folded:
            return self.lmdb(lambda r: r.state_at(run, info, cid, key, damaged))
        out: dict[str, bytes] = {}
        if info is not None and damaged is not None:
            out.update(self.lmdb(lambda r: r.state_at(run, info, folded, key, damaged)))
            number = info.number
            for k in list(damaged):  # the head table holds the folded head's values too

                def head_value(r: SnapshotReader, k: str = k) -> bytes | None:
                    try:
                        return r.get(number, k)
                    except (CodecError, CorruptionError):
                        return None  # a head ref to the same damaged object: still lost

                one = self.lmdb(head_value)
                if one is not None:
                    out[k] = one
                    del damaged[k]
        elif info is not None and key is None:
            got = self.lmdb(lambda r: r.items(info, ""))
            out.update(got)
        elif info is not None and key is not None:
            one = self.lmdb(lambda r: r.get(info.number, key))
            if one is not None:
                out[key] = one
        for layer in reversed(self.layers(run)):  # oldest first
            rm = layer.runs.get(run)
            if rm is None:
                continue
            # While a fold commits, LMDB may already hold the frozen table's
            # checkpoints: only those after LMDB's head apply. The active table
            # may gain a checkpoint (then its delta) meanwhile: not strict.
            # Checkpoints of a deleted incarnation (before the floor) or of a
            # later one (after the view) share ids with this one: skip them.
            floor = rm.floor(self.view.snap) if rm.deleted else 0
            for (c, _h, _m), delta in zip(rm.checkpoints, rm.deltas, strict=False):
                if c.id <= folded or c.id > cid or not floor < c.lsn <= self.view.snap:
                    continue
                for k, value in delta.items():
                    if key is not None and k != key:
                        continue
                    if value is None:
                        out.pop(k, None)
                    else:
                        out[k] = whole(value)  # type: ignore[assignment]
        return out

    def epoch(self, run: str) -> int:
        """The run id's epoch (LSN of its last deletion; 0: none) as the view sees it."""
        return epoch_at(self.view.layers, run, self.view.snap,
                        lambda r: self.lmdb(lambda x: x.epoch(r)))

    def effect_key_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        """The key recorded at an effect position, as the view sees the ledger."""
        for layer in self.view.layers:
            found = layer.effect_pos.get((run, checkpoint, ordinal))
            if found is not None:
                return found
            if layer.masks(run, self.view.snap):  # older positions belong to a deleted run
                return None
        return self.lmdb(lambda r: r.effect_key_at(run, checkpoint, ordinal))


def epoch_at(tables: Iterable[Memtable | None], run: str, lsn: int,
             folded: Callable[[str], int]) -> int:
    """The run id's epoch for a commit at ``lsn``: its newest deletion in ``tables``
    (newest table first) at or before ``lsn``, else ``folded(run)`` (LMDB's)."""
    for mem in tables:
        rm = mem.runs.get(run) if mem is not None else None
        if rm is not None and rm.deleted and rm.floor(lsn):
            return rm.floor(lsn)
    return folded(run)
