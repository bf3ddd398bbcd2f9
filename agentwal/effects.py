"""Effect policy: modes, keys, ledger entries and what to do at each attempt.

Theory of operation: an *effect* is a call to the world outside the store.
Its ledger entry is autonomous (it is its own WAL record, not part of a
commit), so a rollback of the transaction that made it does not erase it.
This module is pure: it says what an entry looks like, how keys are derived
and, given the entry found at a position, what the executor must do next.
``ledger.py`` carries the decisions out (records through the WAL, calls).

Life of an entry (``status``)::

    (none) ──intent──▶ in_doubt ──fn returned──▶ done
                          │  ──fn raised────▶ failed
                          │  ──probe: applied──▶ done
                          │  ──probe: not applied (at_most_once)──▶ not_applied
                          └─ resolve_effect(result=) ─▶ resolved
                             resolve_effect(not_applied=True) ─▶ not_applied
    (deferred, committed) pending ──dispatch──▶ in_doubt ──▶ ... as above
    (any txn.effect entry) ──retire_effect──▶ retired (its position is free again)

``in_doubt`` is what an intent without an outcome is: if we die while ``fn``
runs, recovery finds exactly that. A ``failed`` entry is treated like one at
the next attempt: the exception may have come after the downstream applied
the call (a timeout), so only the mode's rule may call it again.

Decision table (``decide``), for an entry found at the same position/key:

=============  =============  ======================  ===========================
status         at_most_once   at_least_once           exactly_once
=============  =============  ======================  ===========================
(none)         call           call                    call
pending        call           call                    call
retired        call (fresh)   call (fresh)            call (fresh)
done/resolved  return result  return result           return result
not_applied    raise NotAppl. call (attempt + 1)      call (attempt + 1)
in_doubt/fail  probe, else    probe, else call        probe, else call if
               raise InDoubt                          idempotent, else InDoubt
=============  =============  ======================  ===========================

and after a probe (``after_probe``): a result → record ``done`` and return
it; ``NOT_APPLIED`` → at_most_once records ``not_applied`` and raises, the
others call; ``UNKNOWN`` → at_least_once calls, exactly_once calls only if
idempotent, at_most_once raises ``EffectInDoubtError``.

A ``retired`` entry is checked first: it was set aside by
``store.retire_effect`` (kept as history), so the request is a fresh call
whatever its name or args; the executor first copies the old entry to an
archive key (``archive_key``) so the fresh intent does not overwrite it.

Keys are derived from (store id, run, position checkpoint, name, ordinal of
that name) and never from the attempt, the clock or the process, so a step
re-run from the same checkpoint meets the same keys and records. A step
retried after a conflict (``store.transact``, ``begin(retry_of=)``) keeps the
position checkpoint of its first attempt (its *anchor*), so it meets what
that attempt recorded.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import cbor2

from .codec import CodecError, encode_value, loads
from .types import check_key

__all__ = [
    "check_listing",
    "listing",
    "NOT_APPLIED",
    "STATUSES",
    "UNKNOWN",
    "EffectContext",
    "EffectMode",
    "EffectRecord",
    "args_digest",
    "decide",
    "derive_key",
    "effect_id_for",
    "outstanding",
    "still_expected",
    "encode_outbox",
    "decode_outbox",
    "outbox_entries",
    "same_first_effect",
    "crossable",
]

#: Every status an entry can have.
STATUSES = ("pending", "in_doubt", "done", "failed", "not_applied", "resolved", "retired")
#: Statuses after which an entry is never called again at its key.
SETTLED = frozenset({"done", "resolved"})


class EffectMode(str, enum.Enum):
    """The contract an effect runs under (accepted as its string value too)."""

    AT_MOST_ONCE = "at_most_once"
    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE = "exactly_once"


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"agentwal.{self._name}"

    def __reduce__(self) -> str:
        return self._name


#: A probe's answer: the call never reached the downstream.
NOT_APPLIED: Any = _Sentinel("NOT_APPLIED")
#: A probe's answer: the probe cannot tell.
UNKNOWN: Any = _Sentinel("UNKNOWN")


@dataclass(frozen=True, slots=True)
class EffectContext:
    """What an effect function (or a dispatch handler, or a probe) is called with.

    Attributes:
        key: the idempotency key to forward downstream (a header, a client
            token, a unique constraint); the same across attempts and crashes.
        effect_id: the ledger entry's id (``store.effects()``, ``resolve_effect``).
        run: the run the effect belongs to.
        attempt: 1-based, counted durably across crashes and processes.
        args: the recorded arguments (a copy decoded from what was recorded).
        name: the effect's name.
        mode: its mode.
        fencing_token: the epoch of the run's lease this call is made under
            (PostgreSQL; it grows with every change of holder), for a
            downstream that refuses a token lower than the highest it has
            seen, so a worker that lost the run cannot act through it; None
            where runs are not leased (a local store, whose one writer
            process holds them all) and for outbox dispatch.
        conn: for ``txn.effect(..., transactional=True)`` on PostgreSQL, the
            psycopg connection whose open transaction also records the
            outcome: write the business rows through it (never commit or roll
            it back); None otherwise.
    """

    key: str
    effect_id: str
    run: str
    attempt: int
    args: Any
    name: str = ""
    mode: EffectMode = EffectMode.AT_LEAST_ONCE
    fencing_token: int | None = None
    conn: Any = None


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One entry of the effects ledger, as ``store.effects()`` lists it.

    Attributes:
        effect_id: stable id of the entry (derived from ``key``).
        key: the idempotency key.
        name: the effect's name.
        mode: ``at_most_once``, ``at_least_once`` or ``exactly_once``.
        run: the run that first recorded it.
        checkpoint: the checkpoint it is positioned at: the transaction's
            base checkpoint for ``txn.effect`` (0 for a run's first step),
            the commit's checkpoint for ``txn.defer``.
        ordinal: position among the transaction's effects (None when deferred,
            and for ``store.effect``, which has no position: its key is its identity).
        deferred: True for outbox entries (``txn.defer``).
        status: one of ``pending``, ``in_doubt``, ``done``, ``failed``,
            ``not_applied``, ``resolved``.
        attempts: attempts begun so far (durably counted; an attempt is counted
            when its intent is recorded, so one cut off before its call counts too).
        args: the recorded arguments.
        args_digest: hex SHA-256 of the encoded arguments.
        result: the recorded result (``done``/``resolved``), else None.
        error: the last error (``"TypeName: message"``), else None.
        idempotent: the downstream dedups by ``key``.
        created_at / updated_at: seconds since the epoch.
        resolved_by: who settled it with ``resolve_effect`` (else None).
        resolved_at: when ``resolve_effect`` settled it (seconds since the epoch).
        keyed: the key is a business key (``key=``), not derived from the position.
        order: ``(lsn, index)`` of a deferred entry's commit: dispatch order.
        committed_in: the checkpoint whose commit included this effect (the
            first one, for a business key met by several steps); None while the
            transaction that made it has not committed: still running, or
            rolled back, lost to a conflict or to a crash (see
            :attr:`uncommitted`). Deferred entries are made by their commit;
            ``store.effect`` entries belong to no transaction (``ordinal`` None).
        retired_from: for an archived copy of a retired entry, the key it was
            retired from (its own key is an archive key); else None.
        retired_status: the status a ``retired`` entry had when it was retired.
    """

    effect_id: str
    key: str
    name: str
    mode: EffectMode
    run: str
    checkpoint: int
    ordinal: int | None
    deferred: bool
    status: str
    attempts: int
    args: Any
    args_digest: str
    result: Any = None
    error: str | None = None
    idempotent: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0
    resolved_by: str | None = None
    order: tuple[int, int] | None = None
    resolved_at: float | None = None
    keyed: bool = False
    committed_in: int | None = None
    retired_from: str | None = None
    retired_status: str | None = None

    @property
    def uncommitted(self) -> bool:
        """True for an effect whose transaction has not committed (see ``committed_in``).

        Such an effect reached the ledger (and perhaps the world) from a step
        that did not commit. A retry of that step (``store.transact``,
        ``store.begin(run, retry_of=txn)``) or a re-run from the same
        checkpoint meets it and reuses its result; a new step from a later
        checkpoint does not. ``docs/effects.md`` says how to settle one.
        """
        return (not self.deferred and self.ordinal is not None and self.committed_in is None
                and self.status != "retired")

    @property
    def age(self) -> float:
        """Seconds since the entry was first recorded."""
        return max(0.0, time.time() - self.created_at)

    def replace(self, **changes: Any) -> EffectRecord:
        """A copy with ``changes`` and a fresh ``updated_at``."""
        changes.setdefault("updated_at", time.time())
        return dataclasses.replace(self, **changes)


