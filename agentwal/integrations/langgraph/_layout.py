"""How a LangGraph thread is laid out in one agentwal run (pure: names and records, no I/O).

Theory of operation: a thread is an agentwal run of the same id. Its keys::

    langgraph                      marker: this run is a LangGraph thread ({"format": 2})
    ns/<nsid>                      the checkpoint namespace behind <nsid> (a str)
    head/<nsid>                    the id of the newest checkpoint of that namespace
    ck/<nsid>/<checkpoint id>      a checkpoint: its parent, the serialized checkpoint
                                   without channel values, the serialized metadata
    v/<nsid>/<channel>/<version>   one channel value at one version (written once)
    l/<nsid>/<channel>/<token>/<c> chunk c of a pool: elements of a list channel, append-only
    w/<nsid>/<checkpoint id>/<task id>/<idx>   one pending write
    e/<digest>                     (format 1 only) one element of a list, content-addressed

``<nsid>`` is ``root`` for the root namespace and a short hash otherwise, so a
deep subgraph namespace cannot push a key past agentwal's 400-byte limit; any
other part that is long or holds ``/`` is replaced by ``#`` and its hash.
Every serialized payload is stored as ``{"t": type tag, "b": bytes}``, the
pair the saver's serializer produced, so encrypted and custom serializers
round-trip; ``"view"``, when present, is a readable decoding for the CLI only.

A list value (``messages`` under ``add_messages``) is stored in a *pool*: per
(namespace, channel), a list of serialized elements that only ever grows,
through ``txn.append`` (so the log and the folded history of a step hold the
new elements only, and agentwal's list nodes share the rest). A pool is kept
in chunks of ``POOL_CHUNK`` elements, one key each (element ``p`` is item ``p
% POOL_CHUNK`` of chunk ``p // POOL_CHUNK``), so an append copies and a fold
hashes one chunk, not the whole conversation. A version record names its
elements as runs of pool positions: ``{"t": "pool", "k": <pool key>, "s":
[start, stop, start, stop, ...]}`` is the elements ``pool[start:stop]`` of
each run, in order; with ``"b": <value key of an earlier version>, "n": keep,
"d": depth`` it is the first ``keep`` elements of that version followed by the
runs, so a step's record holds only its own runs however many runs the list
has (a pooled element the list skips, such as a message the task wrote before
``add_messages`` gave it an id, adds a run). Every ``MAX_DEPTH`` links a
record lists all its runs again. A task's written message list goes into the
pool of its channel too, so the next checkpoint, whose list ends with those
messages, adds nothing to the pool. A list that is not the pool's elements in
order (an edit in the middle, a branch from an old checkpoint) appends only
what the pool lacks; a list of more than ``MAX_RUNS`` runs starts a new pool
with the whole list.

Format 1 (older threads, still read) stored each element under
``e/<digest>`` and a version as a *chain*: ``{"t": "list", "base": <key of
an earlier version>, "keep": k, "add": [digests]}`` is the first ``k``
elements of the base followed by ``add`` (``depth`` links deep, at most
``MAX_DEPTH``); a written list was ``{"t": "list", "add": [...]}``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "FORMAT",
    "MARKER",
    "MAX_DEPTH",
    "MAX_RUNS",
    "ROOT",
    "checkpoint_key",
    "checkpoint_prefix",
    "digest",
    "element_key",
    "head_key",
    "list_record",
    "ns_id",
    "ns_key",
    "POOL_CHUNK",
    "chunk_key",
    "pool_of_chunk",
    "pool_key",
    "pool_positions",
    "pool_record",
    "resolve_list",
    "value_key",
    "write_key",
    "value_prefix",
    "write_prefix",
    "writes_prefix",
]

MARKER = "langgraph"
#: The layout this version writes (the marker's ``format``); it reads 1 and 2.
FORMAT = 2
ROOT = "root"
#: Links of a list chain before a record lists all its elements (or runs) again.
MAX_DEPTH = 16
#: Runs of pool positions a record listing a whole list may have before the list
#: starts a new pool (each run is an element the list skips: another version of it).
MAX_RUNS = 512
#: Elements per chunk of a pool.
POOL_CHUNK = 64
_SAFE_PART_BYTES = 80


def _hash(text: str, size: int = 8) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).hexdigest()


def ns_id(ns: str) -> str:
    """The short id of checkpoint namespace ``ns`` used inside keys."""
    return ROOT if ns == "" else _hash(ns, 6)


def _part(text: str) -> str:
    """``text`` as one key segment: itself if short and slash-free, else ``#`` + a hash."""
    if (text and "/" not in text and not text.startswith("#")
            and len(text.encode("utf-8", "surrogatepass")) <= _SAFE_PART_BYTES
            and text.isprintable()):
        return text
    return "#" + _hash(text, 12)


def _version_part(version: object) -> str:
    if isinstance(version, bool) or not isinstance(version, (str, int, float)):
        raise TypeError(f"a channel version must be str, int or float, not {version!r}")
    if isinstance(version, str):
        return _part(version)
    return ("i:" if isinstance(version, int) else "f:") + repr(version)


def ns_key(nsid: str) -> str:
    return f"ns/{nsid}"


def head_key(nsid: str) -> str:
    return f"head/{nsid}"


def checkpoint_prefix(nsid: str | None = None) -> str:
    return "ck/" if nsid is None else f"ck/{nsid}/"


