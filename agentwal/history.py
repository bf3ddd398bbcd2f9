"""History encoding: per-checkpoint deltas, manifests, content-addressed values, list chains.

Theory of operation: this module is pure. It decides how a run's history is
laid out as records and objects, and how the state at a checkpoint is rebuilt
from them; it never touches a file. The snapshot module supplies the storage
through the small :class:`Objects` protocol (an LMDB write or read
transaction) and stores the records it gets back; tests supply a dict.

*Refs.* Every value a checkpoint's state holds is recorded as a *ref*:

- ``bytes``: the value's CBOR, inline, when it is shorter than
  :data:`LEAF_MIN` bytes, or shorter than :data:`LARGE` and an array;
- ``(VALUE, addr)``: a value stored once as a leaf object: a large one
  (:data:`LARGE` bytes or more) shared by every checkpoint, key and run
  holding the same bytes, a mid-size one (a plain leaf) by the checkpoints
  and head of the key that wrote it;
- ``(LIST, addr)``: a large CBOR array stored as a *list node*.

*Content addressing.* An object's record is a kind byte (leaf, node or
plain leaf) and its body; its id is ``sha256(record)``. A large value (at
least :data:`LARGE` bytes, not a list) is a *leaf*: storage finds it by id
before adding it, so identical content is stored once. Everything else is
added without a lookup and never indexed by content (layout 4): list nodes
and list segments (a list's versions already share them through ``prev``,
and a content index of random SHA-256 keys made every fold touch, and
copy, every page of it), and values of :data:`LEAF_MIN` bytes up to
:data:`LARGE` that are not arrays, which become *plain leaves* (kind 2,
the body of a leaf) so the head's ``state`` entry and the delta name one
copy instead of holding two. Objects are *addressed* by a small integer
allocated in increasing order (so LMDB appends them and packs its pages),
and refs, nodes and manifests name that address. Snapshots of layout 3
hold nodes and segment leaves that are indexed (kind 0); they read alike.

*List nodes* share the elements of a list that grows by appending (the usual
``messages`` list). A node is ``[count, nbytes, body_sha256, depth, prev,
segs]``: the array has ``count`` items whose encodings, concatenated, are
``nbytes`` long with that SHA-256; its items are those of node ``prev`` (or
none) followed by the segments ``segs`` (each inline bytes, or the address
of a leaf holding them). A new version of a key whose previous version is a
node with the same first ``nbytes`` body bytes is stored as a node pointing
at the previous one plus the appended tail, so an append costs the tail and a
few dozen bytes. ``depth`` counts the nodes behind it; at :data:`MAX_CHAIN`
the new node is re-based instead: ``prev`` becomes None and ``segs`` lists
every segment of the chain (leaves by address, no element copied;
consecutive short inline segments are merged, into a new leaf once they
reach :data:`SEGMENT_LEAF`). Rebuilding any list therefore reads at most
:data:`MAX_CHAIN` nodes plus its leaves.

*Head entries.* The snapshot's ``state`` database (the head's fast path)
stores the ref of a value held as an object (a list node, a large leaf)
instead of the value (:func:`head_entry`), so a fold does not copy a
growing list whole and a large value is stored once; reading it rebuilds
the value (:func:`head_value`).

*Deltas and manifests.* Checkpoint ``c`` of a run has a delta ``{key: ref |
None}`` (None: deleted). A manifest is the full ``{key: ref}`` map at one
checkpoint: compaction writes one where a kept block starts after dropped
checkpoints. The snapshot indexes every delta entry by (key, checkpoint)
(its ``versions`` database), so the state at ``c`` is the nearest
manifest at or before ``c`` (or the empty state) plus, for each key changed
after it, the ref from the delta of its latest change at or before ``c``:
a checkpoint costs the keys it changed, never the whole state. Stores
written before that index (format 2) have a manifest at every id that is a
multiple of :data:`MANIFEST_EVERY` and are read as the manifest at
``c - c % MANIFEST_EVERY`` plus at most ``MANIFEST_EVERY - 1`` deltas
(:func:`manifest_base`) until their first fold builds the index.

*Reference counts.* Each object's count is the number of delta entries,
manifest entries and nodes naming it (head entries hold none: the delta
that wrote the head value does). :func:`store_value` and
:func:`retain` add one (creating the object, and counting its children,
the first time); :func:`release` takes one away and deletes the object at
zero, releasing its children. A crash cannot leave counts half-updated:
the snapshot applies every change of a fold in one LMDB transaction.

Failures are :class:`CodecError` (a missing object, a malformed record);
the snapshot turns them into ``CorruptionError`` naming its file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeAlias

import cbor2

from .codec import CodecError, decode_stored, loads

__all__ = [
    "compare_states",
    "rollback_delta",
    "HEAD_REF",
    "LARGE",
    "LEAF_MIN",
    "LIST",
    "MANIFEST_EVERY",
    "MAX_CHAIN",
    "SEGMENT_LEAF",
    "VALUE",
    "Objects",
    "Ref",
    "apply_delta",
    "decode_refs",
    "encode_refs",
    "head_entry",
    "head_ref",
    "head_value",
    "is_manifest",
    "manifest_base",
    "object_id",
    "release",
    "resolve",
    "retain",
    "store_value",
    "children",
    "check_node",
    "is_node",
    "indexed",
]

#: Stores of format 2 (before the versions index) hold a full manifest at every
#: checkpoint id that is a multiple of this; newer folds write none.
MANIFEST_EVERY = 32
#: Values (and list tails) at least this long are stored as shared objects.
LARGE = 1024
#: Nodes a list chain may have before a version is re-based.
MAX_CHAIN = 32

#: Ref kinds.
VALUE = 1
LIST = 2

#: Object kinds (the first byte of an object record).
_LEAF = 0
_NODE = 1
#: A leaf not indexed by content (layout 4): list segments and mid-size values.
_PLAIN = 2
_LEAVES = (bytes([_LEAF]), bytes([_PLAIN]))

#: Values at least this long (and shorter than :data:`LARGE`) that are not CBOR
#: arrays are stored once as plain leaves instead of inline twice (head and delta).
LEAF_MIN = 256

#: List tails (and runs of small tails merged by a re-base) at least this long
#: become leaf objects; shorter ones stay inline in their node.
SEGMENT_LEAF = 256

#: First byte of a ``state`` entry that holds a ref instead of the value
#: (CBOR never starts an item with 0xff, the "break" code).
HEAD_REF = 0xFF

#: A stored value: inline CBOR bytes, or ``(VALUE | LIST, object address)``.
Ref: TypeAlias = "bytes | tuple[int, int]"

_SHA = 32


class ObjectReader(Protocol):
    """Read access to stored objects: all that rebuilding a value needs."""

    def get(self, addr: int) -> bytes | None: ...


class Objects(ObjectReader, Protocol):
    """Objects with reference counts, found by content (an LMDB txn, or a dict).

    An object has an *address* (an int, allocated in increasing order so
    new objects are appended) and is found again by its *id*, the SHA-256
    of its record, so identical content is stored once.
    """

    def find(self, oid: bytes) -> int | None:
        """The address of the object with id ``oid``, or None."""

    def get(self, addr: int) -> bytes | None:
        """The object's record (kind byte + body), or None."""

    def add(self, oid: bytes | None, record: bytes) -> int:
        """Store a new object with reference count 0; returns its address.

        With ``oid`` None the object is not indexed by content (never found).
        """

    def delete(self, addr: int, oid: bytes) -> None:
        """Remove an object, its count and its id (if the id names this address)."""

    def count(self, addr: int) -> int:
        """The object's reference count."""

    def set_count(self, addr: int, n: int) -> None:
        """Set an object's reference count."""


