"""The PostgreSQL backend: views, reads, fenced commits, history and the ledger over tables.

Theory of operation: the operations are those of the backend seam
(``agentwal/backend.py`` on the ``seam`` branch: ``begin``/``read``/``scan``/
``commit``/``end`` on a view of one run, ``head``/``checkpoints``/``state_at``/
``runs``/``delete_run``, and the ledger with a compare-and-set
``record_effect``), so the public facade can sit on either backend.

*Reads.* Each ``deltas`` row is live from its checkpoint until the one that
next wrote its key (``until``, NULL while it is the key's latest), so the
state at checkpoint ``N`` is the rows with ``ckpt <= N`` whose ``until`` is
NULL or above ``N``: the live rows (a partial index on ``(run, key)``) plus
those superseded after ``N`` (a partial index on ``(run, until)``). Reading
the head, or any view of it, costs the keys read, not the run's history; an
old checkpoint costs its keys plus the writes made since. A prefix is an
index range.

*A view* is ``(run, base, epoch, fence)``: the run's head checkpoint id when
it began, the run id's epoch (sequence number of its last deletion) and the
worker's :class:`~agentwal.postgres.leases.Lease` on the run (None for a
read-only view). Nothing is held open between ``begin`` and ``commit``: reads
at the view go to ``deltas`` at ``ckpt <= base``, which later commits never
change, so a view needs no snapshot on the server.

*A commit* is one PostgreSQL transaction (schema: ``schema.py``)::

    SELECT ... FROM runs WHERE run = $1 FOR UPDATE   -- serializes the run's committers
    fence:  owner, lease epoch, not expired (server clock)   else LeaseLostError
    epoch:  the run was not deleted since the view           else ConflictError(deleted)
    OCC:    head moved → a newer delta on a key read/written
            or under a scanned prefix                         else rebase onto the head
    INSERT vals (sorted by digest), checkpoints, deltas; UPDATE runs head;
    mark the step's effects committed_in; insert its outbox entries
    COMMIT

That is the *checked path*: two round trips (the lock and what is read under
it, then the writes and COMMIT in one pipeline; the writes are one call of
the server-side function ``write_checkpoint``, ``schema.py``). A plain step
(no effects to mark, no outbox, not a fork's first commit) takes the
*one-statement commit* first: the view knows the head's hash and the live
rows of the keys it read (``begin`` reads them with the head, in one
statement), so the client builds the whole checkpoint assuming the head has
not moved and sends it as one call of ``commit_step`` (its own transaction).
Its guard, evaluated under the row lock, checks the head, the run epoch and
the lease (owner, epoch, not expired) and returns NULL, before any write,
when one of them is not as assumed; the commit then takes the checked path,
which raises the right error or rebases. Fencing and OCC are the same on both
paths: every write is in the transaction that checked the lease epoch under
the row lock. The rows travel as JSON text (byte strings in hex): psycopg
spends its per-statement and per-parameter work once per commit, not once
per row.

A view's ``begin`` is one round trip, with the keys the caller names
(``store.begin(run, prefetch=...)``) fetched in the same statement, append
chains included; so a step that reads only those keys costs two round trips.
A list this worker appended to or read at a head (``held.py``) is named in
that statement with the row it holds, and comes back without its value or
chain while that row is still the live one.

Anything refused rolls back, so nothing is applied. The checkpoint hash is
``codec.checkpoint_hash`` over the parent's hash and the delta with keys in
sorted order, as ``verify`` recomputes it from the rows. A session lost
while COMMIT was in flight is resolved on a new session: lock the run's row
(which waits for the lost transaction to end), then look the commit's
``commit_token`` up: present means the checkpoint is returned, absent means
nothing was applied.

Ledger writes (``record_effect``) are their own short transactions, always
``synchronous_commit = on`` (an intent must be durable before its call),
compare-and-set on the stored entry and fenced by the lease when given.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, overload

import cbor2
import psycopg

from .. import failpoints, forks
from ..backend import Change, EffectRace
from ..codec import (
    Joined,
    checkpoint_hash,
    decode_blob_ref,
    decode_meta,
    encode_meta,
    is_blob_ref,
    join_append,
    whole,
)
from ..effects import (
    Deferred,
    EffectRecord,
    args_digest,
    carry_mark,
    decode_entry,
    encode_entry,
    encode_outbox,
    mark_committed,
    outbox_entries,
    outstanding,
    still_expected,
)
from ..errors import (
    BackendUnavailableError,
    CheckpointNotFoundError,
    ConflictError,
    CorruptionError,
    EffectDivergenceError,
    LeaseLostError,
    ReadOnlyError,
    RunExistsError,
    RunNotFoundError,
    StoreClosedError,
)
from ..history import MAX_CHAIN
from ..types import Checkpoint
from . import schema as schema_mod
from .blobs import PgBlobs
from .db import Db, session_gone
from .held import Heads, Held
from .leases import Lease, Leases

__all__ = ["Change", "EffectRace", "PgView", "PostgresBackend"]

_ZERO_HASH = bytes(32)
_CKPT_COLS = "run, id, parent, seq, created_at, meta, hash, origin_run, origin_id"
#: Retries of a commit the server aborted as a serialization failure or deadlock.
_RETRIES = 3
#: Bytes of values a backend keeps to spare ``begin`` fetching them again (``held.py``).
_HELD_BYTES = 16 << 20


def _successor(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` (None: none exists).

    Keys sort by code point (``COLLATE "C"`` on UTF-8), so a prefix scan is
    the index range ``[prefix, successor)``.
    """
    for i in range(len(prefix) - 1, -1, -1):
        c = ord(prefix[i])
        if c < 0x10FFFF:
            nxt = c + 1 if c + 1 != 0xD800 else 0xE000  # past the surrogates
            return prefix[:i] + chr(nxt)
    return None


class _Dropped(Exception):
    """The checkpoint being read was dropped by a compaction (``_state``'s marker row)."""


def _compacted(view: PgView, heads: Heads) -> ConflictError:
    heads.forget(view.run)  # the next begin asks the server for the head
    return ConflictError(view.run, reason=(
        f"a compaction dropped checkpoint {view.base}, which this transaction reads at, "
        "after it began; nothing was applied. Begin again (from the run's head)."))


class _Slow(Exception):
    """The one-round-trip commit was refused by its guard: take the checked path."""


#: A commit's rows (``write_checkpoint``, ``schema.py``), in the checked path's transaction.
_WRITE = ("SELECT write_checkpoint(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
          "%s::json, %s::json, %s::json)")
#: A plain step's whole commit (``commit_step``): its commit sequence number, or NULL when
#: the guard refused (nothing written).
_COMMIT_STEP = ("SELECT commit_step(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s::json, %s::json, %s::json)")


