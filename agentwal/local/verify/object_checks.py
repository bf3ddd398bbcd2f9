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
from ..snapshot.layout import object_split, version_key, version_parts
from .snapshot_base import _U16, _U64, CheckerBase, _Damaged

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

    def check_versions(self) -> None:
        """Every ``versions`` entry names a key of its checkpoint's delta (or a block start),
        and every delta key and block start has its entry (layout 3)."""
        extra = 0
        wanted = set(self.want_versions)
        for (wn, name), once in (self.write_once if self.indexed else {}).items():
            # layout 4: these have no entry
            vk = version_key(wn, name.encode(), once)
            if vk in wanted:
                self.want_versions.discard(vk)
            elif (wn, once) not in self.unread_deltas and once in self.kept.get(wn, ()):
                self.entry_problem("state", _U64.pack(wn) + name.encode(),
                                   f"names checkpoint {once} as the key's only version, whose "
                                   "delta does not hold it")
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
                self.orphan("versions", k, n)  # once per number when a run record is damaged
                continue
            if data is not None and data:
                self.entry_problem("versions", k, f"holds {len(data)} bytes, not none")
            only = self.write_once.get((n, key.decode("utf-8", "replace")))
            if only is not None and only != cid:
                self.entry_problem("versions", k, f"the key's head entry names checkpoint {only} "
                                   "as its only version")
            if k in wanted:  # (a write-once key may have its one entry: salvage writes it)
                self.want_versions.discard(k)
            elif (n, cid) not in self.unread_deltas:
                what = (f"checkpoint {cid} does not start a kept block" if not key else
                        f"checkpoint {cid} of {self.runs[n].name!r} did not change this key")
                self.entry_problem("versions", k, f"names no change: {what}")
        if extra:
            self.db_problem("versions", f"holds {extra} entries, yet meta has no history "
                            "index marker")
        for k in sorted(self.want_versions):
            found = version_parts(k)
            assert found is not None
            what = "the block start" if not found[1] else "the delta's key"
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
            if not self.layout4 and not history.is_node(data) and not history.indexed(data):
                self.entry_problem("objects", k, "is a plain leaf (layout 4) in a snapshot no "
                                   "layout-4 fold wrote")
            elif not present and (history.indexed(data) or not self.layout4):
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
