"""The embedded engine behind the ``backend`` Protocols: ``LocalBackend``.

Theory of operation: the engine (``local.engine.Engine``: views
over the memtables and LMDB, the commit pipeline, the ledger's reads and
writes) already does everything ``backend.Backend`` names; this adapter
gives it those names and value objects. Every ``Transaction`` of a local
store reads and commits through it, and the conformance suite
(``tests/conformance/``) checks it against the same contracts a second
backend must meet. A :class:`LocalView` wraps one engine view (a snapshot
LSN, the memtable layers, an LMDB read transaction); its ``base`` and
``epoch`` are read at that view the first time they are asked for (only a
step that calls an effect asks), so a plain transaction pays for neither.

``record_effect`` is the engine's compare-and-set
(``EffectLog.write_if``): a lock striped over the keys is held from reading
the stored entry to logging the new one, and the store's writer lock keeps
other processes out. The executor (``ledger.py``) writes every entry this
way, so its rule (one writer of a key at a time) is checked, not assumed.

Nothing here touches a file or LMDB itself; it only calls the engine.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from ..backend import Change
from ..codec import Value
from ..effects import EffectRecord
from ..leases import Lease
from ..types import Checkpoint

if TYPE_CHECKING:
    from .engine import Engine
    from .reads import View

__all__ = ["LocalBackend", "LocalView"]


class LocalView:
    """One engine view of one run (``backend.View``)."""

    __slots__ = ("_base", "_engine", "_epoch", "fence", "inner", "run")

    def __init__(self, engine: Engine, run: str, inner: View) -> None:
        self._engine = engine
        self.run = run
        self.inner = inner  # the engine's view: snapshot LSN, layers, LMDB read
        self._base: int | None = None
        self._epoch: int | None = None
        #: the lease of the worker that begun a write on it (``leases.LocalLeases``), or None
        self.fence: Lease | None = None

    @property
    def base(self) -> int:
        if self._base is None:
            head = self._engine._head(self.inner, self.run)
            self._base = head.id if head is not None else 0
        return self._base

    @property
    def epoch(self) -> int:
        if self._epoch is None:
            self._epoch = self._engine._view_epoch(self.inner, self.run)
        return self._epoch


class LocalBackend:
    """``backend.Backend`` and ``backend.Maintenance`` over an open local store."""

    def __init__(self, engine: Engine) -> None:
        self._s = engine

    @property
    def store_id(self) -> uuid.UUID:
        sid: uuid.UUID = self._s.store_id
        return sid

    @property
    def name(self) -> str:
        return self._s.path

    # -- RunStore ---------------------------------------------------------------------

    def begin(self, run: str) -> LocalView:
        return LocalView(self._s, run, self._s._view())

    def read(self, view: LocalView, key: str) -> bytes | None:
        self._s.check_open()
        return self._s._read(view.inner, view.run, key)

    def read_value(self, view: LocalView, key: str) -> Value | None:
        self._s.check_open()
        return self._s._stored(view.inner, view.run, key)

    def scan(self, view: LocalView, prefix: str) -> dict[str, bytes]:
        self._s.check_open()
        return {k: v for k, v in self._s._items(view.inner, view.run, prefix).items()
                if v is not None}

    def commit(self, view: LocalView, change: Change) -> Checkpoint | None:
        if view.fence is not None:
            self._s.check_open()  # a closed store says so before its released leases do
            view.fence.check()  # released since the transaction began: LeaseLostError
        return self._s.commit_change(view.inner, change)

    def end(self, view: LocalView) -> None:
        self._s._release(view.inner)

    def abandon(self, view: LocalView) -> None:
        self._s._dead.append(view.inner)

    # -- HistoryStore -----------------------------------------------------------------

    def head(self, run: str) -> Checkpoint | None:
        return self._s.runs.head(run)

    def checkpoints(self, run: str, *, limit: int | None = None,
                    before: int | None = None) -> list[Checkpoint]:
        return self._s.runs.history(run, limit, before)

    def state_at(self, run: str, checkpoint: int, *, key: str | None = None
                 ) -> dict[str, bytes]:
        s = self._s
        s.check_open()

        def read(v: Any) -> dict[str, bytes]:
            s._check_at(v, run, checkpoint)
            return s._raw_at(v, run, checkpoint, key)

        return s._with_view(read)

    def runs(self) -> list[str]:
        return self._s.runs.names()

    def delete_run(self, run: str) -> None:
        self._s.runs.delete_run(run)

    # -- LedgerStore ------------------------------------------------------------------

    def effect(self, key: str) -> EffectRecord | None:
        self._s.check_open()
        return self._s.effectlog.get(key)

    def effect_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        self._s.check_open()
        return self._s.effectlog.key_at(run, checkpoint, ordinal)

    def record_effect(self, entry: EffectRecord, *, expect: EffectRecord | None,
                      fence: object | None = None) -> EffectRecord:
        return self._s.effectlog.write_if(entry, expect)

    def effects(self) -> list[EffectRecord]:
        self._s.check_open()
        return sorted(self._s.effectlog.entries(), key=lambda e: e.key)

    def outbox(self) -> list[EffectRecord]:
        self._s.check_open()
        return self._s.effectlog.outbox()

    # -- Maintenance ------------------------------------------------------------------

    def sync(self) -> None:
        self._s.sync()

    def stats(self) -> dict[str, Any]:
        return self._s.stats()

    def close(self) -> None:
        self._s.close()