def outstanding(e: EffectRecord) -> bool:
    """True if a later attempt (or dispatch) may still call this entry's effect."""
    if e.status in SETTLED or e.status == "retired":
        return False
    return e.status != "not_applied" or e.mode is not EffectMode.AT_MOST_ONCE


#: Statuses of entries whose effect the outside world may hold.
HELD = ("done", "resolved", "in_doubt", "failed", "pending")


def effects_after(entries: Iterable[EffectRecord], cid: int) -> tuple[EffectRecord, ...]:
    """The entries made after checkpoint ``cid`` that the world may hold (``effects_after``).

    ``txn.effect`` entries positioned at ``cid`` or later, and outbox entries
    of commits after it; ``rollback_to`` and ``fork`` report them.
    """
    return tuple(e for e in entries if e.status in HELD and (
        e.checkpoint > cid if e.deferred else e.checkpoint >= cid))


def same_first_effect(e0: EffectRecord, store_id: Any, run: str, checkpoint: int, name: str,
                      digest: str, mode: EffectMode, key: str | None, epoch: int) -> bool:
    """True if ``e0``, at position 0 of ``checkpoint``, is what a step asks for first.

    The adoption walk's test (``EffectLog.adopt``, ``PostgresStore.txn_adopt``):
    the same name, arguments and mode, and the same key: the business ``key``
    the step gives, or else the key derived from that position.
    """
    if e0.name != name or e0.args_digest != digest or e0.mode != mode:
        return False
    if key is not None:
        return e0.keyed and e0.key == key
    return not e0.keyed and e0.key == derive_key(store_id, run, checkpoint, name, 0,
                                                 epoch=epoch)


