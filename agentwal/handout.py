"""Lists a transaction handed out: read again without decoding, re-put without encoding.

Theory of operation: agents re-put their whole ``messages`` list every step
(``msgs = txn.get("messages"); msgs.append(m); txn["messages"] = msgs``).
Decoding the stored list and encoding it again costs what the list holds;
the step needs only what was appended. Two parts make it cost the change:

*Pristine copies* (:class:`Lists`, one per process). Per ``(run, key)`` it
keeps a stored list (the very object the memtable holds, or equal bytes)
and its decoded value, the *pristine* list, which no caller ever holds and
nothing ever mutates. A read of that same stored value hands out
:func:`fresh` of it: a structural copy (new lists and dicts at every
level, the same immutable scalars), one C-level call for the usual list of
flat messages, so the caller may mutate what it got and nothing else sees
it. A commit whose re-put only grew keeps, for the value it stored, the old
pristine list plus the decoded tail: CBOR items decode independently, so
decoding the tail alone gives exactly what decoding the whole would.

*Handouts* (:class:`Handout`, one per list a transaction handed out). On
``put`` of a list, :meth:`Handout.grown_from` asks whether the first items
are still exactly what was handed out: the caller's value and the pristine
list are walked side by side, level by level. Every scalar of the copy *is*
the pristine one (the copy shares them), so an unchanged scalar is the same
object; every container is a copy, so it must be a container of the same
type and length (and, for a dict, the very same keys in the same order)
whose contents pass the same test one level down. Then the prefix encodes
to the stored bytes, and only the new items are checked and encoded
(``txn.append``'s path). Each level is a few C-level calls (``map``,
``compress``, ``gc.get_referents``) over all its objects, no Python code
per object, and an unchanged scalar is compared by address only, never
touched.

Why identity is enough: the pristine list holds references, so no object in
it can be freed and its id reused. A stored value decodes to dicts, lists
and immutable scalars (``str``, ``bytes``, ``int``, ``float``, ``bool``,
None); a value holding anything else (a set, a datetime) is never kept. An
immutable object that is the same object has the same encoding. A caller
mutating anything in the prefix (an item replaced, even by an equal one; a
message's field changed; a key renamed; a nested list grown) changes some
reference, type, length or key, and the put is encoded whole, as always.
"""

from __future__ import annotations

import gc
import operator
import threading
from itertools import chain, compress, repeat
from typing import Any

from .codec import CodecError, Joined, Value, loads

__all__ = ["Handout", "Lists", "fresh", "levels_of"]

#: The types a stored value decodes to, where an identical object means identical bytes.
_SAFE = frozenset({str, bytes, int, float, bool, type(None), dict, list})
_CONTAINERS = frozenset({dict, list})
_is = operator.is_
_not = operator.not_
_keys_of = dict.keys
_copy = operator.methodcaller("copy")
_dict_copy = dict.copy
_is_box = _CONTAINERS.__contains__
#: Levels of nesting followed at most (a deeper value is never kept).
_MAX_LEVELS = 64

#: Shapes of a kept list (what :func:`fresh` needs to know of it): scalars only,
#: containers holding scalars only (dicts only), anything else.
FLAT, FLAT_BOXES, FLAT_DICTS, NESTED = 0, 1, 2, 3

#: One level of a pristine list, for :meth:`Handout.grown_from`: its objects' count,
#: which of them are containers (and which not), its scalars, its containers' types
#: and lengths, which containers are dicts (and whether all are), and the dicts' keys
#: (in order).
_Level = tuple[int, list[bool], list[bool], list[Any], list[type], list[int], list[bool],
               bool, list[Any]]
_EMPTY: _Level = (0, [], [], [], [], [], [], True, [])


def levels_of(value: list[Any]) -> list[_Level] | None:
    """The levels of ``value`` (its items, what its containers hold, ...), or None if it
    holds a type outside :data:`_SAFE` or nests deeper than :data:`_MAX_LEVELS`."""
    out: list[_Level] = []
    objs: list[Any] = value
    while True:
        types = list(map(type, objs))
        if not set(types) <= _SAFE or len(out) > _MAX_LEVELS:
            return None
        mask = list(map(_is_box, types))
        others = list(map(_not, mask))
        boxes = list(compress(objs, mask))
        box_types = list(compress(types, mask))
        dmask = list(map(_is, box_types, repeat(dict)))
        out.append((len(objs), mask, others, list(compress(objs, others)), box_types,
                    list(map(len, boxes)), dmask, all(dmask),
                    list(chain.from_iterable(compress(boxes, dmask)))))
        if not boxes:
            return out
        objs = gc.get_referents(*boxes)


def shape_of(levels: list[_Level]) -> int:
    """The shape of the list whose :func:`levels_of` are ``levels`` (:data:`FLAT`, ...)."""
    if len(levels) == 1:
        return FLAT
    if len(levels) == 2 and not levels[0][3]:
        return FLAT_DICTS if levels[0][7] else FLAT_BOXES
    return NESTED


def _join_levels(a: list[_Level], b: list[_Level]) -> list[_Level]:
    """The levels of a list made of ``a``'s items then ``b``'s: level by level, the
    objects of ``a`` then those of ``b`` (``gc.get_referents`` keeps that order)."""
    out: list[_Level] = []
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else _EMPTY
        y = b[i] if i < len(b) else _EMPTY
        out.append((x[0] + y[0], x[1] + y[1], x[2] + y[2], x[3] + y[3], x[4] + y[4],
                    x[5] + y[5], x[6] + y[6], x[7] and y[7], x[8] + y[8]))
    return out