def _rows(delta: dict[str, bytes | None], appends: dict[str, tuple[int, int, int, bytes, int]]
          ) -> tuple[str, str, str]:
    """The JSON of a checkpoint's values, delta rows and blob references, as the
    functions of ``schema.py`` take them (byte strings in hex): ``appends`` (``{key:
    (base checkpoint, its depth, base count, tail, base length)}``, :func:`_appends`)
    become append rows holding their tails; values over ``INLINE_MAX`` bytes are stored
    once in ``vals`` by SHA-256."""
    rows: list[list[Any]] = []
    vals: dict[str, str] = {}
    blobs = sorted({bytes.fromhex(decode_blob_ref(v).sha256).hex() for v in delta.values()
                    if is_blob_ref(v)})
    for key, value in delta.items():
        app = appends.get(key)
        stored = value if app is None else app[3]
        vlen = None if value is None else len(value)
        tail: list[Any] = [None, None, None, 0] if app is None else [
            app[0], app[2], app[4], app[1] + 1]
        if stored is None or len(stored) <= schema_mod.INLINE_MAX:
            rows.append([key, None if stored is None else stored.hex(), None, *tail, vlen])
        else:
            d = hashlib.sha256(stored).hexdigest()
            vals[d] = stored.hex()
            rows.append([key, None, d, *tail, vlen])
    return (json.dumps(sorted(vals.items())), json.dumps(rows, ensure_ascii=False),
            json.dumps(blobs))


class _Retry(Exception):
    """The server aborted a commit as a serialization failure or deadlock: run it again."""


@dataclass(frozen=True, slots=True)
class PgView:
    """A view of one run: ``base`` checkpoint, run ``epoch`` and the lease (``fence``)."""

    run: str
    base: int
    epoch: int
    fence: Lease | None = None
    #: ``{prefix: {key: stored bytes}}`` fetched by :meth:`PostgresBackend.prefetch`
    ahead: dict[str, dict[str, bytes]] = field(default_factory=dict)
    #: ``{key: stored bytes or None}`` of the single keys it fetched
    known: dict[str, bytes | None] = field(default_factory=dict)
    #: the hash of checkpoint ``base`` (empty: none), read with it by ``begin``
    head_hash: bytes = b""
    #: ``{key: (checkpoint, depth, value length)}`` of the delta rows its reads met: at the
    #: head, those are the live rows a one-round-trip commit extends with append rows
    rows: dict[str, tuple[int, int, int | None]] = field(default_factory=dict)

    def fetched(self, key: str) -> dict[str, bytes] | None:
        """The prefetched keys of a prefix ``key`` is under, or None."""
        for prefix, got in self.ahead.items():
            if key.startswith(prefix):
                return got
        return None


def _checkpoint(row: tuple[Any, ...]) -> Checkpoint:
    run, cid, parent, seq, created, meta, hsh, origin_run, origin_id = row
    origin = (origin_run, int(origin_id)) if origin_run is not None else None
    return Checkpoint(run, int(cid), None if parent is None else int(parent), int(seq),
                      float(created), decode_meta(bytes(meta)), bytes(hsh).hex(), origin)


def _value(inline: bytes | None, data: bytes | None) -> bytes | None:
    if inline is not None:
        return bytes(inline)
    return None if data is None else bytes(data)


def _appends(change: Change, live: dict[str, tuple[int, int, int | None]]
             ) -> dict[str, tuple[int, int, int, bytes, int]]:
    """The commit's appends to store as append rows: ``{key: (base checkpoint, its depth,
    base count, tail, base length)}``.

    An append is stored as one when its key's live row holds exactly the
    list it extends (that row's whole value has the append's base length;
    the commit rule made sure no commit wrote the key since the view) and
    the chain behind it is shorter than ``history.MAX_CHAIN``; otherwise the
    whole value is stored, which starts a new chain.
    """
    out = {}
    for key, (count, length, tail) in change.appends.items():
        base = live.get(key)
        if (base is not None and base[2] == length and base[1] + 1 < MAX_CHAIN
                and change.writes.get(key) is not None):
            out[key] = (base[0], base[1], count, tail, length)
    return out


#: One statement (one snapshot): the run's head, its run epoch and hash, and the live rows of
#: the keys ``%(keys)s`` (JSON: ``[{"key": k, "have": checkpoint, "epoch": run epoch}, ...]``,
#: ``have`` and ``epoch`` naming the row whose value the client holds, ``held.py``) with
#: every row of the append chains behind them (``top`` marks the live row). A live row that
#: is the one the client holds comes without its value and without its chain (``held``). A
#: run without a row gives no row; a run with no such key, one row of NULLs. Every row is
#: found by a lookup on a whole unique index (``LATERAL ... OFFSET 0``: a subquery per key
#: the planner cannot flatten into a scan of the run's rows, as it did for ``key = ANY(...)``
#: on a table whose statistics lagged its growth: a cost per step linear in the run's live
#: keys).
_AT_HEAD = """
WITH RECURSIVE h AS (SELECT head, run_epoch, head_hash FROM runs WHERE run = %(run)s),
s AS (
  SELECT d.key, d.ckpt, d.base, d.base_count, d.base_len, d.inline, d.digest, d.depth, d.vlen,
         true AS top, coalesce(d.ckpt = k.have AND h.run_epoch = k.epoch, false) AS held
    FROM h, json_to_recordset(%(keys)s::json) AS k(key text, have bigint, epoch bigint),
         LATERAL (SELECT * FROM deltas WHERE run = %(run)s AND key = k.key AND until IS NULL
                  OFFSET 0) d
  UNION ALL
  SELECT d.key, d.ckpt, d.base, d.base_count, d.base_len, d.inline, d.digest, d.depth, d.vlen,
         false, false
    FROM s, LATERAL (SELECT * FROM deltas WHERE run = %(run)s AND ckpt = s.base
                       AND key = s.key OFFSET 0) d
   WHERE NOT s.held)
SELECT h.head, h.run_epoch, h.head_hash, s.key, s.ckpt, s.base, s.base_count, s.base_len,
       CASE WHEN s.held THEN NULL ELSE s.inline END, v.data, s.depth, s.vlen, s.top, s.held
  FROM h LEFT JOIN s ON true
  LEFT JOIN LATERAL (SELECT data FROM vals WHERE digest = s.digest AND NOT s.held OFFSET 0) v
    ON true
"""

