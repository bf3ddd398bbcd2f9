"""Readable decodings of serialized LangGraph values, stored beside the bytes for the CLI.

Theory of operation: the saver keeps its serializer's exact ``(type, bytes)``
pair; this module only adds a best-effort picture of it (``"view"``) so that
``agentwal show`` on a LangGraph store prints messages and dicts, not opaque
bytes. A view is never read back by the saver. Types it cannot decode
without the serializer's secrets (an ``EncryptedSerializer`` tag, pickle)
get no view.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["view_of"]

import ormsgpack

_MAX_VIEW_BYTES = 1 << 20


def _ext(code: int, data: bytes) -> Any:
    inner = ormsgpack.unpackb(data, ext_hook=_ext, option=ormsgpack.OPT_NON_STR_KEYS)
    if (isinstance(inner, list) and len(inner) >= 3 and isinstance(inner[0], str)
            and isinstance(inner[1], str)):
        return {"$type": f"{inner[0]}.{inner[1]}", "value": inner[2]}
    return {"$ext": code, "value": inner}


def view_of(typed: tuple[str, bytes]) -> Any:
    """A CBOR-friendly picture of a serialized value, or None when there is none to give."""
    kind, data = typed
    if len(data) > _MAX_VIEW_BYTES:
        return None
    try:
        if kind == "msgpack":
            return {"value": ormsgpack.unpackb(data, ext_hook=_ext,
                                               option=ormsgpack.OPT_NON_STR_KEYS)}
        if kind == "json":
            return {"value": json.loads(data)}
        if kind in ("null", "empty"):
            return {"value": None}
        if kind == "str":  # some serializers tag text
            return {"value": data.decode("utf-8")}
    except Exception:  # a view is optional: any decoding failure just means no view
        return None
    return None
