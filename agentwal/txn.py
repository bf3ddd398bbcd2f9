"""Transactions: a buffered, savepointed change to one run, committed atomically.

Theory of operation: a :class:`Transaction` reads through a *view* of its
run (``backend.View``: the run as of ``begin``) on a ``backend.RunStore``,
which it calls for every read, scan and the commit, and buffers its writes
as encoded bytes, so a bad key or an unencodable value fails at the call and
nothing is written. It records what it read (keys and
prefixes) for optimistic validation at commit. States::

    active --commit()--> committed      (the store validated, logged, published)
    active --rollback()--> rolled_back  (nothing was written anywhere)
    active --commit() raising--> rolled_back  (ConflictError, DiskFullError, ...)

``put_blob`` streams an artifact to a durable, content-addressed file
(``blobs.py``) at the call, and buffers only its small reference; the blob
stays *pinned* (safe from a sweep) until the transaction finishes, and for
the life of the process when a commit fails with an unknown outcome.

What else it needs of its store (effects, effect positions, blobs, the
store's name and id) is :class:`StepHooks`: each hook is given what it
needs as arguments, so no store reads a transaction's private fields.

A finished transaction is dead: every method raises
:class:`TransactionClosedError`. As a context manager, a clean exit commits
and an exception rolls back and propagates. A transaction is used by one
thread (or one asyncio task); the store it came from may be shared by many.
For asyncio code, ``acommit`` runs ``commit`` in the loop's default executor
(``async with txn:`` uses it) and ``aeffect`` runs an effect whose ledger
writes happen there too (``aio.py``, ``Ledger.arun``); reads stay synchronous.

Effect positions: the n-th ``effect`` of a transaction is positioned at its
base checkpoint (the run's head at ``begin``), or, for a retry of a step
whose earlier attempt recorded effects (``store.transact``,
``store.begin(run, retry_of=txn)``), at that first attempt's base: the
*anchor*, shared by every attempt of the step (its *chain*), so a retry meets
what the earlier attempts recorded. Before an effect runs, the store checks
that its position is still this step's to use (``StepHooks.txn_claim``). A
commit carries the keys of the effects the transaction recorded, and a
commit of a transaction that recorded an effect always makes a checkpoint,
so the next step starts from new positions. The effect calls live in
``txn_effects.py`` (:class:`~.txn_effects.EffectSteps`, a base class).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .aio import off_loop
from .backend import Change, RunStore, View
from .codec import (
    Append,
    DecodedValues,
    Joined,
    Value,
    append_base,
    append_encoded,
    encode_blob_ref,
    encode_value,
    whole,
)
from .effects import Deferred, EffectMode
from .errors import (
    ConflictError,
    DiskFullError,
    MissingKeyError,
    NotAListError,
    RunExistsError,
    StoreClosedError,
    TransactionClosedError,
    TransactionThreadError,
    UnencodableValueError,
)
from .format import TREE_MEDIA_TYPE
from .handout import Handout, Lists
from .ledger import Request
from .txn_effects import EffectSteps, check_effect_args
from .types import BlobRef, Checkpoint, TreeRef, check_key, check_media_type

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Begin", "Savepoint", "StepHooks", "Transaction", "check_effect_args", "check_retry_of"]

_MISSING: Any = object()
#: What a failed commit raises when it certainly applied nothing (its blobs may be unpinned).
_NOT_APPLIED = (ConflictError, DiskFullError, UnencodableValueError, RunExistsError,
                StoreClosedError)

T = TypeVar("T")


#: Small values transactions read lately, decoded; an entry serves only the same bytes,
#: so it is shared by every store and backend of the process.
_DECODED = DecodedValues()
#: Stored lists shorter than this are encoded again on a re-put (cheaper than the snapshot).
_HANDOUT_MIN = 2048
#: Lists transactions read or grew lately, decoded (``handout.Lists``): like ``_DECODED``,
#: an entry serves only the same stored value, so it is shared by the whole process.
_LISTS = Lists()


class StepHooks(Protocol):
    """What a transaction needs from its store besides the ``backend.RunStore``.

    ``path`` names the store in messages and ``store_id`` derives effect keys.
    A store that cannot keep blobs raises ``BackendUnsupportedError`` from
    ``txn_put_blob``/``txn_put_tree`` (its unpin hooks then never see a pin);
    one that can run an effect inside its commit's database transaction also
    has ``txn_effect_transactional(view, req)``.
    """

    path: str
    store_id: Any

    def txn_effect(self, view: View, req: Request) -> Any:
        """Run ``req`` through the store's ledger for the step reading ``view``."""
        ...

    async def txn_aeffect(self, view: View, req: Request) -> Any:
        """:meth:`txn_effect` for asyncio (``Ledger.arun``)."""
        ...

    def txn_claim(self, txn: Transaction, base: int, *, chain: object,
                  inherited: bool) -> None:
        """Claim the effect positions at ``base`` for ``txn``'s step, or raise ConflictError.

        ``chain`` is shared by every attempt of one step; ``inherited`` says
        the positions are an earlier attempt's (a retry, or an adopted one).
        """
        ...

    def txn_adopt(self, run: str, base: int, name: str, digest: str, mode: EffectMode,
                  epoch: int, key: str | None = None) -> int | None:
        """The checkpoint of an uncommitted attempt of this step to meet, or None.

        ``key`` is the business key of the step's first effect (None: positional).
        """
        ...

    def txn_put_blob(self, source: Any, media_type: str | None) -> BlobRef:
        """Store a blob durably and pin it; its reference."""
        ...

    def txn_put_tree(self, path: Any, exclude: Any, base: bytes | None, rehash: bool = False,
                     subdir: str | None = None) -> tuple[BlobRef, list[str]]:
        """Store a tree durably; its reference and the blob hashes it pinned."""
        ...

    def txn_unpin(self, pins: list[str]) -> None:
        """A transaction finished (and its commit did not fail in doubt): unpin its blobs."""
        ...

    def txn_abandon_pins(self, pins: list[str]) -> None:
        """From a finalizer: unpin later; takes no lock."""
        ...


