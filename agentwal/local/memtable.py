"""The memtable: committed records not yet folded into LMDB.

Theory of operation: records become visible here, in LSN order, once the
commit pipeline has made them as durable as the store's mode asks. For each
key a run keeps a short version chain ``[(lsn, value-bytes | None)]`` so that
a transaction reading at snapshot LSN *s* sees the newest version <= *s*
(None is a deletion). Versions that no open transaction can still need are
pruned as new ones arrive. Each checkpoint's own delta is kept too, unpruned
(``RunMem.deltas``, parallel to ``RunMem.checkpoints``): the version chains
answer "what is the value now", the deltas "what was the state at
checkpoint *c*" for checkpoints not yet folded, and the fold writes them as
history. They share the value bytes with the chains, so they cost a dict
per commit, and they go when the table is folded. A value an append made is
a ``codec.Joined`` (the previous value and the new items): reads get it
joined (:meth:`Memtable.lookup`, :meth:`visible`, :meth:`fold_runs`), once,
so a list grown by appends costs each commit what it appended.

A fold freezes the active memtable (no more writes to it) and starts a new
one; transactions that began before keep their reference to the frozen one
and an LMDB read transaction from before the fold, so their view never
changes under them. The memtable does no I/O and takes no locks: the store
serialises writers and publishes new tables under its commit lock.

*Run deletions* (``store.delete_run``) are tombstones: ``RunMem.deleted``
holds the LSN of each delete record applied to this table. A reader at
snapshot LSN *s* with a tombstone *t* <= *s* sees only this table's entries
of the run with LSN > *t*, and nothing of the run in older tables or LMDB
(:meth:`Memtable.masks`): the run is empty from *t* on, and a commit after
it starts the run afresh. Entries before *t* stay for readers whose
snapshot is older. A fold writes only what follows the last tombstone,
after removing the run from LMDB (:meth:`Memtable.fold_runs`). A deletion
also forgets the run's effect positions (its ledger entries stay).

Effects-ledger entries (``effects.py``) live here too until folded: the
latest entry per idempotency key (last record wins, no versions: the ledger
is read at its newest, not at a snapshot) and an index from an effect's
position ``(run, checkpoint, ordinal)`` to its key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..codec import Value, whole
from ..effects import EffectRecord
from ..types import Checkpoint

__all__ = ["Memtable", "RunMem"]

Version = tuple[int, "Value | None"]
#: A checkpoint with its hash and its metadata exactly as encoded and hashed.
Entry = tuple[Checkpoint, bytes, bytes]
FoldItem = tuple[dict[str, "bytes | None"], list[Entry]]
FoldRunItem = tuple[str, int, dict[str, "bytes | None"], list[Entry],
                    list[dict[str, "bytes | None"]], dict[int, bytes]]


@dataclass
class RunMem:
    """One run's unfolded versions and checkpoints."""

    versions: dict[str, list[Version]] = field(default_factory=dict)
    checkpoints: list[Entry] = field(default_factory=list)
    #: the change each checkpoint made, parallel to ``checkpoints`` (read them
    #: through :meth:`delta`: an appended key's value is a ``codec.Joined``)
    deltas: list[Mapping[str, Value | None]] = field(default_factory=list)
    #: checkpoint id -> SHA-256 of its outbox field, for checkpoints that have one
    outboxes: dict[int, bytes] = field(default_factory=dict)
    #: checkpoint id -> the keys its record logged as appends: key -> (base count,
    #: base length); the fold keeps them with the checkpoint (``verify`` rebuilds
    #: the hashed delta from them)
    appends: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    #: LSNs of the run's delete records applied to this table, ascending
    deleted: list[int] = field(default_factory=list)

    def delta(self, i: int) -> dict[str, bytes | None]:
        """Checkpoint ``i``'s delta (``i``: its place in ``checkpoints``), values joined."""
        return {k: whole(v) for k, v in self.deltas[i].items()}

    def floor(self, snap: int) -> int:
        """LSN of the newest deletion visible at ``snap`` (0: none): older entries are dead."""
        for t in reversed(self.deleted):
            if t <= snap:
                return t
        return 0

    def latest(self, snap: int) -> Entry | None:
        """The newest live checkpoint entry with LSN <= ``snap``."""
        floor = self.floor(snap)
        for entry in reversed(self.checkpoints):
            lsn = entry[0].lsn
            if lsn <= floor:
                return None
            if lsn <= snap:
                return entry
        return None

    def head(self, snap: int) -> Checkpoint | None:
        """The newest live checkpoint with LSN <= ``snap``."""
        entry = self.latest(snap)
        return None if entry is None else entry[0]


