"""Plain data types shared by every layer: checkpoints, durability modes, keys.

Theory of operation: nothing here does I/O or holds locks. ``Checkpoint`` is
what the public API returns for a commit; ``Durability`` names the three
acknowledgement policies; ``check_key`` is the one place key rules live.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidKeyError

__all__ = ["MAX_KEY_BYTES", "Checkpoint", "Diff", "Durability", "check_key"]

#: Longest key or run id, in UTF-8 bytes.
MAX_KEY_BYTES = 400


class Durability(str, enum.Enum):
    """When ``commit()`` returns.

    - ``SYNC``: after the record is on stable storage (group-committed fdatasync).
    - ``ASYNC``: after the record is written to the OS; a background flusher
      makes it durable within ``sync_interval``; ``store.sync()`` forces it.
    - ``NONE``: commits are never synced (the log is synced only when a segment
      fills, before a fold, and at ``sync()``/``close()``); for tests and scratch runs.
    """

    SYNC = "sync"
    ASYNC = "async"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One commit of a run.

    Attributes:
        run: the run id.
        id: 1, 2, 3 ... per run.
        parent: the id of the checkpoint this one follows, or None for the first.
        lsn: the log sequence number of the commit record.
        created_at: commit time, seconds since the epoch (UTC).
        meta: metadata given with ``txn.meta(...)``.
        hash: hex SHA-256 covering the parent's hash, this checkpoint's fields
            and its change, so history is tamper-evident.
        origin: ``(run, id)`` the first checkpoint of a fork starts from, else None.
    """

    run: str
    id: int
    parent: int | None
    lsn: int
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    hash: str = ""
    origin: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Diff:
    """What changed in a run between two checkpoints (``store.diff(run, a, b)``).

    Attributes:
        added: keys present at ``b`` but not at ``a``, with their value at ``b``.
        removed: keys present at ``a`` but not at ``b``, with their value at ``a``.
        changed: keys present at both with different values: ``(value at a, value at b)``.
    """

    added: dict[str, Any]
    removed: dict[str, Any]
    changed: dict[str, tuple[Any, Any]]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def check_key(key: object, what: str = "key") -> str:
    """Return ``key`` if it is a valid key or run id, else raise :class:`InvalidKeyError`."""
    if not isinstance(key, str):
        raise InvalidKeyError(key, f"{what} must be str, not {type(key).__name__}")
    if not key:
        raise InvalidKeyError(key, f"{what} must not be empty")
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidKeyError(key, f"{what} is not valid UTF-8 (lone surrogate)") from None
    if n > MAX_KEY_BYTES:
        raise InvalidKeyError(key, f"{what} is {n} UTF-8 bytes, over {MAX_KEY_BYTES}")
    return key
