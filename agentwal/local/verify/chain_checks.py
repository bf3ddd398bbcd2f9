"""The snapshot check's pass over each run's checkpoints: hash chains, manifests, state.

Theory of operation: for each run, in checkpoint id order, decode every
checkpoint record, recompute its hash from its parent's and its delta (the
raw delta as ``snapshot_checks.py``'s header describes), compare each
manifest with the replayed deltas and the head state with the replayed
head. A checkpoint compaction dropped is followed by a manifest and, where
kept, its parent's hash: the chain goes on from there. A damaged record is
reported once, at itself; what needs it is skipped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Set as AbstractSet
from typing import Any

import cbor2

from ... import history
from ...codec import CodecError, append_tail, chain_hash, decode_meta
from ..snapshot.layout import CheckpointRecord, version_key
from .snapshot_base import _U64, _ZERO_HASH, CheckerBase, _Ckpt, _Damaged, _int, _Run

__all__ = ["ChainChecks"]


class ChainChecks(CheckerBase):
    """The checkpoint passes of :class:`~.snapshot_checks.SnapshotChecker`."""

    def checkpoint(self, k: bytes, raw: bytes) -> _Ckpt | None:
        """Decode and check one ``ckpt`` entry (None, reported, if it is bad)."""
        data = self.unseal("ckpt", k, raw)
        obj = None if data is None else self.decode("ckpt", k, data)
        if obj is None:
            return None
        c = CheckpointRecord.decode(obj)
        # Stricter than a read: no bool for an int, a whole SHA-256, the origin's types.
        if (c is None or not _int(c.id) or not (c.parent is None or _int(c.parent))
                or not _int(c.lsn) or len(c.hash) != 32
                or not (c.origin is None or (isinstance(c.origin[0], str)
                                             and _int(c.origin[1])))):
            self.entry_problem("ckpt", k, "checkpoint record is malformed")
            return None
        try:
            decode_meta(c.meta)
        except CodecError as exc:
            self.entry_problem("ckpt", k, f"metadata: {exc}")
            return None
        want = _U64.unpack_from(k, 8)[0]
        if c.id != want:
            self.entry_problem("ckpt", k, f"record says checkpoint {c.id}")
            return None
        if c.parent != (c.id - 1 if c.id > 1 else None):
            self.entry_problem("ckpt", k, f"parent is {c.parent}, not {c.id - 1 or None}")
        if c.lsn > self.applied:
            self.entry_problem("ckpt", k, f"LSN {c.lsn} is after the snapshot's applied LSN "
                               f"{self.applied}")
        return c

    def check_checkpoints(self, damaged_state: set[int]) -> None:
        group: list[tuple[bytes, bytes]] = []
        current: int | None = None
        seen: set[int] = set()
        for k, raw in self.scan("ckpt"):
            self.checked["checkpoints"] += 1
            if len(k) != 16:
                self.entry_problem("ckpt", k, "key is not a run number and a checkpoint id")
                continue
            n = _U64.unpack_from(k)[0]
            if n not in self.runs:
                if n not in self.damaged_runs:
                    self.unseal("ckpt", k, raw)
                self.orphan("ckpt", k, n)
                continue
            if n != current:
                if current is not None:
                    self.check_run(current, group, current not in damaged_state)
                current, group = n, []
                seen.add(n)
            group.append((k, raw))
        if current is not None:
            self.check_run(current, group, current not in damaged_state)
        for n, run in self.runs.items():
            if n not in seen:
                self.entry_problem("runs", run.name.encode(),
                                   f"the run has no checkpoint records (head {run.head})")

    def check_run(self, n: int, group: list[tuple[bytes, bytes]], compare_state: bool) -> None:
        """The chain, the manifests and the head state of one run."""
        run = self.runs[n]
        base = _U64.pack(n)
        ckpts: dict[int, _Ckpt | None] = {}
        for k, raw in group:
            ckpts[_U64.unpack_from(k, 8)[0]] = self.checkpoint(k, raw)
        if len(group) != run.count:
            self.entry_problem("runs", run.name.encode(), f"the run record counts {run.count} "
                               f"checkpoints, {len(group)} are stored")
        for cid in sorted(c for c in ckpts if c > run.head):
            self.entry_problem("ckpt", base + _U64.pack(cid),
                               f"is after the run's head checkpoint {run.head}")
        top = max((c for c in ckpts if c <= run.head), default=0)
        if top < run.head:
            self.entry_problem("runs", run.name.encode(), f"head checkpoint {run.head} is "
                               f"missing; the last one stored is {top}")
        refs: dict[str, history.Ref] = {}
        replayed = top == run.head  # refs hold the state at the checkpoint reached
        prev_hash: bytes | None = _ZERO_HASH
        last_lsn = 0
        # Compaction leaves gaps: the first checkpoint after one carries its dropped
        # parent's hash and has a manifest; the ids in a gap have no records at all.
        self.kept[n] = set(ckpts)
        dropped = self.dropped_ids(ckpts, top, self.block_marked(n, ckpts))
        for cid in range(1, top + 1):
            key = base + _U64.pack(cid)
            c = ckpts.get(cid)
            if cid in dropped:
                self.checked["checkpoints_dropped"] += 1
                continue
            block_start = cid - 1 in dropped
            if block_start:  # the state restarts from its manifest
                prev_hash, replayed = (c.parent_hash if c is not None else None), False
                self.block_starts.setdefault(n, set()).add(cid)
                if self.indexed:
                    self.want_versions.add(version_key(n, b"", cid))
            if cid not in ckpts:
                self.entry_problem("ckpt", key, "is missing: the run's checkpoints are 1.."
                                   f"{run.head}")
            if c is not None:
                if c.lsn <= last_lsn:
                    self.entry_problem("ckpt", key, f"LSN {c.lsn} is not after the previous "
                                       f"checkpoint's ({last_lsn})")
                last_lsn = c.lsn
            present, data = self.fetch("delta", key)
            delta = None if data is None else self.refs_of("delta", key, data, False)
            if not present:
                self.entry_problem("delta", key, "is missing: every checkpoint has a delta")
            if delta is None:
                replayed = False
                self.unread_deltas.add((n, cid))
            else:
                history.apply_delta(refs, delta)
                if self.indexed:
                    self.want_versions.update(version_key(n, k.encode(), cid) for k in delta)
            if c is not None and delta is not None and prev_hash is not None:
                self.check_hash(run, key, c, delta, prev_hash)
            prev_hash = c.hash if c is not None else None
            if history.is_manifest(cid) or block_start:
                # a regular manifest (every MANIFEST_EVERY ids) is required only without
                # the versions index; a store indexed since keeps those it had
                refs, replayed = self.check_manifest(key, cid, refs, replayed,
                                                     block_start or not self.indexed)
        head = ckpts.get(run.head)
        if head is not None and head.hash != run.head_hash:
            self.entry_problem("runs", run.name.encode(), f"head hash differs from that of "
                               f"checkpoint {run.head}")
        if replayed and compare_state:
            self.compare_state(n, run, refs)

    def block_marked(self, n: int, ckpts: dict[int, _Ckpt | None]) -> set[int]:
        """Ids whose record is unreadable but whose block start marker (layout 3) says
        compaction dropped their parent: the gap below them is not missing records."""
        if not self.indexed:
            return set()
        return {cid for cid, c in ckpts.items()
                if c is None and self.fetch("versions", version_key(n, b"", cid))[0]}

    @staticmethod
    def dropped_ids(ckpts: dict[int, _Ckpt | None], top: int,
                    marked: AbstractSet[int] = frozenset()) -> set[int]:
        """Ids compaction dropped: every gap below a record that carries its parent's hash
        (or, if that record is unreadable, below a block start marker)."""
        out: set[int] = set()
        prev = 0
        for cid in sorted(c for c in ckpts if c <= top):
            c = ckpts[cid]
            if cid > prev + 1 and (cid in marked
                                   or (c is not None and c.parent_hash is not None)):
                out.update(range(prev + 1, cid))
            prev = cid
        return out

    def check_hash(self, run: _Run, key: bytes, c: _Ckpt,
                   delta: dict[str, history.Ref | None], prev_hash: bytes) -> None:
        """Recompute checkpoint ``c``'s hash from its parent's, its fields and its delta."""
        try:
            values = {k: None if r is None else self.value(r) for k, r in delta.items()}
            raw = cbor2.dumps(self.logged(values, c.appends) if c.appends else values)
        except _Damaged:
            self.checked["hashes_unchecked"] += 1
            return
        except CodecError as exc:
            self.entry_problem("delta", key, f"cannot rebuild the committed delta: {exc}")
            return
        want = chain_hash(prev_hash, run.name, c.id, c.parent, c.created_at, c.meta, c.origin,
                          hashlib.sha256(raw).digest(), c.outbox)
        self.checked["hashes"] += 1
        if want != c.hash:
            self.entry_problem("ckpt", key, "hash chain broken: the stored hash is not the "
                               "SHA-256 of the parent's hash, this checkpoint's fields and "
                               "its delta")

    @staticmethod
    def logged(values: dict[str, bytes | None], appends: dict[str, tuple[int, int]]
               ) -> dict[str, Any]:
        """The form-2 delta a commit hashed, rebuilt from the whole values it made.

        Raises:
            CodecError: an appended key's value cannot be what the append made.
        """
        out: dict[str, Any] = {}
        for k, v in values.items():
            if k not in appends:
                out[k] = v
                continue
            count, length = appends[k]
            tail = None if v is None else append_tail(v, count, length)
            if tail is None:
                raise CodecError(f"key {k!r} is recorded as an append to {count} items, "
                                 "which its value cannot be")
            out[k] = [count, length, tail]
        if appends.keys() - values.keys():
            raise CodecError(f"keys {sorted(appends.keys() - values.keys())[:5]} are recorded "
                             "as appends but the delta has no such key")
        return out

    def value(self, ref: history.Ref) -> bytes:
        """The value bytes of a ref; a list node is checked on the way (once)."""
        if isinstance(ref, tuple) and ref[0] == history.LIST and ref[1] not in self.nodes_ok:
            try:
                value = history.check_node(self.objs, ref[1])
            except _Damaged:
                raise
            except CodecError:  # the objects pass reports the node; the chain goes on
                return history.resolve(self.objs, ref)
            self.nodes_ok.add(ref[1])
            return value
        return history.resolve(self.objs, ref)

    def check_manifest(self, key: bytes, cid: int, refs: dict[str, history.Ref],
                       replayed: bool, required: bool) -> tuple[dict[str, history.Ref], bool]:
        """Compare the manifest at ``cid`` with the replay; returns the state to go on from."""
        present, data = self.fetch("manifest", key)
        if not present and not required:
            return refs, replayed
        if not present:
            why = (f"a multiple of {history.MANIFEST_EVERY}" if history.is_manifest(cid) else
                   "the first kept after checkpoints compaction dropped")
            self.entry_problem("manifest", key, f"is missing: checkpoint {cid} is {why}")
            return refs, replayed
        found = None if data is None else self.refs_of("manifest", key, data, True)
        if found is None:
            return refs, replayed
        manifest = {k: r for k, r in found.items() if r is not None}
        if not replayed:
            return manifest, True
        if manifest != refs:
            diff = sorted(set(manifest.items()) ^ set(refs.items()), key=repr)
            self.entry_problem("manifest", key, f"differs from the deltas replayed up to it "
                               f"(keys {sorted({k for k, _ in diff})[:5]})")
        return refs, replayed

    def compare_state(self, n: int, run: _Run, refs: dict[str, history.Ref]) -> None:
        """The ``state`` fast path against the history replay of the head checkpoint."""
        seen: set[str] = set()
        for k, raw in self.scan("state", _U64.pack(n)):
            data = self.unseal("state", k, raw)
            key = k[8:].decode("utf-8", "replace")
            seen.add(key)
            if data is None:
                continue
            ref = refs.get(key)
            if ref is None:
                self.entry_problem("state", k, f"is not in the run's history at its head "
                                   f"checkpoint {run.head}")
                continue
            try:
                same = history.head_value(self.objs, data) == history.resolve(self.objs, ref)
            except _Damaged:
                continue
            except CodecError as exc:
                self.entry_problem("state", k, f"cannot compare with history: {exc}")
                continue
            if not same:
                self.entry_problem("state", k, f"differs from the value the history gives at "
                                   f"the head checkpoint {run.head}")
        for key in sorted(refs.keys() - seen):
            self.entry_problem("state", _U64.pack(n) + key.encode(),
                               f"is missing: the history at head checkpoint {run.head} has it")