def object_id(record: bytes) -> bytes:
    """The id of an object record: SHA-256 of its kind byte and body."""
    return hashlib.sha256(record).digest()


# -- CBOR array headers --------------------------------------------------------------

def _array_header(data: bytes) -> tuple[int, int] | None:
    """``(item count, header length)`` if ``data`` is a definite-length CBOR array."""
    if not data:
        return None
    first = data[0]
    if first >> 5 != 4:
        return None
    info = first & 0x1F
    if info < 24:
        return info, 1
    size = {24: 1, 25: 2, 26: 4, 27: 8}.get(info)
    if size is None or len(data) < 1 + size:
        return None  # indefinite length, or reserved
    return int.from_bytes(data[1:1 + size], "big"), 1 + size


def _header(count: int) -> bytes:
    if count < 24:
        return bytes([0x80 | count])
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if count < 1 << (8 * size):
            return bytes([0x80 | info]) + count.to_bytes(size, "big")
    raise ValueError("list too long")


# -- objects -------------------------------------------------------------------------

def _incref(objs: Objects, addr: int) -> None:
    n = objs.count(addr)
    if n < 0 or objs.get(addr) is None:
        raise CodecError(f"object @{addr} is referenced but missing")
    objs.set_count(addr, n + 1)


def _intern(objs: Objects, record: bytes) -> tuple[int, bool]:
    """``(address, created)`` of the object with ``record``; a new one has count 0."""
    oid = object_id(record)
    addr = objs.find(oid)
    if addr is not None:
        return addr, False
    return objs.add(oid, record), True


