"""The LMDB environments of this process: opening, sharing, error translation, file swap.

Theory of operation: this is the only module that imports ``lmdb``. LMDB
forbids opening one environment twice in a process (its locks are per
process), so a writer and read-only stores in the same process share one
:class:`Shared` entry per directory, counted by users and by open read
transactions. Every ``lmdb.Error`` becomes an ``agentwal`` error through
:func:`translate`; other modules of the snapshot name LMDB's exceptions
through :data:`Error` and :data:`MapFullError` only.

*Vacuum* (:meth:`Snapshot.vacuum_copy`, :func:`swap_file`): LMDB's compacting copy
(``copyfd(compact=True)``) is written to ``data.mdb.vacuum`` and fsynced;
with no read open and no other user of the environment in the process,
the environment is closed and the copy renamed over ``data.mdb`` (then the
directory fsynced) while this process holds LMDB's exclusive lock on
``lock.mdb`` (byte 0: what every process holds shared while it has the
environment open). If another process has it open (a read-only store) the
lock is refused and the old file stays: its lock table and mappings
describe the old file. Held through the reopen, the lock makes this
process LMDB's exclusive opener, which rebuilds the lock table from the new
file's meta; a process opening meanwhile waits for it. The lock's file
descriptor stays open as long as the environment (closing any descriptor
of ``lock.mdb`` drops every lock this process holds on it, LMDB's
included). A crash before the rename leaves the old file (a writer's open
removes the leftover copy); after it, the new one: both hold the same
folded state.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from dataclasses import dataclass
from typing import Any

import lmdb

from ... import failpoints
from ...errors import (
    CorruptionError,
    DiskFullError,
    DurabilityError,
    ReadOnlyError,
    StoreClosedError,
    StoreLimitError,
    TooManyReadersError,
)
from ...io import DISK_FULL_ERRNOS, OsFileSystem
from .layout import DATA, DB_KEYS, LOCK, OPTIONAL_DBS, Dbs
from .lmdbfile import check_lmdb_file

__all__ = ["Error", "MapFull", "MapFullError", "MapResizedError", "Shared", "acquire", "closed",
           "discard", "lock", "release", "swap_file", "translate", "write_records"]

#: LMDB's exception root and its map-full error, for the snapshot's other modules.
Error = lmdb.Error
MapFullError = lmdb.MapFullError
MapResizedError = lmdb.MapResizedError


class MapFull(Exception):
    """The LMDB map is full; the store grows it when no read is open, then retries."""

    def __init__(self, size: int) -> None:
        self.size = size
        super().__init__(f"LMDB map of {size} bytes is full")


def translate(exc: Exception, directory: str, what: str, *, reading: bool = False) -> Exception:
    """The agentwal error for an ``lmdb.Error`` raised on the environment in ``directory``.

    Reading goes through the memory map, where I/O cannot fail with an
    error code: any failure while reading is damage to the file.
    """
    path = os.path.join(directory, DATA)
    if isinstance(exc, lmdb.ReadonlyError):
        return ReadOnlyError(directory)
    if "closed/deleted" in str(exc):  # the store was closed under a read
        return StoreClosedError(os.path.dirname(directory))
    if isinstance(exc, lmdb.ReadersFullError):
        return TooManyReadersError(path)
    if getattr(exc, "code", None) == errno.ENOMEM or "Cannot allocate memory" in str(exc):
        return StoreLimitError(path, f"the process has no address space left to map the "
                               f"snapshot ({what}: {exc})",
                               "Close stores this process no longer uses, or open them with "
                               "a smaller map_size; check `ulimit -v`.")
    if getattr(exc, "code", None) in (errno.EMFILE, errno.ENFILE) or \
            "Too many open files" in str(exc):
        return StoreLimitError(path, f"no file descriptor left ({what}: {exc})",
                               "Close stores this process no longer uses, or raise the limit "
                               "(`ulimit -n`; each open store uses about 6).")
    if (isinstance(exc, (lmdb.MapFullError, lmdb.DiskError)) or "No space" in str(exc)
            or getattr(exc, "code", None) in DISK_FULL_ERRNOS):
        return DiskFullError(path, f"no room to write the snapshot {path!r} ({what}); "
                             "LMDB is unchanged and the WAL keeps everything. Free some "
                             "space; the next fold tries again.")
    if reading or isinstance(exc, (lmdb.CorruptedError, lmdb.InvalidError,
                                   lmdb.PageNotFoundError, lmdb.VersionMismatchError,
                                   lmdb.BadValsizeError, lmdb.NotFoundError,
                                   lmdb.BadDbiError, lmdb.BadTxnError,
                                   lmdb.IncompatibleError)):
        return CorruptionError(path, None, f"{what}: {exc}")
    return DurabilityError(path, f"{what}: {exc}")


def closed(directory: str) -> StoreClosedError:
    """The error for a use of the environment in ``directory`` after the store closed."""
    return StoreClosedError(os.path.dirname(directory))


@dataclass
class Shared:
    """One LMDB environment per directory and process, shared by every Snapshot on it."""

    key: str
    env: Any
    dbs: Dbs
    users: int = 1
    readers: int = 0  # read transactions open, across users
    #: after a vacuum: the descriptor of lock.mdb whose lock made this process LMDB's
    #: exclusive opener; closed only after the environment (it would drop LMDB's lock)
    probe: int | None = None
    #: bumped (under :data:`lock`) after every write transaction of this process ends and
    #: every swap: a value read at an older ``gen`` may be stale (``Snapshot.latest``)
    gen: int = 0


#: Guards the registry and every entry's counts (and a swap of its environment).
lock = threading.Lock()
_shared: dict[str, Shared] = {}


def acquire(directory: str, readonly: bool, map_size: int) -> Shared:
    """The process's environment on ``directory``, opened on first use (one more user)."""
    key = os.path.realpath(directory)
    with lock:
        found = _shared.get(key)
        if found is not None:
            found.users += 1
            return found
        env, dbs = _open_env(directory, readonly, map_size)
        entry = _shared[key] = Shared(key, env, dbs)
        return entry


