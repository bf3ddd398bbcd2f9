"""What verification reports, and the plumbing every check shares.

Theory of operation: a :class:`Findings` collects problems, notes and
counts while the checks run; it turns an LMDB entry's key into words
(``'chat'/5``, ``@17``) and reports each entry at most once, so a damaged
entry is one problem, not one per reader. :func:`read_wal` and
:func:`check_control` are the only reads of files (through the I/O seam).
Nothing here raises for damage.
"""

from __future__ import annotations

import collections
import os
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from ...errors import CorruptionError
from ...format import CONTROL_FILE, SNAPSHOT_DIR, WAL_DIR, parse_segment_name
from ...io import FileSystem, read_all
from ..control import read_control
from ..logmark import LOGMARK_FILE, LogMark, mark_problems, read_mark
from ..snapshot.layout import version_parts
from ..wal.frame import parse_header
from ..wal.reader import scan_segment

__all__ = ["LMDB_FILE", "Findings", "Problem", "Source", "VerifyReport", "WalFile",
           "check_control", "check_mark", "load_mark", "read_wal"]

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
#: The snapshot's file, as problems name it.
LMDB_FILE = os.path.join(SNAPSHOT_DIR, "data.mdb")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing ``verify`` found wrong, and where.

    Attributes:
        where: the place in words: ``"snapshot/data.mdb ckpt['chat'/5]"``,
            ``"wal/00000000000000000001.wal @ 4242"``, ``"CONTROL"``.
        what: what is wrong.
        file: the file, relative to the store directory.
        db: the LMDB database (``state``, ``ckpt``, ``objects`` ...), if any.
        key: the entry's key in words (``'chat'/5``, ``@17``), if any.
        offset: the byte offset in ``file``, when known.
    """

    where: str
    what: str
    file: str
    db: str | None = None
    key: str | None = None
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What ``store.verify()`` checked and found.

    Attributes:
        ok: True when nothing is wrong (``problems`` is empty).
        problems: each damaged or inconsistent thing with its location.
        checked: how many of each thing were checked (``lmdb_entries``,
            ``checkpoints``, ``hashes``, ``objects``, ``wal_records`` ...).
        notes: things worth knowing that are not damage (a torn WAL tail
            after the last acknowledged record, a segment removed meanwhile).
    """

    ok: bool
    problems: list[Problem]
    checked: dict[str, int]
    notes: list[str] = field(default_factory=list)


