"""The effects ledger's storage in the engine: entries, positions, the outbox, step claims.

Theory of operation: ``ledger.py`` decides and ``effects.py`` defines the
entries; this module keeps them. An entry is read the way every value is
(``reads.py``): the view's memtable layers newest first, then LMDB; a
write is a ``REC_EFFECT`` WAL record through the commit pipeline, fsynced
in every durability mode and visible once durable (:meth:`EffectLog.write`).
Every read returns a fresh object, so a caller may keep and change it.

It also holds the two rules that tie effect positions to steps:

- *claim* (:meth:`EffectLog.claim`): positions at a checkpoint belong to
  one step; a second live transaction from the same checkpoint, or one that
  began before the run moved on and is not a retry anchored there, gets
  ``ConflictError`` before anything is called or recorded.
- *adopt* (:meth:`EffectLog.adopt`): before a step's first positional
  effect, walk back (at most ``_ADOPT_WALK`` checkpoints) for an uncommitted
  attempt of the same step whose effects it should meet.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..backend import EffectRace
from ..effects import (
    EffectMode,
    EffectRecord,
    crossable,
    decode_entry,
    encode_entry,
    outstanding,
    same_first_effect,
    still_expected,
)
from ..errors import ReadOnlyError
from ..ledger import moved_on

if TYPE_CHECKING:
    from ..txn import Transaction
    from .engine import Engine
    from .reads import View

__all__ = ["EffectLog"]

#: How many checkpoints back a step looks for an uncommitted attempt of itself.
_ADOPT_WALK = 32
#: Locks striped over the keys, for the compare-and-set of ``write_if``.
_CAS_STRIPES = 64


class EffectLog:
    """The ledger's storage in the engine (one per engine: ``engine.effectlog``)."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine
        self._cas = tuple(threading.Lock() for _ in range(_CAS_STRIPES))

    def adopt(self, run: str, base: int, name: str, digest: str, mode: EffectMode,
              epoch: int, key: str | None = None) -> int | None:
        """The checkpoint of an uncommitted attempt of this step, whose effects to meet.

        A step that conflicted, or whose process died, after it called an
        effect leaves entries that no commit marked; if the run moved on
        meanwhile (other transactions committed without effects: a message
        arriving through a web handler), a plain retry begins from a later
        head and would derive new keys. So before the first effect
        of a step, walk back from its base checkpoint through the run's
        checkpoints (at most ``_ADOPT_WALK``): the first checkpoint whose
        position 0 holds an entry decides. A committed entry there means the
        positions since were used and the step is new (None). An uncommitted
        one is the same step's earlier attempt if it asked for the same effect
        (name, args, mode, and the same business ``key`` if the step's first
        effect has one) first: its checkpoint is returned, and the
        transaction's effects are positioned there. The walk never crosses a
        ``rollback_to`` checkpoint or a fork's first checkpoint (steps re-run
        from those are new positions by design), nor a step whose position 0
        is empty but which recorded later positions (:meth:`_positioned_after`),
        and ignores retired entries.
        """
        e = self._e
        pipe = e._pipe
        if base == 0 or pipe is None:
            return None  # a run's first step has no earlier positions
        with e._lock:
            head = pipe.heads.get(run) or e.head_of(run)
        if head is None or head[0] != base:
            return None  # a stale step, which claim refuses

        def find(v: View) -> int | None:
            # Checkpoint ids are consecutive (a commit's id is its parent's + 1), so the
            # steps before this one began at base - 1, base - 2, ...
            for cid in range(base, max(base - _ADOPT_WALK, 0) - 1, -1):
                key0 = self.key_in(v, run, cid, 0)
                e0 = self.get_in(v, key0) if key0 is not None else None
                if e0 is None or e0.status == "retired":
                    continue
                if cid == base or e0.committed_in is not None:
                    return None  # this step's own positions, or a step that committed
                same = same_first_effect(e0, e.store_id, run, cid, name, digest, mode, key,
                                         epoch)
                return cid if same else None
            return None

        found = e._with_view(find)
        if found is None:
            return None
        # The stretch walked over must not cross a rollback_to (steps re-run from one
        # are new by design) nor, back to a run's start, a fork's first checkpoint; a
        # checkpoint compaction dropped there might have been either.
        if not crossable(e.runs.history(run, base - found, None), found, base):
            return None
        if self._positioned_after(run, found, base):
            return None
        return found

    def _positioned_after(self, run: str, lo: int, hi: int) -> bool:
        """True if a step from a checkpoint in ``(lo, hi]`` recorded a positional entry.

        The walk reads position 0 only, and a step whose first effect met a
        business key recorded elsewhere leaves its position 0 empty: such a
        step, committed or not, still separates ``lo`` from ``hi``. Read only
        once the walk has found an attempt to adopt (the retry case), as it
        lists the run's entries.
        """
        between = [x for x in self.query(run, None)
                   if x.ordinal is not None and not x.deferred and x.status != "retired"
                   and lo < x.checkpoint <= hi]
        if not between:
            return False
        # Entries of the run before a delete_run keep their ordinal but not their position.
        return self._e._with_view(lambda v: any(
            self.key_in(v, run, x.checkpoint, x.ordinal) == x.key for x in between
            if x.ordinal is not None))

    def claim(self, txn: Transaction, base: int, chain: object, inherited: bool) -> None:
        """Check that effect positions at ``base`` are ``txn``'s step's to use; claim them.

        Called by the ledger under the position's lock before an effect runs.
        Positions at a checkpoint belong to one step: a second live
        transaction from the same checkpoint, or one begun before the run
        moved on that is not a retry anchored there, would otherwise meet
        (and silently reuse) another step's recorded results. Such a
        transaction gets ``ConflictError`` before anything is called or
        recorded, and its retry (``store.transact``) runs from the new head.
        ``chain`` and ``inherited`` are the step's (``txn.StepHooks.txn_claim``).

        Raises:
            ConflictError: as above.
        """
        e = self._e
        run = txn.run
        with e._lock:
            e._pos_owners.check(txn, base, chain)
            if not inherited and e._pos_owners.owner(run, base) is not txn:
                pipe = e._pipe
                assert pipe is not None
                head = pipe.heads.get(run) or e.head_of(run)
                if (head[0] if head is not None else 0) != base:
                    raise moved_on(run, base, head[0] if head is not None else "nothing")
            e._pos_owners.take(txn, base, chain)

    def recorded(self, key: str) -> EffectRecord | None:
        """The published ledger entry for ``key`` (memtables, then LMDB); under ``_lock``."""
        e = self._e
        for layer in (e._active, e._frozen):
            if layer is not None and key in layer.effects:
                return layer.effects[key][0]
        return e._lmdb_now(lambda r: r.effect(key))

    def get(self, key: str) -> EffectRecord | None:
        e = self._e
        return e._with_view(lambda v: self.get_in(v, key))

    def key_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        e = self._e
        return e._with_view(lambda v: self.key_in(v, run, checkpoint, ordinal))

    def key_in(self, v: View, run: str, checkpoint: int, ordinal: int) -> str | None:
        """The key recorded at a position, as ``v`` sees the ledger."""
        e = self._e
        return e._reads(v).effect_key_at(run, checkpoint, ordinal)

    def write(self, entry: EffectRecord) -> EffectRecord:
        """Log ``entry`` durably; returns it as recorded (decoded from its encoding,
        so it shares no object with the caller's)."""
        e = self._e
        e.check_open()
        if e._pipe is None:
            raise ReadOnlyError(e.path)
        raw = encode_entry(entry)
        recorded = decode_entry(raw)
        e._pipe.record_effect(recorded, raw)
        return decode_entry(raw)

    def write_if(self, entry: EffectRecord, expect: EffectRecord | None) -> EffectRecord:
        """:meth:`write` ``entry`` if its key still holds ``expect``; returns it as stored.

        Compare-and-set: the read, the comparison and the write hold a lock of
        the key's stripe, so two writers of one key in this process never both
        win; the writer lock keeps other processes out.

        Raises:
            EffectRace: the key holds another entry (nothing written).
        """
        with self._cas[hash(entry.key) % _CAS_STRIPES]:
            found = self.get(entry.key)
            if not still_expected(found, expect):
                raise EffectRace(entry.key, found)
            written = self.write(entry)
        return self.get(entry.key) or written

    def layers(self, v: View) -> list[dict[str, tuple[EffectRecord, bytes]]]:
        """Copies of the view's memtable ledgers, newest first (other threads add to them)."""
        e = self._e
        with e._lock:
            return [dict(layer.effects) for layer in v.layers]

    def entries(self) -> list[EffectRecord]:
        """Every ledger entry (fresh objects: callers may keep and change them)."""
        e = self._e

        def read(v: View) -> list[EffectRecord]:
            snap = e._snap
            assert snap is not None
            out = {x.key: x for x in e._lmdb(v, lambda t: list(snap.reader(t).effects()))}
            for layer in reversed(self.layers(v)):
                out.update((k, decode_entry(raw)) for k, (_e, raw) in layer.items())
            return list(out.values())

        return e._with_view(read)

    def query(self, run: str | None, status: str | None) -> list[EffectRecord]:
        """The entries of ``run`` and/or ``status``: LMDB's through its indexes (a
        store without them yet scans), then the memtables' (fresh objects)."""
        e = self._e

        def match(entry: EffectRecord) -> bool:
            return ((run is None or entry.run == run)
                    and (status is None or entry.status == status))

        def read(v: View) -> list[EffectRecord]:
            snap = e._snap
            assert snap is not None
            folded = e._lmdb(v, lambda t: snap.reader(t).effects_of(run, status))
            if folded is None:
                folded = [x for x in e._lmdb(v, lambda t: list(snap.reader(t).effects()))
                          if match(x)]
            out = {x.key: x for x in folded}
            for layer in reversed(self.layers(v)):  # oldest first
                for k, (entry, raw) in layer.items():
                    if match(entry):
                        out[k] = decode_entry(raw)
                    else:  # a newer version that no longer matches hides LMDB's
                        out.pop(k, None)
            return list(out.values())

        return e._with_view(read)

    def outbox(self) -> list[EffectRecord]:
        """Unsettled outbox entries in commit order."""
        e = self._e

        def read(v: View) -> list[EffectRecord]:
            snap = e._snap
            assert snap is not None
            keys = set(e._lmdb(v, lambda t: snap.reader(t).outbox()))
            for layer in self.layers(v):
                keys.update(k for k, (x, _raw) in layer.items() if x.deferred)
            return [x for x in (self.get_in(v, k) for k in keys)
                    if x is not None and x.deferred and outstanding(x)]

        return sorted(e._with_view(read), key=lambda x: x.order or (0, 0))

    def get_in(self, v: View, key: str) -> EffectRecord | None:
        e = self._e
        with e._lock:
            found = next((layer.effects[key] for layer in v.layers if key in layer.effects),
                         None)
        if found is not None:
            return decode_entry(found[1])  # a fresh copy
        snap = e._snap
        assert snap is not None
        return e._lmdb(v, lambda t: snap.reader(t).effect(key))
