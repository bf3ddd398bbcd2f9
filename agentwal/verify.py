"""Verifying a store: every checksum, every hash chain, every cross-reference.

Theory of operation: :func:`verify` is a pure function from what the store
holds (the raw, sealed entries of the snapshot's databases through the small
:class:`Source` protocol, the WAL segments as bytes, the store id) to a
:class:`VerifyReport`. It trusts no checked accessor: it reads every entry
of every database itself, so one damaged entry is reported with its place
(database and key, or file and offset) and the rest is still checked. It
raises nothing for damage; every finding is a :class:`Problem`.

What is checked, database by database (``docs/history.md`` has the table):

- every LMDB value's seal (CRC-32 of key and value), and that it decodes to
  the documented shape;
- ``meta``: sizes, the store id against ``CONTROL``;
- ``runs`` against ``ckpt``/``state``: head exists, head hash, checkpoint
  count, the state entries' count and CRC digest;
- each run's **hash chain**: for every checkpoint, ``chain_hash(parent's
  hash, its fields, sha256(raw delta), outbox digest)`` equals its stored
  hash. The raw delta is rebuilt from the history delta (``{key: ref}``):
  each ref resolves to the exact value bytes committed, in the order
  committed, and ``cbor2`` re-encodes a ``{str: bytes | None}`` map to the
  very bytes the committer hashed (``codec.encode_delta`` is that same
  ``cbor2.dumps``), so a delta that rebuilds to other keys, values or order
  breaks the chain. The outbox's digest is kept in the checkpoint record;
- each manifest equals the replay of the deltas before it, and the head
  state (the ``state`` fast path) equals the replay of the head checkpoint;
- every object: its id in ``oids`` is the SHA-256 of its record, its
  children exist, a list node rebuilds to its length and SHA-256; every
  reference count equals the references found (delta entries, manifest
  entries, node children); no entry of ``delta``, ``manifest``, ``state``,
  ``ckpt``, ``refs`` or ``oids`` belongs to nothing;
- the effects ledger's entries decode, and its index rows name entries;
- the WAL: every segment's header, every frame's CRC, LSNs continuous across
  segments from the snapshot's ``applied_lsn`` on, every record decodes, and
  every commit record's hash is recomputed from its own bytes (folded ones
  must equal the snapshot's checkpoint).

A torn tail of the last segment after ``limit`` (the last LSN published
when the view was taken) is not a problem: a write in progress, or the end
of a write a crash interrupted, which a writer's open zeroes. Anything
before it is.

This module never touches a file: :func:`read_wal` reads the segments
through the I/O seam, and the store hands over an LMDB read transaction.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import cbor2

from . import history
from .codec import (
    CodecError,
    chain_hash,
    checkpoint_hash,
    decode_commit,
    decode_delta,
    decode_meta,
    loads,
    unpack_payload,
)
from .control import read_control
from .effects import EffectRecord, decode_entry, decode_outbox
from .errors import CorruptionError
from .format import (
    CONTROL_FILE,
    REC_COMMIT,
    REC_EFFECT,
    SNAPSHOT_DIR,
    WAL_DIR,
    parse_segment_name,
)
from .io import FileSystem, read_all
from .snapshot import unseal
from .wal import scan_segment
from .wal.frame import parse_header

__all__ = ["Problem", "Source", "VerifyReport", "WalFile", "check_control", "read_wal",
           "verify"]

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_ZERO_HASH = bytes(32)
LMDB_FILE = os.path.join(SNAPSHOT_DIR, "data.mdb")
_META_SIZES = {b"applied_lsn": 8, b"store_id": 16, b"next_run": 8, b"log_pos": 16}
#: Object records kept in memory while verifying (read again when evicted).
CACHE_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing ``verify`` found wrong, and where.

    Attributes:
        where: the place in words: ``"snapshot/data.mdb ckpt['chat'/5]"``,
            ``"wal/00000000000000000001.wal @ 4242"``, ``"CONTROL"``.
        what: what is wrong.
        file: the file, relative to the store directory.
        db: the LMDB database (``state``, ``ckpt``, ``objects`` ...), if any.
        key: the entry's key in words (``'chat'/5``, ``@17``), if any.
        offset: the byte offset in ``file``, when known.
    """

    where: str
    what: str
    file: str
    db: str | None = None
    key: str | None = None
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What ``store.verify()`` checked and found.

    Attributes:
        ok: True when nothing is wrong (``problems`` is empty).
        problems: each damaged or inconsistent thing with its location.
        checked: how many of each thing were checked (``lmdb_entries``,
            ``checkpoints``, ``hashes``, ``objects``, ``wal_records`` ...).
        notes: things worth knowing that are not damage (a torn WAL tail
            after the last acknowledged record, a segment removed meanwhile).
    """

    ok: bool
    problems: list[Problem]
    checked: dict[str, int]
    notes: list[str] = field(default_factory=list)


class Source(Protocol):
    """The raw (sealed) entries of the snapshot's databases, as of one read transaction.

    Both methods raise ``CorruptionError`` when the database itself cannot
    be read (damaged LMDB structure).
    """

    def entries(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(key, sealed value)`` in key order, only keys starting with ``prefix``."""
        ...

    def get(self, db: str, key: bytes) -> bytes | None:
        """The sealed value stored under ``key``, or None."""
        ...