def rebuild(run: str, rows: dict[tuple[str, int], tuple[Any, Any, Any, bytes | None]],
            starts: list[tuple[str, int]], where: str) -> dict[str, bytes]:
    """``{key: value}`` of the append chains that start at ``starts`` (``(key, checkpoint)``),
    from ``rows`` (``{(key, checkpoint): (base, base count, base length, stored)}``, every row
    of each chain): each list rebuilt from the whole value at its bottom, tails joined in order.

    Raises:
        CorruptionError: a row of a chain is missing, or a tail does not fit its base.
    """
    out = {}
    for key, ckpt in starts:
        tails: list[tuple[int, int, bytes]] = []
        at: int | None = ckpt
        value: bytes | Joined | None = None
        while at is not None:
            row = rows.get((key, at))
            if row is None or row[3] is None:
                raise CorruptionError(where, None, f"the list of {run!r}/{key!r} at checkpoint "
                                      f"{ckpt} misses the row of checkpoint {at} it extends")
            if row[0] is None:
                value = row[3]
                break
            tails.append((int(row[1]), int(row[2]), row[3]))
            at = int(row[0])
        assert value is not None
        for entry in reversed(tails):
            joined = join_append(value, entry)
            if joined is None:
                raise CorruptionError(where, None, f"an append to {run!r}/{key!r} (checkpoint "
                                      f"{ckpt}) does not fit the list it extends")
            value = joined
        out[key] = value.whole() if isinstance(value, Joined) else value  # joined once, at the end
    return out


def chain_values(conn: psycopg.Connection[Any], run: str, starts: list[tuple[str, int]],
                 where: str) -> dict[str, bytes]:
    """``{key: value}`` of the delta rows ``starts`` (``(key, checkpoint)``, at most one per
    key) whose values are append chains: every row of each chain in one query, then
    :func:`rebuild`.

    Raises:
        CorruptionError: a row of a chain is missing, or a tail does not fit its base.
    """
    rows = {(str(k), int(c)): (b, bc, bl, _value(inline, data)) for k, c, b, bc, bl, inline, data
            in conn.execute(
        "WITH RECURSIVE c AS ("
        " SELECT d.key, d.ckpt, d.base, d.base_count, d.base_len, d.inline, d.digest"
        "   FROM unnest(%(keys)s::text[], %(ckpts)s::bigint[]) AS s(key, ckpt)"
        "   JOIN deltas d ON d.run = %(run)s AND d.ckpt = s.ckpt AND d.key = s.key"
        " UNION ALL"
        " SELECT d.key, d.ckpt, d.base, d.base_count, d.base_len, d.inline, d.digest"
        "   FROM c JOIN deltas d ON d.run = %(run)s AND d.ckpt = c.base AND d.key = c.key)"
        " SELECT c.key, c.ckpt, c.base, c.base_count, c.base_len, c.inline, v.data"
        "   FROM c LEFT JOIN vals v ON v.digest = c.digest",
        {"run": run, "keys": [k for k, _c in starts], "ckpts": [c for _k, c in starts]})}
    return rebuild(run, rows, starts, where)