def check_retry_of(prev: object, store: RunStore[Any], run: str) -> None:
    """Refuse a ``retry_of`` that is not a finished, uncommitted attempt of ``run`` on ``store``.

    Raises:
        TypeError: ``prev`` is not a Transaction.
        ValueError: it is of another store or run, still active, or committed
            (``Transaction`` also refuses one that made effects before the run was
            deleted).
    """
    if not isinstance(prev, Transaction):
        raise TypeError(f"retry_of must be the Transaction of an earlier attempt, "
                        f"not {type(prev).__name__}")
    if prev._store is not store:
        raise ValueError("retry_of is a transaction of another store")
    if prev.run != run:
        raise ValueError(f"retry_of is a transaction of run {prev.run!r}, not {run!r}")
    if prev.state == "active":
        raise ValueError("retry_of is still active: roll it back (or let its ConflictError "
                         "end it) before retrying the step")
    if prev.state == "committed":
        raise ValueError("retry_of committed: its step is done, so the next step begins "
                         "with a plain store.begin(run)")


class Savepoint:
    """A point inside a transaction to return to with ``txn.rollback_to(sp)``."""

    __slots__ = ("_appends", "_deferred", "_depth", "_meta", "_writes")

    def __init__(self, depth: int, writes: dict[str, Value | None], meta: dict[str, Any],
                 deferred: int = 0, appends: dict[str, tuple[Append, Joined]] | None = None):
        self._depth = depth
        self._writes = writes
        self._meta = meta
        self._deferred = deferred
        self._appends = appends or {}


