"""AgentWALSaver: LangGraph's checkpointer interface over an agentwal store.

Theory of operation: a LangGraph thread is the agentwal run of the same id
(``_layout.py`` has the keys). Each ``put`` is one agentwal commit that writes
the checkpoint record and only the channel values whose version changed; each
``put_writes`` is one commit (durable when it returns, in the store's
durability mode). Reads take one agentwal transaction (a consistent snapshot)
and roll it back. Commits on one thread may race (LangGraph saves a
checkpoint in the background while tasks save their writes): a
``ConflictError`` re-runs the commit from a fresh snapshot.

A list channel's elements live in a pool (``_layout.py``) that grows through
``txn.append``: a step's commit logs the new messages only, whatever the
length of the conversation, and the fold shares the rest. A task's written
messages go into the pool as the write is saved, so the next checkpoint's
list usually adds nothing and its record is a few runs of positions.

Caches (``_cache.py``; shared by shallow copies, which LangGraph makes in
``with_allowlist``): the last list version written per (thread, namespace,
channel) with its element objects, so the next put serializes only new
elements; each slot's pool (its key and element digests), so a put knows
what the pool holds without reading it; the first elements of pools and
each list version read. A cold slot (a new process, or a pool a concurrent
commit dropped) learns its pool from the version its checkpoint's parent (a
write: its checkpoint) holds, or, when that one is not saved yet (a task's
write can land before its checkpoint, which LangGraph saves in the
background), from the namespace's newest checkpoint, reading the pool once;
starting a new pool there instead would make the next checkpoint append its
whole list to it. A cached pool whose stored length differs (another process
appended) is dropped and the commit re-run.

The async methods run the sync ones in a worker thread (``asyncio.to_thread``):
no disk I/O or fsync on the event loop.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import random
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

import agentwal
from agentwal.errors import ConflictError, RunNotFoundError, UnencodableValueError

from . import _layout as L
from ._cache import Listed, Pool, Prepared, Shared
from ._view import view_of

__all__ = ["AgentWALSaver"]

#: A list whose serialized elements total less than this is stored whole.
LIST_MIN_BYTES = 2048
#: A written list (a node's new messages) whose elements total this is stored element-wise,
#: so the next checkpoint's list shares them.
WRITE_LIST_MIN_BYTES = 512
_COMMIT_ATTEMPTS = 50


def _payload(typed: tuple[str, bytes], readable: bool) -> dict[str, Any]:
    kind, data = typed
    rec: dict[str, Any] = {"t": kind, "b": bytes(data)}
    if readable:
        view = view_of((kind, rec["b"]))
        if view is not None:
            rec["view"] = view["value"]
    return rec


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _typed(rec: dict[str, Any]) -> tuple[str, bytes]:
    return rec["t"], rec["b"]


class _StalePool(Exception):
    """A slot's cached pool is not what the store holds: forget it and run the commit again."""

    def __init__(self, slot: tuple[str, str, str], key: str) -> None:
        super().__init__(slot)
        self.slot = slot
        self.key = key  # the pool, longer in the store than in the cache


@dataclass(frozen=True)
class _Grown:
    """Elements a commit appends to a pool, for the caches once it is in."""

    slot: tuple[str, str, str]
    key: str
    before: int  # the pool's length before the append (0: a new pool)
    digests: builtins.list[str]
    elements: builtins.list[tuple[str, bytes]]


def _place(pool: Pool, digests: Sequence[str], cursor: int = 0
           ) -> tuple[builtins.list[int], builtins.list[int]]:
    """Positions in ``pool`` (extended by the new elements) of a list with ``digests``,
    and the indices of the elements the pool lacks, in the order they are appended;
    ``cursor`` is where the first is looked for first (runs stay long)."""
    held = len(pool.digests)
    positions: builtins.list[int] = []
    new: builtins.list[int] = []
    added: dict[str, int] = {}
    for i, dig in enumerate(digests):
        if cursor < held and pool.digests[cursor] == dig:
            at = cursor
        else:
            found = added.get(dig, pool.where.get(dig))
            if found is None:
                found = added[dig] = held + len(new)
                new.append(i)
            at = found
        positions.append(at)
        cursor = at + 1
    return positions, new


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as plain data for checkpoint metadata shown by the CLI (str() beyond that)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth < 6 and isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if depth < 6 and isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    return str(value)