def crossable(history: Iterable[Any], found: int, base: int) -> bool:
    """True if the adoption walk may go from ``base`` back to ``found`` over ``history``.

    ``history`` holds the run's checkpoints from ``base`` down (newest first):
    each of ``found + 1 .. base`` must be there (compaction may have dropped
    one, which might have been a ``rollback_to``) and none of them a
    ``rollback_to`` or a fork's first checkpoint (steps re-run from those are
    new positions by design).
    """
    seen = set()
    for c in history:
        if c.id > found:
            if "rollback_to" in c.meta or c.origin is not None:
                return False
            seen.add(c.id)
    return len(seen) == base - found


def mark_committed(entry: EffectRecord, checkpoint: int) -> EffectRecord | None:
    """``entry`` marked as committed in ``checkpoint``, or None if there is nothing to mark.

    A commit record lists the keys its transaction's effects used; applying
    it (live or in replay) marks each entry once: the first commit wins, and
    ``updated_at`` is kept, so replay rebuilds byte for byte what was live.
    """
    if entry.deferred or entry.committed_in is not None or entry.status == "retired":
        return None
    return entry.replace(committed_in=checkpoint, updated_at=entry.updated_at)


def carry_mark(new: EffectRecord, old: EffectRecord | None) -> EffectRecord:
    """``new`` (a ledger write) keeping the commit mark of the entry it replaces.

    A write prepared from an entry read before its commit was published
    would otherwise drop the mark. Only the same entry's later states carry
    it (same key and creation time, not a fresh entry after a retirement).
    """
    if (old is None or new.committed_in is not None or old.committed_in is None
            or old.status == "retired" or new.created_at != old.created_at
            or new.status == "retired"):
        return new
    return new.replace(committed_in=old.committed_in, updated_at=new.updated_at)


