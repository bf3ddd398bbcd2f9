"""Reading folded history: a run's state at an older checkpoint.

Theory of operation: history is kept as one delta per checkpoint (the refs
of the keys it changed), a ``versions`` index with one entry per key and
checkpoint that changed it, and manifests (every key's ref) only where a
compaction keeps a block start. A state at checkpoint ``cid`` is the nearest
manifest at or before it plus, for each key changed after that manifest, its
latest version's ref (one seek per key in ``versions``). A store written
before the index (format 2) is read through its regular manifests and the
deltas after them. Refs are resolved to value bytes by ``history.py`` over
:class:`~.objects.TxnObjects`. A missing manifest, delta or versions entry
is ``CorruptionError``, never an older state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ... import history
from ...codec import CodecError
from ...errors import CorruptionError
from .base import ReaderBase
from .layout import HISTORY_INDEX, U16, U64, RunInfo, version_key
from .objects import TxnObjects

__all__ = ["HistoryReads"]


class HistoryReads(ReaderBase):
    """The history reads of :class:`~.reader.SnapshotReader`."""

    def _history_record(self, db: Any, run: str, number: int, cid: int,
                        manifest: bool) -> dict[str, history.Ref | None] | None:
        k = U64.pack(number) + U64.pack(cid)
        what = f"{'manifest' if manifest else 'delta'} of checkpoint {run!r}/{cid}"
        data = self._open(k, self._txn.get(k, db=db), what)
        if data is None:
            return None
        try:
            return history.decode_refs(data, manifest=manifest)
        except CodecError as exc:
            raise self._corrupt(f"{what}: {exc}") from None

    def _manifest_before(self, number: int, cid: int) -> int:
        """Id of the run's nearest manifest at or before ``cid`` (0: none)."""
        prefix = U64.pack(number)
        with self._txn.cursor(db=self._manifest) as cur:
            found = cur.prev() if cur.set_range(prefix + U64.pack(cid + 1)) else cur.last()
            if not found:
                return 0
            k = bytes(cur.key())
        if len(k) != 16 or not k.startswith(prefix):
            return 0
        return int(U64.unpack_from(k, 8)[0])

    def history_indexed(self) -> bool:
        """True if the ``versions`` index covers every delta (format 3)."""
        if self._indexed is None:
            k = HISTORY_INDEX
            with self._reading("the history index marker"):
                data = self._open(k, self._txn.get(k, db=self._meta), "the history index marker")
            self._indexed = data is not None and self._versions is not None
        return self._indexed

    def _manifest_refs(self, run: str, number: int, cid: int) -> dict[str, history.Ref]:
        found = self._history_record(self._manifest, run, number, cid, True)
        if found is None:
            raise self._corrupt(f"manifest of checkpoint {run!r}/{cid} is missing")
        return {k: v for k, v in found.items() if v is not None}

    def _delta_refs(self, run: str, number: int, cid: int) -> dict[str, history.Ref | None]:
        delta = self._history_record(self._delta, run, number, cid, False)
        if delta is None:
            raise self._corrupt(f"delta of checkpoint {run!r}/{cid} is missing")
        return delta

    def _refs_at(self, run: str, number: int, cid: int) -> dict[str, history.Ref]:
        """``{key: ref}`` of a run's state at folded checkpoint ``cid`` (0: empty).

        The nearest manifest at or before ``cid``, then, for each key whose
        latest version at or before ``cid`` is newer than it, that version's
        ref from its delta. A store without the index (format 2) is read
        through its regular manifests instead.
        """
        if not self.history_indexed():
            return self._refs_at_manifests(run, number, cid)
        if not cid:
            return {}
        base = self._base_of(run, number, cid)
        refs = self._manifest_refs(run, number, base) if base else {}
        deltas: dict[int, dict[str, history.Ref | None]] = {}
        for key, vid in self._latest_versions(number, cid, base):
            delta = deltas.get(vid)
            if delta is None:
                delta = deltas[vid] = self._delta_refs(run, number, vid)
            if key not in delta:
                raise self._corrupt(f"the versions of {run!r} name key {key!r} at checkpoint "
                                    f"{vid}, whose delta does not hold it")
            ref = delta[key]
            if ref is None:
                refs.pop(key, None)
            else:
                refs[key] = ref
        for key, ref, only in self._write_once(number):
            if base < only <= cid:
                refs[key] = ref
        return refs

    def _write_once(self, number: int) -> Iterator[tuple[str, history.Ref, int]]:
        """``(key, ref, id)`` of each key of run ``number`` whose only version is checkpoint
        ``id`` (its head entry says so, layout 4; it has no ``versions`` entry)."""
        prefix = U64.pack(number)
        with self._txn.cursor(db=self._state) as cur:
            found = cur.set_range(prefix)
            while found:
                k, v = bytes(cur.key()), cur.value()
                if not k.startswith(prefix):
                    return
                if len(v) > 4 and v[4] == history.HEAD_REF:
                    key = k[8:].decode("utf-8", "replace")
                    data = self._open(k, v, f"value of key {key!r}")
                    assert data is not None
                    try:
                        ref, only = history.head_ref(data)
                    except CodecError as exc:
                        raise self._corrupt(f"value of key {key!r}: {exc}") from None
                    if only is not None and ref is not None:
                        yield key, ref, only
                found = cur.next()

    def _base_of(self, run: str, number: int, cid: int) -> int:
        """The manifest a read at ``cid`` starts from (0: none): the nearest at or before it,
        which may not be older than the start of ``cid``'s kept block."""
        base = self._manifest_before(number, cid)
        start = self._version_of(number, b"", cid)  # the block start marker at or before cid
        if start is not None and start > base:
            raise self._corrupt(f"manifest of checkpoint {run!r}/{start} is missing")
        return base

    def _latest_versions(self, number: int, cid: int, after: int) -> Iterator[tuple[str, int]]:
        """``(key, id)`` of each key of run ``number`` whose latest version at or before
        ``cid`` is after ``after`` (a seek per key, so a key's older versions cost nothing)."""
        prefix = U64.pack(number)
        upper = U64.pack(cid + 1)
        with self._txn.cursor(db=self._versions) as cur:
            found = cur.set_range(prefix)
            while found:
                k = bytes(cur.key())
                if not k.startswith(prefix) or len(k) < 18:
                    if k.startswith(prefix):
                        raise self._corrupt(f"a versions entry of run #{number} is malformed")
                    return
                group = k[:10 + U16.unpack_from(k, 8)[0]]
                if len(group) == 10:  # the block start markers: not a key
                    found = cur.set_range(group + b"\xff" * 8)
                    continue
                # the key's first version after cid (or the next key's), then the one before
                at = cur.prev() if cur.set_range(group + upper) else cur.last()
                if at:
                    k = bytes(cur.key())
                    self._open(k, cur.value(), "a versions entry")
                    if len(k) == len(group) + 8 and k.startswith(group):
                        vid = int(U64.unpack_from(k, len(group))[0])
                        if after < vid <= cid:
                            yield group[10:].decode("utf-8", "replace"), vid
                found = cur.set_range(group + b"\xff" * 8)

    def _version_of(self, number: int, key: bytes, cid: int) -> int | None:
        """Id of the latest version of ``key`` at or before ``cid`` (None: none)."""
        group = version_key(number, key, 0)[:-8]
        with self._txn.cursor(db=self._versions) as cur:
            at = cur.prev() if cur.set_range(group + U64.pack(cid + 1)) else cur.last()
            if not at:
                return None
            k = bytes(cur.key())
            if len(k) != len(group) + 8 or not k.startswith(group):
                return None
            self._open(k, cur.value(), "a versions entry")
            return int(U64.unpack_from(k, len(group))[0])

    def _ref_of(self, run: str, number: int, cid: int, key: str) -> history.Ref | None:
        """The ref of ``key`` in a run's state at folded checkpoint ``cid`` (None: absent)."""
        if not self.history_indexed():
            return self._refs_at_manifests(run, number, cid).get(key)
        k = U64.pack(number) + key.encode()
        data = self._open(k, self._txn.get(k, db=self._state), f"value of key {key!r}")
        if data is not None:
            try:
                ref, only = history.head_ref(data)
            except CodecError as exc:
                raise self._corrupt(f"value of key {key!r}: {exc}") from None
            if only is not None:  # its one version (layout 4)
                return ref if only <= cid else None
        base = self._base_of(run, number, cid)
        vid = self._version_of(number, key.encode(), cid)
        if vid is not None and vid > base:
            delta = self._delta_refs(run, number, vid)
            if key not in delta:
                raise self._corrupt(f"the versions of {run!r} name key {key!r} at checkpoint "
                                    f"{vid}, whose delta does not hold it")
            return delta[key]
        return self._manifest_refs(run, number, base).get(key) if base else None

    def _refs_at_manifests(self, run: str, number: int, cid: int) -> dict[str, history.Ref]:
        """:meth:`_refs_at` of a store without the versions index (format 2): the regular
        manifest at or before ``cid`` plus at most ``MANIFEST_EVERY - 1`` deltas."""
        base = self._manifest_before(number, cid) if cid else 0
        # The regular manifest is kept with its checkpoint, so a nearer one than
        # it can only be a compaction's; a farther one means it is missing.
        if history.manifest_base(cid) > base:
            base = history.manifest_base(cid)
        refs = self._manifest_refs(run, number, base) if base else {}
        for i in range(base + 1, cid + 1):
            history.apply_delta(refs, self._delta_refs(run, number, i))
        return refs

    def state_at(self, run: str, info: RunInfo, cid: int, key: str | None = None,
                 damaged: dict[str, str] | None = None) -> dict[str, bytes]:
        """``{key: value bytes}`` of a run at folded checkpoint ``cid`` (only ``key`` if given).

        Rebuilt from the nearest manifest at or before ``cid`` and the latest
        version of each key changed after it (:meth:`_refs_at`); one key costs
        one seek and its delta. With ``damaged`` (salvage),
        a value whose objects are missing or damaged is left out and named
        there with the reason, instead of failing the whole state.

        Raises:
            CorruptionError: a record or object is missing or damaged (with
                ``damaged``: the manifest or a delta, so no key is known).
        """
        with self._reading(f"the state of {run!r} at {cid}"):
            if key is not None:
                ref = self._ref_of(run, info.number, cid, key)
                refs = {} if ref is None else {key: ref}
            else:
                refs = self._refs_at(run, info.number, cid)
            objs = TxnObjects(self)
            if damaged is not None:
                out = {}
                for k, r in refs.items():
                    try:
                        out[k] = history.resolve(objs, r)
                    except (CodecError, CorruptionError) as exc:
                        damaged[k] = str(exc)
                return out
            try:
                return {k: history.resolve(objs, r) for k, r in refs.items()}
            except CodecError as exc:
                raise self._corrupt(f"state of {run!r} at {cid}: {exc}") from None

