"""Reading a damaged ``data.mdb`` by hand: every record it still holds, for salvage.

Theory of operation: LMDB keeps no checksums, and its C code trusts its
pages: walking a damaged tree through it may return another page's records,
or crash the process. Salvage therefore never lets LMDB read a damaged file;
this module parses the file's pages itself (plain reads, no ``lmdb``),
bounds-checking every offset, and returns the records of each named
database that pass every check:

- the newest meta page that parses (magic, version, roots inside the file)
  is the tree to read; the other meta is an older fold and is never mixed in;
- a page is read only if it lies inside the file and the meta's last page,
  names itself in its header, is a branch, leaf or overflow page as its
  parent expects, and is not listed in LMDB's free database;
- a page reached twice (from two parents, or from two databases) is
  dropped from both: one of the two pointers is damaged, and which is not
  known, so neither is believed (the first pass only counts reaches);
- a record's key must lie within the range its parent branch gives that
  child, so a pointer to a stale or foreign page is refused;
- last, every value must pass its seal (the CRC-32 over key and value,
  ``layout.unseal``), so a flipped byte in a key or value drops that record.

What is dropped is counted per database against the entry count LMDB keeps
for it (``md_entries``), and described in :attr:`Rescued.problems`. What is
kept is a subset of the records of the newest fold, each as it was written.
A pointer damaged to name a free page that the free database no longer
lists (the free database itself damaged) could still pass; the engine's own
checks on what is read (run digests, consecutive ids, the hash chain of the
salvaged history) remain behind this.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from .layout import DB_NAMES, unseal

__all__ = ["Rescued", "rescue"]

_MAGIC, _VERSION = 0xBEEFC0DE, 1
_P_BRANCH, _P_LEAF, _P_OVERFLOW = 0x01, 0x02, 0x04
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_P_INVALID = (1 << 64) - 1
_HDR = 16  # page header: pgno u64, pad u16, flags u16, lower/upper u16 (or pages u32)
_MAX_DEPTH = 64


@dataclass
class Rescued:
    """What :func:`rescue` read from one ``data.mdb``.

    Attributes:
        records: ``{database: [(key, sealed value), ...]}`` of the records
            that passed every check, in key order.
        expected: ``{database: entries}`` as LMDB's tree records them (None:
            the database's own record is lost).
        problems: each damage found, in words.
        readable: False if no tree could be read at all (a missing, empty or
            headless file): then ``records`` is empty.
    """

    records: dict[str, list[tuple[bytes, bytes]]] = field(default_factory=dict)
    expected: dict[str, int | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    readable: bool = True

    def dropped(self, db: str) -> int | None:
        """Records of ``db`` LMDB counted but this read could not keep (None: unknown)."""
        want = self.expected.get(db)
        return None if want is None else max(0, want - len(self.records.get(db, [])))


def rescue(path: str) -> Rescued:
    """Every checked record of the LMDB file at ``path`` (never raises for damage)."""
    out = Rescued()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                out.readable = False
                out.problems.append(f"{path} is empty")
                return out
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                _Walk(bytes(data) if size < (64 << 20) else data, path, out).run()
    except FileNotFoundError:
        out.readable = False
        out.problems.append(f"{path} is missing")
    except OSError as exc:
        out.readable = False
        out.problems.append(f"{path} cannot be read: {exc.strerror}")
    return out


def _count(r: Rescued) -> int:
    return sum(len(rows) for rows in r.records.values())


def _applied(r: Rescued) -> int:
    """The applied LSN a tree's sealed meta records (-1: lost)."""
    for k, v in r.records.get("meta", []):
        if k == b"applied_lsn":
            data = unseal(k, v)
            if data is not None and len(data) == 8:
                return int(struct.unpack(">Q", data)[0])
    return -1


