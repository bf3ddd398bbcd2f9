"""Records into a memtable: the one mapping shared by live publish and replay.

Theory of operation: a record becomes visible by being applied to a
memtable, in LSN order. Live, the commit pipeline publishes each durable
batch (``Engine.publish``, from :class:`~.commit.Pending`); at open,
recovery replays the log after LMDB's ``applied_lsn`` (:func:`replay`, from
``records.Replayed*``). Both go through :func:`apply_record`, so a replayed
log rebuilds exactly the table the live store had (the outbox keys of a
commit depend on it: commit.py's outbox dedup says "replay creates exactly
what the live store did"):

- a commit (:class:`Commit`) adds its checkpoint and delta; the ledger
  entries its effects made are marked ``committed_in`` it; its outbox
  becomes ledger entries whose keys derive from the run id's epoch at the
  commit (``reads.epoch_at``: the newest deletion of the run in the tables,
  else LMDB's);
- a ledger write keeps the commit mark of the entry it replaces;
- a deletion is a tombstone.

Pure but for the memtable it is given: no I/O, no locks (the caller holds
the store's ``_lock`` live; replay runs before anything else can read).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeAlias

from ..codec import CodecError, Value, append_base, join_append, whole
from ..effects import (
    Deferred,
    EffectRecord,
    carry_mark,
    encode_entry,
    mark_committed,
    outbox_entries,
)
from ..errors import CorruptionError
from ..types import Checkpoint
from .commit import Pending
from .memtable import Memtable
from .reads import epoch_at
from .records import Replayed, ReplayedDelete, ReplayedEffect
from .recovery import Plan

__all__ = ["Applied", "Commit", "apply_record", "from_pending", "replay"]


class Commit(NamedTuple):
    """A commit as it is applied: its checkpoint and what comes with it."""

    lsn: int
    ckpt: Checkpoint
    hash: bytes
    meta_raw: bytes  # the metadata exactly as encoded and hashed
    delta: Mapping[str, Value | None]  # an appended key's value is a codec.Joined
    outbox_digest: bytes | None = None  # SHA-256 of the commit's outbox field
    deferred: list[Deferred] | None = None
    effect_keys: tuple[str, ...] = ()
    #: keys the record logged as appends: key -> (base count, base length)
    appends: dict[str, tuple[int, int]] | None = None

    @classmethod
    def replayed(cls, r: Replayed, base: Callable[[str, str], Value | None]) -> Commit:
        """The commit a log record holds; ``base(run, key)`` is a key's value before it.

        A form-2 record's append entries are joined to the value the key has
        before the record (the memtable replayed so far, else LMDB): the
        commit applies whole values, as it did live (a ``codec.Joined`` that
        keeps the base and the tail, so replaying a list grown by N appends
        costs what was appended, not N joins of the list).

        Raises:
            CodecError: an append entry's base is missing or is not the list
                the entry extended (its count or length differ).
        """
        rec = r.record
        ckpt = Checkpoint(rec.run, rec.id, rec.parent, r.lsn, rec.created_at, r.meta,
                          rec.hash.hex(), rec.origin)
        digest = None if rec.deferred is None else hashlib.sha256(rec.deferred).digest()
        delta: dict[str, Value | None] = {}
        appends: dict[str, tuple[int, int]] = {}
        for key, v in r.delta.items():
            if not isinstance(v, tuple):
                delta[key] = v
                continue
            stored = base(rec.run, key)
            joined = None if stored is None else join_append(stored, v)
            if joined is None:
                shape = None if stored is None else append_base(whole(stored) or b"")
                found = ("no value" if stored is None else
                         f"{len(stored)} bytes ({shape or 'not a list'})")
                raise CodecError(f"commit {rec.run!r}/{rec.id} appends to key {key!r}, whose "
                                 f"base of {v[0]} items ({v[1]} bytes) is missing: the key "
                                 f"holds {found}")
            delta[key] = joined
            appends[key] = (v[0], v[1])
        return cls(r.lsn, ckpt, rec.hash, rec.meta, delta, digest, r.deferred, rec.effects,
                   appends or None)


#: What :func:`apply_record` takes: a commit, a ledger write, a run deletion.
Applied: TypeAlias = Commit | ReplayedEffect | ReplayedDelete


def from_pending(p: Pending) -> Applied:
    """The record a durable pipeline entry publishes."""
    if p.drop is not None:
        return ReplayedDelete(p.lsn, p.drop, 0)
    if p.ckpt is None:
        assert p.effect is not None
        return ReplayedEffect(p.lsn, *p.effect)
    return Commit(p.lsn, p.ckpt, p.hsh, p.meta_raw, p.delta, p.outbox_digest, p.deferred,
                  p.effect_keys, p.appends)


def apply_record(mem: Memtable, rec: Applied, *, store_id: Any, oldest: int,
                 lookup: Callable[[str], EffectRecord | None],
                 epoch: Callable[[str, int], int]) -> None:
    """Make ``rec`` visible in ``mem``.

    Args:
        mem: the table to apply to (the active one).
        rec: the record.
        store_id: the store's id (outbox keys derive from it).
        oldest: the oldest snapshot LSN a reader may still read at (version pruning).
        lookup: the newest published ledger entry of a key (tables, then LMDB).
        epoch: the run id's epoch for a commit at an LSN (``reads.epoch_at``);
            called after the commit is applied.
    """
    if isinstance(rec, ReplayedDelete):
        mem.apply_delete(rec.lsn, rec.run)
        return
    if isinstance(rec, ReplayedEffect):
        kept = carry_mark(rec.entry, lookup(rec.entry.key))
        mem.apply_effect(rec.lsn, kept, rec.raw if kept is rec.entry else encode_entry(kept))
        return
    c = rec.ckpt
    mem.apply(rec.lsn, c, rec.hash, rec.meta_raw, rec.delta, oldest, rec.outbox_digest,
              rec.appends)
    for key in rec.effect_keys:  # the entries the commit's effects made
        found = lookup(key)
        marked = mark_committed(found, c.id) if found is not None else None
        if marked is not None:
            mem.apply_effect(rec.lsn, marked, encode_entry(marked))
    if rec.deferred:  # the commit dropped the business keys it already knew
        for entry in outbox_entries(store_id, c.run, c.id, c.created_at, c.lsn, rec.deferred,
                                    epoch(c.run, rec.lsn)):
            mem.apply_effect(c.lsn, entry, encode_entry(entry))


def replay(plan: Plan, store_id: Any, folded_epoch: Callable[[str], int] = lambda _r: 0,
           folded_effect: Callable[[str], EffectRecord | None] = lambda _k: None,
           folded_value: Callable[[str, str], bytes | None] = lambda _r, _k: None,
           path: str = "", prefix: bool = False) -> tuple[Memtable, dict[str, tuple[int, bytes]]]:
    """A memtable holding the replayed records, and each replayed run's head.

    ``folded_epoch(run)``, ``folded_effect(key)`` and ``folded_value(run,
    key)`` are what LMDB holds: the run id's epoch, the ledger entry of a key,
    a key's value bytes (the base of an append entry not replayed here);
    ``path`` is the store's, for errors. With ``prefix`` (a ``recover="prefix"``
    open) a record that cannot be applied ends the replay there instead:
    ``plan`` is cut before it (``Plan.cut``: ``plan.lost`` says what follows).

    Raises:
        CorruptionError: a form-2 record appends to a base that is not there.
    """
    mem = Memtable()
    heads: dict[str, tuple[int, bytes]] = {}

    def base(run: str, key: str) -> Value | None:
        found, value = mem.lookup_value(run, key, 1 << 62)
        return value if found else folded_value(run, key)

    def lookup(key: str) -> EffectRecord | None:
        found = mem.effects.get(key)
        return found[0] if found is not None else folded_effect(key)

    def epoch(run: str, lsn: int) -> int:
        return epoch_at((mem,), run, lsn, folded_epoch)

    for i, r in enumerate(plan.records):
        try:
            rec: Applied = Commit.replayed(r, base) if isinstance(r, Replayed) else r
        except CodecError as exc:
            if prefix:
                plan.cut(i, path, f"record LSN {r.lsn}: {exc}")
                break
            raise CorruptionError(path, None, f"record LSN {r.lsn}: {exc}") from None
        # No reader is open during replay: versions older than the record can go.
        apply_record(mem, rec, store_id=store_id, oldest=r.lsn, lookup=lookup, epoch=epoch)
        if isinstance(rec, ReplayedDelete):
            heads.pop(rec.run, None)
        elif isinstance(rec, Commit):
            heads[rec.ckpt.run] = (rec.ckpt.id, rec.hash)
    if plan.records and plan.resume is not None:
        mem.log_pos = (plan.resume[0].first_lsn, plan.resume[2])
    return mem, heads