def still_expected(found: EffectRecord | None, expect: EffectRecord | None) -> bool:
    """True if ``found`` is the entry ``expect`` was, but for a commit mark since.

    The comparison of a ledger compare-and-set (``backend.LedgerStore.record_effect``).
    A commit marks its effects' entries ``committed_in`` (once, first commit
    wins) without the ledger, and every write carries that mark over
    (:func:`carry_mark`): a mark added meanwhile is no lost race.
    """
    if found is None or expect is None:
        return found is expect
    return found == expect or (expect.committed_in is None
                               and dataclasses.replace(found, committed_in=None) == expect)


# -- keys ---------------------------------------------------------------------------


def derive_key(store_id: object, run: str, checkpoint: int, name: str, ordinal: int, *,
               deferred: bool = False, epoch: int = 0) -> str:
    """The default idempotency key of an effect: ASCII, 60 characters.

    Deterministic in (store id, run, checkpoint, name, ordinal of that name,
    the run's epoch); never the attempt, the clock or the process. The epoch
    is the LSN of the run id's last ``delete_run`` (0: never deleted, and
    then left out, so keys are as they always were): a run created again
    under a deleted id derives new keys and does not meet the old results.
    """
    fields: list[Any] = [str(store_id), run, checkpoint, name, ordinal, deferred]
    if epoch:
        fields.append(epoch)
    body = cbor2.dumps(fields)
    return ("awd-" if deferred else "awe-") + hashlib.sha256(body).hexdigest()[:56]


def archive_key(key: str, retired_at: float, attempts: int) -> str:
    """The key an archived copy of the retired entry at ``key`` is kept under."""
    body = cbor2.dumps(["retired", key, retired_at, attempts])
    return "awr-" + hashlib.sha256(body).hexdigest()[:56]


def effect_id_for(key: str) -> str:
    """The ledger id of the entry with idempotency key ``key``."""
    return "ef-" + hashlib.sha256(b"effect-id\0" + key.encode()).hexdigest()[:20]


def args_digest(args_raw: bytes) -> str:
    """Hex digest of encoded arguments that does not depend on their encoding's order.

    Divergence is judged on it, so it must be the same for equal values in
    every process: sets encode in hash-seed order and dicts in insertion
    order, so the digest is taken over the decoded value as a tree (map
    entries and set members sorted by their own digests), in linear time.
    """
    return _node_digest(loads(args_raw)).hex()


def _node_digest(v: Any) -> bytes:
    if isinstance(v, dict):
        tag, parts = b"M", sorted(_node_digest(k) + _node_digest(x) for k, x in v.items())
    elif isinstance(v, (set, frozenset)):
        tag, parts = b"S", sorted(_node_digest(x) for x in v)
    elif isinstance(v, (list, tuple)):
        tag, parts = b"L", [_node_digest(x) for x in v]
    else:
        return hashlib.sha256(b"V" + cbor2.dumps(v)).digest()
    return hashlib.sha256(tag + len(parts).to_bytes(8, "big") + b"".join(parts)).digest()


# -- decisions ----------------------------------------------------------------------

#: What the executor does next.
CALL, RETURN, PROBE, IN_DOUBT, NOT_APPLIED_ERR, DIVERGED = (
    "call", "return", "probe", "in_doubt", "not_applied", "diverged")


