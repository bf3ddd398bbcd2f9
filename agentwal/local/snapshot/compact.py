"""Compaction: dropping old checkpoints in one write transaction (planned by retention).

Theory of operation: ``retention.py`` decides which checkpoints of a run
stay (``choose``) and what dropping the others takes (``plan_run``); this
module carries the plan out inside the caller's write transaction: new
manifests first (they retain what the drops release), then the parent hash
on each kept checkpoint whose parent goes (the chain stays checkable, and a
gap in the ids is told apart from damage), then each dropped checkpoint's
record, delta (with its ``versions`` entries) and manifest, releasing their
references (an object left with none is deleted). A fork's origin is kept in the run record once its
first checkpoint goes. A crash before the commit leaves LMDB as it was.
"""

from __future__ import annotations

from typing import Any

import cbor2

from ... import failpoints, history, retention
from ...codec import CodecError
from ...types import Progress
from .layout import U64, RunInfo, seal, version_key
from .objects import CountingObjects
from .writer import FoldWriter

__all__ = ["Compactor"]


class Compactor(FoldWriter):
    """A fold writer that also drops old checkpoints."""

    def compact(self, runs: list[str] | None, *, keep_last: int | None, cutoff: float | None,
                keep_origins: bool, origins: set[tuple[str, int]] | None,
                progress: Progress | None = None) -> retention.Tally:
        """Drop what the retention rules allow from ``runs`` (None: every folded run)."""
        tally = retention.Tally()
        if not self.history_indexed():
            self._index_history()
        protected: dict[str, set[int]] = {}
        pairs = set(origins or ())  # kept whatever keep_origins says
        if keep_origins:
            pairs |= self._fork_origins()
        for run, cid in pairs:
            protected.setdefault(run, set()).add(cid)
        chosen = self.runs() if runs is None else runs
        for i, run in enumerate(chosen):
            if progress is not None:
                progress("runs", i, len(chosen))
            info = self.run_info(run)
            if info is None or (keep_last is not None and info.head <= keep_last):
                continue  # every id is among the last keep_last: nothing to drop
            self._compact_run(run, info, tally, keep_last=keep_last,
                              cutoff=cutoff, protected=protected.get(run, set()))
        if progress is not None:
            progress("runs", len(chosen), len(chosen))
        failpoints.hit("compact_before_commit")
        return tally

    def _fork_origins(self) -> set[tuple[str, int]]:
        """Every ``(run, id)`` a folded fork started from."""
        out: set[tuple[str, int]] = set()
        for run in self.runs():
            info = self.run_info(run)
            if info is None:
                continue
            if info.origin is not None:
                out.add(info.origin)
                continue
            first = self.checkpoint(run, info.number, 1)
            if first is not None and first.origin is not None:
                out.add(first.origin)
        return out

    def _compact_run(self, run: str, info: RunInfo, tally: retention.Tally, *,
                     keep_last: int | None, cutoff: float | None, protected: set[int]) -> None:
        """Carry out the plan for one run (new manifests, parent hashes, then the drops)."""
        prefix = U64.pack(info.number)
        recs: dict[int, list[Any]] = {}
        with self._reading(f"checkpoints of {run!r}"):
            for k, raw in self._prefixed(self._ckpt, prefix):
                obj = self._load(k, raw, f"checkpoint of {run!r}")
                recs[self._ckpt_from(run, obj).id] = obj
        ids = sorted(recs)
        keep = retention.choose([(c, float(recs[c][3])) for c in ids], keep_last=keep_last,
                                cutoff=cutoff, protected=protected)
        if len(keep) == len(ids):
            return
        manifests = {U64.unpack_from(k, 8)[0]
                     for k, _raw in self._prefixed(self._manifest, prefix)}
        plan = retention.plan_run(ids, keep, manifests)
        objs = CountingObjects(self, tally)
        try:
            for c in plan.manifests:  # first: they retain what the drops release
                refs = self._refs_at(run, info.number, c)
                for ref in refs.values():
                    history.retain(objs, ref)
                k = prefix + U64.pack(c)
                sealed = seal(k, history.encode_refs(refs))
                self._txn.put(k, sealed, db=self._manifest)
                tally.manifests_written += 1
                tally.bytes_written += len(sealed)
            for c in plan.orphans:  # [..., origin, outbox digest, parent hash, appends]
                self._put_versions(info.number, c, [""])  # a block starts here
                k = prefix + U64.pack(c)
                outbox = recs[c][7] if len(recs[c]) > 7 else None
                sealed = seal(k, cbor2.dumps([*recs[c][:7], outbox, recs[c - 1][5],
                                              *recs[c][9:]]))
                self._txn.put(k, sealed, db=self._ckpt)
                tally.bytes_written += len(sealed)
            for c in plan.drop:
                k = prefix + U64.pack(c)
                raw = self._txn.get(k, db=self._delta)
                if raw is not None:
                    tally.bytes_freed += len(raw)
                    self._drop_delta(objs, run, info.number, c)  # and its versions
                self._txn.delete(version_key(info.number, b"", c), db=self._versions)
                raw = self._txn.get(k, db=self._manifest)
                if raw is not None:
                    self._drop_history(objs, self._manifest, run, info.number, c, True)
                    tally.bytes_freed += len(raw)
                    self._txn.delete(k, db=self._manifest)
                raw = self._txn.get(k, db=self._ckpt)
                tally.bytes_freed += len(raw)
                self._txn.delete(k, db=self._ckpt)
        except CodecError as exc:
            raise self._corrupt(f"history of {run!r}: {exc}") from None
        origin = info.origin
        if origin is None and 1 in plan.drop and recs[1][6] is not None:
            origin = (recs[1][6][0], recs[1][6][1])  # the run stays a fork of it
        rec: list[Any] = [info.number, info.head, info.head_hash, info.count - len(plan.drop),
                          info.keys, info.digest]
        if origin is not None:
            rec.append(list(origin))
        rk = run.encode()
        self._txn.put(rk, seal(rk, cbor2.dumps(rec)), db=self._runs)
        tally.runs[run] = len(plan.drop)