def _open_env(directory: str, readonly: bool, map_size: int) -> tuple[Any, Dbs]:
    """Open the LMDB environment and its databases (checking their flags)."""
    # A read-only store still opens the environment for writing when it
    # can, so a writer opened later in this process can share it.
    writable = not readonly or os.access(directory, os.W_OK)
    env = lmdb.open(directory, map_size=map_size, max_dbs=16, max_readers=1024, sync=True,
                    metasync=True, writemap=False, readahead=False, meminit=False,
                    readonly=not writable, lock=True, mode=0o600, create=not readonly)
    try:
        if writable:
            env.reader_check()
        # Handles opened in their own (committed) transaction stay valid.
        try:
            dbs = Dbs(*(_open_db(env, name, readonly, writable) for name in DB_KEYS))
        except lmdb.NotFoundError:  # read-only, and a database is missing
            raise CorruptionError(
                os.path.join(directory, DATA), None,
                "the snapshot lacks a database this version of agentwal keeps (it was "
                "written by an older version)",
                "Open the store once for writing (not read-only) to add it.") from None
        with env.begin() as txn:
            for name, db in zip(DB_KEYS, dbs, strict=True):
                if db is None:
                    continue
                flags = db.flags(txn)
                if any(flags.values()):  # created plain: a set flag is a damaged record
                    raise CorruptionError(os.path.join(directory, DATA), None,
                                          f"database {name.decode()} has flags {flags}")
    except BaseException:
        env.close()
        raise
    if not readonly:
        # LMDB syncs its files but not their names: make snapshot/ and its
        # files durable before a fold can let WAL segments go.
        OsFileSystem().fsync_dir(directory)
        OsFileSystem().fsync_dir(os.path.dirname(os.path.abspath(directory)))
    return env, dbs


def _open_db(env: Any, name: bytes, readonly: bool, writable: bool) -> Any:
    """A named database's handle, created if missing (not by a read-only open, except an
    optional one when the file is writable: a writer of this process may share the handle).

    None for an optional database that a read-only open of a read-only file does not find
    (a store of an older format: it is read without it)."""
    try:
        return env.open_db(name, create=not readonly or (writable and name in OPTIONAL_DBS))
    except lmdb.NotFoundError:
        if name in OPTIONAL_DBS:
            return None
        raise


def release(entry: Shared) -> None:
    """One user fewer; the last one closes the environment."""
    with lock:
        entry.users -= 1
        if entry.users > 0:
            return
        _shared.pop(entry.key, None)
    with contextlib.suppress(lmdb.Error):
        entry.env.close()
    if entry.probe is not None:
        os.close(entry.probe)


def discard(tmp: str) -> None:
    """Remove a compacted copy that will not be used."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


def swap_file(shared: Shared, directory: str, tmp: str) -> bool:
    """Rename the compacted copy ``tmp`` over ``data.mdb`` and reopen ``shared`` on it.

    Returns False (``tmp`` removed, the old file reopened) if another process
    has the environment open.

    Raises:
        RuntimeError: the environment is in use in this process.
        DurabilityError: the rename, the directory sync or the reopen failed;
            the entry is dropped from the registry (reopen the store).
    """
    with lock:
        if shared.users != 1 or shared.readers:
            raise RuntimeError("the environment is in use: cannot swap its file")
        map_size = int(shared.env.info()["map_size"])
        data = os.path.join(directory, DATA)
        try:
            shared.env.close()  # drops this process's locks on lock.mdb
            if shared.probe is not None:
                os.close(shared.probe)
                shared.probe = None
            probe = os.open(os.path.join(directory, LOCK), os.O_RDWR)
            try:
                fcntl.lockf(probe, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError:
                os.close(probe)  # another process has it open: keep the old file
                discard(tmp)
                shared.env, shared.dbs = _open_env(directory, False, map_size)
                return False
            shared.probe = probe
            os.replace(tmp, data)
            failpoints.hit("vacuum_after_rename")
            OsFileSystem().fsync_dir(directory)
            check_lmdb_file(data)
            shared.env, shared.dbs = _open_env(directory, False, map_size)
        except (OSError, lmdb.Error, CorruptionError) as exc:
            _shared.pop(shared.key, None)
            raise DurabilityError(data, f"cannot swap in the compacted snapshot: {exc}; "
                                  "reopen the store") from None
    return True


def write_records(directory: str, records: dict[str, list[tuple[bytes, bytes]]]) -> None:
    """A new environment in ``directory`` holding exactly ``records`` (salvage's rebuilt snapshot).

    Every named database is created, empty if ``records`` has none for it;
    the records are written as they are (sealed values, in key order), in
    one synced transaction.
    """
    os.makedirs(directory, mode=0o700, exist_ok=True)
    total = sum(len(k) + len(v) for rows in records.values() for k, v in rows)
    env = lmdb.open(directory, map_size=1 << max(26, (4 * total + (16 << 20)).bit_length()),
                    max_dbs=16, sync=True, metasync=True, lock=True, mode=0o600)
    try:
        with env.begin(write=True) as txn:
            for name in DB_KEYS:
                db = env.open_db(name, txn=txn, create=True)
                for k, v in records.get(name.decode(), ()):
                    txn.put(k, v, db=db, append=False)
    except lmdb.Error as exc:
        raise translate(exc, directory, "cannot write the rebuilt snapshot") from None
    finally:
        env.close()
