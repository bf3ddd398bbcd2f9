"""Runs and their history: reads at a checkpoint, listings, diffs, rollback, fork, deletion.

Theory of operation: every read here is one view (``reads.py`` walks it:
memtables newest first, then LMDB), so what it returns is one consistent
state even while commits and folds go on. A history read checks its
checkpoint first (:meth:`~agentwal.local.reads.LayeredReader.check_at`:
``RunNotFoundError``/``CheckpointNotFoundError``, also for one retention
dropped), then rebuilds the state from the layers and LMDB's manifests and
deltas. ``history`` pages newest first: the memtables' checkpoints, then
LMDB's older ones (while a fold commits, LMDB may already hold what the
frozen table still shows, so LMDB gives only what is older).

The writes beside transactions are ordinary commits through the pipeline:
``rollback_to`` commits the delta back to a checkpoint's state (having read
the whole run, so any commit since its view conflicts), ``fork`` commits a
new run's first checkpoint with an origin (holding the fold lock from the
origin's check to the commit, so a compaction always sees the fork), and
``delete_run`` logs a durable deletion record and wakes the fold that
removes the run from LMDB. Reading a tree's values inside a diff or a
rollback holds the blob gate, so no sweep removes what they name meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import failpoints
from ..codec import Joined
from ..errors import CheckpointNotFoundError, RunExistsError, RunNotFoundError, StoreClosedError
from ..history import compare_states, rollback_delta
from ..types import Checkpoint, Diff

if TYPE_CHECKING:
    from .engine import Engine
    from .reads import View

__all__ = ["Runs"]


class Runs:
    """Runs and their history in the engine (one per engine: ``engine.runs``)."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    def value(self, run: str, key: str, cid: int | None) -> bytes | None:
        """The stored bytes of ``key`` (latest, or at checkpoint ``cid``), in one view."""
        e = self._e
        if cid is None:
            return self.latest(run, key)

        def read_at(v: View) -> bytes | None:
            e._check_at(v, run, cid)
            return e._raw_at(v, run, cid, key).get(key)

        return e._with_view(read_at)

    def latest(self, run: str, key: str) -> bytes | None:
        """The newest stored bytes of ``key`` (None: absent): a view's read without the view.

        Everything happens under the engine's lock, so no publish, prune or
        fold can move between the memtable lookup and LMDB's read: the layers
        newest first, then (if none decides the key) one short LMDB read that
        :meth:`Snapshot.latest` begins and ends itself. A read-only store
        (one shared, pinned LMDB transaction) and a vacuum's swap take the
        view path. The hot path of ``store.get``: each layer's lookup is
        :meth:`Memtable.lookup` written out here (one call less per layer).
        """
        e = self._e
        if e.closed:
            raise StoreClosedError(e.path, e.closed_why)
        if not e.readonly:
            with e._lock:
                if not e._swapping:
                    snap = e._visible
                    frozen = e._frozen
                    for table in (e._active,) if frozen is None else (e._active, frozen):
                        rm = table.runs.get(run)
                        if rm is None:
                            continue
                        floor = rm.floor(snap) if rm.deleted else 0
                        chain = rm.versions.get(key)
                        if chain is not None:
                            for lsn, value in reversed(chain):
                                if lsn <= snap:
                                    if lsn <= floor:
                                        return None
                                    return (value.whole() if type(value) is Joined
                                            else value)  # type: ignore[return-value]
                        if floor:
                            return None
                    return e._snap.latest(run, key)  # type: ignore[union-attr]
        return e._with_view(lambda v: e._read(v, run, key))

    def state_raw(self, run: str, cid: int | None) -> dict[str, bytes | None]:
        """The run's stored state (latest, or at checkpoint ``cid``), in one view."""
        e = self._e

        def read(v: View) -> dict[str, bytes | None]:
            if cid is not None:
                head = e._check_at(v, run, cid)
                if cid != head.id:
                    return dict(e._raw_at(v, run, cid))
            elif e._head(v, run) is None:
                raise RunNotFoundError(run)
            return e._items(v, run, "")

        return e._with_view(read)

    def head(self, run: str) -> Checkpoint | None:
        """The run's latest checkpoint, or None."""
        e = self._e
        return e._with_view(lambda v: e._head(v, run))

    def history(self, run: str, limit: int | None, upto: int | None) -> list[Checkpoint]:
        """The run's checkpoints, newest first (``Store.history``)."""
        e = self._e

        def read(v: View) -> list[Checkpoint]:
            if upto is not None:  # a bound: one compaction dropped may still page on
                head = e._head(v, run)
                if head is None:
                    raise RunNotFoundError(run)
                if not 1 <= upto <= head.id:
                    raise CheckpointNotFoundError(run, upto)
            out: list[Checkpoint] = []
            for layer in e._layers(v, run):
                rm = layer.runs.get(run)
                if rm is not None:
                    floor = rm.floor(v.snap) if rm.deleted else 0
                    out.extend(c for c, _h, _m in reversed(rm.checkpoints)
                               if floor < c.lsn <= v.snap and (upto is None or c.id < upto))
            info = e._info(v, run)
            if info is not None:
                assert e._snap is not None
                snap = e._snap
                want = None if limit is None else max(0, limit - len(out))

                # While a fold commits, LMDB may already hold what the frozen
                # memtable still shows: take from LMDB only what is older.
                below = min((c.id for c in out), default=None)

                def folded(t: Any) -> list[Checkpoint]:
                    got: list[Checkpoint] = []
                    for c in snap.reader(t).checkpoints(run, info.number, upto):
                        if below is not None and c.id >= below:
                            continue
                        if want is not None and len(got) >= want:
                            break
                        got.append(c)
                    return got

                out.extend(e._lmdb(v, folded))
            return out if limit is None else out[:limit]

        return e._with_view(read)

    def diff(self, run: str, ca: int, cb: int) -> Diff:
        """What changed in ``run`` from checkpoint ``ca`` to ``cb`` (``Store.diff``)."""
        e = self._e

        def read(v: View) -> tuple[dict[str, bytes], dict[str, bytes]]:
            e._check_at(v, run, ca)
            e._check_at(v, run, cb)
            return e._raw_at(v, run, ca), e._raw_at(v, run, cb)

        with e._blobs.gate.shared():  # no sweep between the values and their trees
            return self._diff(run, ca, cb, *e._with_view(read))

    def _diff(self, run: str, ca: int, cb: int, ra: dict[str, bytes], rb: dict[str, bytes]
              ) -> Diff:
        added, removed, changed = compare_states(ra, rb, where=self._e.path, run=run, a=ca,
                                                 b=cb)
        return Diff(added, removed, changed, self._e._trees.key_diffs(added, removed, changed))

    def names(self) -> list[str]:
        """Every run id with at least one checkpoint, sorted."""
        e = self._e

        def read(v: View) -> list[str]:
            assert e._snap is not None
            snap = e._snap
            names = set(e._lmdb(v, lambda t: snap.reader(t).runs()))
            for layer in v.layers:
                names.update(r for r, rm in layer.runs.items()
                             if any(c.lsn <= v.snap for c, _h, _m in rm.checkpoints))
            deleted = {r for layer in v.layers for r, rm in layer.runs.items() if rm.deleted}
            names.difference_update(r for r in deleted if e._head(v, r) is None)
            return sorted(names)

        return e._with_view(read)

    def rollback_to(self, run: str, cid: int) -> Checkpoint:
        """A new checkpoint with the state at ``cid`` (``Store.rollback_to``)."""
        e = self._e
        with e._blobs.gate.shared():  # no blob sweep between reading refs and committing
            pipe, view = e._writable(), e._view()
            try:
                e._check_at(view, run, cid)
                target = e._raw_at(view, run, cid)
                current = {k: v for k, v in e._items(view, run, "").items() if v is not None}
                delta = rollback_delta(current, target)
                # The whole run was read: any commit on it since the view conflicts.
                ckpt = pipe.commit(run, view.snap, set(), {""}, delta, {"rollback_to": cid})
            finally:
                e._release(view)
        return ckpt

    def fork(self, run: str, cid: int, new_run: str) -> Checkpoint:
        """Start ``new_run`` from ``run`` at ``cid`` (``Store.fork``)."""
        e = self._e
        # The fold lock keeps a compaction out from checking the origin to committing
        # the fork (it would not yet see the fork's origin, and could drop it); the
        # blob gate keeps a sweep out from reading the refs to committing them.
        with e._fold_lock, e._blobs.gate.shared():
            pipe, view = e._writable(), e._view()
            try:
                e._check_at(view, run, cid)
                if e._head(view, new_run) is not None:
                    raise RunExistsError(new_run)
                target: dict[str, bytes | None] = dict(e._raw_at(view, run, cid))
                ckpt = pipe.commit(new_run, view.snap, set(), {""}, target, {},
                                   origin=(run, cid))
            finally:
                e._release(view)
        return ckpt

    def delete_run(self, run: str) -> None:
        """Delete ``run`` durably and wake the fold that removes it (``Store.delete_run``)."""
        e = self._e
        pipe = e._writable()
        pipe.delete_run(run)
        failpoints.hit("delete_run_after_record")
        with e._lock:
            e._want_fold()