class _Walk:
    def __init__(self, data: bytes | mmap.mmap, path: str, out: Rescued) -> None:
        self.data = data
        self.path = path
        self.out = out
        self.psize = 0
        self.last = 0
        self.free: set[int] = set()
        self.reach: dict[int, int] = {}
        self.counting = True
        self.problems: list[str] = out.problems

    def u16(self, off: int) -> int:
        return int(struct.unpack_from("<H", self.data, off)[0])

    def u32(self, off: int) -> int:
        return int(struct.unpack_from("<I", self.data, off)[0])

    def u64(self, off: int) -> int:
        return int(struct.unpack_from("<Q", self.data, off)[0])

    # -- meta ---------------------------------------------------------------------------

    def _page_size(self) -> int:
        """The page size a meta page gives (page 0's, else one that page 1 confirms)."""
        n = len(self.data)
        if n >= 44 and self.u32(16) == _MAGIC:
            p = self.u32(40)
            if 512 <= p <= 65536 and not p & (p - 1):
                return p
        for p in (4096, 8192, 16384, 32768, 65536, 1024, 2048, 512):
            if n >= p + 44 and self.u32(p + 16) == _MAGIC and self.u32(p + 40) == p:
                return p
        return 0

    def _metas(self) -> list[tuple[int, int, int, int]]:
        """``(txnid, free root, main root, last page)`` of each meta that parses, newest first."""
        found = []
        for m in (0, 1):
            base = m * self.psize + _HDR
            if base + 152 > len(self.data):
                continue
            if self.u32(base) != _MAGIC or self.u32(base + 4) != _VERSION:
                self.out.problems.append(f"meta page {m} is damaged")
                continue
            free, main = self.u64(base + 64), self.u64(base + 112)
            last, txnid = self.u64(base + 120), self.u64(base + 128)
            if any(r != _P_INVALID and not 2 <= r <= last for r in (free, main)) or \
                    last > (1 << 40):
                self.out.problems.append(f"meta page {m} is damaged (roots outside the file)")
                continue
            found.append((txnid, free, main, last))
        return sorted(found, reverse=True)

    def run(self) -> None:
        out = self.out
        self.psize = self._page_size()
        if not self.psize:
            out.readable = False
            out.problems.append(f"{self.path} has no readable LMDB meta page")
            return
        metas = self._metas()
        if not metas:
            out.readable = False
            out.problems.append(f"{self.path}: neither LMDB meta page is readable")
            return
        # Of LMDB's two trees (the newest fold's, and the previous one, which
        # LMDB keeps whole until the next commit): the newest, unless the
        # other's sealed meta says it covers more of the log (a flipped
        # transaction id must not make the older tree pass for the newer), or
        # the newest is damaged and the other, covering as much, holds more.
        # The two trees are never mixed: each is one consistent fold.
        trees = [(self._read(m), m[0]) for m in metas]
        if len(trees) == 2 and abs(metas[0][0] - metas[1][0]) != 1:
            out.problems.append(f"the meta pages' transaction ids {metas[0][0]} and "
                                f"{metas[1][0]} are not consecutive: one is damaged")
        best, txn = trees[0]
        if len(trees) == 2:
            other, otxn = trees[1]
            damaged = any(best.dropped(n) != 0 for n in DB_NAMES)
            if _applied(other) > _applied(best) or (
                    damaged and _applied(other) == _applied(best)
                    and _count(other) > _count(best)):
                best, txn = other, otxn
        if txn != metas[0][0]:
            best.problems.insert(0, (
                f"the newest fold's tree is damaged: read the older fold's tree (LMDB "
                f"transaction {txn}, {_count(best)} records) instead; what the newest fold "
                "added is lost unless the log still holds it"))
        elif len(trees) == 1:
            best.problems.insert(0, (
                f"one meta page is damaged: read the other's tree (LMDB transaction {txn}), "
                "which may be the older fold's tree; what a newer fold added is lost unless "
                "the log still holds it"))
        out.records, out.expected = best.records, best.expected
        out.problems.extend(best.problems)

    def _read(self, meta: tuple[int, int, int, int]) -> Rescued:
        """Every checked record of the tree of one meta page."""
        out = Rescued()
        _txnid, free_root, main_root, self.last = meta
        self.reach, self.free, self.problems = {}, set(), out.problems
        pages = len(self.data) // self.psize
        if pages <= self.last:
            out.problems.append(f"{self.path} is truncated: {len(self.data)} bytes, its meta "
                                f"names page {self.last}")
        # Pass 1 counts how often each page is reached; pass 2 reads the records
        # of the pages reached once.
        for counting in (True, False):
            self.counting = counting
            free_recs = list(self._tree(free_root, "free"))
            if not counting:
                for _k, v in free_recs:
                    if len(v) >= 8 and len(v) % 8 == 0:
                        count = struct.unpack_from("<Q", v)[0]
                        if 8 * (count + 1) <= len(v):
                            self.free.update(struct.unpack_from(f"<{count}Q", v, 8))
            subs = []
            for k, v in self._tree(main_root, "main", subdata=True):
                name = k.decode("ascii", "replace")
                if name in DB_NAMES and len(v) == 48:
                    subs.append((name, self.u64_of(v, 40), self.u64_of(v, 32)))
            for name, root, entries in subs:
                recs = list(self._tree(root, name))
                if counting:
                    continue
                out.expected[name] = entries
                kept = [(k, v) for k, v in recs if unseal(k, v) is not None]
                if len(kept) < len(recs):
                    out.problems.append(f"database {name}: {len(recs) - len(kept)} records "
                                        "fail their checksum")
                out.records[name] = sorted(kept)
        for name in DB_NAMES:
            if name not in out.expected:
                out.expected[name] = None
                out.problems.append(f"database {name}: its root is lost with the main tree")
        for name, want in out.expected.items():
            lost = out.dropped(name)
            if want is not None and lost:
                out.problems.append(f"database {name}: {lost} of {want} records not readable")
        return out

    @staticmethod
    def u64_of(v: bytes, off: int) -> int:
        return int(struct.unpack_from("<Q", v, off)[0])

    # -- pages --------------------------------------------------------------------------

    def _usable(self, pgno: int, db: str, npages: int = 1) -> bool:
        """Count a reach (pass 1); in pass 2, True if the page may be read."""
        if pgno + npages - 1 > self.last or (pgno + npages) * self.psize > len(self.data) \
                or pgno < 2:
            if not self.counting:
                self.problems.append(f"database {db}: page {pgno} is outside the file")
            return False
        span = range(pgno, pgno + npages)
        if self.counting:
            for p in span:
                self.reach[p] = self.reach.get(p, 0) + 1
            return self.reach[pgno] == 1  # a loop or a second parent: go no further
        if any(self.reach.get(p, 0) > 1 for p in span):
            self.problems.append(f"database {db}: page {pgno} is reached twice (a damaged "
                                     "pointer): dropped")
            return False
        if db != "free" and any(p in self.free for p in span):
            self.problems.append(f"database {db}: page {pgno} is a free page (a damaged "
                                     "pointer): dropped")
            return False
        if self.u64(pgno * self.psize) != pgno:
            self.problems.append(f"database {db}: page {pgno} names another page")
            return False
        return True

    def _tree(self, root: int, db: str, *, subdata: bool = False
              ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of every leaf record of the tree at ``root`` that is in range."""
        if root == _P_INVALID:
            return
        stack: list[tuple[int, bytes | None, bytes | None, int]] = [(root, None, None, 0)]
        while stack:
            pgno, lo, hi, depth = stack.pop()
            if depth > _MAX_DEPTH or not self._usable(pgno, db):
                continue
            off = pgno * self.psize
            flags, lower, upper = self.u16(off + 10), self.u16(off + 12), self.u16(off + 14)
            n = (lower - _HDR) // 2
            if flags & (_P_BRANCH | _P_LEAF) in (0, _P_BRANCH | _P_LEAF) \
                    or lower < _HDR or lower > upper or upper > self.psize or n <= 0:
                if not self.counting:
                    self.problems.append(f"database {db}: page {pgno} is damaged")
                continue
            nodes = []
            for i in range(n):
                node = self.u16(off + _HDR + 2 * i)
                if node < upper or node + 8 > self.psize:
                    break
                a, b, nflags, ksize = struct.unpack_from("<HHHH", self.data, off + node)
                kpos = off + node + 8
                if kpos + ksize > off + self.psize:
                    break
                nodes.append((a | b << 16, nflags, bytes(self.data[kpos:kpos + ksize]),
                              kpos + ksize))
            if len(nodes) < n and not self.counting:
                self.problems.append(f"database {db}: page {pgno} has damaged nodes")
            if flags & _P_BRANCH:
                children = []
                for i, (low, nflags, key, _end) in enumerate(nodes):
                    child = low | nflags << 32
                    start = lo if i == 0 else key
                    stop = nodes[i + 1][2] if i + 1 < len(nodes) else hi
                    children.append((child, start, stop, depth + 1))
                stack.extend(reversed(children))
                continue
            for dsize, nflags, key, dpos in nodes:
                if (lo is not None and key < lo) or (hi is not None and key >= hi):
                    if not self.counting:
                        self.problems.append(f"database {db}: page {pgno} holds a key "
                                                 "outside its parent's range: dropped")
                    continue
                if nflags & _F_DUPDATA or (nflags & _F_SUBDATA and not subdata):
                    continue
                if nflags & _F_BIGDATA:
                    value = self._overflow(dpos, dsize, db) if dpos + 8 <= off + self.psize \
                        else None
                elif dpos + dsize <= off + self.psize:
                    value = bytes(self.data[dpos:dpos + dsize])
                else:
                    value = None
                if value is not None:
                    yield key, value

    def _overflow(self, dpos: int, dsize: int, db: str) -> bytes | None:
        first = self.u64(dpos)
        npages = -(-(dsize + _HDR) // self.psize)
        if not self._usable(first, db, npages):
            return None
        if self.counting:
            return None
        off = first * self.psize
        if not self.u16(off + 10) & _P_OVERFLOW or self.u32(off + 12) < npages:
            self.problems.append(f"database {db}: overflow page {first} is damaged")
            return None
        return bytes(self.data[off + _HDR:off + _HDR + dsize])