class PostgresBackend:
    """A store in one PostgreSQL schema, seen by one worker (``worker_id``)."""

    def __init__(self, dsn: str, *, schema: str, worker_id: str, lease_ttl: float,
                 synchronous: bool, readonly: bool, pool_size: int,
                 create: bool = True, max_steals: int | None = None) -> None:
        self.readonly = readonly
        self.worker_id = worker_id
        self.db = Db(dsn, schema, worker_id=worker_id, pool_size=pool_size,
                     lease_ttl=lease_ttl, synchronous=synchronous)
        self.name = self.db.where
        self.db.open()
        try:
            with self.db.connection() as conn:
                if readonly:
                    self.store_id = schema_mod.check(conn, schema, self.name)
                else:
                    self.store_id = schema_mod.install(conn, schema, self.name, create=create)
        except BaseException:
            self.db.close()
            raise
        self.leases = Leases(self.db, worker_id, lease_ttl, max_steals)
        self.blobs = PgBlobs(self.db, self.name)
        #: values of append chains this worker wrote or read at a head (``held.py``)
        self.held = Held(_HELD_BYTES, min_bytes=schema_mod.INLINE_MAX)
        #: the heads of the runs this worker holds the lease of, as it knows them
        self.heads = Heads()
        self.closed = False
        #: why it is closed when not by close() (a forked child's)
        self.closed_why: str | None = None
        forks.register(self, type(self).close_in_forked_child)

    def close_in_forked_child(self, opener: int) -> None:
        """In a child forked while this backend was open (``agentwal.forks``): closed
        without a word to the server. Its sessions are the parent's (requests and replies
        of both processes would interleave on the same sockets), and so are its leases;
        the child's ``close()`` then does nothing."""
        if not self.closed:
            self.closed_why = forks.why(opener, "Its sessions and leases are that "
                                        "process's: open the store in this process.")
            self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise StoreClosedError(self.name, self.closed_why)

    def _writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(self.name)

    @contextlib.contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        self._check_open()
        with self.db.connection() as conn:
            yield conn

    # -- views and reads -------------------------------------------------------------

    def begin(self, run: str, *, lease: bool = True, keys: tuple[str, ...] = ()) -> PgView:
        """A view of ``run`` as of now; with ``lease`` (writers) this worker's lease on it.

        ``keys`` are fetched at the view in the same round trip (as
        :meth:`prefetch` would, one statement with the head, so one snapshot).

        Raises:
            LeaseHeldError: another worker holds the run's lease.
            ReadOnlyError, StoreClosedError, BackendUnavailableError.
        """
        fence = None
        wanted = sorted(set(keys))
        if lease:
            self._writable()
            fence = self.leases.ensure(run)
            known = self.heads.view(run, fence.epoch, wanted)
            if known is not None:  # no round trip (held.py: the head as this worker knows it)
                return PgView(run, known.head, known.run_epoch, fence,
                              known={k: v for k, (v, _row) in known.keys.items()},
                              head_hash=known.head_hash,
                              rows={k: row for k, (_v, row) in known.keys.items()
                                    if row is not None})
        since = self.heads.stamp()
        view = self._begin(run, fence, wanted)
        if fence is not None and view.base:
            self.heads.learn(run, fence.epoch, view.epoch, view.base, view.head_hash,
                             {k: (view.known[k], view.rows.get(k)) for k in wanted}, since)
        return view

    def _begin(self, run: str, fence: Lease | None, wanted: list[str]) -> PgView:
        """:meth:`begin`'s view read from the server: the head and the keys ``wanted``."""
        with self._conn() as conn:
            if not wanted:
                row = conn.execute("SELECT head, run_epoch, head_hash FROM runs WHERE run = %s",
                                   (run,)).fetchone()
                base, epoch, hsh = (int(row[0]), int(row[1]), bytes(row[2] or b"")
                                    ) if row is not None else (0, 0, b"")
                return PgView(run, base, epoch, fence, head_hash=hsh)
            held = self.held.get(run, wanted)
            rows = conn.execute(_AT_HEAD, {"run": run, "keys": json.dumps(
                [{"key": k, "have": held[k][1], "epoch": held[k][0]} if k in held else {"key": k}
                 for k in wanted], ensure_ascii=False)}).fetchall()
        if not rows:
            return PgView(run, 0, 0, fence, known=dict.fromkeys(wanted))
        view = PgView(run, int(rows[0][0]), int(rows[0][1]), fence,
                      head_hash=bytes(rows[0][2] or b""))
        chains: dict[tuple[str, int], tuple[Any, Any, Any, bytes | None]] = {}
        appended: list[tuple[str, int]] = []
        view.known.update(dict.fromkeys(wanted))
        for _h, _e, _x, k, ckpt, base, count, length, inline, data, depth, vlen, top, kept in rows:
            if k is None:
                continue
            if top:
                view.rows[k] = (int(ckpt), int(depth), None if vlen is None else int(vlen))
            if kept:  # the row whose value this worker holds: sent without it
                view.known[k] = held[k][2]
                continue
            value = _value(inline, data)
            chains[(str(k), int(ckpt))] = (base, count, length, value)
            if not top:
                continue
            if base is None:
                view.known[k] = value
            else:
                appended.append((k, int(ckpt)))
        fetched = rebuild(run, chains, appended, self.name)
        view.known.update(fetched)
        for k, ckpt in appended:
            self.held.put(run, view.epoch, ckpt, {k: fetched[k]})
        return view

    def read_value(self, view: PgView, key: str) -> bytes | None:
        """:meth:`read`: this backend stores whole values (never a ``codec.Joined``)."""
        return self.read(view, key)

    def prefetch(self, view: PgView, prefixes: tuple[str, ...], keys: tuple[str, ...] = ()
                 ) -> None:
        """Fetch every key under ``prefixes`` (one round trip each) and the ``keys`` (one
        for all) at the view now, to serve the view's later reads and scans of them from
        memory (a checkpoint's state never changes, so what was fetched stays right)."""
        for prefix in prefixes:
            if view.fetched(prefix) is None:
                view.ahead[prefix] = self.scan(view, prefix)
        wanted = sorted({k for k in keys if k not in view.known and view.fetched(k) is None})
        if wanted and view.base:
            try:
                got = self._state(view.run, view.base, keys=wanted, seen=view.rows)
            except _Dropped:
                raise _compacted(view, self.heads) from None
            view.known.update((k, got.get(k)) for k in wanted)

    def read(self, view: PgView, key: str) -> bytes | None:
        """The stored bytes of ``key`` at the view (None: absent)."""
        if view.base == 0:
            return None
        if key in view.known:
            return view.known[key]
        got = view.fetched(key)
        if got is not None:
            return got.get(key)
        with self._conn() as conn:
            row = conn.execute(
                "SELECT c.dropped, d.inline, v.data, d.ckpt, d.base, d.depth, d.vlen "
                "FROM checkpoints c LEFT JOIN LATERAL (SELECT inline, digest, ckpt, base, depth, "
                "vlen FROM deltas WHERE run = c.run AND key = %s AND ckpt <= c.id "
                "ORDER BY ckpt DESC LIMIT 1) d "
                "ON true LEFT JOIN vals v ON v.digest = d.digest WHERE c.run = %s AND c.id = %s",
                (key, view.run, view.base)).fetchone()
            if row is None:
                return None  # the run was deleted since the view: its commit will say so
            if row[0]:
                raise _compacted(view, self.heads)
            if row[3] is not None:
                view.rows[key] = (int(row[3]), int(row[5]), None if row[6] is None else int(row[6]))
            if row[4] is not None:  # an append row: the list is rebuilt from its chain
                return chain_values(conn, view.run, [(key, int(row[3]))], self.name)[key]
        return _value(row[1], row[2])

    def scan(self, view: PgView, prefix: str) -> dict[str, bytes]:
        """``{key: stored bytes}`` of every key under ``prefix`` at the view.

        Raises:
            ConflictError: a compaction dropped the view's checkpoint meanwhile.
        """
        got = view.fetched(prefix)
        if got is not None:
            return {k: v for k, v in got.items() if k.startswith(prefix)}
        try:
            return self._state(view.run, view.base, prefix=prefix)
        except _Dropped:
            raise _compacted(view, self.heads) from None

    def _state(self, run: str, upto: int, *, prefix: str = "", key: str | None = None,
               keys: list[str] | None = None,
               seen: dict[str, tuple[int, int, int | None]] | None = None) -> dict[str, bytes]:
        """The values live at checkpoint ``upto`` (module doc: the intervals of delta rows);
        ``seen`` gets ``{key: (checkpoint, depth, value length)}`` of the rows read."""
        if upto == 0:
            return {}
        args: dict[str, Any] = {"run": run, "upto": upto, "key": key, "p": prefix,
                                "hi": _successor(prefix), "keys": keys}
        if keys is not None:
            where = "d.key = ANY(%(keys)s)"
        elif key is not None:
            where = "d.key = %(key)s"
        elif not prefix:
            where = "true"
        elif args["hi"] is None:
            where = "d.key >= %(p)s AND starts_with(d.key, %(p)s)"
        else:
            where = "d.key >= %(p)s AND d.key < %(hi)s"
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT d.key, d.inline, v.data, d.ckpt, d.base, d.depth, d.vlen FROM deltas d "
                "LEFT JOIN vals v ON v.digest = d.digest WHERE d.run = %(run)s "
                "AND d.until IS NULL AND d.ckpt <= %(upto)s AND " + where + " UNION ALL "
                "SELECT d.key, d.inline, v.data, d.ckpt, d.base, d.depth, d.vlen FROM deltas d "
                "LEFT JOIN vals v ON v.digest = d.digest WHERE d.run = %(run)s "
                "AND d.until > %(upto)s AND d.ckpt <= %(upto)s AND " + where + " UNION ALL "
                # A marker row (no key) when a compaction dropped the checkpoint: its rows
                # are gone in part, so what was read above is not its state.
                "SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM checkpoints "
                "WHERE run = %(run)s AND id = %(upto)s AND dropped ORDER BY 1", args).fetchall()
            out: dict[str, bytes] = {}
            appended: list[tuple[str, int]] = []
            for k, inline, data, ckpt, base, depth, vlen in rows:
                if k is None:
                    raise _Dropped
                if seen is not None:
                    seen[k] = (int(ckpt), int(depth), None if vlen is None else int(vlen))
                if base is not None:
                    appended.append((k, int(ckpt)))
                    continue
                value = _value(inline, data)
                if value is not None:
                    out[k] = value
            if appended:  # lists rebuilt from their chains, in one more round trip
                out.update(chain_values(conn, run, appended, self.name))
        return dict(sorted(out.items())) if appended else out

    def end(self, view: PgView) -> None:
        """Release the view: nothing is held on the server, so nothing to do."""

    def abandon(self, view: PgView) -> None:
        """As :meth:`end` (called from finalizers)."""

    # -- committing ------------------------------------------------------------------

    #: ``commit(..., created=)`` stamps a given time (``copy_runs`` keeps the source's).
    commits_at_given_time = True

    def commit(self, view: PgView, change: Change, *,
               created: float | None = None) -> Checkpoint | None:
        """Apply ``change`` as the run's next checkpoint, fenced and validated (module doc).

        ``created`` is the checkpoint's time (default now), hashed like any other.

        Raises:
            LeaseLostError: this worker's lease is gone (nothing applied).
            ConflictError: the commit rule refused it (nothing applied).
            RunExistsError: ``change.origin`` is set and the run has a checkpoint.
            BackendUnavailableError: the server could not be reached; nothing was
                applied, unless the message says the outcome is unknown.
        """
        self._writable()
        if change.empty:
            return self.head_at(view.run, view.base)
        lease = view.fence
        if lease is None:
            raise ReadOnlyError(self.name)  # a read view cannot commit
        if lease.lost is not None:
            raise LeaseLostError(view.run, lease.epoch, lease.lost)
        delta = {k: whole(change.writes[k]) for k in sorted(change.writes)}  # whole values
        digest = hashlib.sha256(cbor2.dumps(delta)).digest()
        meta_raw = encode_meta(dict(change.meta))
        deferred = list(change.deferred)
        token = uuid.uuid4()
        fast = self._fast(view, change)
        for attempt in range(_RETRIES + 1):
            try:
                done, appends = self._commit_once(view, lease, change, delta, digest,
                                                  meta_raw, deferred, token, created, fast=fast)
            except _Slow:
                fast = False
                continue
            except _Retry:
                if attempt == _RETRIES:
                    self.heads.forget(view.run)
                    raise ConflictError(view.run, reason=(
                        "the server kept aborting the commit as a serialization failure; "
                        "nothing was applied. Retry the step.")) from None
                continue
            except BaseException:
                self.heads.forget(view.run)
                raise
            self._remember(view, lease, done, delta, appends)
            return done
        raise AssertionError("unreachable")  # the loop returns or raises

    def _remember(self, view: PgView, lease: Lease, done: Checkpoint,
                  delta: dict[str, bytes | None],
                  appends: dict[str, tuple[int, int, int, bytes, int]] | None) -> None:
        """After committing ``done``: the lists it appended to (likely read by the run's
        next step) are held, and the run's known head moves to it (``held.py``); with
        ``appends`` None (the rows it wrote are not known: a commit resolved after a lost
        reply) the known head is dropped."""
        self.held.put(view.run, view.epoch, done.id,
                      {k: v for k, v in delta.items() if appends and k in appends})
        if appends is None:
            self.heads.forget(view.run)
            return
        rows: dict[str, tuple[bytes | None, tuple[int, int, int | None] | None]] = {}
        for key, value in delta.items():
            app = appends.get(key)
            rows[key] = (value, (done.id, 0 if app is None else app[1] + 1,
                                 None if value is None else len(value)))
        self.heads.advance(view.run, lease.epoch, view.epoch, done.id,
                           bytes.fromhex(done.hash), rows)

    @staticmethod
    def _fast(view: PgView, change: Change) -> bool:
        """Whether ``change`` may take the one-round-trip commit (:meth:`_commit_fast`):
        a plain step (no effects to mark, no outbox, not a fork's first commit) on a view
        that knows its head's hash."""
        return (not change.effects and not change.deferred and change.origin is None
                and (view.base == 0 or bool(view.head_hash))
                and not failpoints.armed("pg_commit_before_commit"))

    def _commit_fast(self, conn: psycopg.Connection[Any], view: PgView, lease: Lease,
                     delta: dict[str, bytes | None], digest: bytes, meta_raw: bytes,
                     token: uuid.UUID, created: float,
                     appends: dict[str, tuple[int, int, int, bytes, int]]
                     ) -> tuple[int, int | None, int, bytes]:
        """The whole commit as one statement (one round trip, its own transaction):
        ``commit_step`` (``schema.py``) locks the run's row, checks the guard (the head
        is still the view's, the run was not deleted, the lease is this worker's, live
        and of the view's epoch, all read under the lock) and writes the rows. The
        checkpoint is built from what the view read (the head's hash, the live rows
        its appends extend), which the guard proves current. A refused guard writes
        nothing (``_Slow``): the caller takes the checked path, which says why (or
        rebases). Returns ``(id, parent, seq, hash)``.
        """
        run = view.run
        cid, parent = view.base + 1, (view.base or None)
        hsh = checkpoint_hash(view.head_hash or _ZERO_HASH, run, cid, parent, created,
                              meta_raw, None, digest, None)
        got = conn.execute(_COMMIT_STEP, (
            run, view.base, view.epoch, self.worker_id, lease.epoch, created, meta_raw, hsh,
            digest, token, *_rows(delta, appends))).fetchone()
        if got is None or got[0] is None:
            raise _Slow  # the guard refused: nothing was written
        return cid, parent, int(got[0]), hsh

    def _commit_once(self, view: PgView, lease: Lease, change: Change,
                     delta: dict[str, bytes | None], digest: bytes, meta_raw: bytes,
                     deferred: list[Deferred], token: uuid.UUID,
                     created_at: float | None, *, fast: bool = False
                     ) -> tuple[Checkpoint, dict[str, tuple[int, int, int, bytes, int]] | None]:
        """One attempt at the commit: the checkpoint, and the appends it stored as append
        rows (None: not known, the commit was resolved after its reply was lost)."""
        run = view.run
        committing = False
        with self._conn() as conn:
            try:
                if fast:
                    created = time.time() if created_at is None else created_at
                    committing = True  # everything is sent at once
                    appends = _appends(change, view.rows)
                    cid, parent, seq, hsh = self._commit_fast(conn, view, lease, delta, digest,
                                                              meta_raw, token, created, appends)
                    failpoints.hit("pg_commit_after_commit")
                    return Checkpoint(run, cid, parent, seq, created, decode_meta(meta_raw),
                                      hsh.hex(), None), appends
                with conn.pipeline():  # BEGIN, the row lock (and live rows): one round trip
                    conn.execute("BEGIN")
                    row, live = self._lock_fenced(conn, run, lease, seq=True,
                                                  live=sorted(change.appends))
                head, head_hash, run_epoch, seq = int(row[0]), row[1], int(row[2]), int(row[6])
                if run_epoch != view.epoch:
                    raise ConflictError(run, deleted=True)
                if change.origin is not None and head > 0:
                    raise RunExistsError(run)
                if change.origin is not None:
                    self._hold_origin(conn, *change.origin)
                if head != view.base:
                    self._validate(conn, run, view.base, change)
                deferred = self._dedup_outbox(conn, deferred)
                outbox = encode_outbox(deferred) if deferred else None
                created = time.time() if created_at is None else created_at
                cid, parent = head + 1, (head or None)
                hsh = checkpoint_hash(bytes(head_hash) if head_hash else _ZERO_HASH, run, cid,
                                      parent, created, meta_raw, change.origin, digest, outbox)
                self._mark_effects(conn, change.effects, cid)
                failpoints.hit("pg_commit_before_commit")
                committing = True  # from here a lost session leaves the outcome to resolve
                appends = _appends(change, live)
                with conn.pipeline():  # the writes and COMMIT: one round trip
                    self._insert(conn, run, cid, parent, seq, created, meta_raw, hsh, digest,
                                 outbox, change.origin, lease.epoch, token, delta, appends)
                    for entry in outbox_entries(self.store_id, run, cid, created, seq,
                                                deferred, view.epoch):
                        conn.execute(
                            "INSERT INTO effects (key, run, ckpt, ordinal, entry) "
                            "VALUES (%s, %s, %s, NULL, %s) ON CONFLICT (key) DO NOTHING",
                            (entry.key, run, cid, encode_entry(entry)))
                    conn.execute("COMMIT")
                failpoints.hit("pg_commit_after_commit")
            except BaseException as exc:
                if committing and session_gone(exc, conn):
                    return self._resolve(run, token, exc), None
                if not conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                if isinstance(exc, LeaseLostError):
                    self.leases.forget(lease, "the server refused the lease")
                if isinstance(exc, (psycopg.errors.SerializationFailure,
                                    psycopg.errors.DeadlockDetected)):
                    raise _Retry from None  # not a psycopg error: passes translate() as is
                if isinstance(exc, psycopg.errors.ForeignKeyViolation) and (
                        exc.diag.constraint_name == "deltas_digest_fkey"):
                    raise _Retry from None  # a compaction freed a value it shares: insert again
                if isinstance(exc, psycopg.errors.ForeignKeyViolation):
                    raise ConflictError(run, reason=(
                        "a blob this transaction put was collected before it committed "
                        "(its run was deleted, and the blob was put over an hour ago); "
                        "nothing was applied. Put the blob again and retry the step.")
                        ) from None
                raise
        meta = decode_meta(meta_raw)
        return Checkpoint(run, cid, parent, seq, created, meta, hsh.hex(), change.origin), appends

    def _hold_origin(self, conn: psycopg.Connection[Any], run: str, cid: int) -> None:
        """In a fork's commit: keep a compaction of the origin run out, and check the origin.

        The origin run's row ``FOR SHARE`` waits for a compaction in progress
        (it holds the row ``FOR UPDATE``), and one that starts later waits for
        this commit and then sees the fork's origin, which it keeps. A fork
        whose origin a compaction dropped after the fork read its state
        commits nothing.

        Raises:
            CheckpointNotFoundError: the origin checkpoint is gone (nothing applied).
        """
        conn.execute("SELECT 1 FROM runs WHERE run = %s FOR SHARE", (run,))
        if conn.execute("SELECT 1 FROM checkpoints WHERE run = %s AND id = %s AND NOT dropped",
                        (run, cid)).fetchone() is None:
            raise CheckpointNotFoundError(run, cid)

    def _dedup_outbox(self, conn: psycopg.Connection[Any],
                      deferred: list[Deferred]) -> list[Deferred]:
        """Drop outbox entries whose business key the ledger has (as the local commit does).

        Raises:
            EffectDivergenceError: the key is recorded (or asked for earlier in this
                commit) with another name, mode or arguments; nothing is committed.
        """
        keys = sorted({d[3] for d in deferred if d[3] is not None})
        if not keys:
            return deferred
        rows = conn.execute("SELECT key, entry FROM effects WHERE key = ANY(%s)",
                            (keys,)).fetchall()
        known: dict[str, tuple[str, str, str]] = {}
        for key, raw in rows:
            e = decode_entry(bytes(raw))
            known[str(key)] = (e.name, e.mode.value, e.args_digest)
        kept: list[Deferred] = []
        for d in deferred:
            name, mode, args_raw, key, _idem = d
            if key is None:
                kept.append(d)
                continue
            want = (name, mode, args_digest(args_raw))
            found = known.get(key)
            if found is None:
                known[key] = want
                kept.append(d)
            elif found != want:
                raise EffectDivergenceError(
                    None, key, f"outbox entry {name!r} has business key {key!r}, which the "
                    f"ledger holds for {found[0]!r} ({found[1]}) with other inputs; nothing "
                    "was committed. Use a key that names one request.")
        return kept

    @overload
    def _lock_fenced(self, conn: psycopg.Connection[Any], run: str, lease: Lease, *,
                     share: bool = False, seq: bool = False, live: None = None
                     ) -> tuple[Any, ...]: ...

    @overload
    def _lock_fenced(self, conn: psycopg.Connection[Any], run: str, lease: Lease, *,
                     share: bool = False, seq: bool = False, live: list[str]
                     ) -> tuple[tuple[Any, ...], dict[str, tuple[int, int, int | None]]]: ...

    def _lock_fenced(self, conn: psycopg.Connection[Any], run: str, lease: Lease, *,
                     share: bool = False, seq: bool = False, live: list[str] | None = None
                     ) -> Any:
        """Lock ``run``'s row (``FOR UPDATE``, or ``FOR SHARE``) and check ``lease`` on it.

        Returns ``(head, head_hash, run_epoch, owner, epoch, live)``, and with
        ``seq`` a new commit sequence number last (taken under the row lock, so
        a run's commits get increasing numbers; an aborted commit leaves a gap).
        A steal of the lease waits for this transaction, or this one sees the
        steal's epoch. With ``live`` (keys), also ``{key: (ckpt, depth, vlen)}`` of
        those keys' live delta rows, read under the lock in the same round trip
        (a pipeline's statements run in order): the bases of the commit's appends.

        Raises:
            LeaseLostError: the row shows another owner or epoch, or the lease expired.
        """
        cur = conn.execute(
            "SELECT head, head_hash, run_epoch, lease_owner, lease_epoch, "
            "lease_expires > clock_timestamp()" + (", nextval('commit_seq')" if seq else "")
            + " FROM runs WHERE run = %s " + ("FOR SHARE" if share else "FOR UPDATE"),
            (run,))
        rows = None if not live else conn.execute(
            "SELECT key, ckpt, depth, vlen FROM deltas WHERE run = %s AND until IS NULL "
            "AND key = ANY(%s)", (run, live))
        row = cur.fetchone()
        self._fence(row, lease)
        assert row is not None
        if live is None:
            return tuple(row)
        found = {} if rows is None else {
            str(k): (int(c), int(d), None if n is None else int(n)) for k, c, d, n in rows}
        return tuple(row), found

    def _fence(self, row: tuple[Any, ...] | None, lease: Lease) -> None:
        """Raise LeaseLostError unless ``row`` (runs, locked) shows ``lease`` live."""
        if row is None:
            raise LeaseLostError(lease.run, lease.epoch, "the run has no lease")
        owner, epoch, live = row[3], int(row[4]), bool(row[5])
        if owner != self.worker_id or epoch != lease.epoch:
            who = f"worker {owner!r} (epoch {epoch})" if owner else "nobody (released)"
            raise LeaseLostError(lease.run, lease.epoch, f"the run's lease is now {who}'s")
        if not live:
            raise LeaseLostError(lease.run, lease.epoch, "the lease expired")

    def _validate(self, conn: psycopg.Connection[Any], run: str, base: int,
                  change: Change) -> None:
        """The commit rule for a view behind the head: ConflictError on an overlap."""
        keys = sorted(set(change.writes) | set(change.reads))
        prefixes = sorted(change.prefixes)
        row = conn.execute(
            "SELECT key FROM deltas WHERE run = %s AND ckpt > %s AND (key = ANY(%s) OR "
            "EXISTS (SELECT 1 FROM unnest(%s::text[]) p WHERE starts_with(key, p))) "
            "ORDER BY ckpt, key LIMIT 1", (run, base, keys, prefixes)).fetchone()
        if row is not None:
            key = str(row[0])
            raise ConflictError(run, key if key in keys else None)

    def _insert(self, conn: psycopg.Connection[Any], run: str, cid: int, parent: int | None,
                seq: int, created: float, meta_raw: bytes, hsh: bytes, digest: bytes,
                outbox: bytes | None, origin: tuple[str, int] | None, epoch: int,
                token: uuid.UUID, delta: dict[str, bytes | None],
                appends: dict[str, tuple[int, int, int, bytes, int]]) -> None:
        """The checkpoint's rows, in the caller's transaction: one statement
        (``write_checkpoint``, ``schema.py``); a key in ``appends`` (:func:`_appends`)
        gets an append row holding its tail only."""
        conn.execute(_WRITE, (run, cid, parent, seq, created, meta_raw, hsh, digest, outbox,
                              origin[0] if origin else None, origin[1] if origin else None,
                              epoch, token, *_rows(delta, appends)))

    def _mark_effects(self, conn: psycopg.Connection[Any], keys: tuple[str, ...],
                      cid: int) -> None:
        """Mark the step's ledger entries ``committed_in`` ``cid`` (in the commit's transaction)."""
        for key in keys:
            row = conn.execute("SELECT entry FROM effects WHERE key = %s FOR UPDATE",
                               (key,)).fetchone()
            if row is None:
                continue
            marked = mark_committed(decode_entry(bytes(row[0])), cid)
            if marked is not None:
                conn.execute("UPDATE effects SET entry = %s WHERE key = %s",
                             (encode_entry(marked), key))

    def _resolve(self, run: str, token: uuid.UUID, exc: BaseException) -> Checkpoint:
        """The session died with COMMIT in flight: find out, on a new one, whether it landed."""
        try:
            with self.db.connection() as conn, conn.transaction():
                # Waits until the lost transaction, which held this lock, has ended.
                conn.execute("SELECT 1 FROM runs WHERE run = %s FOR UPDATE", (run,))
                row = conn.execute(f"SELECT {_CKPT_COLS} FROM checkpoints "
                                   "WHERE commit_token = %s", (token,)).fetchone()
        except BackendUnavailableError as again:
            raise BackendUnavailableError(self.name, (
                f"the session ended while COMMIT was in flight ({exc}) and the server is "
                f"still unreachable ({again.reason}): the outcome of this commit is unknown; "
                f"look at store.head({run!r}) once the server is back")) from None
        if row is None:
            raise BackendUnavailableError(self.name, (
                f"the session ended during the commit ({exc}); it was not applied"))
        return _checkpoint(row)

    # -- history ---------------------------------------------------------------------

    def head(self, run: str) -> Checkpoint | None:
        """The run's newest checkpoint, or None."""
        with self._conn() as conn:
            row = conn.execute(f"SELECT {_CKPT_COLS} FROM checkpoints c "
                               "WHERE run = %s AND id = (SELECT head FROM runs WHERE run = %s)",
                               (run, run)).fetchone()
        return None if row is None else _checkpoint(row)

    def head_at(self, run: str, cid: int) -> Checkpoint | None:
        """Checkpoint ``cid`` of ``run`` (None for 0 or a deleted one)."""
        if cid == 0:
            return None
        with self._conn() as conn:
            row = conn.execute(f"SELECT {_CKPT_COLS} FROM checkpoints WHERE run = %s AND id = %s "
                               "AND NOT dropped", (run, cid)).fetchone()
        return None if row is None else _checkpoint(row)

    def checkpoints(self, run: str, *, limit: int | None = None,
                    before: int | None = None) -> list[Checkpoint]:
        """The run's checkpoints, newest first (ids below ``before`` if given)."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {_CKPT_COLS} FROM checkpoints WHERE run = %s AND id < %s "
                "AND NOT dropped ORDER BY id DESC LIMIT %s",
                (run, before if before is not None else 1 << 62, limit)).fetchall()
        return [_checkpoint(r) for r in rows]

    def state_at(self, run: str, checkpoint: int, *, key: str | None = None) -> dict[str, bytes]:
        """``{key: stored bytes}`` of the run at ``checkpoint`` (only ``key`` if given).

        Raises:
            RunNotFoundError: the run has no checkpoint.
            CheckpointNotFoundError: no such checkpoint.
        """
        self.check_at(run, checkpoint)
        try:
            return self._state(run, checkpoint, key=key)
        except _Dropped:  # a compaction dropped it since check_at
            raise CheckpointNotFoundError(run, checkpoint) from None

    def check_at(self, run: str, checkpoint: int) -> Checkpoint:
        """Checkpoint ``checkpoint`` of ``run``, or RunNotFoundError / CheckpointNotFoundError."""
        ckpt = self.head_at(run, checkpoint) if checkpoint > 0 else None
        if ckpt is None:
            if self.head(run) is None:
                raise RunNotFoundError(run)
            raise CheckpointNotFoundError(run, checkpoint)
        return ckpt

    def runs(self) -> list[str]:
        """Every run id with at least one checkpoint, sorted."""
        with self._conn() as conn:
            rows = conn.execute("SELECT run FROM runs WHERE head > 0 ORDER BY run").fetchall()
        return [str(r[0]) for r in rows]

    def delete_run(self, run: str) -> None:
        """Delete the run's checkpoints and history under this worker's lease, durably.

        The ``runs`` row stays (its lease epoch must never go back); the run's
        epoch becomes a new commit sequence number, so a view from before
        cannot commit and a run made again under the id derives new effect keys.

        Raises:
            RunNotFoundError: the run has no checkpoint.
            LeaseHeldError: another worker holds the run. LeaseLostError.
        """
        self._writable()
        lease = self.leases.ensure(run)
        self.heads.forget(run)
        with self._conn() as conn:
            try:
                conn.execute("BEGIN")
                conn.execute("SET LOCAL synchronous_commit = on")
                row = self._lock_fenced(conn, run, lease)
                if int(row[0]) == 0:
                    raise RunNotFoundError(run)
                shas = [bytes(r[0]) for r in conn.execute(
                    "SELECT DISTINCT sha256 FROM delta_blobs WHERE run = %s", (run,))]
                conn.execute("DELETE FROM checkpoints WHERE run = %s", (run,))
                PgBlobs.collect(conn, shas)  # the run's blobs nothing else references
                # The ledger keeps the run's entries, but their positions are free: a run
                # made again under the id derives new keys at the same positions.
                conn.execute("UPDATE effects SET ordinal = NULL WHERE run = %s "
                             "AND ordinal IS NOT NULL", (run,))
                conn.execute("UPDATE runs SET head = 0, head_hash = NULL, "
                             "run_epoch = nextval('commit_seq') WHERE run = %s", (run,))
                conn.execute("COMMIT")
            except BaseException:
                if not conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise
            finally:  # and what a begin learned meanwhile, before the deletion committed
                self.heads.forget(run)

    # -- the effects ledger ----------------------------------------------------------

    def effect(self, key: str) -> EffectRecord | None:
        """The ledger entry with idempotency key ``key``, or None."""
        with self._conn() as conn:
            row = conn.execute("SELECT entry FROM effects WHERE key = %s", (key,)).fetchone()
        return None if row is None else decode_entry(bytes(row[0]))

    def effect_at(self, run: str, checkpoint: int, ordinal: int) -> str | None:
        """The key of the ``txn.effect`` entry at this position, or None."""
        with self._conn() as conn:
            row = conn.execute("SELECT key FROM effects WHERE run = %s AND ckpt = %s "
                               "AND ordinal = %s LIMIT 1", (run, checkpoint, ordinal)).fetchone()
        return None if row is None else str(row[0])

    def fenced_share(self, conn: psycopg.Connection[Any], lease: Lease) -> None:
        """In ``conn``'s open transaction: lock the run's row ``FOR SHARE``, check ``lease``."""
        try:
            self._lock_fenced(conn, lease.run, lease, share=True)
        except LeaseLostError:
            self.leases.forget(lease, "the server refused the lease")
            raise

    def position_zero(self, run: str, lo: int, hi: int) -> list[EffectRecord]:
        """The entries at position 0 of checkpoints ``lo..hi`` of ``run``, newest first."""
        with self._conn() as conn:
            rows = conn.execute("SELECT entry FROM effects WHERE run = %s AND ordinal = 0 "
                                "AND ckpt BETWEEN %s AND %s ORDER BY ckpt DESC",
                                (run, lo, hi)).fetchall()
        return [decode_entry(bytes(r[0])) for r in rows]

    def positioned_after(self, run: str, lo: int, hi: int) -> bool:
        """True if a live ``txn.effect`` entry of ``run`` holds a position at a checkpoint in
        ``(lo, hi]`` (``delete_run`` nulls the positions of the entries it leaves)."""
        with self._conn() as conn:
            rows = conn.execute("SELECT entry FROM effects WHERE run = %s AND ordinal IS NOT NULL "
                                "AND ckpt > %s AND ckpt <= %s", (run, lo, hi)).fetchall()
        return any(decode_entry(bytes(r[0])).status != "retired" for r in rows)

    def record_effect(self, entry: EffectRecord, *, expect: EffectRecord | None,
                      fence: object | None = None) -> EffectRecord:
        """Store ``entry`` durably if the stored one is still ``expect`` (compare-and-set).

        "Still" by ``effects.still_expected``: a ``committed_in`` mark that a
        commit added since is no change, and the write keeps it
        (``effects.carry_mark``), as the local engine's does. With ``fence``,
        the lease is checked in the same transaction: a worker whose lease
        was taken cannot record an intent or an outcome. An intent is refused
        before the server is asked once the lease is past its local deadline
        (``Lease.check``): a holder cut off from the server starts no call.

        Raises:
            EffectRace: the stored entry is not ``expect`` (nothing written).
            LeaseLostError: ``fence`` is no longer this worker's (nothing written).
        """
        self._writable()
        assert fence is None or isinstance(fence, Lease)  # the views' fence (``begin``)
        if fence is not None and entry.status == "in_doubt":
            fence.check()  # an intent: past the local deadline, announce (and call) nothing
        raw = encode_entry(entry)
        with self._conn() as conn, conn.transaction():
            conn.execute("SET LOCAL synchronous_commit = on")
            if fence is not None:
                self.fenced_share(conn, fence)
            row = conn.execute("SELECT entry FROM effects WHERE key = %s FOR UPDATE",
                               (entry.key,)).fetchone()
            found = None if row is None else decode_entry(bytes(row[0]))
            if not still_expected(found, expect):
                raise EffectRace(entry.key, found)
            kept = carry_mark(entry, found)  # a commit's mark added since stays
            if kept is not entry:
                raw = encode_entry(kept)
            conn.execute(
                "INSERT INTO effects (key, run, ckpt, ordinal, entry) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (key) DO UPDATE SET entry = EXCLUDED.entry, run = EXCLUDED.run, "
                "ckpt = EXCLUDED.ckpt, ordinal = EXCLUDED.ordinal",
                (entry.key, entry.run, entry.checkpoint, entry.ordinal, raw))
        return decode_entry(raw)  # as recorded, sharing nothing with the caller's object

    def effects(self) -> list[EffectRecord]:
        """Every ledger entry, in key order."""
        with self._conn() as conn:
            rows = conn.execute("SELECT entry FROM effects ORDER BY key").fetchall()
        return [decode_entry(bytes(r[0])) for r in rows]

    def outbox(self) -> list[EffectRecord]:
        """The outbox entries not yet settled, in commit order."""
        pending = [e for e in self.effects() if e.deferred and outstanding(e)]
        return sorted(pending, key=lambda e: e.order or (0, 0))

    # -- maintenance -----------------------------------------------------------------

    def sync(self) -> None:
        """Make every acknowledged commit durable (a synchronous commit flushes the ones before)."""
        self._check_open()
        with self._conn() as conn, conn.transaction():
            conn.execute("SET LOCAL synchronous_commit = on")
            conn.execute("SELECT txid_current()")

    def stats(self) -> dict[str, Any]:
        """Row counts and on-disk sizes of the store's tables."""
        out: dict[str, Any] = {"backend": "postgresql", "where": self.name,
                               "worker_id": self.worker_id,
                               "leases_held": sorted(r for r in self.leases._held)}
        with self._conn() as conn:
            for table in ("runs", "checkpoints", "deltas", "vals", "effects", "blobs",
                          "blob_chunks"):
                row = conn.execute(f"SELECT count(*), pg_total_relation_size('{table}') "
                                   f"FROM {table}").fetchone()
                assert row is not None
                out[f"{table}_rows"], out[f"{table}_bytes"] = int(row[0]), int(row[1])
        out["runs"] = len(self.runs())
        out["runs_parked"] = len(self.leases.parked())
        return out

    def close(self) -> None:
        """Release this worker's leases and close the sessions (idempotent)."""
        if self.closed:
            return
        with contextlib.suppress(Exception):
            self.leases.release_all()
        self.leases.close()
        self.closed = True
        self.db.close()
