"""Plain data types shared by every layer: checkpoints, durability modes, keys.

Theory of operation: nothing here does I/O or holds locks. ``Checkpoint`` is
what the public API returns for a commit; ``Durability`` names the three
acknowledgement policies; ``check_key`` is the one place key rules live. ``BlobRef`` is what a key
put with ``txn.put_blob`` reads back as, ``TreeRef`` one put with ``txn.put_tree``; ``TreeDiff``
is the file-level change between two trees.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidKeyError
from .format import MAX_MEDIA_TYPE_BYTES

__all__ = ["MAX_KEY_BYTES", "Checkpoint", "Diff", "Durability", "check_key", "BlobRef",
           "Progress", "TreeDiff", "TreeFile", "TreeRef", "check_media_type"]

#: Longest key or run id, in UTF-8 bytes.
MAX_KEY_BYTES = 400

#: The ``progress=`` callback of ``verify``, ``backup`` and ``compact``:
#: ``progress(phase, done, total)``, ``total`` None when not known in advance.
Progress = Callable[[str, int, "int | None"], None]


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
        effects_after: only on the checkpoint ``rollback_to`` or ``fork``
            returns: the effects-ledger entries made after the target checkpoint
            that the outside world may still hold (done, resolved, in doubt,
            failed, pending), oldest first. Restoring state does not undo them,
            and the steps re-run from the new checkpoint meet new effect keys
            (a business ``key=`` dedups across such re-runs). Empty elsewhere;
            not part of equality.
    """

    run: str
    id: int
    parent: int | None
    lsn: int
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    hash: str = ""
    origin: tuple[str, int] | None = None
    effects_after: tuple[Any, ...] = field(default=(), hash=False, compare=False, repr=False)

    def __init__(self, run: str, id: int, parent: int | None, lsn: int, created_at: float,
                 meta: dict[str, Any] | None = None, hash: str = "",
                 origin: tuple[str, int] | None = None,
                 effects_after: tuple[Any, ...] = ()) -> None:
        # Each slot through its member's own setter: the dataclass's frozen __init__ (an
        # object.__setattr__ call per field) took 2.2x as long, paid on every commit,
        # every record replayed at open and every checkpoint a history lists.
        s = _CHECKPOINT_SETTERS
        s[0](self, run)
        s[1](self, id)
        s[2](self, parent)
        s[3](self, lsn)
        s[4](self, created_at)
        s[5](self, {} if meta is None else meta)
        s[6](self, hash)
        s[7](self, origin)
        s[8](self, effects_after)


_CHECKPOINT_SETTERS: tuple[Callable[[Checkpoint, Any], None], ...] = tuple(
    getattr(Checkpoint, f).__set__ for f in Checkpoint.__slots__)


@dataclass(frozen=True, slots=True)
class Diff:
    """What changed in a run between two checkpoints (``store.diff(run, a, b)``).

    Attributes:
        added: keys present at ``b`` but not at ``a``, with their value at ``b``.
        removed: keys present at ``a`` but not at ``b``, with their value at ``a``.
        changed: keys present at both with different values: ``(value at a, value at b)``.
        trees: file-level changes of the keys above that hold trees.
    """

    added: dict[str, Any]
    removed: dict[str, Any]
    changed: dict[str, tuple[Any, Any]]
    #: For each key above whose value is a tree (at ``a``, at ``b`` or both):
    #: the file-level :class:`TreeDiff` from its old tree (or none) to its new one.
    trees: dict[str, TreeDiff] = field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


#: Keys and run ids that passed :func:`check_key` lately (a str's validity never changes).
_VALID_KEYS: set[str] = set()
_VALID_KEYS_MAX = 4096


def check_checkpoint_id(cid: object) -> int:
    """``cid`` if it can be a checkpoint id (an int, not a bool), else TypeError."""
    if isinstance(cid, bool) or not isinstance(cid, int):
        raise TypeError(f"a checkpoint id is an int, not {type(cid).__name__}")
    return cid