def _children(record: bytes) -> list[int]:
    if record[:1] != bytes([_NODE]):
        return []
    node = _node(record)
    out = [] if node[4] is None else [node[4]]
    out.extend(s for s in node[5] if isinstance(s, int))
    return out


def _node(record: bytes) -> list[Any]:
    """Decode and check a list node record."""
    if record[:1] != bytes([_NODE]):
        raise CodecError("object is not a list node")
    obj = loads(record[1:])
    if not (isinstance(obj, list) and len(obj) == 6 and isinstance(obj[0], int)
            and isinstance(obj[1], int) and isinstance(obj[2], bytes) and len(obj[2]) == _SHA
            and isinstance(obj[3], int) and (obj[4] is None or isinstance(obj[4], int))
            and isinstance(obj[5], list)
            and all(isinstance(s, (bytes, int)) and not isinstance(s, bool) for s in obj[5])):
        raise CodecError("malformed list node")
    return obj


def _load(objs: ObjectReader, addr: int) -> bytes:
    record = objs.get(addr)
    if record is None:
        raise CodecError(f"object @{addr} is missing")
    return record


def _seg(objs: Objects, data: bytes) -> bytes | int:
    """A segment for ``data``: inline if short, else a new plain leaf's address (no count
    taken; not found by content: a list's versions share segments through ``prev``)."""
    if len(data) < SEGMENT_LEAF:
        return data
    return objs.add(None, bytes([_PLAIN]) + data)


def _flatten(objs: ObjectReader, node: list[Any]) -> list[bytes | int]:
    """Every segment of a chain, oldest first."""
    chain = [node[5]]
    while node[4] is not None:
        node = _node(_load(objs, node[4]))
        chain.append(node[5])
    return [s for segs in reversed(chain) for s in segs]


def _coalesce(objs: Objects, segs: Iterable[bytes | int]) -> list[bytes | int]:
    """Merge runs of inline segments (into a leaf once they reach :data:`SEGMENT_LEAF`)."""
    out: list[bytes | int] = []
    run = b""
    for s in segs:
        if isinstance(s, bytes):
            run += s
            if len(run) >= SEGMENT_LEAF:
                out.append(_seg(objs, run))
                run = b""
        else:
            if run:
                out.append(run)
                run = b""
            out.append(s)
    if run:
        out.append(run)
    return out


def _make_node(objs: Objects, node: list[Any]) -> int:
    """Add a list node with one reference counted, and one to each of its children.

    Not found by content: the same list again reuses the previous version's
    node (:func:`store_value`), and an equal node reached another way is rare.
    """
    record = bytes([_NODE]) + cbor2.dumps(node)
    addr = objs.add(None, record)
    for child in _children(record):
        _incref(objs, child)
    objs.set_count(addr, 1)
    return addr


