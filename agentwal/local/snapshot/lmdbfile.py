"""Sanity checks of ``data.mdb`` before it is mapped (the SIGBUS guard).

Theory of operation: touching a page past the end of a truncated memory map
kills the process with SIGBUS, so before LMDB maps ``data.mdb`` this module
reads LMDB's two meta pages itself and checks the file is as long as the
newest meta says. A file may legitimately end early when its highest pages
are "loose" (allocated and freed in one transaction, never written): those
are found in LMDB's free database, walked here by hand. Plain file reads
only; no ``lmdb``.
"""

from __future__ import annotations

import os
import struct

from ...errors import CorruptionError

__all__ = ["check_lmdb_file"]

_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_DATA_VERSION = 1


def check_lmdb_file(path: str) -> None:
    """Refuse a ``data.mdb`` that is shorter than its meta pages say (before mapping it).

    Raises:
        CorruptionError: the file is truncated or its meta pages are damaged.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(2 * 65536)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CorruptionError(path, None, f"cannot read: {exc.strerror}") from None
    if size == 0:
        return
    if len(head) < 160:
        raise CorruptionError(path, 0, f"LMDB file is {size} bytes, shorter than a meta page")
    # Page 0 holds a meta; its header is 16 bytes, then MDB_meta.
    magic, version = struct.unpack_from("<II", head, 16)
    if magic != _LMDB_MAGIC:
        raise CorruptionError(path, 16, "not an LMDB file (bad meta magic)")
    if version != _LMDB_DATA_VERSION:
        raise CorruptionError(path, 20, f"LMDB data version {version}, expected "
                              f"{_LMDB_DATA_VERSION}")
    # mm_dbs[0].md_pad holds the page size (offset 16 + 4 + 4 + 8 + 8 = 40).
    (psize,) = struct.unpack_from("<I", head, 40)
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise CorruptionError(path, 40, f"LMDB page size {psize} is not plausible")
    if size < 2 * psize or len(head) < 2 * psize:
        raise CorruptionError(path, size, "LMDB file is shorter than its two meta pages")
    best: tuple[int, int, int] | None = None
    for page in (0, 1):
        base = page * psize + 16
        m, v = struct.unpack_from("<II", head, base)
        if m != _LMDB_MAGIC or v != _LMDB_DATA_VERSION:
            raise CorruptionError(path, base, f"LMDB meta page {page} is damaged")
        last_pg, txnid = struct.unpack_from("<QQ", head, base + 120)
        if best is None or txnid > best[1]:
            best = (last_pg, txnid, struct.unpack_from("<Q", head, base + 64)[0])
    assert best is not None
    need = (best[0] + 1) * psize
    if size < need and not (size % psize == 0 and _tail_is_free(path, psize, size, best)):
        raise CorruptionError(path, size,
                              f"LMDB file is truncated: {size} bytes, its meta needs {need}")


_P_BRANCH, _P_LEAF, _F_BIGDATA = 0x01, 0x02, 0x01
_P_INVALID = (1 << 64) - 1


def _tail_is_free(path: str, psize: int, size: int, meta: tuple[int, int, int]) -> bool:
    """True if every page between the end of the file and the meta's last page is free.

    LMDB does not write a page that a transaction allocated and freed again
    (a "loose" page); when such pages are the highest ones, the file ends
    before the meta's last page. They are listed in the free database, are
    never read, and the file is sound. A truncated file instead lacks pages
    the trees still use. The free database is walked by hand from the meta's
    root (bounded; any page outside the file or not parsing means no).
    """
    tail = set(range(size // psize, meta[0] + 1))
    free: set[int] = set()
    stack = [meta[2]]
    seen = 0
    with open(path, "rb") as f:
        def page(pgno: int) -> bytes | None:
            if (pgno + 1) * psize > size:
                return None
            f.seek(pgno * psize)
            return f.read(psize)

        while stack:
            pgno = stack.pop()
            seen += 1
            if pgno == _P_INVALID or seen > 100_000:
                return pgno == _P_INVALID and tail <= free
            data = page(pgno)
            if data is None:
                return False
            flags, lower = struct.unpack_from("<HH", data, 10)
            for i in range(max(0, min((lower - 16) >> 1, (psize - 16) // 2))):
                node = struct.unpack_from("<H", data, 16 + 2 * i)[0]
                if node + 8 > psize:
                    return False
                lo, hi, nflags, ksize = struct.unpack_from("<HHHH", data, node)
                if flags & _P_BRANCH:
                    stack.append(lo | hi << 16 | nflags << 32)
                    continue
                if not flags & _P_LEAF:
                    return False
                dpos, dsize = node + 8 + ksize, lo | hi << 16
                if nflags & _F_BIGDATA:
                    first = page(struct.unpack_from("<Q", data, dpos)[0]) if dpos + 8 <= psize \
                        else None
                    if first is None:
                        return False
                    start = struct.unpack_from("<Q", data, dpos)[0] * psize + 16
                    f.seek(start)
                    ids = f.read(dsize)
                elif dpos + dsize <= psize:
                    ids = data[dpos:dpos + dsize]
                else:
                    return False
                if len(ids) < 8 or len(ids) % 8:
                    return False
                count = struct.unpack_from("<Q", ids)[0]
                if 8 * (count + 1) > len(ids):
                    return False
                free.update(struct.unpack_from(f"<{count}Q", ids, 8))
    return tail <= free