def checkpoint_key(nsid: str, checkpoint_id: str) -> str:
    return f"ck/{nsid}/{_part(checkpoint_id)}"


def value_key(nsid: str, channel: str, version: object) -> str:
    return f"v/{nsid}/{_part(channel)}/{_version_part(version)}"


def value_prefix(nsid: str | None = None) -> str:
    return "v/" if nsid is None else f"v/{nsid}/"


def writes_prefix(nsid: str | None = None) -> str:
    """The pending writes of every checkpoint (of one namespace)."""
    return "w/" if nsid is None else f"w/{nsid}/"


def write_prefix(nsid: str, checkpoint_id: str) -> str:
    return f"w/{nsid}/{_part(checkpoint_id)}/"


def write_key(nsid: str, checkpoint_id: str, task_id: str, idx: int) -> str:
    return f"{write_prefix(nsid, checkpoint_id)}{_part(task_id)}/{idx}"


def element_key(dig: str) -> str:
    return f"e/{dig}"


def pool_key(nsid: str, channel: str, token: str) -> str:
    """The name of a pool (what records name); its chunks are keys below it."""
    return f"l/{nsid}/{_part(channel)}/{token}"


def chunk_key(pool: str, chunk: int) -> str:
    return f"{pool}/{chunk:06x}"


def pool_of_chunk(key: str) -> str:
    return key.rsplit("/", 1)[0]


def pool_record(key: str, positions: Sequence[int],
                base: tuple[str, int, int] | None = None) -> dict[str, Any]:
    """The record of a list whose elements are ``pool[p]`` for each of ``positions``.

    ``base`` is ``(value key, keep, depth)`` of an earlier version of the list in
    the same pool: the record then stands for the first ``keep`` elements of that
    version followed by ``positions``, one link deeper.
    """
    runs: list[int] = []
    for p in positions:
        if runs and runs[-1] == p:
            runs[-1] = p + 1
        else:
            runs += [p, p + 1]
    rec: dict[str, Any] = {"t": "pool", "k": key, "s": runs}
    if base is not None:
        rec.update(b=base[0], n=base[1], d=base[2] + 1)
    return rec


def _runs(record: dict[str, Any]) -> list[int]:
    runs = record.get("s")
    if (not isinstance(record.get("k"), str) or not isinstance(runs, list) or len(runs) % 2
            or not all(type(n) is int and n >= 0 for n in runs)
            or any(runs[i + 1] < runs[i] for i in range(0, len(runs), 2))):
        raise LookupError(f"malformed list record {record!r}"[:200])
    return [p for i in range(0, len(runs), 2) for p in range(runs[i], runs[i + 1])]


def pool_positions(record: dict[str, Any], read: Callable[[str], Any]) -> list[int]:
    """The pool positions of a list version's elements, following its links through
    ``read(key)``.

    Raises:
        LookupError: a link is missing, in another pool, or malformed.
    """
    chain = [record]
    while "b" in chain[-1]:
        below = read(chain[-1]["b"])
        if (not isinstance(below, dict) or below.get("t") != "pool"
                or below.get("k") != record.get("k")):
            raise LookupError(f"list version {chain[-1]['b']!r} is missing")
        chain.append(below)
        if len(chain) > MAX_DEPTH + 1:
            raise LookupError("list chain longer than its depth bound")
    positions = _runs(chain[-1])
    for rec in reversed(chain[:-1]):
        keep = rec.get("n")
        if type(keep) is not int or not 0 <= keep <= len(positions):
            raise LookupError(f"malformed list record {rec!r}"[:200])
        positions = positions[:keep] + _runs(rec)
    return positions


def digest(typed: tuple[str, bytes]) -> str:
    """The content address of one serialized element."""
    h = hashlib.blake2b(digest_size=16)
    h.update(typed[0].encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    h.update(typed[1])
    return h.hexdigest()


def list_record(digests: Sequence[str], base: tuple[str, Sequence[str], int] | None
                ) -> dict[str, Any]:
    """The version record of a list whose elements have ``digests``.

    ``base`` is ``(key, digests, depth)`` of an existing version of the same
    channel, or None. The record shares the base's longest common prefix when
    there is one and the chain is not too deep; else it lists every digest.
    """
    if base is not None:
        key, old, depth = base
        keep = 0
        for a, b in zip(old, digests, strict=False):
            if a != b:
                break
            keep += 1
        if keep and depth + 1 < MAX_DEPTH:
            return {"t": "list", "base": key, "keep": keep, "add": list(digests[keep:]),
                    "depth": depth + 1}
    return {"t": "list", "add": list(digests), "depth": 0}


def resolve_list(record: dict[str, Any], read: Callable[[str], Any]) -> list[str]:
    """The digests of a list version, following its chain through ``read(key)``.

    Raises:
        LookupError: a link of the chain is missing.
    """
    chain = [record]
    while "base" in chain[-1]:
        below = read(chain[-1]["base"])
        if not isinstance(below, dict) or below.get("t") != "list":
            raise LookupError(f"list version {chain[-1]['base']!r} is missing")
        chain.append(below)
        if len(chain) > MAX_DEPTH + 1:
            raise LookupError("list chain longer than its depth bound")
    digests: list[str] = list(chain[-1]["add"])
    for rec in reversed(chain[:-1]):
        digests = digests[: rec["keep"]] + list(rec["add"])
    return digests