class Memtable:
    """Unfolded committed state of every run, with per-key version chains."""

    def __init__(self) -> None:
        self.runs: dict[str, RunMem] = {}
        self.last_lsn = 0
        self.nbytes = 0
        self.frozen = False
        #: (segment first LSN, offset) just past the last record applied: where
        #: the log continues once this table is folded
        self.log_pos: tuple[int, int] | None = None
        #: idempotency key -> (latest entry, its encoding)
        self.effects: dict[str, tuple[EffectRecord, bytes]] = {}
        #: (run, checkpoint, ordinal) -> idempotency key, for txn.effect entries
        self.effect_pos: dict[tuple[str, int, int], str] = {}

    def __len__(self) -> int:
        return sum(len(r.checkpoints) for r in self.runs.values())

    @property
    def empty(self) -> bool:
        """True if nothing was published into this table (nothing to fold)."""
        return not self.runs and not self.effects

    def apply_delete(self, lsn: int, run: str) -> None:
        """Make a run deletion visible: from ``lsn`` on the run has nothing, here or below."""
        assert not self.frozen, "a frozen memtable is read-only"
        rm = self.runs.get(run)
        if rm is None:
            rm = self.runs[run] = RunMem()
        rm.deleted.append(lsn)
        rm.outboxes = {}  # by checkpoint id: the ids start again at 1 after this
        # The ledger keeps the run's entries, not their positions in its deleted
        # history: a run created again under this id may call other effects there.
        for pos in [p for p in self.effect_pos if p[0] == run]:
            del self.effect_pos[pos]
        self.nbytes += len(run) + 16
        self.last_lsn = lsn

    def masks(self, run: str, snap: int) -> bool:
        """True if a deletion of ``run`` visible at ``snap`` hides older tables and LMDB."""
        rm = self.runs.get(run)
        return rm is not None and rm.floor(snap) > 0

    def apply_effect(self, lsn: int, entry: EffectRecord, raw: bytes) -> None:
        """Make one ledger entry the latest for its key."""
        assert not self.frozen, "a frozen memtable is read-only"
        self.effects[entry.key] = (entry, raw)
        if entry.ordinal is not None:
            self.effect_pos[(entry.run, entry.checkpoint, entry.ordinal)] = entry.key
        self.nbytes += len(raw) + 16
        self.last_lsn = lsn

    def apply(self, lsn: int, ckpt: Checkpoint, hsh: bytes, meta_raw: bytes,
              delta: Mapping[str, Value | None], oldest_snap: int,
              outbox_digest: bytes | None = None,
              appends: dict[str, tuple[int, int]] | None = None) -> None:
        """Make one commit visible; prune versions older than ``oldest_snap`` can see.

        ``outbox_digest`` is the SHA-256 of the commit's outbox field (its
        checkpoint hash covers it); the fold stores it with the checkpoint, as
        it does ``appends`` (the keys the record logged as appends; ``delta``
        holds their whole values).
        """
        assert not self.frozen, "a frozen memtable is read-only"
        rm = self.runs.get(ckpt.run)
        if rm is None:
            rm = self.runs[ckpt.run] = RunMem()
        versions = rm.versions
        for key, value in delta.items():
            chain = versions.get(key)
            if chain is None or lsn <= oldest_snap:
                # No reader is older than this version (recovery): it replaces all.
                versions[key] = [(lsn, value)]
            else:
                chain.append((lsn, value))
                _prune(chain, oldest_snap)
            self.nbytes += len(key) + (len(value) if value is not None else 0) + 16
        rm.checkpoints.append((ckpt, hsh, meta_raw))
        rm.deltas.append(delta)
        if outbox_digest is not None:
            rm.outboxes[ckpt.id] = outbox_digest
        if appends:
            rm.appends[ckpt.id] = appends
        self.last_lsn = lsn

    def lookup(self, run: str, key: str, snap: int) -> tuple[bool, bytes | None]:
        """``(found, value)`` of ``key`` as of ``snap``; found with None means deleted.

        Under a deletion visible at ``snap`` every key is decided here: a
        version from before it reads as deleted, and so does a missing key.
        """
        found, value = self.lookup_value(run, key, snap)
        return found, whole(value)

    def lookup_value(self, run: str, key: str, snap: int) -> tuple[bool, Value | None]:
        """:meth:`lookup`, with an append's value left a ``codec.Joined`` (replay extends it)."""
        rm = self.runs.get(run)
        if rm is None:
            return False, None
        floor = rm.floor(snap) if rm.deleted else 0
        chain = rm.versions.get(key)
        if chain is not None:
            for lsn, value in reversed(chain):
                if lsn <= snap:
                    return True, (value if lsn > floor else None)
        return (True, None) if floor else (False, None)

    def visible(self, run: str, snap: int) -> dict[str, bytes | None]:
        """Every key of ``run`` this table decides as of ``snap`` (None: deleted).

        Keys last written before a deletion visible at ``snap`` are left out:
        the caller reads nothing below a table that :meth:`masks` the run.
        """
        rm = self.runs.get(run)
        out: dict[str, bytes | None] = {}
        if rm is None:
            return out
        floor = rm.floor(snap) if rm.deleted else 0
        for key, chain in rm.versions.items():
            for lsn, value in reversed(chain):
                if lsn <= snap:
                    if lsn > floor:
                        out[key] = whole(value)
                    break
        return out

    def fold_runs(self) -> list[FoldRunItem]:
        """For a fold: per run, whether LMDB's copy goes first (deleted), then what follows.

        Returns ``(run, reset, final writes, checkpoints, deltas, outbox
        digests)``: ``reset`` is the LSN of the run's last deletion in this
        table (0: none), and then only what was committed after it is folded.
        """
        out: list[FoldRunItem] = []
        for run, rm in self.runs.items():
            floor = rm.deleted[-1] if rm.deleted else 0
            keep = [i for i, (c, _h, _m) in enumerate(rm.checkpoints) if c.lsn > floor]
            deltas = [rm.delta(i) for i in keep]  # oldest first: each join extends the last
            writes = {k: whole(chain[-1][1]) for k, chain in rm.versions.items()
                      if chain[-1][0] > floor}
            out.append((run, floor, writes, [rm.checkpoints[i] for i in keep], deltas,
                        rm.outboxes))
        return out

    def appends_of(self, run: str) -> dict[int, dict[str, tuple[int, int]]]:
        """Checkpoint id -> keys logged as appends (``RunMem.appends``) of ``run``."""
        rm = self.runs.get(run)
        return rm.appends if rm is not None else {}

    def fold_view(self) -> dict[str, FoldItem]:
        """For a fold: each run's final writes and its checkpoints in order (after deletions)."""
        return {run: (writes, ckpts) for run, _reset, writes, ckpts, _d, _o in self.fold_runs()}


def _prune(chain: list[Version], oldest_snap: int) -> None:
    """Drop versions shadowed for every snapshot >= ``oldest_snap``."""
    keep_from = 0
    for i in range(len(chain) - 1, -1, -1):
        if chain[i][0] <= oldest_snap:
            keep_from = i
            break
    if keep_from:
        del chain[:keep_from]
