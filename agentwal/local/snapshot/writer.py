"""The fold writer: a frozen memtable into LMDB, in the fold's one write transaction.

Theory of operation: the fold is the only writer of the snapshot's state.
:meth:`FoldWriter.fold` runs inside one LMDB write transaction that the
snapshot commits with ``sync=True``, together with ``applied_lsn``, so
after any crash LMDB sits exactly at a fold boundary and the WAL supplies
every record after it. For each run it writes each new checkpoint's delta
with the objects it needs and one ``versions`` entry per key, then the
``state`` entries, the checkpoint records and the run record (count and
CRC digest of the state kept in step). *Run deletion* (``FoldRun.reset``)
removes the run's state, checkpoints, deltas, versions and manifests, releasing
their references, before anything committed after the deletion is written
under a new run number. Ledger entries are stored latest per key, each with
a row in the run index and one in the status index (built for every entry
at the first fold of a store that has none, as the versions index of a
store's history is); settled ones past their
retention are dropped with their rows. It never folds over damage: an
entry it replaces is unsealed first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import cbor2

from ... import history
from ...codec import CodecError
from ...effects import STATUSES, EffectRecord, outstanding
from .layout import (
    CRC,
    EFFECTS_INDEX,
    EFFECTS_INDEX_VERSION,
    EPOCH,
    HISTORY_INDEX,
    HISTORY_INDEX_VERSION,
    LAYOUT,
    LAYOUT_VERSION,
    U32,
    U64,
    FoldRun,
    RunInfo,
    implied_versions,
    index_keys,
    pos_key,
    seal,
    version_key,
)
from .objects import TxnObjects, maybe_list
from .reader import SnapshotReader

__all__ = ["FoldWriter"]

_NEWEST = (1 << 64) - 2  # a checkpoint id past every other (the seek adds one)


class FoldWriter(SnapshotReader):
    """A reader over a write transaction that also writes what a fold or compaction changes."""

    def layout_marked(self) -> bool:
        """True if a layout-4 fold (or salvage) wrote this snapshot before."""
        return self._txn.get(LAYOUT, db=self._meta) is not None

    def fold(self, applied_lsn: int, store_id: uuid.UUID, runs: list[FoldRun],
             log_pos: tuple[int, int] | None,
             effects: list[tuple[EffectRecord, bytes]] | None,
             expire_before: float | None) -> None:
        """Write the runs, then the ledger entries, then expire settled entries."""
        if not self.history_indexed():
            self._index_history()
        if not self.layout_marked():  # objects may be unindexed now
            self._txn.put(LAYOUT, seal(LAYOUT, U64.pack(LAYOUT_VERSION)), db=self._meta)
        self._fold_into(applied_lsn, store_id, runs, log_pos)
        if not self.effects_indexed():
            self._index_effects()
        for entry, raw in effects or ():
            self._put_effect(entry, raw)
        if expire_before is not None:
            self._expire_effects(expire_before)

    def _fold_into(self, applied_lsn: int, store_id: uuid.UUID,
                   runs: list[FoldRun], log_pos: tuple[int, int] | None) -> None:
        raw_next = self._open(b"next_run", self._txn.get(b"next_run", db=self._meta),
                              "next run number")
        if raw_next is not None and len(raw_next) != 8:
            raise self._corrupt("the next run number in the snapshot is damaged")
        next_run = U64.unpack(raw_next)[0] if raw_next is not None else 1
        for fr in runs:
            info = self.run_info(fr.run)
            if fr.reset:  # deleted: what follows starts afresh, in a new epoch
                if info is not None:
                    self._drop_run(fr.run, info)
                    info = None
                ek = EPOCH + fr.run.encode()
                self._txn.put(ek, seal(ek, U64.pack(fr.reset)), db=self._meta)
            if not fr.checkpoints:
                continue
            if info is None:
                number, count, nkeys, digest = next_run, 0, 0, 0
                next_run += 1
            else:
                number, count, nkeys, digest = info.number, info.count, info.keys, info.digest
            base = U64.pack(number)
            heads, sole = self._fold_history(number, fr, info.head if info is not None else 0)
            for key, value in fr.writes.items():
                k = base + key.encode()
                old = self._txn.get(k, db=self._state)
                if old is not None:
                    self._open(k, old, f"value of key {key!r}")  # never fold over damage
                    nkeys -= 1
                    digest ^= CRC.unpack_from(old)[0]
                if value is None:
                    self._txn.delete(k, db=self._state)
                else:
                    sealed = seal(k, history.head_entry(value, heads.get(key), sole.get(key)))
                    self._txn.put(k, sealed, db=self._state)
                    nkeys += 1
                    digest ^= CRC.unpack_from(sealed)[0]
            for c, hsh, meta_raw in fr.checkpoints:
                rec: list[Any] = [c.id, c.parent, c.lsn, c.created_at, meta_raw, hsh,
                                  list(c.origin) if c.origin else None,
                                  (fr.outboxes or {}).get(c.id)]
                appended = (fr.appends or {}).get(c.id)
                if appended:  # 9th: the parent hash (compaction sets it); 10th: appends
                    rec += [None, {k: list(a) for k, a in appended.items()}]
                ck = base + U64.pack(c.id)
                self._txn.put(ck, seal(ck, cbor2.dumps(rec)), db=self._ckpt)
            head, head_hash, _meta = fr.checkpoints[-1]
            count += len(fr.checkpoints)
            rk = fr.run.encode()
            run_rec: list[Any] = [number, head.id, head_hash, count, nkeys, digest]
            if info is not None and info.origin is not None:
                run_rec.append(list(info.origin))
            self._txn.put(rk, seal(rk, cbor2.dumps(run_rec)), db=self._runs)
        for name, value in ((b"next_run", U64.pack(next_run)), (b"store_id", store_id.bytes),
                            (b"applied_lsn", U64.pack(applied_lsn))):
            self._txn.put(name, seal(name, value), db=self._meta)
        if log_pos is not None:  # where the log continues: recovery skips what is folded
            self._txn.put(b"log_pos", seal(b"log_pos", U64.pack(log_pos[0]) + U64.pack(log_pos[1])),
                    db=self._meta)
        else:
            self._txn.delete(b"log_pos", db=self._meta)

    def _fold_history(self, number: int, fr: FoldRun, head: int
                      ) -> tuple[dict[str, history.Ref | None], dict[str, int]]:
        """Write each new checkpoint's delta, with its objects and the keys' versions.

        Returns each written key's ref at the last checkpoint (for ``state``),
        and the keys whose only version ever is the one this fold wrote (the
        checkpoint's id: its ``state`` entry says so, and ``versions`` has no
        entry for it; :meth:`_put_key_versions`).
        """
        objs = TxnObjects(self)
        deltas = fr.deltas
        if deltas is None:
            deltas = [{} for _ in fr.checkpoints[:-1]] + [fr.writes]
        base = U64.pack(number)
        # A list value extends the key's previous ref: from this fold if it wrote
        # the key already, else the folded head's (one seek in the versions).
        last: dict[str, history.Ref | None] = {}
        changed: dict[str, list[int]] = {}
        try:
            for (c, _h, _m), delta in zip(fr.checkpoints, deltas, strict=True):
                dref: dict[str, history.Ref | None] = {}
                for key, value in delta.items():
                    if value is None:
                        dref[key] = None
                        continue
                    prev = None
                    if maybe_list(value):
                        if key in last:
                            prev = last[key]
                        elif head:
                            prev = self._ref_of(fr.run, number, head, key)
                    dref[key] = history.store_value(objs, value, prev)
                dk = base + U64.pack(c.id)
                self._drop_delta(objs, fr.run, number, c.id)  # never there, but never stale
                if self._txn.get(dk, db=self._manifest) is not None:
                    self._drop_history(objs, self._manifest, fr.run, number, c.id, True)
                    self._txn.delete(dk, db=self._manifest)
                self._txn.put(dk, seal(dk, history.encode_refs(dref)), db=self._delta)
                for key in dref:
                    changed.setdefault(key, []).append(c.id)
                last.update(dref)
            sole = self._put_key_versions(number, changed, last)
        except CodecError as exc:
            raise self._corrupt(f"history of {fr.run!r}: {exc}") from None
        return last, sole

    def _put_key_versions(self, number: int, changed: dict[str, list[int]],
                          last: dict[str, history.Ref | None]) -> dict[str, int]:
        """The ``versions`` entries of the keys a fold changed, except write-once keys.

        A key the run never had (no ``state`` entry, no version) that this
        fold wrote once and did not delete gets no entry: its head entry
        names its one version instead (layout 4), so a thread's ever-new
        keys (a checkpoint, a pending write) cost no index entry and no page
        of the index is touched for them. A key whose head entry named its
        one version gets that version's entry back when it changes again.
        """
        sole: dict[str, int] = {}
        for key, cids in changed.items():
            k = U64.pack(number) + key.encode()
            data = self._open(k, self._txn.get(k, db=self._state), f"value of key {key!r}")
            if data is not None:
                _ref, only = history.head_ref(data)
                if only is not None and self._txn.get(
                        U64.pack(number) + U64.pack(only), db=self._delta) is not None:
                    # no longer its only version (unless compaction dropped that one: a
                    # read then starts from the manifest of a later block start)
                    self._put_versions(number, only, [key])
            elif (len(cids) == 1 and last.get(key) is not None
                  and self._version_of(number, key.encode(), _NEWEST) is None):
                sole[key] = cids[0]
                continue
            for cid in cids:
                self._put_versions(number, cid, [key])
        return sole

    def _put_versions(self, number: int, cid: int, keys: Iterable[str]) -> None:
        """One ``versions`` entry per key of checkpoint ``cid``'s delta."""
        for key in keys:
            vk = version_key(number, key.encode(), cid)
            self._txn.put(vk, seal(vk, b""), db=self._versions)

    def _drop_delta(self, objs: TxnObjects, run: str, number: int, cid: int) -> bool:
        """Release a delta's refs and remove it with its versions; False if there is none."""
        old = self._history_record(self._delta, run, number, cid, False)
        if old is None:
            return False
        for key, ref in old.items():
            history.release(objs, ref)
            self._txn.delete(version_key(number, key.encode(), cid), db=self._versions)
        self._txn.delete(U64.pack(number) + U64.pack(cid), db=self._delta)
        return True

    def _drop_history(self, objs: TxnObjects, db: Any, run: str, number: int,
                      cid: int, manifest: bool) -> None:
        """Release the refs of a delta or manifest about to be replaced or removed."""
        old = self._history_record(db, run, number, cid, manifest)
        if old is not None:
            for ref in old.values():
                history.release(objs, ref)

    def _index_history(self) -> None:
        """Write the ``versions`` of every folded delta, then the marker (format 3).

        A store from before the index (format 2, read through its regular
        manifests) gets it at its first fold or compaction, in that
        transaction; its manifests stay (each is a full state, still valid).
        """
        entries: list[bytes] = []
        with self._txn.cursor(db=self._delta) as cur:
            for k, raw in cur.iternext():
                k = bytes(k)
                if len(k) != 16:
                    raise self._corrupt(f"delta key {k.hex()} is not a run number and an id")
                number, cid = U64.unpack_from(k)[0], U64.unpack_from(k, 8)[0]
                data = self._open(k, raw, f"delta of checkpoint #{number}/{cid}")
                assert data is not None
                try:
                    refs = history.decode_refs(data, manifest=False)
                except CodecError as exc:
                    raise self._corrupt(f"delta of checkpoint #{number}/{cid}: {exc}") from None
                entries += implied_versions(k, refs)
        # the block start markers: checkpoints whose parent compaction dropped
        with self._txn.cursor(db=self._ckpt) as cur:
            for k, raw in cur.iternext():
                k = bytes(k)
                entries += implied_versions(k, (), self._load(k, raw, "a checkpoint record"))
        for vk in entries:
            self._txn.put(vk, seal(vk, b""), db=self._versions)
        mk = HISTORY_INDEX
        self._txn.put(mk, seal(mk, U64.pack(HISTORY_INDEX_VERSION)), db=self._meta)
        self._indexed = True

    def _drop_run(self, run: str, info: RunInfo) -> None:
        """Remove a run from LMDB: state, checkpoints, deltas, manifests (releasing refs),
        and the positions of its effects-ledger entries (the entries stay)."""
        objs = TxnObjects(self)
        prefix = U64.pack(info.number)
        try:
            for db, manifest in ((self._delta, False), (self._manifest, True)):
                for k, _raw in self._prefixed(db, prefix):
                    self._drop_history(objs, db, run, info.number,
                                       U64.unpack_from(k, 8)[0], manifest)
                    self._txn.delete(k, db=db)
        except CodecError as exc:
            raise self._corrupt(f"history of {run!r}: {exc}") from None
        for db in (self._state, self._ckpt, self._versions):
            for k, _raw in self._prefixed(db, prefix):
                self._txn.delete(k, db=db)
        # Ledger entries stay; their positions in the deleted history go
        # (``_pos_key``: b"p" + CBOR [run, checkpoint, ordinal]).
        for k, _raw in self._prefixed(self._effects, b"p\x83" + cbor2.dumps(run)):
            self._txn.delete(k, db=self._effects)
        self._txn.delete(run.encode(), db=self._runs)

    # -- the effects ledger -----------------------------------------------------------

    def _index_effects(self) -> None:
        """Write the run and status indexes of every ledger entry, then their marker.

        A store from before the indexes (format 1) gets them at its first
        fold; entries folded afterwards keep them in step (:meth:`_put_effect`).
        """
        for entry in list(self.effects()):
            self._index_effect(entry)
        mk = EFFECTS_INDEX
        self._txn.put(mk, seal(mk, U64.pack(EFFECTS_INDEX_VERSION)), db=self._meta)

    def _index_effect(self, entry: EffectRecord) -> None:
        key = entry.key.encode()
        rk, sk = index_keys(entry.run, STATUSES.index(entry.status), entry.key)
        self._txn.put(rk, seal(rk, key), db=self._effects)
        self._txn.put(sk, seal(sk, key), db=self._effects)

    def _unindex_effect(self, entry: EffectRecord) -> None:
        rk, sk = index_keys(entry.run, STATUSES.index(entry.status), entry.key)
        self._txn.delete(rk, db=self._effects)
        self._txn.delete(sk, db=self._effects)

    def _put_effect(self, entry: EffectRecord, raw: bytes) -> None:
        k = b"k" + entry.key.encode()
        old = self.effect(entry.key)  # unsealed first: never folds over damage
        if old is not None:
            self._unindex_effect(old)
        self._txn.put(k, seal(k, raw), db=self._effects)
        self._index_effect(entry)
        key = entry.key.encode()
        if entry.ordinal is not None:
            pk = pos_key(entry.run, entry.checkpoint, entry.ordinal)
            self._txn.put(pk, seal(pk, key), db=self._effects)
        if entry.order is not None:
            qk = b"q" + U64.pack(entry.order[0]) + U32.pack(entry.order[1])
            if outstanding(entry):
                self._txn.put(qk, seal(qk, key), db=self._effects)
            else:
                self._txn.delete(qk, db=self._effects)

    def _expirable(self, e: EffectRecord, before: float) -> bool:
        """A settled entry last updated before ``before`` that nothing can meet again.

        Business keys and outbox entries expire by age alone (that is what the
        retention is for). An entry keyed by its position expires only once
        its run's folded head is past that checkpoint: a step can only start
        at the head, so a position behind it is never re-run, while one at the
        head may still be (an agent waiting, then resuming).
        """
        if outstanding(e) or e.updated_at >= before:
            return False
        if e.keyed or e.deferred:
            return True
        info = self.run_info(e.run)
        return info is not None and info.head > e.checkpoint

    def _expire_effects(self, before: float) -> None:
        doomed = [e for e in self.effects() if self._expirable(e, before)]
        for e in doomed:
            self._txn.delete(b"k" + e.key.encode(), db=self._effects)
            self._unindex_effect(e)
            if e.ordinal is not None:
                self._txn.delete(pos_key(e.run, e.checkpoint, e.ordinal), db=self._effects)
