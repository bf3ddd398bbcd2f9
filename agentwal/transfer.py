"""``copy_runs``: runs with their whole history and effects ledger, from one store to another.

Theory of operation: both stores are reached through their backends (the
``agentwal.backend`` operations: ``checkpoints``, ``state_at``, ``begin``/
``commit``, ``effects``/``record_effect``), so a local store and a
PostgreSQL store copy to each other, and to their own kind, with one
procedure. For each run, oldest checkpoint first, the destination commits
what changed from the previous checkpoint's state (raw stored bytes, never
decoded), with that checkpoint's metadata and, for a fork's first
checkpoint, its origin. Each destination checkpoint is a real commit of the
destination, so its hash chain is the destination's own and ``verify``
passes there; ids, parents, metadata, the state at every checkpoint and
fork origins are the source's. The run's ledger entries are then recorded
in the destination as they are (same keys, same ids, same statuses), so a
retried step there finds its earlier attempt's effects, and an entry in
doubt stays in doubt.

What is not carried over: the commit times and hashes (each destination
stamps its own commits; PostgreSQL keeps the source's times, since its
commits take a given time) and the LSNs (each store has its own sequence).
A blob value's content is streamed from the source (``open_blob`` at its
checkpoint, its SHA-256 checked as it is read) into the destination's blob
store before the checkpoint that references it is committed, once per
content; a tree value's root, directory objects and files likewise (the
source's tree store expands it), and a PostgreSQL destination then records
the tree's edges (``postgres/trees.py``).

Everything is checked before the first write: the runs exist in the
source, none exists in the destination, no ledger entry of theirs is
already in the destination under another content. A
copy that fails midway leaves the runs it finished and part of the one it
was on; ``delete_run`` that one and copy it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .backend import Change
from .codec import (
    Append,
    append_base,
    append_encoded,
    append_tail,
    decode_blob_ref,
    is_blob_ref,
)
from .effects import EffectRecord
from .errors import ReadOnlyError, RunExistsError, RunNotFoundError
from .format import TREE_MEDIA_TYPE
from .types import BlobRef, Checkpoint, Progress, check_key

if TYPE_CHECKING:
    from .treeio import TreeStore

__all__ = ["CopyReport", "copy_runs"]


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What ``copy_runs`` copied.

    Attributes:
        runs: the run ids copied, in the order they were.
        checkpoints: checkpoints committed in the destination.
        effects: ledger entries recorded in the destination.
        renumbered: per run whose retained history had gaps (compaction
            dropped checkpoints), ``{source id: destination id}``; the
            destination numbers its checkpoints 1, 2, 3...
    """

    runs: list[str]
    checkpoints: int
    effects: int
    renumbered: dict[str, dict[int, int]]


def backend_of(store: Any) -> Any:
    """The backend a public store object writes through (local or PostgreSQL)."""
    from .store import Store

    if isinstance(store, Store):
        from .local.backend import LocalBackend

        return LocalBackend(store._engine)
    inner = getattr(store, "_b", None)
    if inner is None:
        raise TypeError(f"not an agentwal store: {type(store).__name__}")
    return inner


def copy_runs(src: Any, dest: Any, runs: Iterable[str] | None = None, *,
              progress: Progress | None = None) -> CopyReport:
    """Copy ``runs`` (default: every run) of store ``src`` into store ``dest`` (module doc).

    ``progress(phase, done, total)`` is told ``("checkpoints", copied, of all
    the runs')`` as each checkpoint is committed in ``dest`` (a run's ledger
    entries are recorded after its checkpoints, within the same phase).

    Raises:
        RunNotFoundError: a run named is not in ``src``.
        RunExistsError: a run is already in ``dest`` (nothing written).
        BackendUnsupportedError: a value is a tree (nothing written).
        ValueError: ``dest`` is ``src``, or holds a ledger entry of these runs
            with other content (nothing written).
        LeaseHeldError: on PostgreSQL, another worker holds a run in ``dest``.
        ReadOnlyError: ``dest`` is read-only.
    """
    if dest is src:
        raise ValueError("copy_runs: the destination is the source store")
    if dest.readonly:
        raise ReadOnlyError(dest.path)
    sb, db = backend_of(src), backend_of(dest)
    names = sorted(set(sb.runs()) if runs is None else {check_key(r, "run id") for r in runs})
    plans = {run: _history(sb, run) for run in names}
    there = set(db.runs())
    for run in names:
        if run in there:
            raise RunExistsError(run)
    entries = [e for e in sb.effects() if e.run in plans]
    for e in entries:
        found = db.effect(e.key)
        if found is not None and found != e:
            raise ValueError(f"the destination already holds ledger entry {e.key!r} "
                             f"(effect {e.effect_id}) with other content; nothing was copied")
    copied = checkpoints = 0
    renumbered: dict[str, dict[int, int]] = {}
    tick = progress or (lambda phase, done, total: None)
    total = sum(len(h) for h in plans.values())
    tick("checkpoints", 0, total)
    for run in _origins_first(names, plans):
        base = checkpoints

        def done(n: int, base: int = base) -> None:
            tick("checkpoints", base + n, total)

        ids = _copy_history(src, sb, db, dest, run, plans[run],
                            [e for e in entries if e.run == run], done)
        checkpoints += len(ids)
        if any(old != new for old, new in ids.items()):
            renumbered[run] = ids
        for e in entries:
            if e.run == run and db.effect(e.key) is None:
                db.record_effect(_renumber(e, ids), expect=None)
                copied += 1
    return CopyReport(_origins_first(names, plans), checkpoints, copied, renumbered)