def _where(config: RunnableConfig) -> tuple[str, str, str | None]:
    conf = config.get("configurable") or {}
    thread = conf.get("thread_id")
    if thread is None:
        raise ValueError("the config has no configurable.thread_id: pass "
                         "{'configurable': {'thread_id': ...}} to the graph")
    return str(thread), str(conf.get("checkpoint_ns") or ""), get_checkpoint_id(config)


def _config(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                             "checkpoint_id": checkpoint_id}}


class AgentWALSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that keeps every thread as an agentwal run.

    Args:
        store: an open agentwal store (the saver does not close it).
        serde: LangGraph serializer (default: LangGraph's JsonPlusSerializer);
            its type tag is stored with its bytes, so encrypted serializers work.
        readable: also store a readable decoding of each value for the CLI.

    Example::

        with agentwal.open("graph.awal") as store:
            graph = builder.compile(checkpointer=AgentWALSaver(store))
            graph.invoke({"messages": [("user", "hi")]},
                         {"configurable": {"thread_id": "t1"}})
    """

    store: agentwal.Store

    def __init__(self, store: agentwal.Store, *, serde: SerializerProtocol | None = None,
                 readable: bool = True) -> None:
        super().__init__(serde=serde)
        self.store = store
        self.readable = readable
        self._shared = Shared()

    @classmethod
    @contextlib.contextmanager
    def from_path(cls, path: str, *, serde: SerializerProtocol | None = None,
                  readable: bool = True, **open_kwargs: Any) -> Iterator[AgentWALSaver]:
        """Open the local store at ``path`` (``agentwal.open(path, **open_kwargs)``) for a saver.

        Example::

            with AgentWALSaver.from_path("graph.awal") as saver:
                graph = builder.compile(checkpointer=saver)
        """
        store = agentwal.open(path, **open_kwargs)
        try:
            yield cls(store, serde=serde, readable=readable)
        finally:
            store.close()

    # -- plumbing ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _reading(self, thread: str) -> Iterator[agentwal.Transaction]:
        txn = self.store.begin(thread)
        try:
            yield txn
        finally:
            txn.rollback()

    def _commit(self, thread: str, body: Callable[[agentwal.Transaction], bool],
                ahead: Callable[[], builtins.list[str]] | None = None) -> None:
        """Run ``body(txn)`` and commit if it returns True; re-run it on a conflict.

        ``ahead()``: the keys ``body`` will read, fetched with the snapshot (on
        PostgreSQL in the same round trip: ``store.begin(prefetch=)``).
        """
        for attempt in range(_COMMIT_ATTEMPTS):
            txn = self.store.begin(thread, prefetch=ahead() if ahead else ())
            try:
                wanted = body(txn)
            except _StalePool as stale:
                txn.rollback()
                self._shared.forget_pool(stale.slot, stale.key)
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise RuntimeError(f"the pool of {stale.slot} kept changing") from None
                continue
            except BaseException:
                txn.rollback()
                raise
            if not wanted:
                txn.rollback()
                return
            try:
                txn.commit()
                return
            except ConflictError:
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise

    def _pool_keys(self, slots: Iterable[tuple[tuple[str, str, str], int | None]], *,
                   linked: bool) -> builtins.list[str]:
        """The keys ``_pooled`` reads for ``slots`` (``(slot, the list's length)``, None: it
        grows), as far as the caches know them: the chunks the pool grows in, unless the
        list is no longer than the pool (it most likely appends nothing: a checkpoint after
        ``put_writes`` put its messages in), and (``linked``) the slot's last version."""
        out = []
        with self._shared.lock:
            for slot, length in slots:
                prev = self._shared.lists.get(slot) if linked else None
                if prev is not None:
                    out.append(prev.key)
                pool = self._shared.pools.get(slot)
                if pool is not None and (length is None or length > len(pool.digests)):
                    chunk = len(pool.digests) // L.POOL_CHUNK
                    out += [L.chunk_key(pool.key, chunk), L.chunk_key(pool.key, chunk + 1)]
        return out

    def _put_value(self, txn: agentwal.Transaction, key: str, rec: dict[str, Any]) -> None:
        try:
            txn.put(key, rec)
        except UnencodableValueError:
            if "view" not in rec:
                raise
            txn.put(key, {k: v for k, v in rec.items() if k != "view"})

    def _is_thread(self, run: str) -> bool:
        return self.store.get(run, L.MARKER) is not None

    def _threads(self) -> builtins.list[str]:
        return [r for r in self.store.runs() if self._is_thread(r)]

    # -- reading -----------------------------------------------------------------------

    def _element(self, txn: agentwal.Transaction, dig: str) -> tuple[str, bytes]:
        hit = self._shared.element(dig)
        if hit is None:
            rec = txn.get(L.element_key(dig))
            if rec is None:
                raise LookupError(f"list element {dig} of thread {txn.run!r} is missing")
            hit = _typed(rec)
            self._shared.remember_element(dig, hit)
        return hit

    def _pool_slice(self, txn: agentwal.Transaction, rec: dict[str, Any]
                    ) -> tuple[tuple[str, bytes], ...]:
        """The elements a pool record names (the pool read once, then cached)."""
        positions = L.pool_positions(rec, txn.get)
        key, need = rec["k"], max(positions, default=-1) + 1
        have = self._shared.pool_elements(txn.run, key)
        if have is None or len(have) < need:
            have = self._read_pool(txn, key, have or (), need)
            if have is None:
                raise LookupError(f"list pool {key!r} of thread {txn.run!r} is missing")
            self._shared.remember_pool_elements(txn.run, key, have)
        return tuple(have[p] for p in positions)

    def _value(self, txn: agentwal.Transaction, vkey: str, rec: dict[str, Any]) -> Any:
        if rec["t"] not in ("list", "pool"):
            return self.serde.loads_typed(_typed(rec))
        listed = self._shared.listed(txn.run, vkey)
        if listed is None:
            if rec["t"] == "pool":
                elements = self._pool_slice(txn, rec)
            else:  # format 1: a chain of element digests
                elements = tuple(self._element(txn, d) for d in L.resolve_list(rec, txn.get))
            whole = None
            if all(kind == "msgpack" for kind, _ in elements):
                # A msgpack array is its header and its items' encodings, concatenated.
                whole = _array_header(len(elements)) + b"".join(data for _, data in elements)
            listed = (elements, whole)
            self._shared.remember_listed(txn.run, vkey, listed)
        elements, whole = listed
        if whole is not None and isinstance(self.serde, JsonPlusSerializer):
            return self.serde.loads_typed(("msgpack", whole))  # one decode call
        return [self.serde.loads_typed(e) for e in elements]

    def _tuple(self, txn: agentwal.Transaction, rec: dict[str, Any]) -> CheckpointTuple:
        thread, ns, cid = txn.run, rec["ns"], rec["id"]
        nsid = L.ns_id(ns)
        cp = self.serde.loads_typed(_typed(rec["cp"]))
        values: dict[str, Any] = {}
        for channel, version in cp.get("channel_versions", {}).items():
            vkey = L.value_key(nsid, channel, version)
            vrec = txn.get(vkey)
            if vrec is not None and vrec["t"] != "empty":
                values[channel] = self._value(txn, vkey, vrec)
        writes = list(txn.items(L.write_prefix(nsid, cid)))
        writes.sort(key=lambda kw: writes_sort_key(kw[1]["path"], kw[1]["task"], kw[1]["idx"]))
        parent = rec.get("parent")
        checkpoint = cast(Checkpoint, {**cp, "channel_values": values})
        return CheckpointTuple(
            config=_config(thread, ns, cid),
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(_typed(rec["md"])),
            parent_config=_config(thread, ns, parent) if parent else None,
            pending_writes=[(w["task"], w["ch"], self._value(txn, key, w))
                            for key, w in writes],
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (the namespace's newest without a checkpoint_id)."""
        thread, ns, cid = _where(config)
        nsid = L.ns_id(ns)
        with self._reading(thread) as txn:
            if cid is None:
                cid = txn.get(L.head_key(nsid))
                if cid is None:
                    return None
            rec = txn.get(L.checkpoint_key(nsid, cid))
            if rec is None or rec["ns"] != ns:
                return None
            return self._tuple(txn, rec)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of one thread (every namespace unless the config names
        one), or of every thread when ``config`` is None; ``filter`` matches metadata."""
        if config is not None:
            thread, ns_only, cid_only = _where(config)
            threads = [thread]
            if "checkpoint_ns" not in (config.get("configurable") or {}):
                ns_only_opt: str | None = None
            else:
                ns_only_opt = ns_only
        else:
            threads, ns_only_opt, cid_only = self._threads(), None, None
        before_id = get_checkpoint_id(before) if before else None
        remaining = limit
        for thread in threads:
            if remaining is not None and remaining <= 0:
                return
            out = self._list_thread(thread, ns_only_opt, cid_only, before_id, filter,
                                    remaining)
            if remaining is not None:
                remaining -= len(out)
            yield from out

    def _list_thread(self, thread: str, ns: str | None, cid: str | None,
                     before_id: str | None, filter: dict[str, Any] | None,
                     limit: int | None) -> builtins.list[CheckpointTuple]:
        prefix = L.checkpoint_prefix(None if ns is None else L.ns_id(ns))
        out: builtins.list[CheckpointTuple] = []
        with self._reading(thread) as txn:
            recs = [rec for _, rec in txn.items(prefix)
                    if (ns is None or rec["ns"] == ns) and (cid is None or rec["id"] == cid)
                    and (before_id is None or rec["id"] < before_id)]
            recs.sort(key=lambda r: r["id"], reverse=True)
            if len(recs) > 1 and (limit is None or limit > 1):
                # their channel values and pending writes: one round trip each on
                # PostgreSQL, instead of one per checkpoint and channel
                nsid = None if ns is None else L.ns_id(ns)
                txn.prefetch(L.value_prefix(nsid), L.writes_prefix(nsid))
            for rec in recs:
                if limit is not None and len(out) >= limit:
                    break
                if filter:
                    md = self.serde.loads_typed(_typed(rec["md"]))
                    if not all(md.get(k) == v for k, v in filter.items()):
                        continue
                out.append(self._tuple(txn, rec))
        return out

    # -- writing -----------------------------------------------------------------------

    def _prepare_list(self, slot: tuple[str, str, str], value: Any) -> Prepared | None:
        """The elements of a list value, serializing only those not in the slot's last
        version (by identity: LangGraph's reducers build a new list of the same objects);
        None when the value is no list or too small to be worth sharing."""
        if type(value) is not list or not value:
            return None
        with self._shared.lock:
            prev = self._shared.lists.get(slot)
        reuse = 0
        if prev is not None:
            limit = min(len(prev.objs), len(value))
            while reuse < limit and value[reuse] is prev.objs[reuse]:
                reuse += 1
        digests = list(prev.digests[:reuse]) if prev else []
        sizes = list(prev.sizes[:reuse]) if prev else []
        fresh: dict[str, tuple[str, bytes]] = {}
        for element in value[reuse:]:
            kind, data = self.serde.dumps_typed(element)
            typed = (kind, bytes(data))
            dig = L.digest(typed)
            digests.append(dig)
            sizes.append(len(typed[1]))
            fresh[dig] = typed
        if sum(sizes) < LIST_MIN_BYTES:
            return None
        return Prepared(tuple(value), tuple(digests), tuple(sizes), fresh)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Store a checkpoint and the channel values of ``new_versions``: one agentwal commit."""
        thread, ns, parent = _where(config)
        nsid = L.ns_id(ns)
        cid = checkpoint["id"]
        bare = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values = checkpoint.get("channel_values", {})
        md = get_checkpoint_metadata(config, metadata)
        plain: builtins.list[tuple[str, dict[str, Any]]] = []
        lists: builtins.list[tuple[str, tuple[str, str, str], Prepared]] = []
        for channel, version in new_versions.items():
            vkey = L.value_key(nsid, channel, version)
            if channel not in values:
                plain.append((vkey, {"t": "empty"}))
                continue
            slot = (thread, nsid, channel)
            prep = self._prepare_list(slot, values[channel])
            if prep is None:
                plain.append((vkey, _payload(self.serde.dumps_typed(values[channel]),
                                             self.readable)))
            else:
                lists.append((vkey, slot, prep))
        record = {"id": cid, "ns": ns, "parent": parent,
                  "cp": _payload(self.serde.dumps_typed(bare), False),
                  "md": _payload(self.serde.dumps_typed(md), self.readable),
                  "run_id": md.get("run_id") if isinstance(md.get("run_id"), str) else None}
        written: dict[tuple[str, str, str], Listed] = {}
        grown: builtins.list[_Grown] = []

        # Keys body reads, fetched with the snapshot (one round trip on PostgreSQL).
        def ahead() -> builtins.list[str]:
            return [L.MARKER, L.ns_key(nsid), L.head_key(nsid),
                    *self._pool_keys([(slot, len(p.digests)) for _k, slot, p in lists],
                                     linked=True)]

        def body(txn: agentwal.Transaction) -> bool:
            written.clear()
            grown.clear()
            self._mark(txn, new_thread=True)
            if L.ns_key(nsid) not in txn:
                txn.put(L.ns_key(nsid), ns)
            for vkey, rec in plain:
                self._put_value(txn, vkey, rec)
            for vkey, slot, prep in lists:

                def typed_of(i: int, prep: Prepared = prep) -> tuple[str, bytes]:
                    typed = prep.fresh.get(prep.digests[i])
                    if typed is None:  # an element reused by identity, needed again
                        kind, data = self.serde.dumps_typed(prep.objs[i])
                        typed = (kind, bytes(data))
                    return typed

                rec, positions = self._pooled(txn, slot, prep.digests, typed_of, parent, grown,
                                              linked=True)
                self._put_value(txn, vkey, rec)
                written[slot] = Listed(vkey, prep.objs, prep.digests, prep.sizes, rec["k"],
                                       tuple(positions), rec.get("d", 0))
            self._put_value(txn, L.checkpoint_key(nsid, cid), record)
            head = txn.get(L.head_key(nsid))
            if head is None or cid > head:
                txn.put(L.head_key(nsid), cid)
            txn.meta(langgraph="checkpoint", checkpoint_ns=ns, checkpoint_id=cid,
                     parent_checkpoint_id=parent, metadata=_plain(md))
            return True

        self._shared.forget_values(thread, [vkey for vkey, _ in plain] +
                                   [vkey for vkey, _, _ in lists])
        self._commit(thread, body, ahead)
        self._grown(grown)
        with self._shared.saved:
            self._shared.lists.update(written)
            self._shared.saved.notify_all()
        return _config(thread, ns, cid)

    def _mark(self, txn: agentwal.Transaction, *, new_thread: bool) -> None:
        """Write the thread marker of this layout (a new thread only if ``new_thread``)."""
        marker = txn.get(L.MARKER)
        if marker is None and not new_thread:
            return
        if marker != {"format": L.FORMAT}:
            txn.put(L.MARKER, {"format": L.FORMAT})

    def _pooled(self, txn: agentwal.Transaction, slot: tuple[str, str, str],
                digests: Sequence[str], typed_of: Callable[[int], tuple[str, bytes]],
                hint: str | None, grown: builtins.list[_Grown], *, linked: bool = False
                ) -> tuple[dict[str, Any], builtins.list[int]]:
        """The record of a list with ``digests`` and its pool positions, appending to the
        slot's pool the elements it lacks (``typed_of(i)``: element ``i`` serialized); a
        new pool when there is none or the list would take too many runs of the old one.

        ``linked``: the record may link to the slot's last version (a checkpoint's list;
        a write's list stands alone). ``hint``: the checkpoint whose version of the
        channel names the pool when the slot is not cached. Raises _StalePool when the
        stored pool is not the cached one.
        """
        pool = self._pool_of(txn, slot, hint)
        record: dict[str, Any] | None = None
        if pool is not None:
            with self._shared.lock:
                prev = self._shared.lists.get(slot) if linked else None
            keep = 0
            if prev is not None and prev.pool == pool.key and prev.key in txn:
                limit = min(len(prev.positions), len(digests))
                while keep < limit and prev.digests[keep] == digests[keep]:
                    keep += 1
            with self._shared.lock:
                tail, new = _place(pool, digests[keep:],
                                   prev.positions[keep - 1] + 1 if prev and keep else 0)
                before = len(pool.digests)
            new = [keep + i for i in new]
            positions = [*(prev.positions[:keep] if prev else ()), *tail]
            key = pool.key
            if prev is not None and keep and prev.depth + 1 < L.MAX_DEPTH:
                record = L.pool_record(key, tail, (prev.key, keep, prev.depth))
            else:
                record = L.pool_record(key, positions)
        if record is None or len(record["s"]) > 2 * L.MAX_RUNS:
            key = L.pool_key(slot[1], slot[2], os.urandom(6).hex())
            positions = new = list(range(len(digests)))
            before = 0
            record = L.pool_record(key, positions)
        if new:
            elements = [typed_of(i) for i in new]
            mark = txn.savepoint()
            if not self._append(txn, key, before, elements):
                txn.rollback_to(mark)
                raise _StalePool(slot, key)
            grown.append(_Grown(slot, key, before, [digests[i] for i in new], elements))
        return record, positions

    def _append(self, txn: agentwal.Transaction, pool: str, before: int,
                elements: builtins.list[tuple[str, bytes]]) -> bool:
        """Append ``elements`` to a pool of ``before`` elements, chunk by chunk; False if
        a chunk's stored length says the pool is not that long."""
        at = 0
        while at < len(elements):
            chunk, offset = divmod(before + at, L.POOL_CHUNK)
            part = elements[at:at + L.POOL_CHUNK - offset]
            recs = [_payload(e, self.readable) for e in part]
            key = L.chunk_key(pool, chunk)
            try:
                got = txn.append(key, *recs)
            except UnencodableValueError:
                if not any("view" in r for r in recs):
                    raise
                got = txn.append(key, *[{k: v for k, v in r.items() if k != "view"}
                                        for r in recs])
            if got != offset + len(part):
                return False
            at += len(part)
        return True

    def _read_pool(self, txn: agentwal.Transaction, pool: str, have: Sequence[tuple[str, bytes]],
                   need: int) -> builtins.list[tuple[str, bytes]] | None:
        """The pool's elements: ``have`` (a cached prefix) and the chunks after it; None if
        the pool has no chunk.

        Raises:
            LookupError: a chunk is damaged, or the pool holds fewer than ``need``.
        """
        chunk = len(have) // L.POOL_CHUNK
        out = list(have[:chunk * L.POOL_CHUNK])
        while True:
            key = L.chunk_key(pool, chunk)
            stored = txn.get(key)
            if stored is None:
                if chunk == 0:
                    return None
                break
            if not isinstance(stored, builtins.list) or len(stored) > L.POOL_CHUNK:
                raise LookupError(f"list pool chunk {key!r} of thread {txn.run!r} is damaged")
            out.extend(_typed(p) for p in stored)
            if len(stored) < L.POOL_CHUNK:
                break
            chunk += 1
        if len(out) < need:
            raise LookupError(f"list pool {pool!r} of thread {txn.run!r} holds {len(out)} "
                              f"elements, fewer than {need}")
        return out

    def _pool_of(self, txn: agentwal.Transaction, slot: tuple[str, str, str],
                 hint: str | None) -> Pool | None:
        """The slot's pool: cached, or learned from the version checkpoint ``hint`` holds
        (read once), or failing that from the namespace's newest checkpoint's version."""
        with self._shared.lock:
            pool = self._shared.pools.get(slot)
            stale = self._shared.stale_pools.pop(slot, None) if pool is None else None
        if stale is not None:  # another commit grew it: read it as it is now, keep growing it
            grown = self._read_pool(txn, stale, (), 0)
            if grown is not None:
                pool = Pool(stale, [L.digest(e) for e in grown])
                with self._shared.lock:
                    pool = self._shared.pools.setdefault(slot, pool)
                self._shared.remember_pool_elements(txn.run, stale, grown)
                return pool
        if pool is not None:
            return pool
        # A task's write is often saved before the checkpoint it names (LangGraph saves
        # that in the background): the newest saved checkpoint knows the pool then. A new
        # pool here would get the next checkpoint's whole list appended to it.
        if hint is not None:
            pool = self._learn_pool(txn, slot, hint)
        if pool is None:
            head = txn.get(L.head_key(slot[1]))
            if isinstance(head, str) and head != hint:
                pool = self._learn_pool(txn, slot, head)
        return pool

    def _learn_pool(self, txn: agentwal.Transaction, slot: tuple[str, str, str], cid: str
                    ) -> Pool | None:
        """The pool holding checkpoint ``cid``'s version of the slot's channel, read from
        the store and cached (with that version as the slot's last, unless the caches have
        ones); None if ``cid`` is not stored or its version is not pooled."""
        _thread, nsid, channel = slot
        rec = txn.get(L.checkpoint_key(nsid, cid))
        if not isinstance(rec, dict) or rec.get("ns") is None:
            return None
        version = self.serde.loads_typed(_typed(rec["cp"])).get(
            "channel_versions", {}).get(channel)
        vrec = None if version is None else txn.get(L.value_key(nsid, channel, version))
        if not isinstance(vrec, dict) or vrec.get("t") != "pool":
            return None
        positions = L.pool_positions(vrec, txn.get)
        elements = self._read_pool(txn, vrec["k"], (), max(positions, default=-1) + 1)
        if elements is None:
            return None
        pool = Pool(vrec["k"], [L.digest(e) for e in elements])
        learned = Listed(L.value_key(nsid, channel, version), (),
                         tuple(pool.digests[p] for p in positions), (), pool.key,
                         tuple(positions), vrec.get("d", 0))
        with self._shared.lock:
            self._shared.pools.setdefault(slot, pool)
            self._shared.lists.setdefault(slot, learned)
        self._shared.remember_pool_elements(txn.run, pool.key, elements)
        return pool

    def _grown(self, grown: builtins.list[_Grown]) -> None:
        """Bring the caches up to the pools a commit grew (it is in)."""
        for g in grown:
            with self._shared.lock:
                cur = self._shared.pools.get(g.slot)
                if cur is not None and cur.key == g.key:
                    if len(cur.digests) == g.before:
                        cur.extend(g.digests)
                elif g.before == 0:
                    self._shared.pools[g.slot] = Pool(g.key, g.digests)
            if g.before == 0:
                self._shared.remember_pool_elements(g.slot[0], g.key, g.elements)
            else:
                self._shared.remember_pool_elements(g.slot[0], g.key, g.elements, g.before)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Store a task's writes for a checkpoint: special writes (errors, interrupts,
        resumes) replace, regular ones keep the first stored. Durable when it returns."""
        thread, ns, cid = _where(config)
        if cid is None:
            raise ValueError("put_writes needs a config with configurable.checkpoint_id")
        nsid = L.ns_id(ns)
        prepared = []
        for idx, (channel, value) in enumerate(writes):
            widx = WRITES_IDX_MAP.get(channel, idx)
            head = {"task": task_id, "path": task_path, "ch": channel, "idx": widx}
            elements = self._write_elements(value)
            rec = None if elements is not None else {
                **head, **_payload(self.serde.dumps_typed(value), self.readable)}
            prepared.append((L.write_key(nsid, cid, task_id, widx), widx, head, rec, elements))
        self._shared.forget_values(thread, [key for key, *_ in prepared])
        grown: builtins.list[_Grown] = []

        def ahead() -> builtins.list[str]:
            slots = [((thread, nsid, str(head["ch"])), None)
                     for *_, head, _r, elements in prepared if elements is not None]
            return [L.MARKER, *(key for key, *_ in prepared),
                    *self._pool_keys(slots, linked=False)]

        def body(txn: agentwal.Transaction) -> bool:
            grown.clear()
            wrote = False
            for key, widx, head, rec, elements in prepared:
                if widx >= 0 and key in txn:
                    continue
                if elements is not None:  # messages: into the pool the next checkpoint uses
                    slot = (thread, nsid, str(head["ch"]))
                    typed = [t for _, t in elements]
                    rec = {**head, **self._pooled(txn, slot, [d for d, _ in elements],
                                                  typed.__getitem__, cid, grown)[0]}
                assert rec is not None
                self._put_value(txn, key, rec)
                wrote = True
            if wrote:
                if grown:
                    self._mark(txn, new_thread=False)
                txn.meta(langgraph="writes", checkpoint_ns=ns, checkpoint_id=cid,
                         task_id=task_id, channels=[c for c, _ in writes])
            return wrote

        self._commit(thread, body, ahead)
        self._grown(grown)

    def _write_elements(self, value: Any) -> builtins.list[tuple[str, tuple[str, bytes]]] | None:
        """A written list's elements, serialized, when they are worth sharing; else None."""
        if type(value) is not list or not value:
            return None
        out = []
        for element in value:
            kind, data = self.serde.dumps_typed(element)
            typed = (kind, bytes(data))
            out.append((L.digest(typed), typed))
        return out if sum(len(t[1]) for _, t in out) >= WRITE_LIST_MIN_BYTES else None

    # -- deleting and copying ----------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread (its agentwal run) with every checkpoint and write; a run of
        the same id that is not a LangGraph thread is left alone."""
        self._shared.forget_thread(thread_id)
        if self.store.head(thread_id) is None or not self._is_thread(thread_id):
            return  # nothing of LangGraph's here (a run of the same id is not a thread)
        with contextlib.suppress(RunNotFoundError):
            self.store.delete_run(thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is listed."""
        ids = set(run_ids)
        if not ids:
            return
        for thread in self._threads():

            def body(txn: agentwal.Transaction) -> bool:
                doomed = [(k, rec) for k, rec in txn.items(L.checkpoint_prefix())
                          if rec.get("run_id") in ids]
                for key, rec in doomed:
                    txn.delete(key)
                    nsid = L.ns_id(rec["ns"])
                    for wkey in txn.keys(L.write_prefix(nsid, rec["id"])):
                        txn.delete(wkey)
                self._fix_heads(txn, {L.ns_id(rec["ns"]) for _, rec in doomed})
                if doomed:
                    txn.meta(langgraph="delete_for_runs", run_ids=sorted(ids))
                return bool(doomed)

            self._commit(thread, body)

    def _fix_heads(self, txn: agentwal.Transaction, nsids: set[str]) -> None:
        for nsid in nsids:
            ids = [rec["id"] for _, rec in txn.items(L.checkpoint_prefix(nsid))]
            if ids:
                txn.put(L.head_key(nsid), max(ids))
            elif L.head_key(nsid) in txn:
                txn.delete(L.head_key(nsid))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread to another (an agentwal fork
        when the target is new, so the copy shares the source's stored values; a
        merge into an existing thread).

        Raises:
            RunExistsError: the target is an agentwal run that is not a thread.
        """
        head = self.store.head(source_thread_id)
        if head is None or not self._is_thread(source_thread_id):
            return
        if self.store.head(target_thread_id) is None:
            with contextlib.suppress(agentwal.RunExistsError):
                self.store.fork(source_thread_id, head.id, target_thread_id)
                return
        if not self._is_thread(target_thread_id):
            raise agentwal.RunExistsError(target_thread_id)  # someone else's run: not merged
        with self._reading(source_thread_id) as src:
            items = list(src.items())
        self._shared.forget_thread(target_thread_id)

        def body(txn: agentwal.Transaction) -> bool:
            for key, value in items:
                if key.startswith("head/"):
                    mine = txn.get(key)
                    txn.put(key, value if mine is None else max(mine, value))
                else:
                    txn.put(key, value)
            txn.meta(langgraph="copy_thread", source=source_thread_id)
            return True

        self._commit(target_thread_id, body)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``"keep_latest"`` keeps each namespace's newest checkpoint (with
        its writes and values), ``"delete"`` deletes the threads. The agentwal history
        of the removed checkpoints is freed by ``store.compact``."""
        if strategy == "delete":
            for thread in thread_ids:
                self.delete_thread(thread)
            return
        if strategy != "keep_latest":
            raise ValueError(f"strategy must be 'keep_latest' or 'delete', not {strategy!r}")
        for thread in thread_ids:
            self._shared.forget_thread(thread)
            if self.store.head(thread) is not None and self._is_thread(thread):
                self._commit(thread, self._keep_latest)
            self._shared.forget_thread(thread)

    def _keep_latest(self, txn: agentwal.Transaction) -> bool:
        heads = {key.removeprefix("head/"): cid for key, cid in txn.items("head/")}
        keep_ck = {L.checkpoint_key(nsid, cid) for nsid, cid in heads.items()}
        keep_w = tuple(L.write_prefix(nsid, cid) for nsid, cid in heads.items())
        live_values: dict[str, dict[str, Any]] = {}
        live_elements: set[str] = set()  # format 1
        live_pools: set[str] = set()
        for key in keep_ck:
            rec = txn.get(key)
            if rec is None:
                continue
            nsid = L.ns_id(rec["ns"])
            cp = self.serde.loads_typed(_typed(rec["cp"]))
            for channel, version in cp.get("channel_versions", {}).items():
                vkey = L.value_key(nsid, channel, version)
                vrec = txn.get(vkey)
                if vrec is None:
                    continue
                if vrec["t"] == "list":
                    digests = L.resolve_list(vrec, txn.get)
                    live_elements.update(digests)
                    vrec = L.list_record(digests, None)
                elif vrec["t"] == "pool":
                    live_pools.add(vrec["k"])
                    vrec = L.pool_record(vrec["k"], L.pool_positions(vrec, txn.get))
                live_values[vkey] = vrec
        kept_writes = [(k, w) for k, w in txn.items("w/") if keep_w and k.startswith(keep_w)]
        for _, w in kept_writes:
            if w["t"] == "list":
                live_elements.update(L.resolve_list(w, txn.get))
            elif w["t"] == "pool":
                live_pools.add(w["k"])
        kept_keys = {k for k, _ in kept_writes}
        doomed = [k for k in txn.keys("ck/") if k not in keep_ck]
        doomed += [k for k in txn.keys("w/") if k not in kept_keys]
        doomed += [k for k in txn.keys("v/") if k not in live_values]
        doomed += [k for k in txn.keys("e/") if k.removeprefix("e/") not in live_elements]
        doomed += [k for k in txn.keys("l/") if L.pool_of_chunk(k) not in live_pools]
        for vkey, vrec in live_values.items():
            stored = txn.get(vkey) or {}
            if "base" in stored or "b" in stored:
                txn.put(vkey, vrec)
        for key in doomed:
            txn.delete(key)
        txn.meta(langgraph="prune", strategy="keep_latest", removed=len(doomed))
        return bool(doomed) or bool(live_values)

    # -- versions ----------------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """A version above ``current``: a zero-padded counter and a random tiebreak, so two
        branches of one thread (time travel) never reuse a (channel, version) slot."""
        if current is None:
            n = 0
        elif isinstance(current, (int, float)):
            n = int(current)
        else:
            n = int(current.split(".")[0])
        return f"{n + 1:032}.{random.random():016}"

    # -- async twins -------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in found:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)