class Transaction(EffectSteps):
    """A write transaction on one run; get one from ``store.begin(run)``.

    Example::

        with store.begin("run-42") as txn:
            step = txn.get("step", 0)
            txn["step"] = step + 1
        print(txn.checkpoint.id)
    """

    def __init__(self, store: RunStore[Any], view: View, hooks: StepHooks, *,
                 retry_of: Transaction | None = None) -> None:
        self._store = store
        self._hooks = hooks
        self.run = view.run
        self._view = view
        #: key -> encoded value (None: deleted); an append's value is a ``Joined``
        #: (the stored list and the new items, joined only if something reads it)
        self._writes: dict[str, Value | None] = {}
        #: key -> (append entry, the value it made): a write that is an append to the
        #: stored list, logged as the entry while ``_writes`` holds that value
        self._appends: dict[str, tuple[Append, Joined]] = {}
        #: stored lists ``get`` handed out, to log a re-put that only appended as an append
        self._handouts: dict[str, Handout] = {}
        #: key -> (the value a re-put that only grew made, the handout it grew from, the
        #: encoded tail): kept in ``_LISTS`` once the commit has stored it
        self._grown: dict[str, tuple[Joined, Handout, bytes]] = {}
        self._reads: set[str] = set()
        self._prefixes: set[str] = set()
        self._meta: dict[str, Any] = {}
        #: a fork's ``(run, checkpoint)`` for the run's first commit (salvage sets it)
        self._origin: tuple[str, int] | None = None
        self._savepoints: list[Savepoint] = []
        self._deferred: list[Deferred] = []
        self._effects_made = 0  # effect positions used (never rolled back: effects are not)
        self._effect_names: dict[str, int] = {}
        self._state = "active"
        #: the thread that began it, and one the transaction is lent to while its
        #: owner awaits an agentwal call that runs off the event loop (``_lent``)
        self._owner = threading.get_ident()
        self._borrower: int | None = None
        self.checkpoint: Checkpoint | None = None
        self._blob_pins: list[str] = []  # hashes put_blob pinned for this transaction
        self._blobs_in_doubt = False  # a commit failed with an unknown outcome: keep them
        self._effect_keys: list[str] = []  # keys of the effects recorded, in call order
        self._effect_names_made: list[str] = []
        #: (base checkpoint, run epoch) effects are positioned at; None: not yet chosen
        self._anchor: tuple[int, int] | None = None
        self._chain: object = object()  # shared by every attempt of one step
        self._anchored = False  # the anchor came from an earlier attempt (a retry)
        self._adopted = False  # the anchor is an uncommitted attempt's, found by the engine
        #: 1 for a step's first transaction, 2 for its first retry, ...
        self.attempt = 1
        if retry_of is not None:
            if retry_of._anchor is not None and retry_of._anchor[1] != view.epoch:
                self._state = "rolled_back"  # never used: hand the view back now
                store.end(view)
                raise ValueError(
                    f"retry_of made effects on run {self.run!r} before it was deleted "
                    "(store.delete_run): the run is a new one now. Begin its steps with a "
                    "plain store.begin(run); their effects get new keys.")
            self._chain = retry_of._chain
            self._anchor = retry_of._anchor
            self._anchored = retry_of._anchor is not None
            self.attempt = retry_of.attempt + 1

    # -- lifecycle -----------------------------------------------------------------

    @property
    def state(self) -> str:
        """``"active"``, ``"committed"`` or ``"rolled_back"``."""
        return self._state

    def _check(self) -> None:
        if self._state != "active":
            raise TransactionClosedError(self.run, self._state.replace("_", " "))
        me = threading.get_ident()
        if me != self._owner and me != self._borrower:
            raise TransactionThreadError(self.run, threading.current_thread().name)

    async def _lent(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` off the loop, on a thread this transaction is lent to meanwhile."""

        def call() -> T:
            self._borrower = threading.get_ident()
            try:
                return fn(*args, **kwargs)
            finally:
                self._borrower = None

        return await off_loop(call)

    def commit(self) -> Checkpoint | None:
        """Validate, log and publish the change; returns the new checkpoint.

        A transaction that changed nothing, set no meta, deferred nothing and
        called no effect makes no checkpoint and returns the run's head as it
        was (None for a new run). One that called an effect always makes a
        checkpoint, so the next step meets new effect positions.

        Raises:
            ConflictError: a concurrent commit changed what this one read or
                wrote; nothing was applied, the store is fine.
            DiskFullError: not acknowledged, nothing applied; commit again later.
            DurabilityError: the store stopped accepting commits; reopen it.
            TransactionClosedError: already committed or rolled back.
            KeyboardInterrupt: Ctrl-C, held until a local commit has ended; ``state``
                says whether it landed (``"committed"``, ``checkpoint`` set).
        """
        self._check()
        try:
            self.checkpoint = self._store.commit(self._view, self._change())
        except BaseException as exc:
            landed = getattr(exc, "agentwal_checkpoint", None)
            if isinstance(exc, KeyboardInterrupt) and landed is not None:
                self.checkpoint = landed  # Ctrl-C, held until the commit had landed
                self._finish("committed")
                raise
            if not isinstance(exc, _NOT_APPLIED):
                self._blobs_in_doubt = True  # the log may hold the commit: keep its blobs
            self._finish("rolled_back")
            if isinstance(exc, ConflictError) and self._effect_names_made and not exc.effects:
                raise ConflictError(exc.run, exc.key, deleted=exc.deleted,
                                    reason=_conflict_reason(exc),
                                    effects=tuple(self._effect_names_made)) from None
            raise
        self._finish("committed")
        for key, (made, handout, tail) in self._grown.items():
            entry = self._appends.get(key)
            if entry is not None and entry[1] is made and self._writes.get(key) is made:
                _LISTS.grown(self.run, key, made, handout, tail)
        return self.checkpoint

    def rollback(self) -> None:
        """Discard every change; the transaction is finished. Nothing was written."""
        self._check()
        self._finish("rolled_back")

    def _change(self) -> Change:
        """What committing now applies, as the backend seam's value object (copies)."""
        writes = dict(self._writes)
        appends = {k: entry for k, (entry, made) in self._appends.items()
                   if writes.get(k) is made}
        for k, v in writes.items():
            if type(v) is Joined and k not in appends:  # not logged as an entry: whole
                writes[k] = v.whole()
        return Change(run=self.run, writes=writes, reads=frozenset(self._reads),
                      prefixes=frozenset(self._prefixes), meta=dict(self._meta),
                      deferred=tuple(self._deferred), effects=tuple(self._effect_keys),
                      origin=self._origin, appends=appends)

    def _finish(self, state: str) -> None:
        self._state = state
        self._store.end(self._view)
        if self._blob_pins and not self._blobs_in_doubt:
            self._hooks.txn_unpin(self._blob_pins)
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
                self._store.abandon(self._view)
                if self._blob_pins:
                    self._hooks.txn_abandon_pins(self._blob_pins)

    # -- reading -------------------------------------------------------------------

    def _raw(self, key: str) -> bytes | None:
        if key in self._writes:
            mine = self._writes[key]
            return mine.whole() if type(mine) is Joined else mine  # type: ignore[return-value]
        self._reads.add(key)
        return self._store.read(self._view, key)

    def _decode(self, raw: bytes, key: str) -> Any:
        return _DECODED.decode(self.run, key, raw, self._hooks.path, "value of ")

    def _handed(self, key: str) -> Any:
        """The decoded value of ``key`` (``_MISSING`` if absent); a stored list of
        ``_HANDOUT_MIN`` bytes or more is noted as handed out (``handout.py``), and
        comes from ``_LISTS`` when it holds that stored value (a copy, never decoded)."""
        if key in self._writes:
            raw = self._raw(key)
            return _MISSING if raw is None else self._decode(raw, key)
        self._reads.add(key)
        stored = self._store.read_value(self._view, key)
        if stored is None:
            return _MISSING
        if len(stored) < _HANDOUT_MIN:
            return self._decode(stored if type(stored) is bytes else whole(stored),  # type: ignore[arg-type]
                                key)
        handout = _LISTS.handout(self.run, key, stored)
        if handout is not None:
            value: Any = handout.value()
        else:
            value = self._decode(whole(stored), key)  # type: ignore[arg-type]
            if type(value) is not list:
                return value
            handout = _LISTS.keep(self.run, key, stored, value)
        if handout is not None:
            self._handouts[key] = handout
        return value

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` as this transaction sees it, or ``default``.

        Raises:
            InvalidKeyError: ``key`` is not a valid key.
            CorruptionError: the stored value is damaged.
        """
        self._check()
        value = self._handed(check_key(key))
        return default if value is _MISSING else value

    def __getitem__(self, key: str) -> Any:
        self._check()
        value = self._handed(check_key(key))
        if value is _MISSING:
            raise MissingKeyError(self.run, key)
        return value

    def __contains__(self, key: object) -> bool:
        self._check()
        if not isinstance(key, str):
            return False  # like a dict: a key that cannot exist is not in it
        check_key(key)
        if key in self._writes:
            return self._writes[key] is not None
        self._reads.add(key)
        return self._store.read_value(self._view, key) is not None  # never joins a list

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
        stored = self._store.scan(self._view, prefix)
        mine = {key: whole(raw) for key, raw in self._writes.items() if key.startswith(prefix)}
        present = [(key, raw) for key in sorted(stored.keys() | mine.keys())
                   if (raw := mine[key] if key in mine else stored[key]) is not None]
        return ((key, self._decode(raw, key)) for key, raw in present)

    def prefetch(self, *prefixes: str, keys: Iterable[str] = ()) -> None:
        """A hint that this transaction will read many keys under ``prefixes``, or ``keys``.

        A backend with a round trip per read (PostgreSQL) fetches every key
        under the prefixes now (one round trip per prefix) and the ``keys``
        (one for all of them), and serves the later ``get``/``in``/``items``
        of those keys from memory; the local engine ignores it. It reads
        nothing by itself: only the reads that follow count for the commit rule.

        Raises:
            TransactionClosedError: the transaction is finished.
            TypeError: a prefix or key is not a str. InvalidKeyError: a bad key.
        """
        self._check()
        if not all(isinstance(p, str) for p in prefixes):
            raise TypeError("prefixes must be str")
        wanted = tuple(check_key(k) for k in keys if k not in self._writes)
        fetch = getattr(self._store, "prefetch", None)
        if fetch is not None:
            fetch(self._view, tuple(prefixes), wanted)

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
        check_key(key)
        handout = self._handouts.get(key) if type(value) is list else None
        if handout is not None and handout.grown_from(value):
            # The first items are the stored ones, untouched: only the rest is new.
            tail = encode_value(key, value[handout.count:])
            joined = Joined.of(handout.stored, tail)
            if joined is not None:
                self._appends[key] = ((handout.count, len(handout.stored), tail), joined)
                self._writes[key] = joined
                self._grown[key] = (joined, handout, tail)
                return
        self._writes[key] = encode_value(key, value)

    def __setitem__(self, key: str, value: Any) -> None:
        self.put(key, value)

    def append(self, key: str, *items: Any) -> int:
        """Add ``items`` at the end of the list under ``key`` (a new list if it is absent).

        The cheap way to grow a list (a conversation's ``messages``): the
        stored list is neither decoded nor encoded again; only ``items`` are
        checked and encoded, and joined to its bytes. The result reads back
        exactly as ``put(key, old + list(items))`` would. It reads the key
        (a concurrent write of it conflicts, as with ``get`` then ``put``).

        Returns:
            The list's length after the append (read from its header, not decoded).

        Raises:
            InvalidKeyError: bad key. UnencodableValueError: an item cannot be
            stored. NotAListError: the key holds something else. Either way
            nothing changes. CorruptionError: the stored list is damaged.

        Example::

            txn.append("messages", {"role": "user", "content": "hi"})
        """
        self._check()
        check_key(key)
        tail = encode_value(key, list(items))
        # The stored list (or an earlier append of this transaction) is extended as
        # it is: an append's value stays a Joined, never joined here.
        if key in self._writes:
            stored = self._writes[key]
        else:
            self._reads.add(key)
            stored = self._store.read_value(self._view, key)
        if stored is None:
            self._writes[key] = tail
            return len(items)
        joined = Joined.of(stored, tail)
        if joined is None:
            raise NotAListError(self.run, key,
                                type(self._decode(whole(stored) or b"", key)).__name__)
        noted = self._note_append(key, stored, tail, joined)
        self._writes[key] = joined if noted else joined.whole()
        return joined.count

    def _note_append(self, key: str, stored: Value, tail: bytes, joined: Joined) -> bool:
        """Note that ``joined`` (``stored`` + ``tail``'s items) is an append, to log as one.

        An append to what the view holds is an entry over that value; one to
        an earlier append of this transaction extends that entry's tail; one
        to a value this transaction put is a whole value. Returns whether it
        is logged as an entry (else the caller stores ``joined`` joined).
        """
        before = self._appends.get(key)
        if before is not None and self._writes.get(key) is before[1]:
            (count, length, first), _made = before
            more = append_encoded(first, tail)
            if more is not None:
                self._appends[key] = ((count, length, more), joined)
                return True
            return False
        if key in self._writes:
            return False
        base = ((stored.count, len(stored)) if type(stored) is Joined
                else append_base(stored))  # type: ignore[arg-type]
        if base is not None:
            self._appends[key] = ((base[0], base[1], tail), joined)
            return True
        return False

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if it is absent)."""
        self._check()
        self._writes[check_key(key)] = None

    def put_blob(self, key: str, source: Any, *, media_type: str | None = None) -> BlobRef:
        """Stream a large artifact into the store and set ``key`` to its :class:`BlobRef`.

        ``source`` is read in 1 MiB pieces, written to a file under
        ``<store>/blobs/`` and hashed (SHA-256) as it goes, never held in
        memory whole. The file is durable under its hash before this returns;
        the key's new value, the small reference, then commits with the
        transaction like any other write (a rollback leaves only an
        unreferenced file, which a sweep removes). Content already in the
        store is kept once. ``get(key)`` returns the BlobRef;
        ``store.open_blob(run, key)`` reads the content.

        Args:
            key: the key.
            source: a file path (str or os.PathLike); a binary stream (anything
                whose ``read(n)`` returns bytes: a file opened ``'rb'``,
                ``io.BytesIO``...), read from its position to its end and not
                closed; or a BlobRef of a blob in this store (nothing is copied).
            media_type: recorded in the reference (``"image/png"``); for a
                BlobRef source, None keeps its own.

        Returns:
            The reference now buffered for ``key``.

        Raises:
            InvalidKeyError: a bad key. ValueError: a bad ``media_type``.
            TypeError: ``source`` is none of the kinds above.
            BlobSourceError: the source cannot be read (a missing file, a
                stream that raised or returned str, a BlobRef of no blob here).
            DiskFullError: no room; nothing was stored.
            DurabilityError: a write or fsync failed; the store accepts no
                more commits.
            ReadOnlyError, TransactionClosedError.
            Whatever is raised, ``key`` keeps its value in this transaction
            and the transaction stays usable (except after DurabilityError).

        Example::

            with store.begin("train") as txn:
                txn.put_blob("weights", "model.safetensors")
                txn["epoch"] = 3
            with store.open_blob("train", "weights") as f:
                header = f.read(8)
        """
        self._check()
        check_key(key)
        if media_type is not None:
            check_media_type(media_type)
        if TREE_MEDIA_TYPE in (media_type, getattr(source, "media_type", None)):
            raise ValueError(f"media_type {TREE_MEDIA_TYPE!r} is reserved for trees; store a "
                             "directory with put_tree")
        ref = self._hooks.txn_put_blob(source, media_type)
        self._blob_pins.append(ref.sha256)
        self._writes[key] = encode_blob_ref(ref)
        return ref

    def put_tree(self, key: str, path: str | os.PathLike[str] | TreeRef, *,
                 exclude: Any = None, rehash: bool = False, subdir: str | None = None
                 ) -> TreeRef:
        """Snapshot the directory tree at ``path`` and set ``key`` to its :class:`TreeRef`.

        Regular files (with their permission bits), symbolic links (as
        links) and directories, empty ones too, are stored through the blob
        store: each file's content once, each directory as a small
        content-addressed object, so an unchanged file or subdirectory adds
        nothing. A file whose size, mtime, ctime and inode match the store's
        stat cache is not read again, and a directory whose entries all match
        it is not looked into (``rehash=True`` reads and hashes every file).
        A file that changes while it is read is
        read again (:class:`~agentwal.errors.TreeSourceError` after three
        tries). Everything is durable when this returns; the reference
        commits with the transaction. The store's own directory, if inside
        ``path``, is skipped. Sockets, FIFOs and devices are skipped.

        ``path`` may also be a :class:`TreeRef` of this store (from ``get``,
        any run or checkpoint): the same tree is put under ``key`` without
        reading any file, or with ``subdir`` its directory at that path, as a
        tree of its own (it keeps the gitignore flag; the source's exclude
        patterns, relative to its top, are dropped).

        Args:
            key: the key.
            path: the directory, or a TreeRef of this store.
            exclude: gitignore-style patterns (a str or a list of them),
                relative to ``path``; :data:`agentwal.GITIGNORE` (alone or in
                the list) also honours the ``.gitignore`` files in the tree
                and skips ``.git``. A restore leaves the same paths alone.
                Not with a TreeRef.
            rehash: ignore the stat cache: read and hash every file (for a
                change its size, mtime, ctime, inode and mode cannot show,
                docs/workspace.md "Limits"); the cache is then rebuilt.
            subdir: with a TreeRef, a ``/``-separated path of one of its
                directories.

        Returns:
            The reference now buffered for ``key``.

        Raises:
            InvalidKeyError: a bad key. TypeError: a bad ``exclude``, or
                ``exclude`` with a TreeRef, or ``subdir`` without one.
            TreeSourceError: ``path`` is not a directory, or a file cannot be
                read or kept changing; a TreeRef this store does not hold (or
                whose files were swept); nothing is committed.
            TreePathError: ``subdir`` is not a directory of the TreeRef's tree.
            DiskFullError, DurabilityError, ReadOnlyError, TransactionClosedError:
                as for :meth:`put_blob`.
            Whatever is raised, ``key`` keeps its value and the transaction
            stays usable (except after DurabilityError).

        Example::

            with store.begin("agent") as txn:
                txn.put_tree("workspace", "repo/", exclude=agentwal.GITIGNORE)
        """
        self._check()
        check_key(key)
        # The key's value now (committed, or put earlier in this transaction): files of
        # that tree need no pin (a commit that replaced it would make this one conflict).
        ref, pins = self._hooks.txn_put_tree(path, exclude, self._raw(key), rehash, subdir)
        self._blob_pins.extend(pins)
        self._writes[key] = encode_blob_ref(ref)
        return TreeRef(ref.sha256, ref.size)

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
        sp = Savepoint(len(self._savepoints), dict(self._writes), dict(self._meta),
                       len(self._deferred), dict(self._appends))
        self._savepoints.append(sp)
        return sp

    def rollback_to(self, sp: Savepoint) -> None:
        """Undo changes made after ``sp``; ``sp`` stays usable, later savepoints do not.

        Raises:
            ValueError: ``sp`` is not a live savepoint of this transaction.
        """
        self._check()
        if not isinstance(sp, Savepoint):
            raise ValueError(f"rollback_to takes a Savepoint from txn.savepoint(), not {sp!r}; "
                             "to go back to a checkpoint, use store.rollback_to(run, id)")
        if sp._depth >= len(self._savepoints) or self._savepoints[sp._depth] is not sp:
            raise ValueError("savepoint is not live in this transaction (released or foreign)")
        del self._savepoints[sp._depth + 1 :]
        self._writes = dict(sp._writes)
        self._appends = dict(sp._appends)
        self._meta = dict(sp._meta)
        del self._deferred[sp._deferred :]

    def __repr__(self) -> str:
        return f"<agentwal.Transaction run={self.run!r} {self._state} writes={len(self._writes)}>"

    # -- asyncio ---------------------------------------------------------------------

    async def acommit(self) -> Checkpoint | None:
        """:meth:`commit` for asyncio code: validation, write and fsync run off the loop.

        The whole commit runs in the loop's default executor; concurrent
        ``acommit`` calls share fsyncs (group commit) like threads do. A
        cancellation of the awaiting task takes effect once the commit has
        finished one way or the other: ``state`` and ``checkpoint`` then say
        which.

        Raises:
            What :meth:`commit` raises, and ``asyncio.CancelledError``.
        """
        self._check()
        return await self._lent(self.commit)

    async def aput_blob(self, key: str, source: Any, *, media_type: str | None = None
                        ) -> BlobRef:
        """:meth:`put_blob` for asyncio code: the blob's write and fsync run off the loop.

        Same arguments, result and errors as :meth:`put_blob`.
        """
        self._check()
        return await self._lent(self.put_blob, key, source, media_type=media_type)

    async def aput_tree(self, key: str, path: str | os.PathLike[str], *, exclude: Any = None
                        ) -> TreeRef:
        """:meth:`put_tree` for asyncio code: reading and storing the tree run off the loop.

        Same arguments, result and errors as :meth:`put_tree`.
        """
        self._check()
        return await self._lent(self.put_tree, key, path, exclude=exclude)

    async def __aenter__(self) -> Transaction:
        return self.__enter__()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        """Like ``__exit__``, committing with :meth:`acommit` (``async with txn:``)."""
        if self._state != "active":
            return
        if et is None:
            await self.acommit()
        else:
            self.rollback()


def _conflict_reason(exc: ConflictError) -> str | None:
    """``exc``'s own message without its run prefix, to re-raise it with more said."""
    if exc.deleted:
        return None
    text = str(exc)
    prefix = f"run {exc.run!r}: "
    return text[len(prefix):] if text.startswith(prefix) else text


class Begin:
    """A transaction begun for asyncio code (``store.abegin``).

    ``async with store.abegin(run) as txn:`` commits with ``await
    txn.acommit()`` on a clean exit and rolls back on an exception;
    ``txn = await store.abegin(run)`` gives the transaction itself (which
    ``async with txn:`` finishes the same way).
    """

    __slots__ = ("_txn",)

    def __init__(self, txn: Transaction) -> None:
        self._txn = txn

    def __await__(self) -> Generator[Any, None, Transaction]:
        return self._ready().__await__()

    async def _ready(self) -> Transaction:
        return self._txn

    async def __aenter__(self) -> Transaction:
        return await self._txn.__aenter__()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._txn.__aexit__(et, ev, tb)