def check_key(key: object, what: str = "key") -> str:
    """Return ``key`` if it is a valid key or run id, else raise :class:`InvalidKeyError`."""
    if type(key) is str and key in _VALID_KEYS:  # the hot path of every read
        return key
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
    if type(key) is str:
        if len(_VALID_KEYS) >= _VALID_KEYS_MAX:
            _VALID_KEYS.clear()
        _VALID_KEYS.add(key)
    return key


_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A large binary artifact stored with ``txn.put_blob``: what reading its key returns.

    The artifact itself lives in a content-addressed file under the store's
    ``blobs/`` directory; read it with ``store.open_blob(run, key)``. Two
    refs are equal when their content and media type are.

    Attributes:
        sha256: the SHA-256 of the content, 64 lowercase hex digits.
        size: the content's length in bytes.
        media_type: what the caller said it is (``"image/png"``), or None.

    Raises:
        ValueError: (when constructed) a malformed hash, a negative size or a
            media type that is not a str of 1..255 UTF-8 bytes.

    Example::

        ref = store.get("run-42", "weights")   # BlobRef(sha256='9f86...', size=...)
    """

    sha256: str
    size: int
    media_type: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.sha256, str) and len(self.sha256) == 64
                and set(self.sha256) <= _HEX):
            raise ValueError(f"sha256 must be 64 lowercase hex digits, not {self.sha256!r}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"size must be an int >= 0, not {self.size!r}")
        if self.media_type is not None:
            check_media_type(self.media_type)


def check_media_type(media_type: object) -> str:
    """Return ``media_type`` if it is a str of 1..255 UTF-8 bytes, else raise ValueError."""
    if not isinstance(media_type, str) or not media_type:
        raise ValueError(f"media_type must be a non-empty str, not {media_type!r}")
    try:
        n = len(media_type.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("media_type is not valid UTF-8 (lone surrogate)") from None
    if n > MAX_MEDIA_TYPE_BYTES:
        raise ValueError(f"media_type is {n} UTF-8 bytes, over {MAX_MEDIA_TYPE_BYTES}")
    return media_type


@dataclass(frozen=True, slots=True)
class TreeRef:
    """A directory tree stored with ``txn.put_tree``: what reading its key returns.

    The tree is content-addressed: ``sha256`` names its root object (a small
    blob listing the top directory's object, the file count and the exclude
    patterns), which names the directory objects, which name the files'
    blobs. Equal trees have equal refs. Restore it with
    ``store.restore_tree(run, key, dest)``; read one file with
    ``store.open_tree_file(run, key, relpath)``.

    Attributes:
        sha256: the SHA-256 of the root object, 64 lowercase hex digits.
        size: the root object's length in bytes (not the tree's).

    Example::

        ref = store.get("run-42", "workspace")   # TreeRef(sha256='3a7b...', size=97)
    """

    sha256: str
    size: int

    def __post_init__(self) -> None:
        BlobRef(self.sha256, self.size)  # the same checks


@dataclass(frozen=True, slots=True)
class TreeDiff:
    """File-level changes from one tree to another (paths relative to the root, ``/``-separated).

    Attributes:
        added: paths only in the new tree, with their size (a link's size is
            its target's length).
        removed: paths only in the old tree, with their size.
        modified: paths in both whose content, mode or kind differs:
            ``(old size, new size)``.
    """

    added: dict[str, int]
    removed: dict[str, int]
    modified: dict[str, tuple[int, int]]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.modified)


@dataclass(frozen=True, slots=True)
class TreeFile:
    """One file or link of a stored tree (``store.list_tree``).

    Attributes:
        path: its path from the tree's root, ``/``-separated.
        kind: ``"file"`` or ``"link"``.
        mode: a file's permission bits (``0o644``); 0 for a link.
        size: a file's length, or a link target's.
        sha256: a file's content hash (hex); "" for a link.
        target: a link's target; "" for a file.
    """

    path: str
    kind: str
    mode: int
    size: int
    sha256: str = ""
    target: str = ""