def decide(entry: EffectRecord | None, *, name: str, digest: str, mode: EffectMode,
           has_probe: bool, idempotent: bool) -> str:
    """The next step for a request at a key that has ``entry`` (see the table above)."""
    if entry is None or entry.status == "retired":
        return CALL
    if entry.name != name or entry.args_digest != digest or entry.mode != mode:
        return DIVERGED
    if entry.status in SETTLED:
        return RETURN
    if entry.status == "pending":
        return CALL
    if entry.status == "not_applied":
        return NOT_APPLIED_ERR if mode is EffectMode.AT_MOST_ONCE else CALL
    # in_doubt or failed
    if has_probe:
        return PROBE
    if mode is EffectMode.AT_LEAST_ONCE or (mode is EffectMode.EXACTLY_ONCE and idempotent):
        return CALL
    return IN_DOUBT


def after_probe(answer: Any, mode: EffectMode, idempotent: bool) -> str:
    """The next step once a probe answered ``answer`` for an entry in doubt."""
    if answer is UNKNOWN:
        if mode is EffectMode.AT_LEAST_ONCE or (mode is EffectMode.EXACTLY_ONCE and idempotent):
            return CALL
        return IN_DOUBT
    if answer is NOT_APPLIED:
        return NOT_APPLIED_ERR if mode is EffectMode.AT_MOST_ONCE else CALL
    return RETURN


# -- encoding -----------------------------------------------------------------------

#: An outbox entry as logged with its commit: (name, mode, args bytes,
#: business key or None, idempotent).
Deferred = tuple[str, str, bytes, "str | None", bool]


def encode_outbox(entries: list[Deferred]) -> bytes:
    """The commit payload's outbox field: a CBOR list of 5-element arrays."""
    return bytes(cbor2.dumps([list(d) for d in entries]))


def decode_outbox(data: bytes) -> list[Deferred]:
    """Decode a commit's outbox field; :class:`CodecError` if malformed."""
    obj = loads(data)
    if not isinstance(obj, list):
        raise CodecError("outbox is not a list")
    out: list[Deferred] = []
    for d in obj:
        if not (isinstance(d, list) and len(d) == 5 and isinstance(d[0], str)
                and d[1] in {m.value for m in EffectMode} and isinstance(d[2], bytes)
                and (d[3] is None or isinstance(d[3], str)) and isinstance(d[4], bool)):
            raise CodecError("outbox entry is malformed")
        out.append((d[0], d[1], d[2], d[3], d[4]))
    return out


def outbox_entries(store_id: object, ckpt_run: str, ckpt_id: int, created_at: float, lsn: int,
                   deferred: list[Deferred], epoch: int = 0) -> list[EffectRecord]:
    """The pending ledger entries a committed outbox makes (deterministic: replay agrees).

    ``epoch`` is the run's epoch when it committed (:func:`derive_key`).
    """
    seen: dict[str, int] = {}
    out = []
    for i, (name, mode, args_raw, key, idempotent) in enumerate(deferred):
        n = seen.get(name, 0)
        seen[name] = n + 1
        k = key if key is not None else derive_key(store_id, ckpt_run, ckpt_id, name, n,
                                                   deferred=True, epoch=epoch)
        out.append(EffectRecord(
            effect_id_for(k), k, name, EffectMode(mode), ckpt_run, ckpt_id, None, True,
            "pending", 0, loads(args_raw), args_digest(args_raw), idempotent=idempotent,
            created_at=created_at, updated_at=created_at, order=(lsn, i),
            keyed=key is not None))
    return out


_FIELDS = ("effect_id", "key", "name", "mode", "run", "checkpoint", "ordinal", "deferred",
           "status", "attempts", "args", "args_digest", "result", "error", "idempotent",
           "created_at", "updated_at", "resolved_by", "order", "resolved_at", "keyed")


def encode_entry(e: EffectRecord) -> bytes:
    """The CBOR map stored in the WAL (``REC_EFFECT``) and in LMDB.

    ``args`` and ``result`` are stored as their own encoded bytes, exactly as
    checked by :func:`~agentwal.codec.encode_value`.

    Raises:
        UnencodableValueError: the result (or args) cannot be stored.
    """
    out: dict[str, Any] = {"v": 1}
    for f in _FIELDS:
        out[f] = getattr(e, f)
    out["mode"] = e.mode.value
    out["order"] = list(e.order) if e.order is not None else None
    out["args"] = encode_value(f"args of effect {e.name!r}", e.args)
    out["result"] = encode_value(f"result of effect {e.name!r}", e.result)
    for f in _SPARSE:
        if getattr(e, f) is not None:
            out[f] = getattr(e, f)
    return bytes(cbor2.dumps(out))


