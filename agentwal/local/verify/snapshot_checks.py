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
import struct
import uuid
from collections.abc import Callable

from ... import history
from ...codec import CodecError, decode_value, loads
from ...effects import STATUSES, EffectRecord, decode_entry
from ...types import Progress
from ..snapshot.layout import EFFECTS_INDEX, HISTORY_INDEX, LAYOUT, RunInfo, index_keys
from .chain_checks import ChainChecks
from .object_checks import ObjectChecks
from .snapshot_base import _U32, _U64, _Damaged, _int, _Run

__all__ = ["CACHE_BYTES", "SNAPSHOT_PARTS", "SnapshotChecker"]

#: The parts of verify's ``snapshot`` phase, in order, as its progress names them.
SNAPSHOT_PARTS = ("meta", "runs", "state", "checkpoints (hash chains)", "deltas", "manifests",
                  "versions", "objects", "references", "object ids", "effects")


_META_SIZES = {b"applied_lsn": 8, b"store_id": 16, b"next_run": 8, b"log_pos": 16,
               EFFECTS_INDEX: 8, HISTORY_INDEX: 8, LAYOUT: 8}
#: Object records kept in memory while verifying (read again when evicted).
CACHE_BYTES = 64 << 20

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


class SnapshotChecker(ChainChecks, ObjectChecks):
    """Checks one snapshot (``src`` None: no snapshot to read; only the log is checked).

    The passes are split by concern: the checkpoint chains in
    ``chain_checks.py``, history storage in ``object_checks.py``, the
    shared reads in ``snapshot_base.py``; meta, runs, state and the ledger here.
    """

    def objects(self) -> history.ObjectReader:
        return _Objects(self)

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
            if k == LAYOUT:  # even damaged (reported here): never judge layout-4 objects
                self.layout4 = True  # by layout 3's rules, a report per object
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
                # from being reported as belonging to no run (``orphan``).
                self.damaged_run_records += 1
                with contextlib.suppress(CodecError, IndexError, TypeError):
                    n = loads(raw[4:])[0]
                    if _int(n):
                        self.damaged_runs.add(n)
                continue
            obj = self.decode("runs", k, data)
            if obj is None:
                self.damaged_run_records += 1
                continue
            info = RunInfo.decode(obj)
            # Stricter than a read: no bool for an int, and a whole SHA-256.
            if (info is None or len(info.head_hash) != 32
                    or not all(_int(x) for x in (info.number, info.head, info.count, info.keys,
                                                 info.digest))
                    or (info.origin is not None and not _int(info.origin[1]))):
                self.entry_problem("runs", k, "run record is malformed")
                self.damaged_run_records += 1
                continue
            try:
                name = k.decode("utf-8")
            except UnicodeDecodeError:
                self.entry_problem("runs", k, "run id is not UTF-8")
                continue
            n = info.number
            if n in self.runs:
                self.entry_problem("runs", k, f"run number #{n} is also that of run "
                                   f"{self.runs[n].name!r}")
                continue
            if self.next_run is not None and n >= self.next_run:
                self.entry_problem("runs", k, f"run number #{n} is not below next_run "
                                   f"{self.next_run}")
            if info.head < 1:
                self.entry_problem("runs", k, f"head checkpoint {info.head} is not an id")
            self.runs[n] = _Run(name, info.head, info.head_hash, info.count, info.keys,
                                info.digest, info.origin)
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
                self.orphan("state", k, n)
                continue
            data = self.unseal("state", k, raw)
            if data is None:
                damaged.add(n)
                continue
            try:
                k[8:].decode("utf-8")
                value = history.head_value(self.objs, data)
                decode_value(value)  # a blob (or tree) reference is a value too
                only = history.head_ref(data)[1]
                if only is not None:
                    self.write_once[(n, k[8:].decode("utf-8"))] = only
                    if only > self.runs[n].head:
                        self.entry_problem("state", k, f"names checkpoint {only} as the key's "
                                           "only version, past the run's head")
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

    def folded_value(self, run: str, key: str) -> bytes | None:
        """The value bytes the snapshot's state holds for ``run``/``key`` (None: none, or
        unreadable: the state pass reports that)."""
        n = self.run_nos.get(run)
        if self.src is None or n is None:
            return None
        k = _U64.pack(n) + key.encode()
        _present, data = self.fetch("state", k)
        if data is None:
            return None
        try:
            return history.head_value(self.objs, data)
        except CodecError:
            return None

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