class Source(Protocol):
    """The raw (sealed) entries of the snapshot's databases, as of one read transaction.

    Both methods raise ``CorruptionError`` when the database itself cannot
    be read (damaged LMDB structure).
    """

    def entries(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(key, sealed value)`` in key order, only keys starting with ``prefix``."""
        ...

    def get(self, db: str, key: bytes) -> bytes | None:
        """The sealed value stored under ``key``, or None."""
        ...


@dataclass(frozen=True, slots=True)
class WalFile:
    """A WAL segment as read for verification: its name and bytes (None: it vanished)."""

    name: str
    data: bytes | None
    error: str = ""


def read_wal(fs: FileSystem, wal_dir: str) -> list[WalFile]:
    """Every segment file in ``wal_dir`` (named like one), in LSN order, read whole.

    A segment removed between the listing and the read (a fold of another
    process) has ``data`` None; a file that cannot be read has ``error``.
    """
    if not fs.exists(wal_dir):
        return []
    names = [n for n in fs.listdir(wal_dir) if parse_segment_name(n) is not None]
    out = []
    for name in sorted(names, key=lambda n: parse_segment_name(n) or 0):
        try:
            out.append(WalFile(name, read_all(fs, os.path.join(wal_dir, name))))
        except FileNotFoundError:
            out.append(WalFile(name, None))
        except OSError as exc:
            out.append(WalFile(name, None, exc.strerror or str(exc)))
    return out


def check_control(fs: FileSystem, store: str, store_id: uuid.UUID) -> list[Problem]:
    """Problems of ``CONTROL``: damaged, unreadable, or naming another store."""
    try:
        ctl = read_control(fs, store)
    except CorruptionError as exc:
        return [Problem(CONTROL_FILE, exc.reason, CONTROL_FILE, offset=exc.offset)]
    except OSError as exc:
        return [Problem(CONTROL_FILE, f"cannot be read: {exc.strerror or exc}", CONTROL_FILE)]
    if ctl is None:
        return [Problem(CONTROL_FILE, "is missing", CONTROL_FILE)]
    if ctl.store_id != store_id:
        return [Problem(CONTROL_FILE, f"names store {ctl.store_id}; the store opened as "
                        f"{store_id}", CONTROL_FILE)]
    return []


def load_mark(fs: FileSystem, store: str, store_id: uuid.UUID
              ) -> tuple[LogMark | None, list[Problem]]:
    """``LOGMARK`` (None: there is none, or it is damaged) and its problems."""
    try:
        return read_mark(fs, store, store_id), []
    except CorruptionError as exc:
        return None, [Problem(LOGMARK_FILE, exc.reason, LOGMARK_FILE, offset=exc.offset)]
    except OSError as exc:
        return None, [Problem(LOGMARK_FILE, f"cannot be read: {exc.strerror or exc}",
                              LOGMARK_FILE)]


def check_mark(mark: LogMark | None, wal: list[WalFile], applied: int
               ) -> tuple[list[Problem], int]:
    """Problems of the log against ``mark``, and the LSN the mark says was acknowledged.

    ``mark`` must have been read before ``wal``, and ``applied`` after it.
    """
    if mark is None:
        return [], 0
    found = {}
    last = 0
    for f in wal:
        first = parse_segment_name(f.name)
        if f.data is None or first is None:
            continue
        found[first] = len(f.data)
        header = parse_header(f.data)
        if not isinstance(header, str) and header.first_lsn == first:
            last = scan_segment(f.data, header).next_lsn - 1
    where = os.path.join(WAL_DIR, "")
    return [Problem(where, what, where) for what in mark_problems(mark, found, applied, last)], \
        mark.acked


class Findings:
    """Problems, notes and counts of one verification."""

    def __init__(self, store_id: uuid.UUID) -> None:
        self.store_id = store_id
        self.problems: list[Problem] = []
        self.notes: list[str] = []
        self.checked: collections.Counter[str] = collections.Counter()
        self.run_names: dict[int, str] = {}  # run number -> run id, for key_text
        self._flagged: set[tuple[str, bytes]] = set()  # entries with a problem reported

    def report(self) -> VerifyReport:
        """The report of what was found so far."""
        return VerifyReport(not self.problems, list(self.problems),
                            dict(sorted(self.checked.items())), list(self.notes))

    def key_text(self, db: str, key: bytes) -> str:
        """An entry's key in words."""
        if db in ("ckpt", "delta", "manifest") and len(key) == 16:
            n, cid = _U64.unpack_from(key)[0], _U64.unpack_from(key, 8)[0]
            run = self.run_names.get(n)
            return f"{run!r}/{cid}" if run is not None else f"run #{n}/{cid}"
        if db == "state" and len(key) > 8:
            n = _U64.unpack_from(key)[0]
            run = self.run_names.get(n)
            k = key[8:].decode("utf-8", "replace")
            return f"{run!r}/{k!r}" if run is not None else f"run #{n}/{k!r}"
        if db == "versions":
            parts = version_parts(key)
            if parts is not None:
                n, name, cid = parts
                run = self.run_names.get(n)
                who = repr(run) if run is not None else f"run #{n}"
                what = repr(name.decode("utf-8", "replace")) if name else "block start"
                return f"{who}/{what}@{cid}"
        if db == "objects" and len(key) == 10:  # a part of a record stored in parts
            return f"@{_U64.unpack_from(key)[0]}#{int.from_bytes(key[8:], 'big')}"
        if db in ("objects", "refs") and len(key) == 8:
            return f"@{_U64.unpack(key)[0]}"
        if db == "oids":
            return key.hex()[:16]
        if db in ("meta", "runs"):
            return repr(key.decode("utf-8", "replace"))
        if db == "effects" and key[:1] == b"k":
            return f"k {key[1:].decode('utf-8', 'replace')!r}"
        if db == "effects" and key[:1] == b"q" and len(key) == 13:
            return f"q {_U64.unpack_from(key, 1)[0]}/{_U32.unpack_from(key, 9)[0]}"
        return key.hex()

    def entry_problem(self, db: str, key: bytes, what: str) -> None:
        """Report a problem with one LMDB entry (only the first for each entry)."""
        if (db, key) in self._flagged:
            return
        self._flagged.add((db, key))
        text = self.key_text(db, key)
        self.problems.append(Problem(f"{LMDB_FILE} {db}[{text}]", what, LMDB_FILE, db, text))

    def db_problem(self, db: str, what: str) -> None:
        self.problems.append(Problem(f"{LMDB_FILE} {db}", what, LMDB_FILE, db))

    def wal_problem(self, name: str, offset: int | None, what: str) -> None:
        rel = os.path.join(WAL_DIR, name)
        where = rel if offset is None else f"{rel} @ {offset}"
        self.problems.append(Problem(where, what, rel, offset=offset))