_TYPES: Mapping[str, tuple[type, ...]] = {
    "effect_id": (str,), "key": (str,), "name": (str,), "mode": (str,), "run": (str,),
    "checkpoint": (int,), "ordinal": (int, type(None)), "deferred": (bool,),
    "status": (str,), "attempts": (int,), "args_digest": (str,),
    "error": (str, type(None)), "idempotent": (bool,), "created_at": (int, float),
    "updated_at": (int, float), "resolved_by": (str, type(None)),
    "order": (list, type(None)), "args": (bytes,), "result": (bytes,),
}
#: Fields added after the first entries were written: (types, value when absent).
_OPTIONAL: Mapping[str, tuple[tuple[type, ...], Any]] = {
    "resolved_at": ((int, float, type(None)), None),
    "keyed": ((bool,), False),
    "committed_in": ((int, type(None)), None),
    "retired_from": ((str, type(None)), None),
    "retired_status": ((str, type(None)), None),
}
#: Optional fields written only when set, so entries without them encode as before.
_SPARSE = ("committed_in", "retired_from", "retired_status")


def decode_entry(data: bytes) -> EffectRecord:
    """Decode a ledger entry, checking every field; :class:`CodecError` if malformed."""
    obj = loads(data)
    if not isinstance(obj, dict) or obj.get("v") != 1:
        raise CodecError("effect entry is not a version-1 map")
    for f, types in _TYPES.items():
        if f not in obj or not isinstance(obj[f], types):
            raise CodecError(f"effect entry field {f!r} is missing or of the wrong type")
    for f, (types, absent) in _OPTIONAL.items():
        if not isinstance(obj.setdefault(f, absent), types):
            raise CodecError(f"effect entry field {f!r} is of the wrong type")
    if obj["status"] not in STATUSES:
        raise CodecError(f"effect entry has unknown status {obj['status']!r}")
    try:
        mode = EffectMode(obj["mode"])
    except ValueError:
        raise CodecError(f"effect entry has unknown mode {obj['mode']!r}") from None
    order = obj["order"]
    if order is not None and not (len(order) == 2 and all(isinstance(x, int) for x in order)):
        raise CodecError("effect entry order is malformed")
    fields: dict[str, Any] = {f: obj.get(f) for f in _FIELDS}
    fields["mode"] = mode
    fields["args"] = loads(obj["args"])
    fields["result"] = loads(obj["result"])
    fields["order"] = tuple(order) if order is not None else None
    fields["created_at"] = float(obj["created_at"])
    fields["updated_at"] = float(obj["updated_at"])
    if obj["resolved_at"] is not None:
        fields["resolved_at"] = float(obj["resolved_at"])
    for f in _SPARSE:
        fields[f] = obj[f]
    return EffectRecord(**fields)


def check_listing(run: str | None, status: str | None) -> None:
    """Refuse a bad filter of ``store.effects(run=, status=)``.

    Raises:
        ValueError: an unknown status. InvalidKeyError: a bad run id.
    """
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {list(STATUSES)}, not {status!r}")
    if run is not None:
        check_key(run, "run id")


def listing(found: Iterable[EffectRecord], run: str | None, status: str | None
            ) -> list[EffectRecord]:
    """``store.effects``'s answer from the entries ``found``: oldest first, filtered.

    Oldest first is by creation time, then commit order, then key; only
    entries of ``run`` and of ``status`` (each when given) are kept.
    """
    return [e for e in sorted(found, key=lambda e: (e.created_at, e.order or (0, 0), e.key))
            if (run is None or e.run == run) and (status is None or e.status == status)]
