"""The LMDB snapshot: the folded state, checkpoints and ``applied_lsn``.

Theory of operation: LMDB holds everything the WAL no longer needs to. It
is written only by the fold, and each fold is one LMDB write transaction
committed with ``sync=True`` that also stores ``applied_lsn``, the LSN of the
last record it covers. LMDB's copy-on-write B+tree and double meta page make
that commit atomic, so after any crash LMDB sits exactly at a fold boundary
and the WAL supplies every record after ``applied_lsn``.

:class:`Snapshot` owns one store's use of the environment: its lifetime,
read transactions (counted, so a map resize or a vacuum waits for them) and
the two write transactions, :meth:`Snapshot.fold` and
:meth:`Snapshot.compact`. The package is split by concern:

- ``layout``: the schema (databases, keys, sealed values, run records);
- ``lmdbfile``: the file sanity check before mapping (the SIGBUS guard);
- ``env``: the process's environments, LMDB error translation and the
  vacuum's file swap; the only module that imports ``lmdb``;
- ``reader``: every read, bound to one LMDB transaction;
- ``objects``: ``history.Objects`` over a transaction;
- ``writer``: the fold writer; ``compact``: compaction.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ... import retention
from ...effects import EffectRecord
from ...errors import CorruptionError, DiskFullError, DurabilityError, ReadOnlyError
from ...io import DISK_FULL_ERRNOS, io_error
from ...types import Progress
from . import env
from .compact import Compactor
from .env import MapFull
from .layout import DATA, DB_NAMES, VACUUM, FoldRun, RunInfo, unseal
from .lmdbfile import check_lmdb_file
from .reader import HeadLists, RawEntries, SnapshotReader, read_value
from .writer import FoldWriter

__all__ = ["DB_NAMES", "FoldRun", "MapFull", "RawEntries", "RunInfo", "Snapshot",
           "SnapshotReader", "check_lmdb_file", "unseal"]

#: The least address space a writer reserves for LMDB; a full map is doubled on demand.
MIN_MAP = 64 << 20
#: The least a read-only open reserves: it cannot grow its map while it holds a read,
#: so it keeps room for the writer's growth (address space only, never disk).
MIN_READ_MAP = 1 << 30 if sys.maxsize > 2**32 else 256 << 20


def initial_map_size(data_path: str, readonly: bool) -> int:
    """The map to open ``data_path`` with: in proportion to the file, a power of two.

    A writer reserves twice the file (at least :data:`MIN_MAP`) and doubles
    the map when a fold fills it; a read-only open reserves eight times (at
    least :data:`MIN_READ_MAP`). So thousands of stores fit in one process's
    address space, where a fixed 1 TiB each allowed about 126.
    """
    try:
        size = os.path.getsize(data_path)
    except OSError:
        size = 0
    want = max(MIN_READ_MAP if readonly else MIN_MAP, size * (8 if readonly else 2))
    return 1 << (want - 1).bit_length()
_RUN_NUMBERS = 4096  # cached run numbers of :meth:`Snapshot.latest` (cleared when full)
_LATEST = 4096  # values :meth:`Snapshot.latest` read lately (cleared when full)
_LATEST_MAX = 4096  # ... of at most this many bytes


class Snapshot:
    """The LMDB environment under ``<store>/snapshot``."""

    def __init__(self, directory: str, *, readonly: bool, map_size: int | None = None) -> None:
        self.directory = directory
        self.readonly = readonly
        #: called (raising OSError) before the first fold writes the ``layout`` marker:
        #: the store's CONTROL must say ``format.LAYOUT4_VERSION`` before it holds layout 4
        self.before_layout4: Callable[[], None] | None = None
        self._write_lock = threading.Lock()
        data = os.path.join(directory, DATA)
        if readonly and not os.path.exists(data):
            raise CorruptionError(data, None, "the snapshot is missing")
        if not readonly:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            env.discard(os.path.join(directory, VACUUM))  # a vacuum interrupted before its rename
        check_lmdb_file(data)
        if map_size is None:
            map_size = initial_map_size(data, readonly)
        try:
            shared = env.acquire(directory, readonly, map_size)
        except env.Error as exc:
            raise env.translate(exc, directory, "cannot open the snapshot") from None
        self._shared: env.Shared | None = shared
        #: run id -> (environment, LMDB commit id, run number or None), for :meth:`latest`
        self._run_numbers: dict[str, tuple[Any, int, int | None]] = {}
        #: lists rebuilt for head entries, per LMDB commit (read transactions only)
        self._lists = HeadLists()
        #: (run, key) -> (environment, its ``gen``, the value bytes or None), for :meth:`latest`
        self._latest: dict[tuple[str, str], tuple[env.Shared, int, bytes | None]] = {}
        self._bind(shared)

    def _bind(self, shared: env.Shared) -> None:
        self.env = shared.env
        self._dbs = shared.dbs
        self._lists.clear()  # commit ids name states of the environment they came from
        self._latest.clear()

    def _live(self) -> env.Shared:
        if self._shared is None:
            raise env.closed(self.directory)
        return self._shared

    # -- reading ------------------------------------------------------------------

    def begin_read(self) -> Any:
        """A read transaction: a consistent view of the last fold. End it with :meth:`end_read`."""
        with env.lock:  # not while a vacuum swaps the environment
            shared = self._live()
            try:
                txn = shared.env.begin(buffers=False)
            except env.MapResizedError:
                txn = self._adopt_map(shared)
            except env.Error as exc:
                raise env.translate(exc, self.directory, "cannot begin a read") from None
            shared.readers += 1
        return txn

    def _adopt_map(self, shared: env.Shared) -> Any:
        """Another process grew the data past this map: adopt its size (no read may be open)."""
        if shared.readers:
            raise DurabilityError(os.path.join(self.directory, DATA),
                                  "the writer grew the snapshot past the address space this "
                                  "process reserved for it, and reads are open here; finish "
                                  "them (or close and reopen this read-only store)")
        try:
            shared.env.set_mapsize(0)
            return shared.env.begin(buffers=False)
        except env.Error as exc:
            raise env.translate(exc, self.directory, "cannot begin a read") from None

    def end_read(self, txn: Any) -> None:
        """End a read transaction from :meth:`begin_read` (once)."""
        with contextlib.suppress(env.Error):
            txn.abort()
        if self._shared is not None:
            with env.lock:
                self._shared.readers -= 1

    def latest(self, run: str, key: str) -> bytes | None:
        """The folded value bytes of ``key`` in ``run`` now, in one short read transaction.

        The hot path of ``store.get``: the transaction begins and ends under
        the environment's lock, so it is never open while a vacuum swaps the
        file or the map grows (and needs no reader count). The run's number
        is cached per LMDB commit: a read transaction's id names the commit
        it sees, so an entry of another id, or of a swapped environment, is
        stale and read again.

        Small values read (sealed and checked) are kept with the environment's
        ``gen``, which this process bumps after each of its write transactions
        (only this process writes: it holds the store's writer lock) and each
        swap: while ``gen`` has not moved, LMDB holds the same bytes, and the
        read takes no LMDB transaction at all. (The caller's memtables, read
        first, hold anything a fold is moving into LMDB until that fold has
        ended and bumped ``gen``.)
        """
        slot = (run, key)
        cached = self._latest.get(slot)
        if cached is not None and cached[0] is self._shared and cached[1] == cached[0].gen:
            return cached[2]
        with env.lock:
            shared = self._live()
            gen = shared.gen
            try:
                txn = shared.env.begin(buffers=False)
            except env.Error as exc:
                raise env.translate(exc, self.directory, "cannot begin a read") from None
            try:
                tid = txn.id()
                hit = self._run_numbers.get(run)
                if hit is not None and hit[0] is shared.env and hit[1] == tid:
                    number = hit[2]
                else:
                    info = SnapshotReader(self.directory, shared.dbs, txn).run_info(run)
                    number = None if info is None else info.number
                    if len(self._run_numbers) >= _RUN_NUMBERS:
                        self._run_numbers.clear()
                    self._run_numbers[run] = (shared.env, tid, number)
                value = None if number is None else read_value(
                    self.directory, shared.dbs, txn, number, key, self._lists)
            finally:
                txn.abort()
        if value is None or len(value) <= _LATEST_MAX:
            if len(self._latest) >= _LATEST:
                self._latest.clear()
            self._latest[slot] = (shared, gen, value)
        return value

    def value_in(self, txn: Any, run_no: int, key: str) -> bytes | None:
        """``reader(txn).get(run_no, key)`` without building the reader (a view's hot read)."""
        return read_value(self.directory, self._dbs, txn, run_no, key, self._lists)

    def reader(self, txn: Any) -> SnapshotReader:
        """The reads of the snapshot as of ``txn`` (from :meth:`begin_read`)."""
        return SnapshotReader(self.directory, self._dbs, txn, self._lists)

    def raw(self, txn: Any) -> RawEntries:
        """The sealed entries of every database as of ``txn``, for ``verify``."""
        return self.reader(txn).raw()

    def forget_readers(self, n: int) -> None:
        """Drop ``n`` read transactions from the count (their owner is closing)."""
        if self._shared is not None and n:
            with env.lock:
                self._shared.readers = max(0, self._shared.readers - n)

    def readers(self) -> int:
        """Read transactions open on this environment in this process (all users)."""
        return self._live().readers

    def users(self) -> int:
        """Stores of this process sharing the environment (this one included)."""
        return self._live().users

    # -- writing ------------------------------------------------------------------

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[Compactor]:
        """One write transaction, committed (synced) on a clean exit, aborted otherwise."""
        if self.readonly:
            raise ReadOnlyError(self.directory)
        with self._write_lock:
            try:
                # The environment has sync=True and metasync=True: the commit
                # fdatasyncs the data pages, then the meta page.
                with self.env.begin(write=True) as txn:
                    yield Compactor(self.directory, self._dbs, txn)
            except env.MapFullError:
                raise MapFull(self.env.info()["map_size"]) from None
            except env.Error as exc:
                raise env.translate(exc, self.directory, what) from None
            finally:
                shared = self._shared
                if shared is not None:
                    with env.lock:  # committed, failed or aborted: values read before may be stale
                        shared.gen += 1

    def fold(self, applied_lsn: int, store_id: uuid.UUID, runs: list[FoldRun],
             log_pos: tuple[int, int] | None = None,
             effects: list[tuple[EffectRecord, bytes]] | None = None,
             expire_before: float | None = None) -> None:
        """Write a frozen memtable into LMDB in one synced transaction.

        ``effects`` are ledger entries to store (latest per key); settled
        entries last updated before ``expire_before`` are dropped.

        Raises:
            MapFull: the map is full; :meth:`grow` it (no reads open) and retry.
            DiskFullError / DurabilityError / CorruptionError: LMDB failed.
        """
        writer: FoldWriter
        with self._writing("fold failed") as writer:
            if self.before_layout4 is not None and not writer.layout_marked():
                try:  # CONTROL says so first: an older agentwal refuses, never misreads
                    self.before_layout4()
                except OSError as exc:
                    raise io_error(exc, self.directory,
                                   "cannot raise the store's format version") from None
            writer.fold(applied_lsn, store_id, runs, log_pos, effects, expire_before)

    def compact(self, runs: list[str] | None, *, keep_last: int | None, cutoff: float | None,
                keep_origins: bool, origins: set[tuple[str, int]] | None = None,
                progress: Progress | None = None) -> retention.Tally:
        """Drop old checkpoints in one synced write transaction (``retention.py`` plans it).

        Args:
            runs: the runs to compact (None: every folded run).
            keep_last: keep each run's last ``keep_last`` ids.
            cutoff: keep checkpoints created at or after this time (seconds).
            keep_origins: keep every checkpoint a fork's origin names.
            origins: more ``(run, id)`` origins to keep (forks not yet folded).
            progress: called with ``("runs", runs done, runs)`` as each run is planned.

        Returns:
            What was dropped, freed and written.

        Raises:
            MapFull: a new manifest did not fit; grow the map and call again.
            DiskFullError / DurabilityError / CorruptionError: LMDB failed or
                a record is damaged; nothing was changed.
        """
        with self._writing("compaction failed") as compactor:
            tally = compactor.compact(runs, keep_last=keep_last, cutoff=cutoff,
                                      keep_origins=keep_origins, origins=origins,
                                      progress=progress)
        return tally

    def grow(self) -> int:
        """Double the map size; only call with no read transaction open. Returns the new size."""
        shared = self._live()
        with self._write_lock, env.lock:
            if shared.readers:
                raise RuntimeError("cannot resize the LMDB map while reads are open")
            size = int(self.env.info()["map_size"]) * 2
            try:
                self.env.set_mapsize(size)
            except env.Error as exc:
                raise env.translate(exc, self.directory, "cannot grow the map") from None
            return size

    # -- vacuum ---------------------------------------------------------------------

    def vacuum_copy(self) -> str:
        """Write LMDB's compacting copy beside ``data.mdb`` and fsync it; returns its path.

        Raises:
            DiskFullError: no room for the copy (removed; nothing changed).
            DurabilityError: writing or syncing it failed (removed; nothing changed).
        """
        if self.readonly:
            raise ReadOnlyError(self.directory)
        tmp = os.path.join(self.directory, VACUUM)
        self.discard(tmp)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                self.env.copyfd(fd, compact=True)
                os.fsync(fd)
            finally:
                os.close(fd)
        except env.Error as exc:
            self.discard(tmp)
            raise env.translate(exc, self.directory, "cannot write the compacted copy") from None
        except OSError as exc:
            self.discard(tmp)
            if exc.errno in DISK_FULL_ERRNOS:
                raise DiskFullError(tmp, f"no room for the compacted copy {tmp!r}; the store "
                                    "is unchanged. Free some space and vacuum again.") from None
            raise DurabilityError(tmp, f"cannot write the compacted copy: "
                                  f"{exc.strerror or exc}") from None
        return tmp

    def discard(self, tmp: str) -> None:
        """Remove a compacted copy that will not be used."""
        env.discard(tmp)

    def swap_in(self, tmp: str) -> bool:
        """Make the compacted copy ``tmp`` the snapshot and reopen the environment on it.

        The caller holds every write out and has checked that no read
        transaction is open and no other store of this process shares the
        environment (:meth:`readers`, :meth:`users`).

        Returns:
            False (``tmp`` removed, nothing changed) if another process has
            the environment open.

        Raises:
            DurabilityError: the rename, the directory sync or the reopen failed;
                this snapshot is closed (reopen the store).
        """
        shared = self._live()
        try:
            swapped = env.swap_file(shared, self.directory, tmp)
        except DurabilityError:
            self._shared = None
            raise
        finally:
            with env.lock:
                shared.gen += 1
        self._bind(shared)
        return swapped

    # -- stats, backup, close -------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """LMDB file size and entry counts."""
        txn = self.begin_read()  # counted, so a map resize waits for it
        dbs = self._dbs
        try:
            info = self.env.info()
            st = self.env.stat()
            counts = {name: txn.stat(db)["entries"] if db is not None else 0
                      for name, db in (("folded_runs", dbs.runs), ("state_keys", dbs.state),
                                       ("checkpoints", dbs.ckpt), ("deltas", dbs.delta),
                                       ("manifests", dbs.manifest),
                                       ("versions", dbs.versions),
                                       ("objects", dbs.refs),  # one per object
                                       ("effect_index_entries", dbs.effects))}
        except env.Error as exc:
            raise env.translate(exc, self.directory, "cannot read stats", reading=True) from None
        finally:
            self.end_read(txn)
        path = os.path.join(self.directory, DATA)
        return {"lmdb_bytes": os.path.getsize(path) if os.path.exists(path) else 0,
                "lmdb_last_page": info["last_pgno"], "lmdb_page_size": st["psize"], **counts}

    def copy_to(self, directory: str) -> None:
        """Write a consistent, compacted copy of the environment as ``directory/data.mdb``.

        LMDB copies from one read transaction, so folds may run meanwhile and
        the copy is the state of one fold boundary. ``directory`` must exist
        and hold no ``data.mdb``; the caller fsyncs the copy.

        Raises:
            DiskFullError / DurabilityError: the copy could not be written.
        """
        self._live()
        try:
            self.env.copy(directory, compact=True)
        except env.Error as exc:
            raise env.translate(exc, self.directory,
                                f"cannot copy the snapshot to {directory!r}") from None

    def close(self) -> None:
        """Release the environment (idempotent); the last user closes it."""
        shared, self._shared = self._shared, None
        if shared is not None:
            env.release(shared)
