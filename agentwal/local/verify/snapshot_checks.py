"""Checking the LMDB snapshot: seals, shapes, hash chains, history against state, objects.

Theory of operation: :class:`SnapshotChecker` reads every entry of every
database through a :class:`~.report.Source` (raw sealed entries of one read
transaction), in passes: ``meta`` and ``runs`` first (run numbers name the
keys of every other database), then ``state`` (per-run count and CRC
digest), then each run's checkpoints in id order, where it recomputes the
hash chain from the deltas, compares each manifest with the replay and the
head state with the replayed head, then every delta, manifest, object,
reference count, object id and ledger entry. References are counted as the
deltas, manifests and list nodes are read, and compared with ``refs`` last.

*The raw delta.* A checkpoint's hash covers ``sha256`` of its delta as the
committer encoded it (``codec.encode_delta``: ``cbor2.dumps`` of
``{key: value bytes | None}``, keys in the order first written). LMDB keeps
``{key: ref}`` in that order, and each ref resolves to the exact value bytes
committed; ``cbor2.dumps`` of a ``{str: bytes | None}`` map is deterministic
(a definite-length map, shortest-form lengths), so rebuilding it gives the
hashed bytes back. The outbox, which becomes ledger entries that change as
they are dispatched, is covered by the digest kept in the checkpoint record.

A damaged entry is reported once, at itself: the checks that would need it
(a chain through a damaged checkpoint, a list through a damaged leaf) skip
what they cannot see instead of reporting it again.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import struct
import uuid
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import cbor2

from ... import history
from ...codec import CodecError, chain_hash, decode_meta, decode_value, loads
from ...effects import STATUSES, EffectRecord, decode_entry
from ...errors import CorruptionError
from ...types import Progress
from ..snapshot.layout import (
    EFFECTS_INDEX,
    HISTORY_INDEX,
    index_keys,
    object_record,
    object_split,
    unseal,
    version_key,
    version_parts,
)
from .report import Findings, Source

__all__ = ["CACHE_BYTES", "SNAPSHOT_PARTS", "SnapshotChecker"]

#: The parts of verify's ``snapshot`` phase, in order, as its progress names them.
SNAPSHOT_PARTS = ("meta", "runs", "state", "checkpoints (hash chains)", "deltas", "manifests",
                  "versions", "objects", "references", "object ids", "effects")

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_ZERO_HASH = bytes(32)
_META_SIZES = {b"applied_lsn": 8, b"store_id": 16, b"next_run": 8, b"log_pos": 16,
               EFFECTS_INDEX: 8, HISTORY_INDEX: 8}
#: Object records kept in memory while verifying (read again when evicted).
CACHE_BYTES = 64 << 20


@dataclass
class _Run:
    """A run record as found in ``runs``."""

    name: str
    head: int
    head_hash: bytes
    count: int
    keys: int
    digest: int
    origin: tuple[str, int] | None = None  # kept once compaction dropped checkpoint 1


@dataclass(frozen=True)
class _Ckpt:
    """A decoded checkpoint record."""

    id: int
    parent: int | None
    lsn: int
    created_at: float
    meta: bytes
    hash: bytes
    origin: tuple[str, int] | None
    outbox: bytes | None
    #: the dropped parent's hash (compaction): the chain goes on from it
    parent_hash: bytes | None = None


class _Damaged(CodecError):
    """An object needed is damaged: reported once, at the object, not at each user."""


class _Objects:
    """``history.Objects`` (reads only) over the verifier's sealed reads.

    Keeps the records it read, up to :data:`CACHE_BYTES`, least recently used
    first out: a list's leaves are read once per version of the list
    otherwise (every delta of a growing ``messages`` list names all of them).
    """

    def __init__(self, v: SnapshotChecker) -> None:
        self._v = v
        self._cache: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._bytes = 0

    def get(self, addr: int) -> bytes | None:
        found = self._cache.get(addr)
        if found is not None:
            self._cache.move_to_end(addr)
            return found
        present, data = self._v.fetch_object(addr)
        if present and data is None:
            raise _Damaged(f"object @{addr} is damaged")
        if data is not None:
            self._cache[addr] = data
            self._bytes += len(data)
            while self._bytes > CACHE_BYTES:
                self._bytes -= len(self._cache.popitem(last=False)[1])
        return data



def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class SnapshotChecker(Findings):
    """Checks one snapshot (``src`` None: no snapshot to read; only the log is checked)."""

    def __init__(self, src: Source | None, store_id: uuid.UUID) -> None:
        super().__init__(store_id)
        self.src = src
        self.applied = 0
        self.next_run: int | None = None
        self.runs: dict[int, _Run] = {}
        self.run_nos: dict[str, int] = {}
        self.damaged_runs: set[int] = set()  # run numbers of damaged run records
        self.objs = _Objects(self)
        self.found_refs: collections.Counter[int] = collections.Counter()
        self.addrs: set[int] = set()
        self.nodes_ok: set[int] = set()  # list nodes already rebuilt and checked
        self.kept: dict[int, set[int]] = {}  # run number -> checkpoint ids stored
        #: run number -> ids that follow checkpoints compaction dropped (they have manifests)
        self.block_starts: dict[int, set[int]] = {}
        #: the store has the versions index (format 3): its marker is in meta
        self.indexed = False
        #: the ``versions`` keys the deltas and block starts call for (format 3)
        self.want_versions: set[bytes] = set()
        #: (run number, id) of deltas that could not be read: their versions are not judged
        self.unread_deltas: set[tuple[int, int]] = set()

    # -- reading ------------------------------------------------------------------

    def scan(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Entries of ``db``; a database LMDB cannot walk is one problem, then the scan ends."""
        assert self.src is not None
        try:
            for k, raw in self.src.entries(db, prefix):
                if not prefix:
                    self.checked["lmdb_entries"] += 1
                yield k, raw
        except CorruptionError as exc:
            self.db_problem(db, f"LMDB cannot read this database any further: {exc.reason}")

    def unseal(self, db: str, key: bytes, raw: bytes) -> bytes | None:
        """The value of a sealed entry, or None (reported) if its CRC does not match."""
        data = unseal(key, raw)
        if data is None:
            self.entry_problem(db, key, "checksum mismatch: the CRC-32 stored with the entry "
                               "does not cover its key and value")
        return data

    def fetch(self, db: str, key: bytes) -> tuple[bool, bytes | None]:
        """``(present, value)``; value None when absent or damaged (damage is reported)."""
        assert self.src is not None
        try:
            raw = self.src.get(db, key)
        except CorruptionError as exc:
            self.entry_problem(db, key, f"LMDB cannot read it: {exc.reason}")
            return True, None
        if raw is None:
            return False, None
        return True, self.unseal(db, key, raw)

    def fetch_object(self, addr: int) -> tuple[bool, bytes | None]:
        """``(present, record)`` of an object, joined from its parts if it has them (format 3);
        record None when absent or damaged (damage, a part included, is reported)."""
        k = _U64.pack(addr)
        present, head = self.fetch("objects", k)
        split = None if head is None else object_split(head)
        if split is None:
            return present, None if head is None else self.object_record(k, head)
        size, count = split
        if size < 0:
            self.entry_problem("objects", k, "the head of an object in parts is malformed")
            return True, None
        parts = []
        for i in range(1, count + 1):
            pk = k + _U16.pack(i)
            there, part = self.fetch("objects", pk)
            if not there:
                self.entry_problem("objects", pk, f"is missing: object @{addr} has {count} "
                                   "parts")
            if part is None:
                return True, None
            parts.append(part)
        record = b"".join(parts)
        if len(record) != size:
            self.entry_problem("objects", k, f"its parts join to {len(record)} bytes, its head "
                               f"says {size}")
            return True, None
        return True, self.object_record(k, record)

    def object_record(self, k: bytes, form: bytes) -> bytes | None:
        """An object's record from its stored form (None, reported, if it does not inflate)."""
        try:
            return object_record(form)
        except CodecError as exc:
            self.entry_problem("objects", k, f"the compressed record does not inflate: {exc}")
            return None

    def decode(self, db: str, key: bytes, data: bytes) -> Any:
        """Decode CBOR from an entry; None (reported) if it does not decode."""
        try:
            return loads(data)
        except CodecError as exc:
            self.entry_problem(db, key, str(exc))
            return None

    def refs_of(self, db: str, key: bytes, data: bytes,
                manifest: bool) -> dict[str, history.Ref | None] | None:
        try:
            return history.decode_refs(data, manifest=manifest)
        except CodecError as exc:
            self.entry_problem(db, key, str(exc))
            return None

    # -- the snapshot ---------------------------------------------------------------

    def check_snapshot(self, progress: Progress | None = None) -> None:
        """Every check of LMDB, in order; ``progress`` is told each part as it begins.

        The parts are named in the phase (``"snapshot: checkpoints"``, see
        :data:`SNAPSHOT_PARTS`) so that a long part (the hash chains of the
        checkpoints, usually) never shows as the previous one; ``done`` counts
        the parts finished, of 11, ending with the last part at 11.
        """
        damaged: set[int] = set()
        steps: list[Callable[[], object]] = [
            self.check_meta, self.check_runs, lambda: damaged.update(self.check_state()),
            lambda: self.check_checkpoints(damaged),
            lambda: self.check_history_records("delta"),
            lambda: self.check_history_records("manifest"), self.check_versions,
            self.check_objects, self.check_refs, self.check_oids, self.check_effects]
        assert len(steps) == len(SNAPSHOT_PARTS)
        for i, (step, part) in enumerate(zip(steps, SNAPSHOT_PARTS, strict=True)):
            if progress is not None:
                progress(f"snapshot: {part}", i, len(steps))
            step()
        if progress is not None:
            progress(f"snapshot: {SNAPSHOT_PARTS[-1]}", len(steps), len(steps))

    def check_meta(self) -> None:
        seen: dict[bytes, bytes] = {}
        for k, raw in self.scan("meta"):
            data = self.unseal("meta", k, raw)
            if data is None:
                continue
            want = 8 if k.startswith(b"epoch:") else _META_SIZES.get(k)  # a run id's epoch
            if want is None:
                self.entry_problem("meta", k, "an entry the snapshot never writes")
            elif len(data) != want:
                self.entry_problem("meta", k, f"is {len(data)} bytes, not {want}")
            else:
                seen[k] = data
        self.indexed = HISTORY_INDEX in seen
        if b"applied_lsn" in seen:
            self.applied = _U64.unpack(seen[b"applied_lsn"])[0]
        if b"next_run" in seen:
            self.next_run = _U64.unpack(seen[b"next_run"])[0]
        sid = seen.get(b"store_id")
        if sid is not None and sid != self.store_id.bytes:
            self.entry_problem("meta", b"store_id", f"the snapshot belongs to store "
                               f"{uuid.UUID(bytes=sid)}, not {self.store_id} (CONTROL)")

    def check_runs(self) -> None:
        for k, raw in self.scan("runs"):
            self.checked["runs"] += 1
            data = self.unseal("runs", k, raw)
            if data is None:
                # Its entries are not checked; a number still read from it keeps them
                # from being reported as belonging to no run.
                with contextlib.suppress(CodecError, IndexError, TypeError):
                    n = loads(raw[4:])[0]
                    if _int(n):
                        self.damaged_runs.add(n)
                continue
            obj = self.decode("runs", k, data)
            if obj is None:
                continue
            if not (isinstance(obj, list) and len(obj) in (6, 7)
                    and all(_int(obj[i]) for i in (0, 1, 3, 4, 5))
                    and isinstance(obj[2], bytes) and len(obj[2]) == 32
                    and (len(obj) == 6 or (isinstance(obj[6], list) and len(obj[6]) == 2
                                           and isinstance(obj[6][0], str)
                                           and _int(obj[6][1])))):
                self.entry_problem("runs", k, "run record is malformed")
                continue
            try:
                name = k.decode("utf-8")
            except UnicodeDecodeError:
                self.entry_problem("runs", k, "run id is not UTF-8")
                continue
            n = obj[0]
            if n in self.runs:
                self.entry_problem("runs", k, f"run number #{n} is also that of run "
                                   f"{self.runs[n].name!r}")
                continue
            if self.next_run is not None and n >= self.next_run:
                self.entry_problem("runs", k, f"run number #{n} is not below next_run "
                                   f"{self.next_run}")
            if obj[1] < 1:
                self.entry_problem("runs", k, f"head checkpoint {obj[1]} is not an id")
            self.runs[n] = _Run(name, obj[1], obj[2], obj[3], obj[4], obj[5],
                                (obj[6][0], obj[6][1]) if len(obj) == 7 else None)
            self.run_nos[name] = n
            self.run_names[n] = name
        if self.runs and self.applied == 0:
            self.db_problem("meta", "applied_lsn is missing, yet the snapshot holds runs")

    def check_state(self) -> set[int]:
        """Seal, decode, run membership of every state entry; per-run count and digest.

        Returns the run numbers with a damaged entry (their digest is not compared).
        """
        counts: collections.Counter[int] = collections.Counter()
        digests: collections.Counter[int] = collections.Counter()
        damaged: set[int] = set()
        for k, raw in self.scan("state"):
            self.checked["state_keys"] += 1
            if len(k) <= 8:
                self.entry_problem("state", k, "key is too short for a run number and a key")
                continue
            n = _U64.unpack_from(k)[0]
            counts[n] += 1
            if len(raw) >= 4:
                digests[n] ^= struct.unpack_from("<I", raw)[0]
            if n not in self.runs:
                if n not in self.damaged_runs:
                    self.entry_problem("state", k, f"belongs to no run (run number #{n})")
                continue
            data = self.unseal("state", k, raw)
            if data is None:
                damaged.add(n)
                continue
            try:
                k[8:].decode("utf-8")
                value = history.head_value(self.objs, data)
                decode_value(value)  # a blob (or tree) reference is a value too
            except _Damaged:
                damaged.add(n)
            except (UnicodeDecodeError, CodecError) as exc:
                self.entry_problem("state", k, f"value does not decode: {exc}")
                damaged.add(n)
        for n, run in self.runs.items():
            if n in damaged:
                continue
            if counts[n] != run.keys or digests[n] != run.digest:
                self.entry_problem("runs", run.name.encode(),
                                   f"state holds {counts[n]} keys of the run (digest "
                                   f"{digests[n]:08x}); the run record says {run.keys} "
                                   f"({run.digest:08x})")
        return damaged

    def checkpoint(self, k: bytes, raw: bytes) -> _Ckpt | None:
        """Decode and check one ``ckpt`` entry (None, reported, if it is bad)."""
        data = self.unseal("ckpt", k, raw)
        obj = None if data is None else self.decode("ckpt", k, data)
        if obj is None:
            return None
        ok = (isinstance(obj, list) and len(obj) in (7, 8, 9) and _int(obj[0])
              and (obj[1] is None or _int(obj[1])) and _int(obj[2])
              and isinstance(obj[3], (int, float)) and isinstance(obj[4], bytes)
              and isinstance(obj[5], bytes) and len(obj[5]) == 32
              and (obj[6] is None or (isinstance(obj[6], list) and len(obj[6]) == 2
                                      and isinstance(obj[6][0], str) and _int(obj[6][1])))
              and (len(obj) == 7 or obj[7] is None
                   or (isinstance(obj[7], bytes) and len(obj[7]) == 32))
              and (len(obj) < 9 or (isinstance(obj[8], bytes) and len(obj[8]) == 32)))
        if not ok:
            self.entry_problem("ckpt", k, "checkpoint record is malformed")
            return None
        c = _Ckpt(obj[0], obj[1], obj[2], float(obj[3]), obj[4], obj[5],
                  (obj[6][0], obj[6][1]) if obj[6] is not None else None,
                  obj[7] if len(obj) >= 8 else None, obj[8] if len(obj) == 9 else None)
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
                    self.entry_problem("ckpt", k, f"belongs to no run (run number #{n})")
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
        """Ids whose record is unreadable but whose block start marker (format 3) says
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
            raw = cbor2.dumps({k: None if r is None else self.value(r)
                               for k, r in delta.items()})
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

    def check_history_records(self, db: str) -> None:
        """Every delta or manifest: seal, shape, owner; count the references it holds."""
        manifest = db == "manifest"
        for k, raw in self.scan(db):
            self.checked[db + "s"] += 1
            data = self.unseal(db, k, raw)
            refs = None if data is None else self.refs_of(db, k, data, manifest)
            if len(k) != 16:
                self.entry_problem(db, k, "key is not a run number and a checkpoint id")
                continue
            n, cid = _U64.unpack_from(k)[0], _U64.unpack_from(k, 8)[0]
            run = self.runs.get(n)
            if run is None:
                if n not in self.damaged_runs:
                    self.entry_problem(db, k, f"belongs to no run (run number #{n})")
            elif (not 1 <= cid <= run.head or cid not in self.kept.get(n, (cid,))
                  or (manifest and not history.is_manifest(cid)
                      and cid not in self.block_starts.get(n, ()))):
                self.entry_problem(db, k, f"belongs to no checkpoint of {run.name!r} (head "
                                   f"{run.head})")
            for ref in (refs or {}).values():
                if isinstance(ref, tuple):
                    self.found_refs[ref[1]] += 1

    def check_versions(self) -> None:
        """Every ``versions`` entry names a key of its checkpoint's delta (or a block start),
        and every delta key and block start has its entry (format 3)."""
        extra = 0
        for k, raw in self.scan("versions"):
            self.checked["versions"] += 1
            data = self.unseal("versions", k, raw)
            parts = version_parts(k)
            if parts is None:
                self.entry_problem("versions", k, "key is not a run number, a key and an id")
                continue
            n, key, cid = parts
            if not self.indexed:
                extra += 1
                continue
            if n not in self.runs:
                if n not in self.damaged_runs:
                    self.entry_problem("versions", k, f"belongs to no run (run number #{n})")
                continue
            if data is not None and data:
                self.entry_problem("versions", k, f"holds {len(data)} bytes, not none")
            if k in self.want_versions:
                self.want_versions.discard(k)
            elif (n, cid) not in self.unread_deltas:
                what = (f"checkpoint {cid} does not start a kept block" if not key else
                        f"checkpoint {cid} of {self.runs[n].name!r} did not change this key")
                self.entry_problem("versions", k, f"names no change: {what}")
        if extra:
            self.db_problem("versions", f"holds {extra} entries, yet meta has no history "
                            "index marker")
        for k in sorted(self.want_versions):
            parts = version_parts(k)
            assert parts is not None
            what = "the block start" if not parts[1] else "the delta's key"
            self.entry_problem("versions", k, f"is missing: {what} has no version entry")

    def check_objects(self) -> None:
        nodes = []
        parts: set[bytes] = set()  # keys of the parts the heads read so far name
        for k, raw in self.scan("objects"):
            self.checked["objects"] += 1
            if len(k) == 10:  # a part of a record stored in parts (read with its head)
                if k not in parts:
                    self.unseal("objects", k, raw)
                    self.entry_problem("objects", k, "a part of no object")
                continue
            if len(k) != 8:
                self.entry_problem("objects", k, "key is not an address")
                continue
            addr = _U64.unpack(k)[0]
            self.addrs.add(addr)
            head = self.unseal("objects", k, raw)
            if head is None:
                continue
            split = object_split(head)
            if split is not None:
                parts.update(k + _U16.pack(i) for i in range(1, max(split[1], 0) + 1))
                found_record = self.fetch_object(addr)[1]
            else:
                found_record = self.object_record(k, head)
            if found_record is None:
                continue
            data = found_record
            try:
                kids = history.children(data)
            except CodecError as exc:
                self.entry_problem("objects", k, str(exc))
                continue
            for child in kids:
                self.found_refs[child] += 1
            oid = hashlib.sha256(data).digest()
            present, found = self.fetch("oids", oid)
            if not present:
                self.entry_problem("objects", k, "its SHA-256 has no entry in oids (the record "
                                   "changed, or its id was lost)")
            elif found is not None and found != k:
                self.entry_problem("objects", k, f"oids maps its SHA-256 to "
                                   f"{self.key_text('objects', found)}")
            if history.is_node(data):
                nodes.append((k, addr, kids))
        for k, addr, kids in nodes:
            missing = [c for c in kids if c not in self.addrs]
            if missing:
                self.entry_problem("objects", k, f"names missing objects {missing[:5]}")
                continue
            if addr in self.nodes_ok:  # rebuilt and checked with a delta that names it
                continue
            try:
                history.check_node(self.objs, addr)
            except _Damaged:
                continue
            except CodecError as exc:
                self.entry_problem("objects", k, str(exc))
        for addr in sorted(set(self.found_refs) - self.addrs):
            self.db_problem("objects", f"object @{addr} is referenced "
                            f"{self.found_refs[addr]} times but missing")

    def check_refs(self) -> None:
        counted: set[int] = set()
        for k, raw in self.scan("refs"):
            data = self.unseal("refs", k, raw)
            if len(k) != 8:
                self.entry_problem("refs", k, "key is not an address")
                continue
            addr = _U64.unpack(k)[0]
            counted.add(addr)
            if addr not in self.addrs:
                self.entry_problem("refs", k, "counts references to an object that does "
                                   "not exist")
                continue
            if data is None:
                continue
            if len(data) != 8:
                self.entry_problem("refs", k, f"is {len(data)} bytes, not 8")
                continue
            n, found = _U64.unpack(data)[0], self.found_refs[addr]
            if n != found:
                self.entry_problem("refs", k, f"counts {n} references; {found} were found "
                                   "(delta and manifest entries, list nodes)")
            elif n == 0:
                self.entry_problem("refs", k, "nothing references the object (it should "
                                   "have been freed)")
        for addr in sorted(self.addrs - counted):
            self.entry_problem("objects", _U64.pack(addr), "has no reference count in refs")

    def check_oids(self) -> None:
        for k, raw in self.scan("oids"):
            data = self.unseal("oids", k, raw)
            if data is None:
                continue
            if len(k) != 32 or len(data) != 8:
                self.entry_problem("oids", k, "is not a 32-byte id naming an 8-byte address")
                continue
            addr = _U64.unpack(data)[0]
            present, record = self.fetch_object(addr)
            if not present:
                self.entry_problem("oids", k, f"names object @{addr}, which does not exist")
            elif record is not None and hashlib.sha256(record).digest() != k:
                self.entry_problem("oids", k, f"names object @{addr}, whose SHA-256 differs")

    def check_effects(self) -> None:
        # With the index marker, every entry has its run and status rows (format 2).
        indexed = self.fetch("meta", EFFECTS_INDEX)[0]
        for k, raw in self.scan("effects"):
            self.checked["effect_entries"] += 1
            data = self.unseal("effects", k, raw)
            if data is None:
                continue
            kind = k[:1]
            try:
                if kind == b"k":
                    entry = decode_entry(data)
                    if entry.key.encode() != k[1:]:
                        self.entry_problem("effects", k, f"entry has key {entry.key!r}")
                    elif indexed:
                        for row in index_keys(entry.run, STATUSES.index(entry.status),
                                              entry.key):
                            if not self.fetch("effects", row)[0]:
                                self.entry_problem("effects", k, "the entry is missing from "
                                                   f"the {'run' if row[:1] == b'r' else 'status'}"
                                                   " index")
                elif kind == b"p":
                    # A position row may outlive its entry (expired) or name an entry a
                    # business key moved elsewhere: only its own shape is checked.
                    pos = loads(k[1:])
                    if not (isinstance(pos, list) and len(pos) == 3
                            and isinstance(pos[0], str) and _int(pos[1]) and _int(pos[2])):
                        raise CodecError("position row is not [run, checkpoint, ordinal]")
                    data.decode("utf-8")
                elif kind == b"q" and len(k) == 13:
                    order = (_U64.unpack_from(k, 1)[0], _U32.unpack_from(k, 9)[0])
                    e = self.effect_index(k, data)
                    if e is not None and e.order != order:
                        self.entry_problem("effects", k, f"names ledger entry {e.key!r}, "
                                           "whose outbox order differs")
                elif kind in (b"r", b"s") and len(k) == (25 if kind == b"r" else 26):
                    e = self.effect_index(k, data)
                    if e is not None and k not in index_keys(
                            e.run, STATUSES.index(e.status), e.key):
                        self.entry_problem("effects", k, f"names ledger entry {e.key!r}, "
                                           f"whose {'run' if kind == b'r' else 'status'} "
                                           "differs")
                else:
                    self.entry_problem("effects", k, "an entry the ledger never writes")
            except (CodecError, UnicodeDecodeError) as exc:
                self.entry_problem("effects", k, str(exc))

    def effect_index(self, k: bytes, target: bytes) -> EffectRecord | None:
        """The ledger entry an outbox-order or index row names (it must exist), if readable."""
        present, data = self.fetch("effects", b"k" + target)
        if not present:
            self.entry_problem("effects", k, f"names ledger entry {target!r}, which is missing")
            return None
        return None if data is None else decode_entry(data)

    def folded_hash(self, run: str, cid: int) -> bytes | None:
        """The hash the snapshot stores for ``run``/``cid``, if it has one."""
        n = self.run_nos.get(run)
        if self.src is None or n is None:
            return None
        k = _U64.pack(n) + _U64.pack(cid)
        _present, data = self.fetch("ckpt", k)
        obj = None if data is None else self.decode("ckpt", k, data)
        if isinstance(obj, list) and len(obj) >= 6 and isinstance(obj[5], bytes):
            return obj[5]
        return None