@dataclass(frozen=True, slots=True)
class WalFile:
    """A WAL segment as read for verification: its name and bytes (None: it vanished)."""

    name: str
    data: bytes | None
    error: str = ""


def read_wal(fs: FileSystem, wal_dir: str) -> list[WalFile]:
    """Every segment file in ``wal_dir`` (named like one), in LSN order, read whole.

    A segment removed between the listing and the read (a fold of another
    process) has ``data`` None; a file that cannot be read has ``error``.
    """
    if not fs.exists(wal_dir):
        return []
    names = [n for n in fs.listdir(wal_dir) if parse_segment_name(n) is not None]
    out = []
    for name in sorted(names, key=lambda n: parse_segment_name(n) or 0):
        try:
            out.append(WalFile(name, read_all(fs, os.path.join(wal_dir, name))))
        except FileNotFoundError:
            out.append(WalFile(name, None))
        except OSError as exc:
            out.append(WalFile(name, None, exc.strerror or str(exc)))
    return out


def check_control(fs: FileSystem, store: str, store_id: uuid.UUID) -> list[Problem]:
    """Problems of ``CONTROL``: damaged, unreadable, or naming another store."""
    try:
        ctl = read_control(fs, store)
    except CorruptionError as exc:
        return [Problem(CONTROL_FILE, exc.reason, CONTROL_FILE, offset=exc.offset)]
    except OSError as exc:
        return [Problem(CONTROL_FILE, f"cannot be read: {exc.strerror or exc}", CONTROL_FILE)]
    if ctl is None:
        return [Problem(CONTROL_FILE, "is missing", CONTROL_FILE)]
    if ctl.store_id != store_id:
        return [Problem(CONTROL_FILE, f"names store {ctl.store_id}; the store opened as "
                        f"{store_id}", CONTROL_FILE)]
    return []


def verify(src: Source | None, wal: list[WalFile], *, store_id: uuid.UUID, limit: int,
           problems: list[Problem] | None = None) -> VerifyReport:
    """Check a store's snapshot and log; returns every problem found.

    Args:
        src: the snapshot's raw entries (None: the snapshot could not be
            read at all; ``problems`` should say why).
        wal: the WAL segments (:func:`read_wal`).
        store_id: the store's id (from ``CONTROL``).
        limit: an LSN acknowledged before ``wal`` was read (the last one,
            for the writer): damage at or before it is a problem even at the
            tail of the log; after it, a torn tail is a write in progress.
        problems: problems already found by the caller (``CONTROL``).

    Returns:
        A :class:`VerifyReport`.
    """
    v = _Verifier(src, store_id)
    v.problems.extend(problems or [])
    if src is not None:
        v.check_snapshot()
    v.check_wal(wal, limit)
    return VerifyReport(not v.problems, v.problems, dict(sorted(v.checked.items())), v.notes)


# -- the verifier -----------------------------------------------------------------------


@dataclass
class _Run:
    """A run record as found in ``runs``."""

    name: str
    head: int
    head_hash: bytes
    count: int
    keys: int
    digest: int


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


class _Damaged(CodecError):
    """An object needed is damaged: reported once, at the object, not at each user."""


