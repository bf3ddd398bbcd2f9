"""The saver's in-memory caches: what a put can reuse and what a read need not rebuild.

Theory of operation: every entry describes something stored and immutable
once written, so a hit is never wrong in this process: a list version (its
value key never holds two different lists, versions being unique per
branch; a put of the same key, as LangGraph's conformance suite does,
forgets it first), an element (content-addressed), the first elements of a
pool (pools only grow) and a thread's last list version per channel (used
for its element objects only). A slot's pool (its key and the digests of its
elements) is checked against the store inside the commit: ``txn.append``
returns the pool's length, and a length other than the cached one drops the
entry and re-runs the commit. Deleting, pruning or copying into a thread
forgets the thread's entries. The caches are bounded by bytes (least recently used
first). One lock guards them all; the same lock's condition is notified
after every put (``effect()`` waits on it for a task's checkpoint). Another
process writing the same store is not seen, which is why the saver never
trusts a cached base without reading its key.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Listed", "Pool", "Prepared", "Resolved", "Shared"]

_ELEMENT_CACHE_BYTES = 64 << 20
_RESOLVED_CACHE_BYTES = 64 << 20
#: A list version as read: its serialized elements, and their msgpack array when all are msgpack.
Resolved = tuple[tuple[tuple[str, bytes], ...], bytes | None]


def _size(elements: list[tuple[str, bytes]]) -> int:
    return sum(len(b) for _, b in elements)


@dataclass(frozen=True)
class Listed:
    """The last version of a list channel written through this saver (one slot)."""

    key: str  # its value key
    objs: tuple[Any, ...]  # the element objects, for reuse by identity (none if learned)
    digests: tuple[str, ...]
    sizes: tuple[int, ...]
    pool: str | None = None  # the pool its elements are in, at these positions
    positions: tuple[int, ...] = ()
    depth: int = 0  # links of its record's chain


class Pool:
    """What a slot's pool holds, as of a commit: its key and its elements' digests."""

    __slots__ = ("digests", "key", "where")

    def __init__(self, key: str, digests: Iterable[str]) -> None:
        self.key = key
        self.digests: list[str] = []
        self.where: dict[str, int] = {}  # digest -> its first position
        self.extend(digests)

    def extend(self, digests: Iterable[str]) -> None:
        for dig in digests:
            self.where.setdefault(dig, len(self.digests))
            self.digests.append(dig)


@dataclass(frozen=True)
class Prepared:
    """A list value ready to store: every element's digest, new ones serialized."""

    objs: tuple[Any, ...]
    digests: tuple[str, ...]
    sizes: tuple[int, ...]
    fresh: dict[str, tuple[str, bytes]]


class Shared:
    """State every shallow copy of one saver shares."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.saved = threading.Condition(self.lock)  # notified after every put
        self.lists: dict[tuple[str, str, str], Listed] = {}
        self.pools: dict[tuple[str, str, str], Pool] = {}  # (thread, nsid, channel) -> pool
        #: slot -> the key of the pool its cache lost to a concurrent commit (read it again)
        self.stale_pools: dict[tuple[str, str, str], str] = {}
        # (thread, pool key) -> the pool's first elements as read or written
        self.pooled: OrderedDict[tuple[str, str], list[tuple[str, bytes]]] = OrderedDict()
        self.pooled_bytes = 0
        self.elements: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self.element_bytes = 0
        # (thread, value key) -> a list version's elements (and their msgpack array)
        self.resolved: OrderedDict[tuple[str, str], Resolved] = OrderedDict()
        self.resolved_bytes = 0

    def element(self, dig: str) -> tuple[str, bytes] | None:
        with self.lock:
            hit = self.elements.get(dig)
            if hit is not None:
                self.elements.move_to_end(dig)
            return hit

    def remember_element(self, dig: str, typed: tuple[str, bytes]) -> None:
        with self.lock:
            if dig in self.elements:
                return
            self.elements[dig] = typed
            self.element_bytes += len(typed[1])
            while self.element_bytes > _ELEMENT_CACHE_BYTES and self.elements:
                _, old = self.elements.popitem(last=False)
                self.element_bytes -= len(old[1])

    def listed(self, thread: str, vkey: str) -> Resolved | None:
        with self.lock:
            hit = self.resolved.get((thread, vkey))
            if hit is not None:
                self.resolved.move_to_end((thread, vkey))
            return hit

    def remember_listed(self, thread: str, vkey: str, listed: Resolved) -> None:
        size = sum(len(b) for _, b in listed[0]) * 2
        with self.lock:
            if (thread, vkey) in self.resolved or size > _RESOLVED_CACHE_BYTES // 4:
                return
            self.resolved[(thread, vkey)] = listed
            self.resolved_bytes += size
            while self.resolved_bytes > _RESOLVED_CACHE_BYTES and self.resolved:
                _, old = self.resolved.popitem(last=False)
                self.resolved_bytes -= sum(len(b) for _, b in old[0]) * 2

    def forget_values(self, thread: str, vkeys: Iterable[str]) -> None:
        with self.lock:
            for vkey in vkeys:
                old = self.resolved.pop((thread, vkey), None)
                if old is not None:
                    self.resolved_bytes -= sum(len(b) for _, b in old[0]) * 2

    def pool_elements(self, thread: str, key: str) -> list[tuple[str, bytes]] | None:
        with self.lock:
            hit = self.pooled.get((thread, key))
            if hit is not None:
                self.pooled.move_to_end((thread, key))
            return hit

    def remember_pool_elements(self, thread: str, key: str,
                               elements: list[tuple[str, bytes]], before: int | None = None
                               ) -> None:
        """Cache a pool's first elements as read, or (``before`` given) the elements a
        commit appended to a pool of ``before`` elements (kept only if the cache holds
        exactly those)."""
        with self.lock:
            hit = self.pooled.get((thread, key))
            if before is not None:
                if hit is None or len(hit) != before:
                    return
                hit.extend(elements)
                self.pooled_bytes += _size(elements)
            else:
                if hit is not None and len(hit) >= len(elements):
                    return
                if hit is not None:
                    self.pooled_bytes -= _size(hit)
                self.pooled[(thread, key)] = list(elements)
                self.pooled_bytes += _size(elements)
            self.pooled.move_to_end((thread, key))
            while self.pooled_bytes > _ELEMENT_CACHE_BYTES and self.pooled:
                _, old = self.pooled.popitem(last=False)
                self.pooled_bytes -= _size(old)

    def forget_pool(self, slot: tuple[str, str, str], key: str | None = None) -> None:
        """Drop the slot's cached pool; ``key``: the pool to read again from the store the
        next time the slot needs one (it grew under another commit), instead of a new one."""
        with self.lock:
            self.pools.pop(slot, None)
            if key is not None:
                self.stale_pools[slot] = key

    def forget_thread(self, thread: str) -> None:
        with self.lock:
            for k in [k for k in self.lists if k[0] == thread]:
                del self.lists[k]
            for k in [k for k in self.pools if k[0] == thread]:
                del self.pools[k]
            for k in [k for k in self.stale_pools if k[0] == thread]:
                del self.stale_pools[k]
            for p in [p for p in self.pooled if p[0] == thread]:
                self.pooled_bytes -= _size(self.pooled.pop(p))
            for r in [r for r in self.resolved if r[0] == thread]:
                self.resolved_bytes -= sum(len(b) for _, b in self.resolved.pop(r)[0]) * 2


