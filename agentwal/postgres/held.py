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
are kept (smaller ones travel in the row anyway), and none over a sixteenth
of the bound; the whole is bounded by bytes, least recently used out first.

:class:`Heads` goes further for the runs whose lease the worker holds: while
it holds a run's lease under one epoch, no other worker can commit to the run
(every write is fenced by that epoch), so the run's head moves only by this
worker's own commits, and the worker can know the head (id and hash) and the
values of the keys it fetched there or wrote since. A ``begin`` that names
only such keys then needs no round trip: its view is the head as known, a real
checkpoint whose values are those held. If the worker is wrong about the head
(two of its threads committing to one run, or a lease that was lost), the
commit's guard finds the head or the lease not as assumed and the commit
takes the checked path, which rebases or refuses as for any view behind the
head: the view was a consistent snapshot of a real checkpoint all along.
Entries are tied to the lease epoch they were learned under, dropped when a
commit fails, the run is deleted or a compaction drops a view's checkpoint,
and bounded per run (keys, bytes) and in number of runs. A begin's server read
is learned only if nothing changed the run while it was in flight (a stamp
taken before it, :meth:`Heads.stamp`): a read from before another thread's
commit or a deletion would otherwise set the known head back to a checkpoint
the run has left, and later begins would start there. A compaction (any
worker's, no lease needed) may store a live append row whole meanwhile: its
value and checkpoint stay, only its chain depth drops to 0, so the depth
known here is then too high, which only makes the next append start a new
chain earlier (``history.MAX_CHAIN``), as for a view begun before the
compaction.

Thread-safe; nothing here talks to the server.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Heads", "Held", "Known", "Row"]

#: A key's live delta row at a head: ``(checkpoint, depth, value length)``, as
#: ``backend.PgView.rows`` holds it; None for a key that has none.
Row = tuple[int, int, int | None] | None


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


@dataclass(slots=True)
class _AtHead:
    """What a worker knows of one run at its head, under lease epoch ``lease_epoch``."""

    lease_epoch: int
    run_epoch: int
    head: int
    head_hash: bytes
    #: ``{key: (value, live row)}``, oldest first
    keys: OrderedDict[str, tuple[bytes | None, Row]] = field(default_factory=OrderedDict)
    size: int = 0


@dataclass(frozen=True, slots=True)
class Known:
    """A run's head as known without asking: ``keys`` is ``{key: (value, live row)}``."""

    run_epoch: int
    head: int
    head_hash: bytes
    keys: dict[str, tuple[bytes | None, Row]]


class Heads:
    """The head of each run this worker holds the lease of, with the values it knows there
    (module doc), at most ``max_keys`` keys and ``max_bytes`` of values per run and
    ``max_runs`` runs."""

    def __init__(self, *, max_runs: int = 256, max_keys: int = 512,
                 max_bytes: int = 8 << 20) -> None:
        self.max_runs, self.max_keys, self.max_bytes = max_runs, max_keys, max_bytes
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, _AtHead] = OrderedDict()
        # A clock of changes to what is known: each forget and advance stamps its run,
        # and a begin's server read is learned only if its run was not stamped after
        # the read started (else a read from before a commit or a deletion would set the
        # known head back to a checkpoint the run has left). Stamps of at most
        # 4 * max_runs runs are kept; an older one counts as the newest one dropped.
        self._clock = 0
        self._stamps: OrderedDict[str, int] = OrderedDict()
        self._dropped_stamp = 0

    def stamp(self) -> int:
        """Now, on the clock :meth:`learn` takes (read it before asking the server)."""
        with self._lock:
            return self._clock

    def _touch(self, run: str) -> None:
        """Stamp ``run`` as changed now (under the lock)."""
        self._clock += 1
        self._stamps[run] = self._clock
        self._stamps.move_to_end(run)
        while len(self._stamps) > 4 * self.max_runs:
            _run, old = self._stamps.popitem(last=False)
            self._dropped_stamp = max(self._dropped_stamp, old)

    def view(self, run: str, lease_epoch: int, keys: Iterable[str]) -> Known | None:
        """The head of ``run`` and the ``keys`` there, if known under ``lease_epoch`` and
        every one of ``keys`` is known; else None (ask the server)."""
        with self._lock:
            at = self._runs.get(run)
            if at is None or at.lease_epoch != lease_epoch:
                return None
            got = {}
            for key in keys:
                entry = at.keys.get(key)
                if entry is None:
                    return None
                got[key] = entry
            self._runs.move_to_end(run)
            return Known(at.run_epoch, at.head, at.head_hash, got)

    def learn(self, run: str, lease_epoch: int, run_epoch: int, head: int, head_hash: bytes,
              found: Mapping[str, tuple[bytes | None, Row]], since: int) -> None:
        """``found`` (``{key: (value, live row)}``) was read from the server at ``head``
        by a read that started at :meth:`stamp` ``since``; ignored if the run changed
        after that (this worker's commit, a failed commit, a deletion) or if this worker
        already knows a later head."""
        with self._lock:
            if self._stamps.get(run, self._dropped_stamp) > since:
                return
            at = self._runs.get(run)
            if at is not None and (at.lease_epoch, at.run_epoch) == (lease_epoch, run_epoch
                                                                     ) and at.head > head:
                return
            if at is None or (at.lease_epoch, at.run_epoch, at.head) != (
                    lease_epoch, run_epoch, head):
                at = self._runs[run] = _AtHead(lease_epoch, run_epoch, head, head_hash)
            self._add(at, found)
            self._runs.move_to_end(run)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)

    def advance(self, run: str, lease_epoch: int, run_epoch: int, head: int, head_hash: bytes,
                written: Mapping[str, tuple[bytes | None, Row]]) -> None:
        """This worker committed checkpoint ``head`` writing ``written``; what is known of
        the run moves with it if it was known at ``head - 1``, and is dropped otherwise."""
        with self._lock:
            self._touch(run)
            at = self._runs.get(run)
            if at is None:
                return
            if (at.lease_epoch, at.run_epoch, at.head) != (lease_epoch, run_epoch, head - 1):
                del self._runs[run]
                return
            at.head, at.head_hash = head, head_hash
            self._add(at, written)

    def forget(self, run: str) -> None:
        """Drop what is known of ``run`` (a failed commit, a deletion, a compaction under
        a view), and have reads begun before now not learned."""
        with self._lock:
            self._touch(run)
            self._runs.pop(run, None)

    def _add(self, at: _AtHead, entries: Mapping[str, tuple[bytes | None, Row]]) -> None:
        for key, entry in entries.items():
            old = at.keys.pop(key, None)
            if old is not None and old[0] is not None:
                at.size -= len(old[0])
            at.keys[key] = entry
            if entry[0] is not None:
                at.size += len(entry[0])
        while at.keys and (len(at.keys) > self.max_keys or at.size > self.max_bytes):
            _key, (value, _row) = at.keys.popitem(last=False)
            if value is not None:
                at.size -= len(value)