def store_value(objs: Objects, value: bytes, prev: Ref | None) -> Ref:
    """The ref for ``value`` (CBOR bytes), with one reference counted for it.

    Args:
        objs: where objects live.
        value: the value's CBOR, as committed.
        prev: the ref of the same key at the previous checkpoint, if any; a
            list value that extends it shares its elements.

    Returns:
        Inline bytes, ``(VALUE, address)`` or ``(LIST, address)``.

    Raises:
        CodecError: an object ``prev`` names is missing or malformed.
    """
    if len(value) < LARGE:
        if len(value) < LEAF_MIN or value[0] >> 5 == 4:  # short, or an array
            return value
        addr = objs.add(None, bytes([_PLAIN]) + value)
        objs.set_count(addr, 1)
        return (VALUE, addr)
    head = _array_header(value)
    if head is None:
        addr, _created = _intern(objs, bytes([_LEAF]) + value)
        objs.set_count(addr, objs.count(addr) + 1)
        return (VALUE, addr)
    count, hlen = head
    body = value[hlen:]
    sha = hashlib.sha256(body).digest()
    node: list[Any] | None = None
    if isinstance(prev, tuple) and prev[0] == LIST:
        old = _node(_load(objs, prev[1]))
        ocount, obytes, osha = old[0], old[1], old[2]
        if (count >= ocount and len(body) >= obytes
                and hashlib.sha256(body[:obytes]).digest() == osha):
            if len(body) == obytes:  # the same list again
                _incref(objs, prev[1])
                return prev
            tail = _seg(objs, body[obytes:])
            if old[3] + 1 < MAX_CHAIN:
                node = [count, len(body), sha, old[3] + 1, prev[1], [tail]]
            else:  # re-base: list every segment, copy no element
                node = [count, len(body), sha, 0, None,
                        _coalesce(objs, [*_flatten(objs, old), tail])]
    if node is None:
        node = [count, len(body), sha, 0, None, [_seg(objs, body)]]
    return (LIST, _make_node(objs, node))


def retain(objs: Objects, ref: Ref) -> None:
    """Count one more reference to an existing ref (a manifest entry)."""
    if isinstance(ref, tuple):
        _incref(objs, ref[1])


def release(objs: Objects, ref: Ref | None) -> None:
    """Drop one reference; an object left with none is deleted, and its children released.

    Raises:
        CodecError: the object is missing or has no references left.
    """
    if not isinstance(ref, tuple):
        return
    stack = [ref[1]]
    while stack:
        addr = stack.pop()
        n = objs.count(addr)
        if n <= 0:
            raise CodecError(f"object @{addr} is released but has no references")
        if n > 1:
            objs.set_count(addr, n - 1)
            continue
        record = _load(objs, addr)
        objs.delete(addr, object_id(record))
        stack.extend(_children(record))


# -- reading -------------------------------------------------------------------------

def resolve(objs: ObjectReader, ref: Ref) -> bytes:
    """The value bytes a ref stands for.

    Raises:
        CodecError: an object is missing or malformed, or a list's length is wrong.
    """
    if isinstance(ref, bytes):
        return ref
    kind, addr = ref
    record = _load(objs, addr)
    if kind == VALUE:
        if record[:1] not in _LEAVES:
            raise CodecError(f"object @{addr} is not a value")
        return record[1:]
    node = _node(record)
    parts: list[bytes] = []
    for s in _flatten(objs, node):
        if isinstance(s, bytes):
            parts.append(s)
        else:
            leaf = _load(objs, s)
            if leaf[:1] not in _LEAVES:
                raise CodecError(f"object @{s} is not a leaf")
            parts.append(leaf[1:])
    body = b"".join(parts)
    if len(body) != node[1]:
        raise CodecError(f"list @{addr} rebuilds to {len(body)} bytes, not {node[1]}")
    return _header(node[0]) + body


