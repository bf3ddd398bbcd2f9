"""How a LangGraph thread is laid out in one agentwal run (pure: names and records, no I/O).

Theory of operation: a thread is an agentwal run of the same id. Its keys::

    langgraph                      marker: this run is a LangGraph thread ({"format": 1})
    ns/<nsid>                      the checkpoint namespace behind <nsid> (a str)
    head/<nsid>                    the id of the newest checkpoint of that namespace
    ck/<nsid>/<checkpoint id>      a checkpoint: its parent, the serialized checkpoint
                                   without channel values, the serialized metadata
    v/<nsid>/<channel>/<version>   one channel value at one version (written once)
    e/<digest>                     one element of a list channel, content-addressed
    w/<nsid>/<checkpoint id>/<task id>/<idx>   one pending write

``<nsid>`` is ``root`` for the root namespace and a short hash otherwise, so a
deep subgraph namespace cannot push a key past agentwal's 400-byte limit; any
other part that is long or holds ``/`` is replaced by ``#`` and its hash.
Every serialized payload is stored as ``{"t": type tag, "b": bytes}``, the
pair the saver's serializer produced, so encrypted and custom serializers
round-trip; ``"view"``, when present, is a readable decoding for the CLI only.

A list value (``messages`` under ``add_messages``) is stored element by
element: each element once under ``e/<digest>``, and the version record names
its elements as a *chain*: ``{"base": <key of an earlier version>, "keep": k,
"add": [...]}`` means the first ``k`` elements of the base followed by
``add``. So a step that appends one message writes one element and a record
of a few dozen bytes, not the whole history. Every ``MAX_DEPTH`` links a
record lists all its digests again (``depth`` 0), which bounds a read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "MARKER",
    "MAX_DEPTH",
    "ROOT",
    "checkpoint_key",
    "checkpoint_prefix",
    "digest",
    "element_key",
    "head_key",
    "list_record",
    "ns_id",
    "ns_key",
    "resolve_list",
    "value_key",
    "write_key",
    "value_prefix",
    "write_prefix",
    "writes_prefix",
]

MARKER = "langgraph"
ROOT = "root"
#: Links of a list chain before a record lists all its elements again.
MAX_DEPTH = 16
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