def fresh(value: Any, shape: int = NESTED) -> Any:
    """A structural copy of a value made of :data:`_SAFE` types: new dicts and lists at
    every level, the same (immutable) scalars. Mutating it changes nothing of ``value``.

    ``shape`` (of a list, from :func:`shape_of`) picks the one-call copies.
    """
    if shape == FLAT:
        return value.copy()
    if shape == FLAT_DICTS:
        return list(map(_dict_copy, value))
    if shape == FLAT_BOXES:
        return list(map(_copy, value))
    t = type(value)
    if t is list:
        return [fresh(x) if type(x) in _CONTAINERS else x for x in value]
    if t is dict:
        return {k: fresh(v) if type(v) in _CONTAINERS else v for k, v in value.items()}
    return value


class Handout:
    """A stored list a transaction handed out (a :func:`fresh` copy of ``pristine``).

    Immutable once made: :class:`Lists` shares one with every transaction that
    reads the same stored value.
    """

    __slots__ = ("count", "levels", "pristine", "shape", "stored")

    def __init__(self, stored: Value, pristine: list[Any], levels: list[_Level]) -> None:
        self.stored = stored  # the encoded list, as the view holds it (maybe a Joined)
        self.pristine = pristine  # its decoded value, never handed out
        self.levels = levels  # levels_of(pristine)
        self.shape = shape_of(levels)
        self.count = len(pristine)  # its items

    def value(self) -> list[Any]:
        """A new copy of the list, for a caller to keep and mutate."""
        return fresh(self.pristine, self.shape)  # type: ignore[no-any-return]

    def grown_from(self, value: list[Any]) -> bool:
        """True if ``value``'s first :attr:`count` items are exactly the handed-out ones."""
        if len(value) < self.count:
            return False
        mine: list[Any] = value[:self.count]
        for n, mask, others, scalars, types, lens, dmask, dicts, keys in self.levels:
            if len(mine) != n:
                return False
            if not types:  # scalars only, and nothing below
                return all(map(_is, mine, scalars))  # none replaced, even by an equal one
            if scalars:
                if not all(map(_is, compress(mine, others), scalars)):
                    return False
                boxes = list(compress(mine, mask))
            else:
                boxes = mine
            if list(map(type, boxes)) != types or list(map(len, boxes)) != lens:
                return False
            if keys:
                mine_keys = list(chain.from_iterable(boxes if dicts else compress(boxes, dmask)))
                if len(mine_keys) != len(keys) or not all(map(_is, mine_keys, keys)):
                    return False
            mine = gc.get_referents(*boxes)
        return False


class Lists:
    """Decoded lists lately read or committed, by ``(run, key)``: a read of the same stored
    value gets a copy of the kept one instead of a decode.

    An entry is a :class:`Handout`: ``stored`` (a :class:`~agentwal.codec.Joined`
    the memtable holds, or bytes) and ``pristine``, its decoded list, which no
    caller ever gets (only copies) and nothing mutates (a grown entry is a new
    list). It serves a read whose stored value is that very object, or equal
    bytes, so it never returns another value than decoding would. Bounded in
    entries and in encoded bytes (oldest dropped first). Lookups take no lock
    (one dict operation); changes do.
    """

    __slots__ = ("_bytes", "_entries", "_limit", "_lock", "_max_bytes")

    def __init__(self, limit: int = 256, max_bytes: int = 32 << 20) -> None:
        self._entries: dict[tuple[str, str], Handout] = {}
        self._limit = limit
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()

    def handout(self, run: str, key: str, stored: Value) -> Handout | None:
        """The kept decoded list of ``stored`` as a :class:`Handout`, or None."""
        hit = self._entries.get((run, key))
        if hit is None:
            return None
        kept = hit.stored
        if kept is not stored:
            if len(kept) != len(stored):
                return None
            a = kept.whole() if type(kept) is Joined else kept
            b = stored.whole() if type(stored) is Joined else stored
            if a != b:
                return None
        return hit

    def keep(self, run: str, key: str, stored: Value, value: list[Any]) -> Handout | None:
        """Keep a copy of ``value`` (``stored``, decoded) and return its handout; None (and
        nothing kept) if it holds a type outside :data:`_SAFE` or nests too deep."""
        levels = levels_of(value)
        if levels is None:
            return None
        handout = Handout(stored, fresh(value, shape_of(levels)), levels)
        self._put(run, key, handout)
        return handout

    def grown(self, run: str, key: str, stored: Joined, handout: Handout, tail: bytes) -> None:
        """Keep ``stored`` (``handout``'s list with the encoded list ``tail``'s items
        appended) as its pristine list plus the decoded tail (if the tail is made of
        :data:`_SAFE` types only: nothing else can be copied safely)."""
        try:  # after a commit: never raise (the tail was encoded here, so it decodes)
            items = loads(tail)
        except CodecError:
            items = None
        levels = levels_of(items) if type(items) is list else None
        if levels is None:
            with self._lock:
                self._drop((run, key))
            return
        self._put(run, key, Handout(stored, handout.pristine + items,
                                    _join_levels(handout.levels, levels)))

    def _put(self, run: str, key: str, handout: Handout) -> None:
        size = len(handout.stored)
        if size > self._max_bytes:
            return
        slot = (run, key)
        with self._lock:
            self._drop(slot)
            while self._entries and (len(self._entries) >= self._limit
                                     or self._bytes + size > self._max_bytes):
                self._drop(next(iter(self._entries)))
            self._entries[slot] = handout
            self._bytes += size

    def _drop(self, slot: tuple[str, str]) -> None:
        old = self._entries.pop(slot, None)
        if old is not None:
            self._bytes -= len(old.stored)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
