"""Stored values as the page draws them: bounded trees and short previews.

Theory of operation: state is untrusted and may be huge, so nothing is sent
whole. :func:`tree` turns a value into nested nodes the page renders as a
collapsible tree: text past :data:`TEXT_CHARS` and containers past
:data:`ITEMS` entries are cut, each cut node saying its full size; bytes
show a short preview; a blob reference becomes a link to download it.
:func:`preview` is one line of JSON, abbreviated the same way. A LangGraph
saver's payload (``{"t", "b", "view"}``, see ``integrations/langgraph``) is
drawn as its decoded view, marked with the serializer's tag and the size of
the bytes it stands for. Pure: no I/O.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import math
import uuid
from typing import Any

from ..types import BlobRef
from ..views import to_json

#: Characters of text a node shows before it is cut.
TEXT_CHARS = 2000
#: Entries of a list or dict a node shows before it is cut.
ITEMS = 200
#: How deep the tree goes before the rest is a preview.
DEPTH = 12
#: Bytes of a bytes value shown (as base64).
BYTES_SHOWN = 48


def tree(value: Any, blob_url: str, depth: int = 0) -> dict[str, Any]:
    """A node for ``value``: ``{"type", ...}`` with sizes wherever something was left out."""
    if isinstance(value, BlobRef):
        return {"type": "blob", "sha256": value.sha256, "size": value.size,
                "media_type": value.media_type, "url": blob_url}
    if _is_serialized(value):  # a LangGraph saver's payload: its readable view, marked
        node = tree(value["view"], blob_url, depth)
        node["serialized"] = {"kind": value["t"], "length": len(value["b"])}
        return node
    if isinstance(value, dict):
        if depth >= DEPTH:
            return _cut_preview(value)
        keys = list(value)
        return {"type": "dict", "length": len(keys), "truncated": len(keys) > ITEMS,
                "items": [[k if isinstance(k, str) else to_json(k),
                           tree(value[k], blob_url, depth + 1)] for k in keys[:ITEMS]]}
    if isinstance(value, (list, tuple, set, frozenset)):
        if depth >= DEPTH:
            return _cut_preview(value)
        is_set = isinstance(value, (set, frozenset))
        items = sorted(value, key=to_json) if is_set else list(value)
        return {"type": "list", "kind": "set" if is_set else None, "length": len(items),
                "truncated": len(items) > ITEMS,
                "items": [tree(v, blob_url, depth + 1) for v in items[:ITEMS]]}
    if isinstance(value, str):
        return {"type": "str", "value": value[:TEXT_CHARS], "length": len(value),
                "truncated": len(value) > TEXT_CHARS}
    if isinstance(value, bytes):
        return {"type": "bytes", "length": len(value), "truncated": len(value) > BYTES_SHOWN,
                "base64": base64.b64encode(value[:BYTES_SHOWN]).decode("ascii")}
    if isinstance(value, float) and not math.isfinite(value):
        return {"type": "float", "value": repr(value)}
    if value is None or isinstance(value, (bool, int, float)):
        return {"type": "null" if value is None else type(value).__name__,
                "value": value if not isinstance(value, int) or abs(value) < 2**53
                else str(value)}
    if isinstance(value, datetime.datetime):
        return {"type": "other", "kind": "datetime", "value": value.isoformat()}
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return {"type": "other", "kind": type(value).__name__, "value": str(value)}
    return {"type": "other", "kind": type(value).__name__, "value": to_json(value)[:TEXT_CHARS]}


#: The type tags of the serializers whose payloads the LangGraph saver gives a view.
SERIALIZED_KINDS = ("msgpack", "json", "null", "empty", "str")


def _is_serialized(value: Any) -> bool:
    """``{"t": tag, "b": bytes, "view": value}``: what ``AgentWALSaver(readable=True)`` stores."""
    return (isinstance(value, dict) and set(value) == {"t", "b", "view"}
            and value["t"] in SERIALIZED_KINDS and isinstance(value["b"], bytes))


def _cut_preview(value: Any) -> dict[str, Any]:
    text = to_json(value)
    return {"type": "preview", "value": text[:TEXT_CHARS], "length": len(text),
            "truncated": len(text) > TEXT_CHARS}


def preview(value: Any) -> dict[str, Any]:
    """One line of JSON for ``value``: ``{"json": text, "length": n, "truncated": bool}``."""
    text = to_json(value)
    return {"json": text[:TEXT_CHARS], "length": len(text), "truncated": len(text) > TEXT_CHARS}