def head_entry(value: bytes, ref: Ref | None, sole: int | None = None) -> bytes:
    """What the ``state`` database stores for a head value: the value, or an object's ref.

    A value stored as an object (a large value's leaf, a list node) is named
    by its ref instead of copied: a list node is rebuilt on read instead of
    rewritten whole by every fold, and a large value is kept once, in
    ``objects``, not a second time in ``state``. With ``sole`` (layout 4) the
    key has exactly one version in the run's history, at checkpoint ``sole``,
    and no ``versions`` entry: the entry is ``0xff`` + CBOR ``[ref, sole]``
    (the ref inline bytes or ``[kind, address]``).
    """
    if sole is not None:
        return bytes([HEAD_REF]) + cbor2.dumps([_ref_to_cbor(value if ref is None else ref),
                                                sole])
    if isinstance(ref, tuple):
        return bytes([HEAD_REF]) + cbor2.dumps(list(ref))
    return value


def head_ref(stored: bytes) -> tuple[Ref | None, int | None]:
    """``(ref, sole version)`` of a ``state`` entry: ``(None, None)`` for a value held
    inline, ``(ref, None)`` for a head ref, ``(ref, id)`` for a key whose only version is
    checkpoint ``id`` (:func:`head_entry`). :class:`CodecError` if malformed."""
    if not stored or stored[0] != HEAD_REF:
        return None, None
    obj = loads(stored[1:])
    if (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[0], (bytes, list))
            and isinstance(obj[1], int) and not isinstance(obj[1], bool) and obj[1] > 0):
        return _ref_from_cbor(obj[0], allow_none=False), obj[1]
    return _ref_from_cbor(obj, allow_none=False), None


def head_value(objs: ObjectReader, stored: bytes) -> bytes:
    """The value bytes of a ``state`` entry written by :func:`head_entry`."""
    if not stored or stored[0] != HEAD_REF:
        return stored
    ref, _sole = head_ref(stored)
    assert ref is not None
    return resolve(objs, ref)


# -- deltas and manifests ------------------------------------------------------------

def _ref_to_cbor(ref: Ref | None) -> Any:
    return list(ref) if isinstance(ref, tuple) else ref


def _ref_from_cbor(obj: Any, *, allow_none: bool) -> Ref | None:
    if obj is None and allow_none:
        return None
    if isinstance(obj, bytes):
        return obj
    if (isinstance(obj, list) and len(obj) == 2 and obj[0] in (VALUE, LIST)
            and isinstance(obj[1], int) and not isinstance(obj[1], bool) and obj[1] >= 0):
        return (obj[0], obj[1])
    raise CodecError("malformed ref")


def encode_refs(refs: Mapping[str, Ref | None]) -> bytes:
    """Encode a delta (``{key: ref | None}``) or a manifest (``{key: ref}``)."""
    return bytes(cbor2.dumps({k: _ref_to_cbor(v) for k, v in refs.items()}))


def decode_refs(data: bytes, *, manifest: bool) -> dict[str, Ref | None]:
    """Decode a delta or manifest record; :class:`CodecError` if malformed."""
    obj = loads(data)
    if not isinstance(obj, dict):
        raise CodecError("history record is not a map")
    out: dict[str, Ref | None] = {}
    for k, v in obj.items():
        if not isinstance(k, str):
            raise CodecError("history record has a key that is not a string")
        out[k] = _ref_from_cbor(v, allow_none=not manifest)
    return out


def manifest_base(cid: int) -> int:
    """The id of the manifest the state at ``cid`` starts from (0: the empty state)."""
    return cid - cid % MANIFEST_EVERY


def is_manifest(cid: int) -> bool:
    """True if checkpoint ``cid`` gets a manifest."""
    return cid % MANIFEST_EVERY == 0


def apply_delta(state: dict[str, Ref], delta: Mapping[str, Ref | None]) -> None:
    """Apply a delta to a ``{key: ref}`` map in place."""
    for k, v in delta.items():
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v



