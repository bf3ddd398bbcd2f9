"""The snapshot check's passes over history storage: deltas, manifests, objects, refs, ids.

Theory of operation: every delta and manifest record is unsealed, decoded
and owned by a known run; every object record decodes and its references
are counted as they are read; the stored reference counts must equal the
counts found; each object id must name the object whose SHA-256 it is. A
damaged object is reported once, at the object (``_Damaged``), not at each
list or delta that names it.
"""

from __future__ import annotations

import hashlib

from ... import history
from ...codec import CodecError
from .snapshot_base import _U64, CheckerBase, _Damaged

__all__ = ["ObjectChecks"]


class ObjectChecks(CheckerBase):
    """The history-storage passes of :class:`~.snapshot_checks.SnapshotChecker`."""

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
                self.orphan(db, k, n)
            elif (not 1 <= cid <= run.head or cid not in self.kept.get(n, (cid,))
                  or (manifest and not history.is_manifest(cid)
                      and cid not in self.block_starts.get(n, ()))):
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