class _Objects:
    """``history.Objects`` (reads only) over the verifier's sealed reads.

    Keeps the records it read, up to :data:`CACHE_BYTES`, least recently used
    first out: a list's leaves are read once per version of the list
    otherwise (every delta of a growing ``messages`` list names all of them).
    """

    def __init__(self, v: _Verifier) -> None:
        self._v = v
        self._cache: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._bytes = 0

    def get(self, addr: int) -> bytes | None:
        found = self._cache.get(addr)
        if found is not None:
            self._cache.move_to_end(addr)
            return found
        present, data = self._v.fetch("objects", _U64.pack(addr))
        if present and data is None:
            raise _Damaged(f"object @{addr} is damaged")
        if data is not None:
            self._cache[addr] = data
            self._bytes += len(data)
            while self._bytes > CACHE_BYTES:
                self._bytes -= len(self._cache.popitem(last=False)[1])
        return data

    def find(self, oid: bytes) -> int | None:
        raise NotImplementedError  # verify never adds objects

    def add(self, oid: bytes, record: bytes) -> int:
        raise NotImplementedError

    def delete(self, addr: int, oid: bytes) -> None:
        raise NotImplementedError

    def count(self, addr: int) -> int:
        raise NotImplementedError

    def set_count(self, addr: int, n: int) -> None:
        raise NotImplementedError


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _Verifier:
    def __init__(self, src: Source | None, store_id: uuid.UUID) -> None:
        self.src = src
        self.store_id = store_id
        self.problems: list[Problem] = []
        self.notes: list[str] = []
        self.checked: collections.Counter[str] = collections.Counter()
        self._flagged: set[tuple[str, bytes]] = set()  # entries with a problem reported
        self.applied = 0
        self.next_run: int | None = None
        self.runs: dict[int, _Run] = {}
        self.run_nos: dict[str, int] = {}
        self.damaged_runs: set[int] = set()  # run numbers of damaged run records
        self.objs = _Objects(self)
        self.found_refs: collections.Counter[int] = collections.Counter()
        self.addrs: set[int] = set()
        self.nodes_ok: set[int] = set()  # list nodes already rebuilt and checked

    # -- reporting ----------------------------------------------------------------

    def key_text(self, db: str, key: bytes) -> str:
        """An entry's key in words."""
        if db in ("ckpt", "delta", "manifest") and len(key) == 16:
            n, cid = _U64.unpack_from(key)[0], _U64.unpack_from(key, 8)[0]
            run = self.runs.get(n)
            return f"{run.name!r}/{cid}" if run else f"run #{n}/{cid}"
        if db == "state" and len(key) > 8:
            n = _U64.unpack_from(key)[0]
            run = self.runs.get(n)
            k = key[8:].decode("utf-8", "replace")
            return f"{run.name!r}/{k!r}" if run else f"run #{n}/{k!r}"
        if db in ("objects", "refs") and len(key) == 8:
            return f"@{_U64.unpack(key)[0]}"
        if db == "oids":
            return key.hex()[:16]
        if db in ("meta", "runs"):
            return repr(key.decode("utf-8", "replace"))
        if db == "effects" and key[:1] == b"k":
            return f"k {key[1:].decode('utf-8', 'replace')!r}"
        if db == "effects" and key[:1] == b"q" and len(key) == 13:
            return f"q {_U64.unpack_from(key, 1)[0]}/{_U32.unpack_from(key, 9)[0]}"
        return key.hex()

    def entry_problem(self, db: str, key: bytes, what: str) -> None:
        """Report a problem with one LMDB entry (only the first for each entry)."""
        if (db, key) in self._flagged:
            return
        self._flagged.add((db, key))
        text = self.key_text(db, key)
        self.problems.append(Problem(f"{LMDB_FILE} {db}[{text}]", what, LMDB_FILE, db, text))

    def db_problem(self, db: str, what: str) -> None:
        self.problems.append(Problem(f"{LMDB_FILE} {db}", what, LMDB_FILE, db))

    def wal_problem(self, name: str, offset: int | None, what: str) -> None:
        rel = os.path.join(WAL_DIR, name)
        where = rel if offset is None else f"{rel} @ {offset}"
        self.problems.append(Problem(where, what, rel, offset=offset))

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

    def check_snapshot(self) -> None:
        self.check_meta()
        self.check_runs()
        damaged = self.check_state()
        self.check_checkpoints(damaged)
        self.check_history_records("delta")
        self.check_history_records("manifest")
        self.check_objects()
        self.check_refs()
        self.check_oids()
        self.check_effects()

    def check_meta(self) -> None:
        seen: dict[bytes, bytes] = {}
        for k, raw in self.scan("meta"):
            data = self.unseal("meta", k, raw)
            if data is None:
                continue
            want = _META_SIZES.get(k)
            if want is None:
                self.entry_problem("meta", k, "an entry the snapshot never writes")
            elif len(data) != want:
                self.entry_problem("meta", k, f"is {len(data)} bytes, not {want}")
            else:
                seen[k] = data
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
            if not (isinstance(obj, list) and len(obj) == 6
                    and all(_int(obj[i]) for i in (0, 1, 3, 4, 5))
                    and isinstance(obj[2], bytes) and len(obj[2]) == 32):
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
            self.runs[n] = _Run(name, obj[1], obj[2], obj[3], obj[4], obj[5])
            self.run_nos[name] = n
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
                loads(value)
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
        ok = (isinstance(obj, list) and len(obj) in (7, 8) and _int(obj[0])
              and (obj[1] is None or _int(obj[1])) and _int(obj[2])
              and isinstance(obj[3], (int, float)) and isinstance(obj[4], bytes)
              and isinstance(obj[5], bytes) and len(obj[5]) == 32
              and (obj[6] is None or (isinstance(obj[6], list) and len(obj[6]) == 2
                                      and isinstance(obj[6][0], str) and _int(obj[6][1])))
              and (len(obj) == 7 or obj[7] is None
                   or (isinstance(obj[7], bytes) and len(obj[7]) == 32)))
        if not ok:
            self.entry_problem("ckpt", k, "checkpoint record is malformed")
            return None
        c = _Ckpt(obj[0], obj[1], obj[2], float(obj[3]), obj[4], obj[5],
                  (obj[6][0], obj[6][1]) if obj[6] is not None else None,
                  obj[7] if len(obj) == 8 else None)
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
        for cid in range(1, top + 1):
            key = base + _U64.pack(cid)
            c = ckpts.get(cid)
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
            else:
                history.apply_delta(refs, delta)
            if c is not None and delta is not None and prev_hash is not None:
                self.check_hash(run, key, c, delta, prev_hash)
            prev_hash = c.hash if c is not None else None
            if history.is_manifest(cid):
                refs, replayed = self.check_manifest(key, cid, refs, replayed)
        head = ckpts.get(run.head)
        if head is not None and head.hash != run.head_hash:
            self.entry_problem("runs", run.name.encode(), f"head hash differs from that of "
                               f"checkpoint {run.head}")
        if replayed and compare_state:
            self.compare_state(n, run, refs)

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
                       replayed: bool) -> tuple[dict[str, history.Ref], bool]:
        """Compare the manifest at ``cid`` with the replay; returns the state to go on from."""
        present, data = self.fetch("manifest", key)
        if not present:
            self.entry_problem("manifest", key, f"is missing: checkpoint {cid} is a multiple "
                               f"of {history.MANIFEST_EVERY}")
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
            elif not 1 <= cid <= run.head or (manifest and not history.is_manifest(cid)):
                self.entry_problem(db, k, f"belongs to no checkpoint of {run.name!r} (head "
                                   f"{run.head})")
            for ref in (refs or {}).values():
                if isinstance(ref, tuple):
                    self.found_refs[ref[1]] += 1

    def check_objects(self) -> None:
        nodes = []
        for k, raw in self.scan("objects"):
            self.checked["objects"] += 1
            if len(k) != 8:
                self.entry_problem("objects", k, "key is not an address")
                continue
            addr = _U64.unpack(k)[0]
            self.addrs.add(addr)
            data = self.unseal("objects", k, raw)
            if data is None:
                continue
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
            present, record = self.fetch("objects", data)
            if not present:
                self.entry_problem("oids", k, f"names object @{addr}, which does not exist")
            elif record is not None and hashlib.sha256(record).digest() != k:
                self.entry_problem("oids", k, f"names object @{addr}, whose SHA-256 differs")

    def check_effects(self) -> None:
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
                else:
                    self.entry_problem("effects", k, "an entry the ledger never writes")
            except (CodecError, UnicodeDecodeError) as exc:
                self.entry_problem("effects", k, str(exc))

    def effect_index(self, k: bytes, target: bytes) -> EffectRecord | None:
        """The ledger entry an outbox-order row names (it must exist), if readable."""
        present, data = self.fetch("effects", b"k" + target)
        if not present:
            self.entry_problem("effects", k, f"names ledger entry {target!r}, which is missing")
            return None
        return None if data is None else decode_entry(data)

    # -- the log ------------------------------------------------------------------------

    def lmdb_hash(self, run: str, cid: int) -> bytes | None:
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

    def check_wal(self, wal: list[WalFile], limit: int) -> None:
        live = [w for w in wal if w.data is not None]
        for w in wal:
            if w.error:
                self.wal_problem(w.name, None, f"cannot be read: {w.error}")
            elif w.data is None:
                self.notes.append(f"{WAL_DIR}/{w.name} was removed while verifying (a fold)")
        firsts = [parse_segment_name(w.name) or 0 for w in live]
        if self.applied and not live and not any(w.data is None for w in wal):
            self.problems.append(Problem(WAL_DIR, f"the log is missing: the snapshot covers "
                                         f"LSN {self.applied} but no segment remains", WAL_DIR))
        hashes: dict[tuple[str, int], bytes] = {}
        expected: int | None = None
        for i, w in enumerate(live):
            assert w.data is not None
            self.checked["wal_segments"] += 1
            self.checked["wal_bytes"] += len(w.data)
            stale = any(f <= self.applied + 1 for f in firsts[i + 1:])
            header = parse_header(w.data)
            if isinstance(header, str):
                self.wal_problem(w.name, 0, header)
                expected = None
                continue
            if header.first_lsn != firsts[i]:
                self.wal_problem(w.name, 40, f"header says first LSN {header.first_lsn}")
            if header.store_id != self.store_id:
                self.wal_problem(w.name, 16, f"segment belongs to store {header.store_id}")
            if not stale:
                start = self.applied + 1 if expected is None else max(expected,
                                                                      self.applied + 1)
                if header.first_lsn > start:
                    self.wal_problem(w.name, 0, f"log records {start}..{header.first_lsn - 1} "
                                     "are missing")
            scan = scan_segment(w.data, header)
            for f in scan.frames:
                self.check_record(w.name, f, hashes)
            expected = scan.next_lsn
            if scan.state == "clean":
                continue
            last = i == len(live) - 1
            if last and scan.next_lsn > limit:
                self.notes.append(f"{WAL_DIR}/{w.name}: torn tail at offset {scan.end} after "
                                  f"the last acknowledged record (a write in progress, or one a "
                                  f"crash interrupted; a writer's open zeroes it)")
            else:
                self.wal_problem(w.name, scan.end, scan.reason + (
                    "" if last else " (the segment was complete before the next one began)"))

    def check_record(self, name: str, f: Any, hashes: dict[tuple[str, int], bytes]) -> None:
        """Decode one frame and recompute a commit's hash."""
        self.checked["wal_records"] += 1
        try:
            if f.type == REC_EFFECT:
                decode_entry(unpack_payload(f.payload, f.flags))
                return
            if f.type != REC_COMMIT:
                raise CodecError(f"unknown record type {f.type}")
            rec = decode_commit(f.payload)
            decode_meta(rec.meta)
            raw = unpack_payload(rec.delta, f.flags)
            decode_delta(raw, 0)
            if rec.deferred is not None:
                decode_outbox(rec.deferred)
        except CodecError as exc:
            self.wal_problem(name, f.offset, f"record LSN {f.lsn}: {exc}")
            return
        if rec.id != (rec.parent or 0) + 1:
            self.wal_problem(name, f.offset, f"record LSN {f.lsn}: checkpoint {rec.id} has "
                             f"parent {rec.parent}")
        parent_hash: bytes | None = _ZERO_HASH
        if rec.parent is not None:
            parent_hash = hashes.get((rec.run, rec.parent)) or self.lmdb_hash(rec.run, rec.parent)
        if parent_hash is None:
            self.checked["wal_hashes_unchecked"] += 1
        else:
            self.checked["wal_hashes"] += 1
            want = checkpoint_hash(parent_hash, rec.run, rec.id, rec.parent, rec.created_at,
                                   rec.meta, rec.origin, hashlib.sha256(raw).digest(),
                                   rec.deferred)
            if want != rec.hash:
                self.wal_problem(name, f.offset, f"record LSN {f.lsn} ({rec.run!r}/{rec.id}): "
                                 "hash chain broken: its hash is not that of its parent, "
                                 "fields and delta")
        if f.lsn <= self.applied:
            folded = self.lmdb_hash(rec.run, rec.id)
            if folded is not None and folded != rec.hash:
                self.wal_problem(name, f.offset, f"record LSN {f.lsn} ({rec.run!r}/{rec.id}) "
                                 "differs from the checkpoint the snapshot holds")
        hashes[(rec.run, rec.id)] = rec.hash
