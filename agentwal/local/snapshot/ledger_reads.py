"""Reading the folded effects ledger: entries, positions, the outbox and the indexes.

Theory of operation: the ``effects`` database holds each entry under
``k`` + its idempotency key, each transaction position under ``p`` (naming
the entry's key), the outbox order under ``q``, and (format 2, marked in
``meta``) indexes by run and by status that name entries by key. Every row is
sealed; an index row naming a missing entry is ``CorruptionError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...codec import CodecError
from ...effects import STATUSES, EffectRecord, decode_entry
from .base import ReaderBase
from .layout import EFFECTS_INDEX, pos_key, run_index_prefix, status_index_prefix

__all__ = ["LedgerReads"]


class LedgerReads(ReaderBase):
    """The ledger reads of :class:`~.reader.SnapshotReader`."""

    def _entry(self, k: bytes, v: Any) -> EffectRecord:
        data = self._open(k, v, "an effects-ledger entry")
        assert data is not None
        try:
            return decode_entry(data)
        except CodecError as exc:
            raise self._corrupt(f"effects-ledger entry {k[1:]!r}: {exc}") from None

    def effect(self, key: str) -> EffectRecord | None:
        """The folded ledger entry with idempotency key ``key``, or None."""
        k = b"k" + key.encode()
        with self._reading("the effects ledger"):
            v = self._txn.get(k, db=self._effects)
            return None if v is None else self._entry(k, v)

    def effect_key_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        """The key of the ``self._txn.effect`` entry at this position, or None."""
        k = pos_key(run, checkpoint, ordinal)
        with self._reading("the effects ledger"):
            data = self._open(k, self._txn.get(k, db=self._effects), "an effect position")
        return None if data is None else data.decode("utf-8", "replace")

    def effects(self) -> Iterator[EffectRecord]:
        """Every folded ledger entry, in key order."""
        for k, v in self._effect_rows(b"k", "the effects ledger"):
            yield self._entry(k, v)

    def effects_indexed(self) -> bool:
        """True if the ledger's run and status indexes are complete (format 2)."""
        k = EFFECTS_INDEX
        with self._reading("the effects index marker"):
            data = self._open(k, self._txn.get(k, db=self._meta), "the effects index marker")
        return data is not None

    def effects_of(self, run: str | None, status: str | None) -> list[EffectRecord] | None:
        """The folded entries of ``run`` and/or ``status`` through the indexes, in key order.

        Each entry read is checked against the query (a digest collision in
        an index key only costs its read). None if the store has no indexes
        yet, or if neither filter is given: scan :meth:`effects` instead.
        """
        if (run is None and status is None) or not self.effects_indexed():
            return None
        if status is not None:
            prefix = status_index_prefix(STATUSES.index(status), run)
        else:
            assert run is not None
            prefix = run_index_prefix(run)
        out = []
        for k, v in self._effect_rows(prefix, "the effects index"):
            data = self._open(k, v, "an effects index row")
            assert data is not None
            entry = self.effect(data.decode("utf-8", "replace"))
            if entry is None:
                raise self._corrupt(f"the effects index names {data!r}, which is missing")
            if (run is None or entry.run == run) and (status is None or entry.status == status):
                out.append(entry)
        return out

    def outbox(self) -> list[str]:
        """Keys of folded outbox entries not yet settled, in commit order."""
        out = []
        for k, v in self._effect_rows(b"q", "the outbox"):
            data = self._open(k, v, "an outbox entry")
            assert data is not None
            out.append(data.decode("utf-8", "replace"))
        return out

    def _effect_rows(self, kind: bytes, what: str) -> Iterator[tuple[bytes, Any]]:
        """``(key, sealed value)`` of the ``effects`` rows of one kind (b"k", b"p", b"q"),
        or of any key prefix."""
        with self._reading(what), self._txn.cursor(db=self._effects) as cur:
            found = cur.set_range(kind)
            while found:
                k = bytes(cur.key())
                if not k.startswith(kind):
                    break
                yield k, cur.value()
                found = cur.next()

