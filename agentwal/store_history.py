"""The store facade's reads and history: ``get``, ``state``, ``history``, ``diff``, ...

Theory of operation: one part of :class:`agentwal.Store` (a base class it
inherits), split from ``store.py`` to keep each module to one concern. Each
method checks its arguments, carries its contract in its docstring, and
delegates to the engine's ``Runs`` (``local/runs.py``: the reads at a
checkpoint, the history walk, the writes ``rollback_to`` and ``fork``);
decoding stored values, and a rollback's or fork's ``effects_after``, stay
here because they are the same for every backend. Like ``store.py``, it
imports nothing of ``agentwal.local`` at run time.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .codec import ABSENT, AS_IS, FLAT_DICT, DecodedValues, decode_stored
from .effects import EffectRecord
from .types import (
    Checkpoint,
    Diff,
    check_checkpoint_id,
    check_key,
)

if TYPE_CHECKING:
    from .local.engine import Engine

__all__ = ["HistoryAPI"]


class HistoryAPI:
    """``Store``'s reads of a run's state and history, and ``rollback_to``/``fork``."""

    _engine: Engine
    path: str
    readonly: bool
    _decoded: DecodedValues

    if TYPE_CHECKING:  # on Store, from EffectsAPI
        def _effects_after(self, run: str, cid: int) -> tuple[EffectRecord, ...]: ...

    # -- reads ----------------------------------------------------------------------

    def get(self, run: str, key: str, default: Any = None, *, at: int | None = None) -> Any:
        """The value of ``key`` in ``run`` (latest, or at checkpoint ``at``), or ``default``.

        Args:
            run: the run id.
            key: the key.
            default: returned when the key is absent (at that checkpoint).
            at: a checkpoint id of the run; None reads the latest commit.

        Raises:
            InvalidKeyError: bad run id or key. CorruptionError: damaged value.
            RunNotFoundError: ``at`` is given and the run has no checkpoint.
            CheckpointNotFoundError: the run has no checkpoint ``at``.

        Example::

            plan_then = store.get("run-42", "plan", at=3)
        """
        e = self._engine
        if at is None and type(run) is str and type(key) is str:
            # The hot path: a small value read since the last commit anywhere in the
            # store is still the latest (the state at that LSN cannot change).
            hit = self._decoded.entries.get((run, key))
            if hit is not None and hit[3] == e.stamp and not e.closed:
                kind = hit[2]
                if kind == AS_IS:
                    return hit[1]
                if kind == ABSENT:
                    return default
                return dict(hit[1]) if kind == FLAT_DICT else list(hit[1])
        check_key(run, "run id")
        check_key(key)
        if at is not None:
            raw = e.runs.value(run, key, check_checkpoint_id(at))
            return default if raw is None else decode_stored(raw, self.path, f"{run!r}/{key!r}")
        stamp = None if self.readonly else e.stamp  # read before the value: never newer
        raw = e.runs.latest(run, key)
        if raw is None:
            if stamp is not None:
                self._decoded.absent(run, key, stamp)
            return default
        return self._decoded.decode(run, key, raw, self.path, stamp=stamp)

    def state(self, run: str, *, at: int | None = None) -> dict[str, Any]:
        """The run's state as a new dict: the latest, or as of checkpoint ``at``.

        Any checkpoint can be read, folded or not; a folded one is rebuilt
        from one manifest and at most ``history.MANIFEST_EVERY - 1`` deltas.

        Raises:
            RunNotFoundError: the run has no checkpoint.
            CheckpointNotFoundError: the run has no checkpoint ``at``.
            CorruptionError: a record needed is damaged.

        Example::

            before = store.state("run-42", at=7)
        """
        check_key(run, "run id")
        raw = self._engine.runs.state_raw(run, None if at is None else check_checkpoint_id(at))
        return {k: decode_stored(b, self.path, f"{run!r}/{k!r}")
                for k, b in sorted(raw.items()) if b is not None}

    def head(self, run: str) -> Checkpoint | None:
        """The run's latest checkpoint, or None if it has none."""
        check_key(run, "run id")
        return self._engine.runs.head(run)

    def history(self, run: str, *, limit: int | None = None,
                before: int | None = None) -> list[Checkpoint]:
        """The run's checkpoints, newest first (at most ``limit``; ids below ``before``).

        Args:
            run: the run id (an unknown run has no history: ``[]``).
            limit: at most this many.
            before: a checkpoint id of the run: only older checkpoints (to page
                back: ``before=page[-1].id``); one compaction dropped is fine.

        Raises:
            RunNotFoundError / CheckpointNotFoundError: ``before`` is not an id
                between 1 and the run's head.
            ValueError: a negative ``limit``.

        Example::

            page = store.history("run-42", limit=20)
            older = store.history("run-42", limit=20, before=page[-1].id)
        """
        check_key(run, "run id")
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        upto = None if before is None else check_checkpoint_id(before)
        return self._engine.runs.history(run, limit, upto)

    def diff(self, run: str, a: int, b: int) -> Diff:
        """What changed in ``run`` from checkpoint ``a`` to checkpoint ``b``.

        Returns:
            A :class:`Diff`: keys added, removed and changed (values decoded;
            ``changed[key] == (value at a, value at b)``). ``a`` may be newer
            than ``b``; the diff then reads backwards.

        Raises:
            RunNotFoundError: no such run.
            CheckpointNotFoundError: ``a`` or ``b`` is not a checkpoint of the run.

        Example::

            d = store.diff("run-42", 5, 9)
            print(sorted(d.changed))
        """
        check_key(run, "run id")
        return self._engine.runs.diff(run, check_checkpoint_id(a), check_checkpoint_id(b))

    # -- writes beside transactions -------------------------------------------------

    def rollback_to(self, run: str, checkpoint: int) -> Checkpoint:
        """Make a new checkpoint whose state equals the state at ``checkpoint``.

        The new checkpoint's parent is the run's head (history is kept) and
        its metadata is ``{"rollback_to": checkpoint}``. It is an ordinary
        commit: durable as the store's mode says, and visible once it returns.

        State is restored; the world is not. The returned checkpoint's
        ``effects_after`` lists the effects made after ``checkpoint`` that the
        outside world may still hold; steps re-run from the new checkpoint
        meet new effect keys and call again, unless they use a business
        ``key=`` (see ``docs/effects.md``).

        Raises:
            RunNotFoundError / CheckpointNotFoundError: no such run or checkpoint.
            ConflictError: a commit on the run raced this one; nothing was
                applied, call it again.
            ReadOnlyError, DiskFullError, DurabilityError: as for a commit.

        Example::

            store.rollback_to("run-42", 7)
            assert store.state("run-42") == store.state("run-42", at=7)
        """
        check_key(run, "run id")
        cid = check_checkpoint_id(checkpoint)
        ckpt = self._engine.runs.rollback_to(run, cid)
        return dataclasses.replace(ckpt, effects_after=self._effects_after(run, cid))

    def fork(self, run: str, checkpoint: int, new_run: str) -> Checkpoint:
        """Start ``new_run`` from the state of ``run`` at ``checkpoint``.

        The new run's first checkpoint (id 1, no parent) has
        ``origin == (run, checkpoint)`` and that state; from then on the two
        runs are independent. A fork waits for a fold, compaction, ``verify``
        or ``backup`` in progress, so a compaction (which keeps every fork's
        origin by default) always sees it.

        Returns:
            The new run's first checkpoint; its ``effects_after`` lists the
            source run's effects made after ``checkpoint`` that the outside
            world may still hold (the fork's steps meet new effect keys).

        Raises:
            RunNotFoundError / CheckpointNotFoundError: no such run or checkpoint.
            RunExistsError: ``new_run`` already has a checkpoint.
            InvalidKeyError: a bad run id.
            ReadOnlyError, DiskFullError, DurabilityError: as for a commit.

        Example::

            store.fork("run-42", 7, "run-42-b")
        """
        check_key(run, "run id")
        check_key(new_run, "run id")
        cid = check_checkpoint_id(checkpoint)
        ckpt = self._engine.runs.fork(run, cid, new_run)
        return dataclasses.replace(ckpt, effects_after=self._effects_after(run, cid))
