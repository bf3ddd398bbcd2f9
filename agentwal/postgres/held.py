"""Values a worker already holds, so that a ``begin`` does not fetch them again.

Theory of operation: a committed delta row never changes its value. The value
of key ``K`` written at checkpoint ``C`` of run ``R`` in run epoch ``E`` (a
deleted run id starts again at checkpoint 1 under a new epoch) is the same
bytes for as long as the row exists; a compaction may store an append row
whole instead, but never with other bytes. So a worker may keep, per ``(run,
key)``, the epoch, checkpoint and value of a row it wrote (``commit``) or read
at the head (``begin``), and tell the server at the next ``begin`` which row
it holds: the server sends a key's value only when that key's live row is
another one. Keeping a wrong entry cannot give a wrong read; only an entry
whose bytes differ from its row's could, and entries are made from the bytes
the row was written from or read back.

What it saves is the transfer and the client's work for values that change
rarely but are read on every step, above all a list stored as an append
chain (LangGraph's message pool chunk), whose rows would otherwise be fetched
and joined on every ``begin``. Only values over ``schema.INLINE_MAX`` bytes
are kept (smaller ones travel in the row anyway); the whole is bounded by
bytes, least recently used out first. Thread-safe; nothing here talks to the
server.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping

__all__ = ["Held"]


class Held:
    """``{(run, key): (run epoch, checkpoint, value)}``, at most ``max_bytes`` of values."""

    def __init__(self, max_bytes: int, *, min_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], tuple[int, int, bytes]] = OrderedDict()
        self._bytes = 0

    def get(self, run: str, keys: Iterable[str]) -> dict[str, tuple[int, int, bytes]]:
        """``{key: (epoch, checkpoint, value)}`` of the ``keys`` held for ``run``."""
        out = {}
        with self._lock:
            for key in keys:
                entry = self._entries.get((run, key))
                if entry is not None:
                    self._entries.move_to_end((run, key))
                    out[key] = entry
        return out

    def put(self, run: str, epoch: int, ckpt: int, values: Mapping[str, bytes | None]) -> None:
        """Hold ``values`` (``{key: value}``, None: deleted) as written at ``ckpt`` of
        ``run`` in run epoch ``epoch``; a deleted or small value drops what was held."""
        with self._lock:
            for key, value in values.items():
                old = self._entries.pop((run, key), None)
                if old is not None:
                    self._bytes -= len(old[2])
                if value is None or not self.min_bytes < len(value) <= self.max_bytes // 16:
                    continue
                self._entries[(run, key)] = (epoch, ckpt, value)
                self._bytes += len(value)
            while self._bytes > self.max_bytes:
                _, (_e, _c, gone) = self._entries.popitem(last=False)
                self._bytes -= len(gone)