# -- verifying -----------------------------------------------------------------------

def is_node(record: bytes) -> bool:
    """True if an object record is a list node (else a leaf, or malformed)."""
    return record[:1] == bytes([_NODE])


def children(record: bytes) -> list[int]:
    """Addresses an object record names (a node's ``prev`` and leaf segments; none for a leaf).

    Each is one reference counted for the child. :class:`CodecError` if the
    record is neither a leaf nor a well-formed node.
    """
    if record[:1] not in (*_LEAVES, bytes([_NODE])):
        raise CodecError(f"object kind {record[:1].hex() or 'missing'} is neither leaf nor node")
    return _children(record)


def indexed(record: bytes) -> bool:
    """True if an object is found by content, so its id must be in the content index.

    Leaves of kind 0 are; plain leaves never are; list nodes are not from
    layout 4 on (one a layout-3 fold wrote may still be, and then its id
    names it).
    """
    return record[:1] == bytes([_LEAF])


def check_node(objs: ObjectReader, addr: int) -> bytes:
    """Check a list node against its chain: it rebuilds to ``nbytes`` bytes with its SHA-256.

    Also checks ``depth`` (one more than ``prev``'s, 0 without one) and
    that every segment address is a leaf.

    Returns:
        The list's value bytes, as :func:`resolve` gives them.

    Raises:
        CodecError: naming what does not hold.
    """
    node = _node(_load(objs, addr))
    if node[4] is None:
        if node[3] != 0:
            raise CodecError(f"list node @{addr} has no prev but depth {node[3]}")
    else:
        prev = _node(_load(objs, node[4]))
        if node[3] != prev[3] + 1:
            raise CodecError(f"list node @{addr} has depth {node[3]}, its prev @{node[4]} "
                             f"{prev[3]}")
    value = resolve(objs, (LIST, addr))
    head = _array_header(value)
    assert head is not None
    if hashlib.sha256(value[head[1]:]).digest() != node[2]:
        raise CodecError(f"list node @{addr} rebuilds to a body whose SHA-256 is not its own")
    return value


def compare_states(ra: Mapping[str, bytes], rb: Mapping[str, bytes], *, where: str, run: str,
                   a: int, b: int
                   ) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple[Any, Any]]]:
    """``(added, removed, changed)`` from state ``ra`` (checkpoint ``a``) to ``rb`` (``b``).

    The states are ``{key: stored bytes}``; the values come back decoded, in
    key order. A key whose bytes differ but whose values are equal (a dict
    encoded in another key order) is not changed. ``where`` names the store
    in a ``CorruptionError`` of a damaged value. What ``store.diff`` reports,
    for every backend.
    """

    def dec(raw: bytes, k: str, cid: int) -> Any:
        return decode_stored(raw, where, f"{run!r}/{k!r} at {cid}")

    added = {k: dec(rb[k], k, b) for k in sorted(rb.keys() - ra.keys())}
    removed = {k: dec(ra[k], k, a) for k in sorted(ra.keys() - rb.keys())}
    changed: dict[str, tuple[Any, Any]] = {}
    for k in sorted(ra.keys() & rb.keys()):
        if ra[k] != rb[k]:
            old, new = dec(ra[k], k, a), dec(rb[k], k, b)
            if old != new:  # equal values may encode differently (dict order)
                changed[k] = (old, new)
    return added, removed, changed


def rollback_delta(current: Mapping[str, bytes], target: Mapping[str, bytes]
                   ) -> dict[str, bytes | None]:
    """The writes that turn state ``current`` into ``target`` (None deletes a key).

    What ``rollback_to`` commits, for every backend: each key whose stored
    bytes differ (or that ``current`` lacks) gets ``target``'s bytes, each key
    ``target`` lacks is deleted.
    """
    delta: dict[str, bytes | None] = {k: v for k, v in target.items() if current.get(k) != v}
    delta.update((k, None) for k in current.keys() - target.keys())
    return delta
