"""Retention: which checkpoints compaction keeps, the policies, the report, run deletion.

Theory of operation: this module is pure. It decides, from a run's folded
checkpoint ids and creation times, which checkpoints ``store.compact``
keeps and what has to be rewritten so that every kept one stays readable;
``snapshot.py`` carries the plan out in one LMDB write transaction, so a
crash leaves LMDB before it or after it, never between.

*What is kept* (:func:`choose`): a run's head always; every checkpoint a
fork's ``origin`` names (``protected``); the last ``keep_last`` ids; those
created at or after ``cutoff``. With both ``keep_last`` and ``cutoff`` a
checkpoint is kept if either keeps it; with neither, nothing is dropped.

*Staying readable* (:func:`plan_run`): the state at checkpoint ``c`` is the
nearest manifest at or before ``c`` plus the deltas after it up to ``c``.
Kept checkpoints form blocks of consecutive ids; inside a block each
checkpoint is its predecessor plus its own delta. A block that now starts
after a dropped checkpoint (an *orphan*: its parent is dropped) gets a new
manifest at its first id unless it has one, written from the old records
before anything is deleted, so every kept checkpoint still rebuilds from
records that are kept. The bound on deltas per read holds: a block longer
than ``MANIFEST_EVERY`` contains a regular manifest. Each orphan also gets
its dropped parent's hash recorded beside it, so the hash chain can be
checked from the oldest kept checkpoint (and across every gap).

*Deletion* (``local.records.encode_delete_run``): ``store.delete_run`` logs a
``REC_DELETE_RUN`` record whose payload is the CBOR array ``[run, head
id]``. The head id is informational (what the run had when it was deleted).

Nothing here touches a file, a lock or the clock; ``store.py`` passes "now".
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from .types import check_key

__all__ = [
    "CompactReport",
    "KeepFor",
    "KeepLast",
    "Policy",
    "RunPlan",
    "Tally",
    "check_args",
    "choose",
    "plan_run",
    "policy_args",
]


@dataclass(frozen=True, slots=True)
class KeepLast:
    """Retention policy: keep each run's last ``n`` checkpoints (``n >= 1``).

    Give it to ``agentwal.open(path, retain=agentwal.KeepLast(100))``; it is
    ``store.compact(keep_last=n)`` applied by the background fold thread.

    Raises:
        ValueError: ``n`` is not an int of at least 1.
    """

    n: int

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"KeepLast needs an int n >= 1, not {self.n!r}")


@dataclass(frozen=True, slots=True)
class KeepFor:
    """Retention policy: keep checkpoints younger than ``age`` (a ``timedelta``).

    ``agentwal.open(path, retain=agentwal.KeepFor(timedelta(days=7)))`` is
    ``store.compact(older_than=age)`` applied by the background fold thread.
    Combine with :class:`KeepLast` as ``retain=(KeepLast(10), KeepFor(age))``:
    a checkpoint either of them keeps is kept.

    Raises:
        ValueError: ``age`` is not a non-negative ``timedelta``.
    """

    age: datetime.timedelta

    def __post_init__(self) -> None:
        if not isinstance(self.age, datetime.timedelta) or self.age.total_seconds() < 0:
            raise ValueError(f"KeepFor needs a timedelta >= 0, not {self.age!r}")


#: A retention policy for ``agentwal.open(retain=...)``.
Policy: TypeAlias = "KeepLast | KeepFor"


@dataclass(frozen=True, slots=True)
class CompactReport:
    """What ``store.compact`` did.

    Attributes:
        checkpoints_dropped: checkpoints removed, over all runs.
        bytes_freed: bytes of LMDB values deleted (checkpoint records,
            deltas, manifests, objects and their counts and index entries;
            each value with its 4-byte CRC, keys not counted). LMDB reuses
            the pages; the file shrinks only with ``vacuum=True``.
        runs: run id -> checkpoints dropped from it (runs that lost any).
        objects_freed: content-addressed objects whose last reference went.
        manifests_written: new manifests written so that kept checkpoints
            after a dropped one stay readable.
        bytes_written: bytes of LMDB values written (those manifests, and
            checkpoint records that now carry their dropped parent's hash).
        file_bytes_before: size of ``snapshot/data.mdb`` before.
        file_bytes_after: its size after (smaller only after a vacuum).
        vacuumed: the LMDB file was rewritten compactly.
    """

    checkpoints_dropped: int
    bytes_freed: int
    runs: dict[str, int] = field(default_factory=dict, hash=False)
    objects_freed: int = 0
    manifests_written: int = 0
    bytes_written: int = 0
    file_bytes_before: int = 0
    file_bytes_after: int = 0
    vacuumed: bool = False


@dataclass
class Tally:
    """Counts a compaction accumulates while it runs (``snapshot.Snapshot.compact``)."""

    runs: dict[str, int] = field(default_factory=dict)
    bytes_freed: int = 0
    objects_freed: int = 0
    manifests_written: int = 0
    bytes_written: int = 0

    @property
    def dropped(self) -> int:
        """Checkpoints dropped so far."""
        return sum(self.runs.values())


def check_args(keep_last: object, older_than: object) -> None:
    """Refuse bad ``compact`` arguments before anything is done.

    Raises:
        TypeError / ValueError: ``keep_last`` is not an int >= 1, or
            ``older_than`` is not a non-negative ``timedelta``.
    """
    if keep_last is not None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int):
            raise TypeError(f"keep_last is an int, not {type(keep_last).__name__}")
        if keep_last < 1:
            raise ValueError("keep_last must be at least 1 (the head is always kept)")
    if older_than is not None:
        if not isinstance(older_than, datetime.timedelta):
            raise TypeError(f"older_than is a datetime.timedelta, not "
                            f"{type(older_than).__name__}")
        if older_than.total_seconds() < 0:
            raise ValueError("older_than must not be negative")


def selected_runs(runs: Iterable[str] | None) -> list[str] | None:
    """``compact``'s ``runs=``: its run ids sorted, or None for every run.

    Raises:
        TypeError: one str instead of a list of them. InvalidKeyError: a bad id.
    """
    if runs is None:
        return None
    if isinstance(runs, str):
        raise TypeError("runs is a list of run ids, not one str")
    return sorted({check_key(r, "run id") for r in runs})


def policy_args(retain: object) -> tuple[int | None, datetime.timedelta | None]:
    """``(keep_last, older_than)`` for a ``retain=`` value: None, a policy, or a tuple of them.

    Raises:
        TypeError: something that is not a policy. ValueError: two of one kind.
    """
    if retain is None:
        return None, None
    items: Iterable[Any] = retain if isinstance(retain, (tuple, list)) else (retain,)
    keep_last: int | None = None
    older_than: datetime.timedelta | None = None
    for p in items:
        if isinstance(p, KeepLast):
            if keep_last is not None:
                raise ValueError("retain= has two KeepLast policies")
            keep_last = p.n
        elif isinstance(p, KeepFor):
            if older_than is not None:
                raise ValueError("retain= has two KeepFor policies")
            older_than = p.age
        else:
            raise TypeError(f"retain= takes agentwal.KeepLast / agentwal.KeepFor (or a tuple "
                            f"of them), not {type(p).__name__}")
    return keep_last, older_than


def choose(ckpts: Sequence[tuple[int, float]], *, keep_last: int | None,
           cutoff: float | None, protected: Set[int] = frozenset()) -> set[int]:
    """The ids to keep among a run's folded checkpoints.

    Args:
        ckpts: ``(id, created_at)`` of every folded checkpoint, ascending.
        keep_last: keep ids greater than ``head - keep_last``.
        cutoff: keep checkpoints created at or after this time (seconds).
        protected: ids that must stay (fork origins).

    Returns:
        The ids kept: always the head (the greatest id).
    """
    if not ckpts:
        return set()
    if keep_last is None and cutoff is None:
        return {c for c, _t in ckpts}
    head = ckpts[-1][0]
    keep = {head}
    keep.update(c for c, _t in ckpts if c in protected)
    if keep_last is not None:
        keep.update(c for c, _t in ckpts if c > head - keep_last)
    if cutoff is not None:
        keep.update(c for c, t in ckpts if t >= cutoff)
    return keep


@dataclass(frozen=True, slots=True)
class RunPlan:
    """How one run is compacted.

    Attributes:
        drop: ids to remove (checkpoint record, delta, manifest if any).
        manifests: kept ids that need a new manifest (written first).
        orphans: kept ids whose parent is dropped by this plan: their record
            gets the parent's hash.
    """

    drop: tuple[int, ...]
    manifests: tuple[int, ...]
    orphans: tuple[int, ...]


def plan_run(ids: Sequence[int], keep: Set[int], manifests: Set[int]) -> RunPlan:
    """Plan the compaction of one run (see the theory of operation).

    Args:
        ids: the run's folded checkpoint ids, ascending (gaps are earlier drops).
        keep: the ids to keep (a subset of ``ids``).
        manifests: the ids that have a manifest now.
    """
    drop = tuple(c for c in ids if c not in keep)
    dropped = set(drop)
    orphans = tuple(c for c in ids if c in keep and c - 1 in dropped)
    return RunPlan(drop, tuple(c for c in orphans if c not in manifests), orphans)
