"""Transactions: a buffered, savepointed change to one run, committed atomically.

Theory of operation: a :class:`Transaction` reads through a *view* (the
memtables and an LMDB read transaction as of ``begin``; see ``store.py``)
and buffers its writes as encoded bytes, so a bad key or an unencodable value
fails at the call and nothing is written. It records what it read (keys and
prefixes) for optimistic validation at commit. States::

    active --commit()--> committed      (the store validated, logged, published)
    active --rollback()--> rolled_back  (nothing was written anywhere)
    active --commit() raising--> rolled_back  (ConflictError, DiskFullError, ...)

A finished transaction is dead: every method raises
:class:`TransactionClosedError`. As a context manager, a clean exit commits
and an exception rolls back and propagates. A transaction is used by one
thread; the store it came from may be shared by many.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from .codec import decode_stored, encode_value
from .errors import MissingKeyError, TransactionClosedError
from .types import Checkpoint, check_key

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Savepoint", "Transaction"]

_MISSING: Any = object()


class _Engine(Protocol):
    path: str

    def _txn_read(self, txn: Transaction, key: str) -> bytes | None: ...
    def _txn_items(self, txn: Transaction, prefix: str) -> dict[str, bytes | None]: ...
    def _txn_commit(self, txn: Transaction) -> Checkpoint | None: ...
    def _txn_release(self, txn: Transaction) -> None: ...
    def _txn_abandon(self, txn: Transaction) -> None: ...


class Savepoint:
    """A point inside a transaction to return to with ``txn.rollback_to(sp)``."""

    __slots__ = ("_depth", "_meta", "_writes")

    def __init__(self, depth: int, writes: dict[str, bytes | None], meta: dict[str, Any]):
        self._depth = depth
        self._writes = writes
        self._meta = meta


class Transaction:
    """A write transaction on one run; get one from ``store.begin(run)``.

    Example::

        with store.begin("run-42") as txn:
            step = txn.get("step", 0)
            txn["step"] = step + 1
        print(txn.checkpoint.id)
    """

    def __init__(self, engine: _Engine, run: str, view: Any) -> None:
        self._engine = engine
        self.run = run
        self._view = view
        self._writes: dict[str, bytes | None] = {}
        self._reads: set[str] = set()
        self._prefixes: set[str] = set()
        self._meta: dict[str, Any] = {}
        self._savepoints: list[Savepoint] = []
        self._state = "active"
        self.checkpoint: Checkpoint | None = None

    # -- lifecycle -----------------------------------------------------------------

    @property
    def state(self) -> str:
        """``"active"``, ``"committed"`` or ``"rolled_back"``."""
        return self._state

    def _check(self) -> None:
        if self._state != "active":
            raise TransactionClosedError(self.run, self._state.replace("_", " "))

    def commit(self) -> Checkpoint | None:
        """Validate, log and publish the change; returns the new checkpoint.

        A transaction that changed nothing and set no meta makes no checkpoint
        and returns the run's head as it was (None for a new run).

        Raises:
            ConflictError: a concurrent commit changed what this one read or
                wrote; nothing was applied, the store is fine.
            DiskFullError: not acknowledged, nothing applied; commit again later.
            DurabilityError: the store stopped accepting commits; reopen it.
            TransactionClosedError: already committed or rolled back.
        """
        self._check()
        try:
            self.checkpoint = self._engine._txn_commit(self)
        except BaseException:
            self._finish("rolled_back")
            raise
        self._finish("committed")
        return self.checkpoint

    def rollback(self) -> None:
        """Discard every change; the transaction is finished. Nothing was written."""
        self._check()
        self._finish("rolled_back")

    def _finish(self, state: str) -> None:
        self._state = state
        self._engine._txn_release(self)
        self._savepoints.clear()

    def __enter__(self) -> Transaction:
        self._check()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._state != "active":
            return
        if et is None:
            self.commit()
        else:
            self.rollback()

    def __del__(self) -> None:
        # The collector may run while this thread holds the store's lock:
        # only hand the view back, the store releases it later.
        if getattr(self, "_state", None) == "active":
            with contextlib.suppress(Exception):
                self._engine._txn_abandon(self)

    # -- reading -------------------------------------------------------------------

    def _raw(self, key: str) -> bytes | None:
        if key in self._writes:
            return self._writes[key]
        self._reads.add(key)
        return self._engine._txn_read(self, key)

    def _decode(self, raw: bytes, key: str) -> Any:
        return decode_stored(raw, self._engine.path, f"value of {self.run!r}/{key!r}")

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` as this transaction sees it, or ``default``.

        Raises:
            InvalidKeyError: ``key`` is not a valid key.
            CorruptionError: the stored value is damaged.
        """
        self._check()
        raw = self._raw(check_key(key))
        return default if raw is None else self._decode(raw, key)

    def __getitem__(self, key: str) -> Any:
        self._check()
        raw = self._raw(check_key(key))
        if raw is None:
            raise MissingKeyError(self.run, key)
        return self._decode(raw, key)

    def __contains__(self, key: object) -> bool:
        self._check()
        if not isinstance(key, str):
            return False  # like a dict: a key that cannot exist is not in it
        return self._raw(check_key(key)) is not None

    def items(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """``(key, value)`` pairs in key order, optionally only keys under ``prefix``.

        The keys are read (and the transaction checked) when ``items`` is
        called; values are decoded as the iterator reaches them.

        Raises:
            TransactionClosedError: the transaction is finished.
            TypeError: ``prefix`` is not a str.
        """
        self._check()
        if not isinstance(prefix, str):
            raise TypeError("prefix must be str")
        self._prefixes.add(prefix)
        merged = self._engine._txn_items(self, prefix)
        for key, raw in self._writes.items():
            if key.startswith(prefix):
                merged[key] = raw
        present = [(key, merged[key]) for key in sorted(merged) if merged[key] is not None]
        return ((key, self._decode(raw, key)) for key, raw in present if raw is not None)

    def keys(self, prefix: str = "") -> list[str]:
        """The keys present, in order, optionally only under ``prefix``."""
        return [k for k, _ in self.items(prefix)]

    # -- writing -------------------------------------------------------------------

    def put(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` (any CBOR-encodable value).

        Raises:
            InvalidKeyError: bad key. UnencodableValueError: bad value.
            Either way nothing changes.
        """
        self._check()
        self._writes[check_key(key)] = encode_value(key, value)

    def __setitem__(self, key: str, value: Any) -> None:
        self.put(key, value)

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if it is absent)."""
        self._check()
        self._writes[check_key(key)] = None

    def __delitem__(self, key: str) -> None:
        self._check()
        if self._raw(check_key(key)) is None:
            raise MissingKeyError(self.run, key)
        self._writes[key] = None

    def meta(self, **fields: Any) -> None:
        """Attach metadata to this commit's checkpoint (merged over earlier calls)."""
        self._check()
        merged = {**self._meta, **fields}
        encode_value("meta", merged)
        self._meta = merged

    # -- savepoints ----------------------------------------------------------------

    def savepoint(self) -> Savepoint:
        """Mark the current changes; ``rollback_to`` returns to this mark."""
        self._check()
        sp = Savepoint(len(self._savepoints), dict(self._writes), dict(self._meta))
        self._savepoints.append(sp)
        return sp

    def rollback_to(self, sp: Savepoint) -> None:
        """Undo changes made after ``sp``; ``sp`` stays usable, later savepoints do not.

        Raises:
            ValueError: ``sp`` is not a live savepoint of this transaction.
        """
        self._check()
        if sp._depth >= len(self._savepoints) or self._savepoints[sp._depth] is not sp:
            raise ValueError("savepoint is not live in this transaction (released or foreign)")
        del self._savepoints[sp._depth + 1 :]
        self._writes = dict(sp._writes)
        self._meta = dict(sp._meta)

    def __repr__(self) -> str:
        return f"<agentwal.Transaction run={self.run!r} {self._state} writes={len(self._writes)}>"
