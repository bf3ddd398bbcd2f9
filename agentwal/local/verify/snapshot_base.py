"""The snapshot checker's base: the records it decodes and its sealed reads.

Theory of operation: :class:`CheckerBase` holds what every pass of the
snapshot check shares (``snapshot_checks.py`` runs the passes, in the order
its header gives): the run records found (:class:`_Run`), the counters of
references, addresses and list nodes seen, and the reads of one
:class:`~.report.Source` that report damage as they meet it (``scan``,
``unseal``, ``fetch``, ``decode``, ``refs_of``). It reports; it never repairs.
"""

from __future__ import annotations

import abc
import collections
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ... import history
from ...codec import CodecError, loads
from ...errors import CorruptionError
from ..snapshot.layout import CheckpointRecord, object_record, object_split, unseal
from .report import Findings, Source

__all__ = ["CheckerBase"]


_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_ZERO_HASH = bytes(32)


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


#: A decoded checkpoint record (the snapshot layout's own codec).
_Ckpt = CheckpointRecord


class _Damaged(CodecError):
    """An object needed is damaged: reported once, at the object, not at each user."""


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class CheckerBase(Findings, abc.ABC):
    """The state every pass shares, and its reads (``src`` None: there is no snapshot)."""

    def __init__(self, src: Source | None, store_id: uuid.UUID) -> None:
        super().__init__(store_id)
        self.src = src
        self.applied = 0
        self.next_run: int | None = None
        self.runs: dict[int, _Run] = {}
        self.run_nos: dict[str, int] = {}
        self.damaged_runs: set[int] = set()  # run numbers of damaged run records
        self.damaged_run_records = 0  # run records whose seal or shape is bad
        self.orphans: set[int] = set()  # run numbers of no run, reported once (``orphan``)
        self.objs: history.ObjectReader = self.objects()
        self.found_refs: collections.Counter[int] = collections.Counter()
        self.addrs: set[int] = set()
        self.nodes_ok: set[int] = set()  # list nodes already rebuilt and checked
        self.kept: dict[int, set[int]] = {}  # run number -> checkpoint ids stored
        #: run number -> ids that follow checkpoints compaction dropped (they have manifests)
        self.block_starts: dict[int, set[int]] = {}
        #: the store has the versions index (layout 3): its marker is in meta
        self.indexed = False
        #: a layout-4 fold wrote here: nodes and plain leaves need no ``oids`` entry
        self.layout4 = False
        #: the ``versions`` keys the deltas and block starts call for (layout 3)
        self.want_versions: set[bytes] = set()
        #: (run number, key) -> the checkpoint its head entry names as its only version
        #: (layout 4: such a key has no ``versions`` entry)
        self.write_once: dict[tuple[int, str], int] = {}
        #: (run number, id) of deltas that could not be read: their versions are not judged
        self.unread_deltas: set[tuple[int, int]] = set()

    def orphan(self, db: str, k: bytes, n: int) -> None:
        """Report an entry of run number ``n``, which no readable run record has.

        A damaged run record's number is read as well as it can be
        (``damaged_runs``: its entries are that damage, not more). When the
        damage hit the number itself, the run's entries name a number no
        record claims: with a damaged run record about, each such number is
        reported once, as probably that record's, not at every entry.
        """
        if n in self.damaged_runs:
            return
        if self.damaged_run_records:
            if n in self.orphans:
                return
            self.orphans.add(n)
            self.entry_problem(db, k, f"belongs to no run (run number #{n}); a damaged run "
                               "record is probably its run's (its other entries are not "
                               "listed)")
            return
        self.entry_problem(db, k, f"belongs to no run (run number #{n})")

    @abc.abstractmethod
    def objects(self) -> history.ObjectReader:
        """The objects' reader the passes use (``SnapshotChecker``'s keeps a cache)."""

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
        """``(present, record)`` of an object, joined from its parts if it has them (layout 3);
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