def _history(sb: Any, run: str) -> list[Checkpoint]:
    hist = list(reversed(sb.checkpoints(run)))
    if not hist:
        raise RunNotFoundError(run)
    return hist


def _origins_first(names: list[str], plans: dict[str, list[Checkpoint]]) -> list[str]:
    """``names`` with every fork after the run it was forked from (when that is copied too)."""
    out: list[str] = []
    done: set[str] = set()

    def visit(run: str, path: frozenset[str]) -> None:
        if run in done or run in path:
            return
        origin = plans[run][0].origin
        if origin is not None and origin[0] in plans:
            visit(origin[0], path | {run})
        done.add(run)
        out.append(run)

    for run in names:
        visit(run, frozenset())
    return out


def _states(sb: Any, run: str, hist: list[Checkpoint]
            ) -> Iterator[tuple[Checkpoint, dict[str, bytes | None], dict[str, Append]]]:
    """Each checkpoint with what changed from the one before (None: deleted), and which
    of those changes append to the list the key held (so the destination stores the
    new items only)."""
    prev: dict[str, bytes] = {}
    for c in hist:
        state = sb.state_at(run, c.id)
        delta: dict[str, bytes | None] = {k: v for k, v in state.items() if prev.get(k) != v}
        appends: dict[str, Append] = {}
        for k, v in delta.items():
            old = prev.get(k)
            if old is None or v is None:
                continue
            base = append_base(old)
            tail = None if base is None else append_tail(v, *base)
            if base is not None and tail is not None and append_encoded(old, tail) == v:
                appends[k] = (base[0], base[1], tail)
        delta.update((k, None) for k in prev.keys() - state.keys())
        yield c, delta, appends
        prev = state


def _carry_blobs(src: Any, dest: Any, run: str, cid: int, delta: dict[str, bytes | None],
                 carried: set[str], pins: list[str]) -> None:
    """Stream the blobs (and trees) ``delta`` references from ``src`` into ``dest``, each
    content once.

    A local destination pins what it stores until the caller unpins ``pins``
    (after the commits that reference them).
    """
    into = _trees_of(dest).blobs
    for key, value in delta.items():
        if not is_blob_ref(value):
            continue
        ref = decode_blob_ref(value)
        if ref.sha256 in carried:
            continue
        if ref.media_type == TREE_MEDIA_TYPE:
            trees = _trees_of(src)
            for part in sorted(trees.expand([ref]), key=lambda r: r.sha256):
                if part.sha256 not in carried:
                    with trees.blobs.open(BlobRef(part.sha256, part.size)) as reader:
                        pins.append(into.put(reader).sha256)  # its SHA-256 checked at the end
                    carried.add(part.sha256)
            record = getattr(_trees_of(dest), "record", None)
            if record is not None:
                record(ref)  # PostgreSQL: what the tree reaches, for collection
            continue
        with src.open_blob(run, key, at=cid) as reader:  # its SHA-256 checked at the end
            pins.append(into.put(reader, ref.media_type).sha256)
        carried.add(ref.sha256)


def _trees_of(store: Any) -> TreeStore:
    """The tree store of a local or PostgreSQL store (its ``blobs`` is the blob store)."""
    from .store import Store

    trees: TreeStore = store._engine._trees if isinstance(store, Store) else store._trees
    return trees


def _copy_history(src: Any, sb: Any, db: Any, dest: Any, run: str, hist: list[Checkpoint],
                  entries: list[EffectRecord], done: Callable[[int], None]
                  ) -> dict[int, int]:
    """Commit the run's checkpoints in ``db``; returns ``{source id: destination id}``.

    ``done(n)`` is called after the n-th checkpoint is committed.
    """
    ids: dict[int, int] = {}
    keeps_time = bool(getattr(db, "commits_at_given_time", False))
    carried: set[str] = set()
    pins: list[str] = []
    try:
        for c, delta, appends in _states(sb, run, hist):
            _carry_blobs(src, dest, run, c.id, delta, carried, pins)
            # The keys of the entries this checkpoint committed: the destination's commit
            # marks them when they are there (they are recorded after), and they make a
            # checkpoint that changed no key (only effects, or an outbox) a commit too.
            made_here = tuple(e.key for e in entries if c.id in (e.committed_in, (
                e.checkpoint if e.deferred else None))) or (f"agentwal-copy:{run}:{c.id}",)
            change = Change(run=run, writes=delta, prefixes=frozenset({""}), meta=c.meta,
                            origin=c.origin if not ids else None, effects=made_here,
                            appends=appends)
            view = db.begin(run)
            try:
                made = (db.commit(view, change, created=c.created_at) if keeps_time
                        else db.commit(view, change))
            finally:
                db.end(view)
            ids[c.id] = made.id
            done(len(ids))
    finally:
        if pins:
            _trees_of(dest).blobs.unpin(pins)
        release = getattr(dest, "release", None)
        if release is not None:
            release(run)
    return ids


def _renumber(e: EffectRecord, ids: dict[int, int]) -> EffectRecord:
    """``e`` with its checkpoint positions in the destination's numbering."""
    if all(old == new for old, new in ids.items()):
        return e
    return dataclasses.replace(
        e, checkpoint=ids.get(e.checkpoint, e.checkpoint),
        committed_in=None if e.committed_in is None else ids.get(e.committed_in,
                                                                   e.committed_in))
