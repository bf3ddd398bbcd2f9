"""Before an open touches anything: is the path a store, or a place a new store may go?

Theory of operation: a writer open creates the store directory when it is
missing, and a store is then made in it; so an operator's slip (a path to a
file, a typo in a parent directory, a project folder) must be refused with a
typed error that says what is there and what to do, never turned into a
store or reported as a disk problem. :func:`prepare` runs first in
``Store._open``, before the writer lock file or anything else is created.

What a directory may hold and still become a store: nothing, or only the
names a store's own creation leaves when a crash interrupts it (``LOCK``,
``CONTROL.tmp``, an empty ``wal/``, ``snapshot/``) or a store's names
(``CONTROL`` present: it is a store, damaged or not, and recovery decides).
Anything else is another program's directory.
"""

from __future__ import annotations

import os

from ..errors import CorruptionError, NotAStoreError, StoreNotFoundError
from ..format import (
    BLOBS_DIR,
    CACHE_DIR,
    CONTROL_FILE,
    SNAPSHOT_DIR,
    TMP_SUFFIX,
    WAL_DIR,
    parse_segment_name,
)
from ..io import FileSystem
from .healthfile import HEALTH_FILE
from .logmark import LOGMARK_FILE

__all__ = ["prepare", "missing_snapshot", "STORE_NAMES"]

#: Every name agentwal itself puts in a store directory.
STORE_NAMES = frozenset({
    CONTROL_FILE, CONTROL_FILE + TMP_SUFFIX, LOGMARK_FILE, LOGMARK_FILE + TMP_SUFFIX, "LOCK",
    HEALTH_FILE, HEALTH_FILE + TMP_SUFFIX, WAL_DIR, SNAPSHOT_DIR, BLOBS_DIR, CACHE_DIR,
})

_READ_ONLY = "A read-only open never creates a store: check the path, or open it writable once."


def prepare(fs: FileSystem, path: str, *, readonly: bool) -> None:
    """Refuse a path that is not a store and cannot become one; create a writer's directory.

    Raises:
        NotAStoreError: ``path`` is a file, or a directory of other files.
        StoreNotFoundError: no store at ``path`` and a read-only open; or its
            parent directory is missing.
        OSError: the directory could not be created (the caller types it).
    """
    if os.path.lexists(path) and not os.path.isdir(path):
        raise NotAStoreError(path, "is a file, not a store directory",
                             "Pass the directory of a store, or a path where a new one may be "
                             "created (a missing or empty directory).")
    if readonly:
        if not os.path.isdir(path):
            raise StoreNotFoundError(path, "no store here (the directory does not exist)",
                                     _READ_ONLY)
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise StoreNotFoundError(path, f"its parent directory {parent!r} does not exist",
                                 "Create the parent directory first (agentwal creates only the "
                                 "store's own directory), or check the path for a typo.")
    fs.mkdir(path)
    fs.fsync_dir(parent)
    names = fs.listdir(path)
    if CONTROL_FILE in names:
        return
    foreign = sorted(n for n in names if n not in STORE_NAMES)
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise NotAStoreError(path, f"is a directory that is not an agentwal store (it holds "
                             f"{shown}, and no CONTROL file)",
                             "Open a new or empty directory (agentwal makes the store there), "
                             "or the directory of an existing store; nothing was changed.")


def no_control(path: str, wal_names: list[str]) -> StoreNotFoundError | None:
    """The error of a read-only open of a directory without ``CONTROL``, unless it looks damaged.

    A directory whose ``wal/`` holds files is a store that lost its
    ``CONTROL`` (the caller raises ``CorruptionError``): None then.
    """
    if wal_names:
        return None
    return StoreNotFoundError(path, "no agentwal store here (no CONTROL file)", _READ_ONLY)


def missing_snapshot(fs: FileSystem, path: str) -> CorruptionError | None:
    """The error of an existing store whose LMDB file is gone or empty while its log no
    longer starts at the first record (the folded records are only in LMDB), else None.

    Checked before LMDB is opened, which would make a new, empty ``data.mdb``
    (and the log's gap would then be reported as a removed segment). A store
    whose log still starts at LSN 1 is rebuilt from it by recovery.
    """
    data = os.path.join(path, SNAPSHOT_DIR, "data.mdb")
    try:
        if os.path.getsize(data) > 0:
            return None
        what = "is empty"
    except FileNotFoundError:
        what = ("is missing" if os.path.isdir(os.path.join(path, SNAPSHOT_DIR))
                else f"is missing (no {SNAPSHOT_DIR}/ directory)")
    except OSError:
        return None  # unreadable: LMDB's own open says why
    wal_dir = os.path.join(path, WAL_DIR)
    firsts = [n for n in map(parse_segment_name, fs.listdir(wal_dir) if fs.exists(wal_dir)
                             else []) if n is not None]
    if not firsts or min(firsts) <= 1:
        return None
    return CorruptionError(
        data, None, f"the store's snapshot {what}, and its log starts at LSN {min(firsts)}: "
        f"records 1..{min(firsts) - 1} were folded into the snapshot and are nowhere else",
        f"Put back {SNAPSHOT_DIR}/data.mdb from a backup of this store (agentwal backup "
        "copies it); nothing was changed.")

