"""Tier ``corrupt``: a damaged copy of a store opens exactly, to a committed prefix, or refuses.

Theory of operation: a *base* store is built once per seed and variant with
the seeded :class:`~.workload.Workload` (small WAL segments, two explicit
folds part-way through), so it holds folded state in LMDB and, unless it was
closed, a WAL tail of several segments that no fold has covered yet. The
variants are ``sync``/``none`` durability crossed with ``close`` (``close()``
folds everything) and ``abandon`` (``testing.crash()`` keeps the tail). A
*case* copies a base, damages one file of the copy in one seeded way (the
kinds are in :data:`DAMAGE_KINDS`) and hands the copy to a :class:`Checker`.

The checker is a child interpreter that opens the copy, reads every run's
state and history and the run list, closes it (which repairs the log and
folds the replayed tail), opens and reads it once more, and answers one JSON
line. It serves case after case and is re-spawned only when it dies, so a
segfault, SIGBUS, abort or hang is charged to the case that caused it without
paying an interpreter start per case; a hang makes the child dump its stack
and exit before the parent's own timeout would kill it.

:func:`judge` decides, in this order:

- the child died (a signal, an exit) or hung: failure;
- an exception that is not an ``agentwal.Error`` escaped: failure;
- ``CorruptionError`` (on open, read, close or reopen): ok, the damage was seen;
  any other ``agentwal.Error``: failure (damage must be reported as corruption);
- the copy opened: the :class:`~.workload.Oracle` must find the state after
  exactly the first ``c`` commits, where ``c`` equals every commit for damage
  to LMDB or CONTROL (the WAL no longer holds what LMDB lost, so a prefix
  there is a silent loss), and ``applied <= c <= commits`` for damage to the
  WAL (a damaged tail may cost commits not yet folded, never folded ones);
  the run list must match, and the reopen must show the same state.

Damage (one file per case; which file, offset, length and bit come from the seed):

==============  ===============================================================
``wal-*``       a segment: truncate; append zeros or garbage; zero a range; flip
                a bit in the header, a frame header, a payload or the zero tail
``lmdb-*``      ``snapshot/data.mdb``: truncate (anywhere, or to 0 bytes);
                delete; append zeros or garbage; flip a bit in a meta page, a
                live B-tree page, a live overflow page or anywhere; zero a page
``control-*``   ``CONTROL``: flip a bit; truncate
==============  ===============================================================

:data:`LMDB_STRUCTURAL_KINDS` damage LMDB's own tree, which has no checksums;
the engine's own checks catch nearly all of it, but about one case in 800 still
crashes LMDB (see ``docs/guarantees.md``). The parent only copies, damages and judges;
nothing here changes the engine.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import random
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from typing import IO, Any

from .. import open as open_store
from ..errors import Error
from ..format import (
    CONTROL_FILE,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    SNAPSHOT_DIR,
    WAL_DIR,
    parse_segment_name,
)
from ..local.wal.frame import parse_header
from ..local.wal.reader import scan_segment
from .hooks import crash as crash_store
from .tiers import Result
from .workload import Oracle, Workload, drive, read_all

__all__ = [
    "CHECKED_KINDS",
    "DAMAGE_KINDS",
    "LMDB_STRUCTURAL_KINDS",
    "VARIANTS",
    "Base",
    "Checker",
    "Damage",
    "apply_damage",
    "build_base",
    "check_copy",
    "corrupt_cases",
    "judge",
    "lmdb_pages",
    "serve",
]

#: Store options of the bases: 4 KiB segments, and folds only when the harness asks.
CORRUPT_OPTIONS: dict[str, Any] = {"segment_bytes": 4096, "wal_max_bytes": 64 << 20}

#: ``durability-ending`` of the bases built for every seed.
VARIANTS = ("sync-abandon", "none-close", "sync-close", "none-abandon")

WAL_KINDS = ("wal-truncate", "wal-append-zeros", "wal-append-garbage", "wal-zero-range",
             "wal-flip-header", "wal-flip-frame-header", "wal-flip-payload",
             "wal-flip-zero-tail")
LMDB_KINDS = ("lmdb-truncate", "lmdb-empty", "lmdb-delete", "lmdb-append-zeros",
              "lmdb-append-garbage", "lmdb-flip-meta", "lmdb-flip-btree", "lmdb-flip-overflow",
              "lmdb-flip-anywhere", "lmdb-zero-page")
CONTROL_KINDS = ("control-flip", "control-truncate")
#: Every kind of damage, in the order a round of cases cycles through them.
DAMAGE_KINDS = WAL_KINDS + LMDB_KINDS + CONTROL_KINDS
#: Damage to LMDB's own structure (meta pages, B-tree pages). LMDB keeps no checksums,
#: and a per-record CRC cannot see a record that a damaged tree hides or misplaces; the
#: engine's run digests and id checks catch most of it, not all (``tests/crash/
#: test_corruption.py`` measures how often).
LMDB_STRUCTURAL_KINDS = ("lmdb-flip-meta", "lmdb-flip-btree", "lmdb-flip-anywhere",
                         "lmdb-zero-page")
#: The kinds of damage the engine is built to catch: every case must pass.
CHECKED_KINDS = tuple(k for k in DAMAGE_KINDS if k not in LMDB_STRUCTURAL_KINDS)

_OPS = 140  # operations per base: about 115 commits
_ROUND = 80  # cases per round of bases (building the four bases costs about 1.5 s)
_CHILD = "from agentwal.testing.corrupt import serve; serve()"
_DATA_MDB = os.path.join(SNAPSHOT_DIR, "data.mdb")


# -- bases ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Base:
    """A store built once and copied for every case.

    Attributes:
        path: the store directory (never damaged itself).
        seed: the workload seed it was built from.
        variant: one of :data:`VARIANTS`.
        commits: commits acknowledged when it was closed or abandoned.
        applied: commits folded into LMDB (an LSN is a commit count).
        workload: the workload that built it (its model judges the copies).
    """

    path: str
    seed: str
    variant: str
    commits: int
    applied: int
    workload: Workload


def build_base(path: str, seed: str, variant: str) -> Base:
    """Build a base store at ``path`` (replacing what is there) for one variant.

    Two folds at seeded points put most commits into LMDB; ``*-close`` then
    folds the rest, ``*-abandon`` leaves a WAL tail of several segments.
    """
    durability, ending = variant.split("-")
    rng = random.Random(f"{seed}/{variant}")
    folds = {rng.randrange(30, 60), rng.randrange(70, 100)}
    w = Workload(seed, big=0.0)
    shutil.rmtree(path, ignore_errors=True)
    store = open_store(path, durability=durability, **CORRUPT_OPTIONS)
    commits = 0
    try:
        for i in range(_OPS):
            commits += drive(store, w, i, 1)
            if i in folds:
                store.snapshot()
        applied = int(store.stats()["applied_lsn"])
    except BaseException:
        crash_store(store)
        raise
    if ending == "close":
        store.close()
        applied = commits
    else:
        crash_store(store)
    return Base(path, seed, variant, commits, applied, w)


# -- damage ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Damage:
    """What one case did to its copy.

    Attributes:
        kind: one of :data:`DAMAGE_KINDS`.
        scope: ``"wal"``, ``"lmdb"`` or ``"control"``: which rule judges the outcome.
        file: the damaged file, relative to the store.
        offset: where the damage starts.
        what: a short description (``"flip bit 3 @ 8231 in state/leaf page 2"``).
    """

    kind: str
    scope: str
    file: str
    offset: int
    what: str


def _flip(path: str, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def _overwrite(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _segments(store: str) -> list[str]:
    wal = os.path.join(store, WAL_DIR)
    return sorted(os.path.join(WAL_DIR, n) for n in os.listdir(wal)
                  if parse_segment_name(n) is not None)


def _frames(data: bytes) -> list[tuple[int, int]]:
    """``(offset, end)`` of each valid frame of a segment image."""
    header = parse_header(data)
    if isinstance(header, str):
        return []
    return [(f.offset, f.end) for f in scan_segment(data, header).frames]


def _wal_damage(store: str, kind: str, rng: random.Random) -> Damage:
    segs = _segments(store)
    rel = rng.choice(segs)
    if kind == "wal-flip-zero-tail":  # prefer a segment that has a zero tail left
        tails = [s for s in segs if _tail(_read(os.path.join(store, s))) is not None]
        rel = rng.choice(tails) if tails else rel
    path = os.path.join(store, rel)
    data = _read(path)
    frames = _frames(data)
    used = frames[-1][1] if frames else SEGMENT_HEADER_SIZE
    label = f"{os.path.basename(rel)}{' (last)' if rel == segs[-1] else ''}"
    frame = rng.choice(frames) if frames else (0, SEGMENT_HEADER_SIZE)
    if kind == "wal-truncate":
        at = rng.randrange(0, used + 64)
        _truncate(path, at)
        return Damage(kind, "wal", rel, at, f"truncate {label} to {at} of {len(data)}")
    if kind in ("wal-append-zeros", "wal-append-garbage"):
        n = rng.randint(1, 8192)
        _append(path, bytes(n) if kind == "wal-append-zeros" else rng.randbytes(n))
        return Damage(kind, "wal", rel, len(data), f"append {n} bytes to {label}")
    if kind == "wal-zero-range":
        at = rng.randrange(0, used)
        n = rng.randint(1, 512)
        _overwrite(path, at, bytes(min(n, len(data) - at)))
        return Damage(kind, "wal", rel, at, f"zero {n} bytes @ {at} of {label}")
    if kind == "wal-flip-header":
        lo, hi, where = 0, SEGMENT_HEADER_SIZE, "header"
    elif kind == "wal-flip-frame-header":
        lo, hi, where = frame[0], frame[0] + RECORD_HEADER_SIZE, f"frame header @ {frame[0]}"
    elif kind == "wal-flip-payload":
        lo, hi = frame[0] + RECORD_HEADER_SIZE, frame[1]
        where = f"payload of frame @ {frame[0]}"
    else:
        tail = _tail(data)
        lo, hi = tail if tail is not None else (len(data) - 1, len(data))
        where = "zero tail"
    at, bit = rng.randrange(lo, max(hi, lo + 1)), rng.randrange(8)
    _flip(path, at, bit)
    return Damage(kind, "wal", rel, at, f"flip bit {bit} @ {at} ({where}) of {label}")


def _tail(data: bytes) -> tuple[int, int] | None:
    frames = _frames(data)
    used = frames[-1][1] if frames else SEGMENT_HEADER_SIZE
    return (used, len(data)) if used < len(data) else None


def _lmdb_damage(store: str, kind: str, rng: random.Random) -> Damage:
    path = os.path.join(store, _DATA_MDB)
    data = _read(path)
    psize = struct.unpack_from("<I", data, 40)[0] if len(data) >= 44 else 4096
    npages = max(1, len(data) // psize)
    if kind == "lmdb-truncate":
        at = rng.randrange(0, len(data))
        _truncate(path, at)
        return Damage(kind, "lmdb", _DATA_MDB, at, f"truncate data.mdb to {at} of {len(data)}")
    if kind == "lmdb-empty":
        _truncate(path, 0)
        return Damage(kind, "lmdb", _DATA_MDB, 0, "truncate data.mdb to 0 bytes")
    if kind == "lmdb-delete":
        os.unlink(path)
        return Damage(kind, "lmdb", _DATA_MDB, 0, "delete data.mdb")
    if kind in ("lmdb-append-zeros", "lmdb-append-garbage"):
        n = rng.randint(1, 3 * psize)
        _append(path, bytes(n) if kind == "lmdb-append-zeros" else rng.randbytes(n))
        return Damage(kind, "lmdb", _DATA_MDB, len(data), f"append {n} bytes to data.mdb")
    roles = lmdb_pages(data)
    if kind == "lmdb-zero-page":
        page = rng.randrange(npages)
        _overwrite(path, page * psize, bytes(psize))
        return Damage(kind, "lmdb", _DATA_MDB, page * psize,
                      f"zero page {page} ({roles.get(page, 'unused')})")
    if kind == "lmdb-flip-meta":
        at = rng.randrange(2) * psize + rng.randrange(_META, _META + _META_SIZE)
    elif kind in ("lmdb-flip-btree", "lmdb-flip-overflow"):
        want = ("/overflow",) if kind == "lmdb-flip-overflow" else ("/branch", "/leaf")
        pages = sorted(p for p, r in roles.items() if r.endswith(want)) or [npages - 1]
        at = rng.choice(pages) * psize + rng.randrange(psize)
    else:
        at = rng.randrange(len(data))
    bit = rng.randrange(8)
    _flip(path, at, bit)
    page = at // psize
    return Damage(kind, "lmdb", _DATA_MDB, at, f"flip bit {bit} @ {at} = page {page} + "
                  f"{at % psize} ({roles.get(page, 'unused')})")


def _control_damage(store: str, kind: str, rng: random.Random) -> Damage:
    path = os.path.join(store, CONTROL_FILE)
    size = os.path.getsize(path)
    at = rng.randrange(size)
    if kind == "control-truncate":
        _truncate(path, at)
        return Damage(kind, "control", CONTROL_FILE, at, f"truncate CONTROL to {at} of {size}")
    bit = rng.randrange(8)
    _flip(path, at, bit)
    return Damage(kind, "control", CONTROL_FILE, at, f"flip bit {bit} @ {at} of CONTROL")


def apply_damage(store: str, kind: str, rng: random.Random) -> Damage:
    """Damage one file of the store copy at ``store`` in the way ``kind`` names.

    Args:
        store: a copy of a closed or abandoned store (it is changed in place).
        kind: one of :data:`DAMAGE_KINDS`.
        rng: picks the file, the offset and the bits.

    Returns:
        What was done, for the case's report and for :func:`judge`.
    """
    if kind in WAL_KINDS:
        return _wal_damage(store, kind, rng)
    if kind in LMDB_KINDS:
        return _lmdb_damage(store, kind, rng)
    if kind in CONTROL_KINDS:
        return _control_damage(store, kind, rng)
    raise ValueError(f"unknown damage kind {kind!r}; expected one of {DAMAGE_KINDS}")


# -- LMDB's page layout (read-only, to aim the damage and to name what it hit) ----------

# LMDB 0.9 on a 64-bit little-endian host. A page starts with a 16-byte header
# (pgno u64, pad u16, flags u16, lower/upper u16 or overflow page count u32), then
# u16 node offsets. Pages 0 and 1 hold an MDB_meta after that header: magic,
# version, address, mapsize, two MDB_db (48 bytes each, root pgno at +40),
# last_pg, txnid. A node is lo/hi u16 (data size, or a child pgno with flags),
# flags u16, key size u16, then the key and the data.
_META, _META_SIZE = 16, 136
_META_FREE_ROOT, _META_MAIN_ROOT, _META_TXNID = 24 + 40, 72 + 40, 128
_P_BRANCH, _P_LEAF = 0x01, 0x02
_F_BIGDATA, _F_SUBDATA = 0x01, 0x02
_P_INVALID = (1 << 64) - 1


def lmdb_pages(data: bytes) -> dict[int, str]:
    """The live pages of an LMDB file image and their roles, walked from the newest meta.

    Roles are ``"meta"`` for pages 0 and 1, else ``"<db>/branch"``,
    ``"<db>/leaf"`` or ``"<db>/overflow"``, where ``<db>`` is ``free``,
    ``main`` or a named database (``meta``, ``runs``, ``state``, ``ckpt``).
    Pages that are not reachable (free or stale) are absent. The walk
    tolerates damage: it skips what does not parse.
    """
    if len(data) < 160:
        return {}
    psize = struct.unpack_from("<I", data, 40)[0]
    if psize < 512 or psize > 65536 or len(data) < 2 * psize:
        return {}
    metas = [(struct.unpack_from("<Q", data, m * psize + _META + _META_TXNID)[0],
              m * psize + _META) for m in (0, 1)]
    meta = max(metas)[1]
    pages = {0: "meta", 1: "meta"}
    stack = [(struct.unpack_from("<Q", data, meta + _META_FREE_ROOT)[0], "free"),
             (struct.unpack_from("<Q", data, meta + _META_MAIN_ROOT)[0], "main")]
    while stack:
        pgno, db = stack.pop()
        if pgno == _P_INVALID or pgno in pages or (pgno + 1) * psize > len(data):
            continue
        stack.extend(_walk_page(data, psize, pgno, db, pages))
    return pages


def _walk_page(data: bytes, psize: int, pgno: int, db: str,
               pages: dict[int, str]) -> list[tuple[int, str]]:
    """Label one branch or leaf page; return the pages it points to."""
    off = pgno * psize
    flags, lower = struct.unpack_from("<HH", data, off + 10)
    kind = "branch" if flags & _P_BRANCH else "leaf" if flags & _P_LEAF else ""
    if not kind:
        return []
    pages[pgno] = f"{db}/{kind}"
    out = []
    for i in range(max(0, min((lower - 16) >> 1, (psize - 16) // 2))):
        node = off + struct.unpack_from("<H", data, off + 16 + 2 * i)[0]
        if node + 8 > off + psize:
            continue
        lo, hi, nflags, ksize = struct.unpack_from("<HHHH", data, node)
        if kind == "branch":
            out.append((lo | hi << 16 | nflags << 32, db))
            continue
        dpos = node + 8 + ksize
        if nflags & _F_BIGDATA and dpos + 8 <= len(data):
            first = struct.unpack_from("<Q", data, dpos)[0]
            if (first + 1) * psize <= len(data) and first not in pages:
                count = struct.unpack_from("<I", data, first * psize + 12)[0]
                for p in range(first, min(first + count, len(data) // psize)):
                    pages[p] = f"{db}/overflow"
        elif nflags & _F_SUBDATA and db == "main" and dpos + 48 <= len(data):
            name = data[node + 8 : dpos].decode("ascii", "replace")
            out.append((struct.unpack_from("<Q", data, dpos + 40)[0], name))
    return out


# -- the child: open, read, close, reopen ---------------------------------------------------


def _plain(value: Any) -> Any:
    """A JSON-safe image of a decoded value; equal values give equal images."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) and not k.startswith("$")
                                       for k in value):
        return {k: _plain(v) for k, v in value.items()}
    return {"$r": f"{type(value).__name__}: {value!r}"[:300]}


def _unplain(value: Any) -> Any:
    """The value :func:`_plain` was made from (anything it could not encode stays a dict)."""
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"$b"}:
            return base64.b64decode(value["$b"])
        return {k: _unplain(v) for k, v in value.items()}
    return value


def _attempt(path: str, runs: list[str]) -> dict[str, Any]:
    """One pass: open, read everything, close. Never raises."""
    out: dict[str, Any] = {"status": "opened"}
    stage, store = "open", None
    try:
        store = open_store(path)
        stage = "read"
        states, history = read_all(store, runs)
        out.update(states=_plain(states), runs=store.runs(),
                   history={r: [_plain([c.id, c.parent, c.lsn, c.created_at, c.meta, c.hash,
                                        c.origin]) for c in h] for r, h in history.items()})
        stage = "close"
        store.close()  # releases the store even when it raises
    except Error as exc:
        out.update(status="error", stage=stage, code=exc.code, type=type(exc).__name__,
                   message=str(exc)[:400])
    except Exception as exc:
        out.update(status="unexpected", stage=stage, type=f"{type(exc).__module__}."
                   f"{type(exc).__qualname__}", message=str(exc)[:400],
                   traceback=traceback.format_exc()[-1500:])
    finally:
        if store is not None and stage != "close":
            with contextlib.suppress(Exception):
                crash_store(store)
    return out


def check_copy(path: str, runs: list[str]) -> dict[str, Any]:
    """Open a damaged store, read it, close it, and open and read it again.

    Meant to run in a child interpreter (see :class:`Checker`). Returns
    ``{"first": pass, "second": pass}`` (``second`` only when the first pass
    opened, read and closed cleanly); a pass has ``status`` ``"opened"``
    (with ``states``, ``history``, ``runs``), ``"error"`` (an ``agentwal.Error``:
    ``code``, ``type``, ``message``, ``stage``) or ``"unexpected"``.
    """
    first = _attempt(path, runs)
    out = {"first": first}
    if first["status"] == "opened":
        out["second"] = _attempt(path, runs)
    return out


def serve() -> None:
    """The child's loop: one JSON request per line on stdin, one JSON answer per line.

    A request is ``{"path": ..., "runs": [...], "timeout": seconds}``. Stray
    output goes to stderr; a case that takes longer than ``timeout`` makes
    the child dump every thread's stack to stderr and exit with status 1.
    """
    import faulthandler

    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    for line in sys.stdin:
        req = json.loads(line)
        faulthandler.dump_traceback_later(float(req.get("timeout", 30.0)), exit=True)
        answer = check_copy(req["path"], list(req["runs"]))
        faulthandler.cancel_dump_traceback_later()
        out.write(json.dumps(answer) + "\n")
        out.flush()


class Checker:
    """A child interpreter that checks damaged copies one after another.

    The child is started on first use and again after it dies; a death or
    hang is reported as the answer of the case that caused it. Use it as a
    context manager, or call :meth:`close`.

    Example::

        with Checker(timeout=30) as checker:
            answer = checker.check(copy, ["run-0", "run-1"])
    """

    def __init__(self, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.spawned = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._err: IO[bytes] | None = None
        self._buf = b""

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.close()
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (pkg_root, os.environ.get("PYTHONPATH", "")) if p))
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the child)
        self._proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", _CHILD],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._err, env=env, bufsize=0)
        self._buf = b""
        self.spawned += 1
        return self._proc

    def check(self, path: str, runs: list[str]) -> dict[str, Any]:
        """Check one copy; returns the child's answer or ``{"status": "crash" | "hang", ...}``."""
        proc = self._proc if self._proc is not None and self._proc.poll() is None else None
        proc = proc or self._spawn()
        assert proc.stdin is not None and self._err is not None
        err_start = self._err.seek(0, os.SEEK_END)
        request = json.dumps({"path": path, "runs": runs, "timeout": self.timeout})
        with contextlib.suppress(BrokenPipeError):  # it died: the read below reports how
            proc.stdin.write(request.encode() + b"\n")
            proc.stdin.flush()
        line = self._readline(proc, time.monotonic() + self.timeout + 10)
        if line is not None:
            answer: dict[str, Any] = json.loads(line)
            return answer
        killed = proc.poll() is None  # no answer, still alive: a hang faulthandler missed
        if killed:
            proc.kill()
        rc = proc.wait()
        self._err.seek(err_start)
        stderr = self._err.read().decode("utf-8", "replace")[-3000:]
        self.close()
        if killed or "Timeout (" in stderr:
            return {"status": "hang", "returncode": rc, "stderr": stderr}
        if rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
            return {"status": "crash", "signal": name, "stderr": stderr}
        return {"status": "crash", "returncode": rc, "stderr": stderr}

    def _readline(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def close(self) -> None:
        """Stop the child (if any) and free its pipes."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._err is not None:
            self._err.close()
            self._err = None

    def __enter__(self) -> Checker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- judging --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Seen:
    """A checkpoint as the child read it: what the oracle looks at."""

    id: int
    parent: int | None


def _checkpoints(history: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {run: [_Seen(row[0], row[1]) for row in rows] for run, rows in history.items()}


def _failure(p: dict[str, Any]) -> str | None:
    """Why a pass that did not open is a failure, or None if it reported corruption."""
    status = p["status"]
    if status == "crash":
        how = p.get("signal") or f"exit status {p.get('returncode')}"
        return f"crash: the interpreter died ({how}): {_last_line(p.get('stderr', ''))}"
    if status == "hang":
        return f"hang: no answer in time: {_last_line(p.get('stderr', ''))}"
    if status == "unexpected":
        return f"escaped: {p['type']} at {p['stage']}: {p['message']}"
    if status == "error" and p["code"] != "corruption":
        return f"misreported: {p['type']} at {p['stage']}: {p['message']}"
    return None


def _difference(states: dict[str, dict[str, Any]], model: dict[str, dict[str, Any]]) -> str:
    """The first key where a recovered state and a model state disagree, in words."""
    for run in sorted(set(states) | set(model)):
        got, want = states.get(run, {}), model.get(run, {})
        for key in sorted(set(got) | set(want)):
            if key not in got:
                return f"{run}/{key} is missing"
            if key not in want:
                return f"{run}/{key} should not exist"
            if got[key] != want[key]:
                return f"{run}/{key} holds another value"
    return "the states are equal"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[:300]


def judge(base: Base, damage: Damage, answer: dict[str, Any]) -> tuple[bool, str]:
    """Judge a checker's answer for a copy of ``base`` damaged by ``damage``.

    Returns:
        ``(ok, detail)``; ``detail`` starts with the outcome (``exact``,
        ``prefix 97/115``, ``detected``) or the failure class (``crash``,
        ``hang``, ``escaped``, ``misreported``, ``lost_ack``, ``garbage`` ...).
    """
    first = answer.get("first", answer)
    why = _failure(first)
    if why is not None:
        return False, why
    if first["status"] == "error" and "states" not in first:
        return True, f"detected at {first['stage']}: {first['message'][:160]}"
    w = base.workload
    states = _unplain(first["states"])
    history = _checkpoints(first["history"])
    lo = base.applied if damage.scope == "wal" else base.commits
    verdict = Oracle(w).check(states, history, base.commits, False, durable=lo)
    if not verdict.ok:
        return False, (f"{verdict.failure}: {verdict.detail} (allowed: the state after "
                       f"{lo}..{base.commits} commits; against all {base.commits}: "
                       f"{_difference(states, w.model(base.commits))})")
    counts = w.commits_per_run(verdict.commits)
    want = sorted(r for r, n in counts.items() if n)
    if sorted(first["runs"]) != want:
        return False, f"runs: listed {first['runs']}, expected {want}"
    outcome = ("exact" if verdict.commits == base.commits
               else f"prefix {verdict.commits}/{base.commits}")
    if first["status"] == "error":  # read fine, failed to close: reported, so acceptable
        return True, f"{outcome}, then detected at close: {first['message'][:120]}"
    second = answer.get("second", {"status": "hang"})
    why = _failure(second)
    if why is not None:
        return False, f"after reopen, {why}"
    if second["status"] == "error":
        return True, f"{outcome}, detected after reopen: {second['message'][:120]}"
    if second["states"] != first["states"] or second["history"] != first["history"]:
        return False, "changed: the reopened store differs from what the first open read"
    return True, outcome


# -- the tier -----------------------------------------------------------------------------


def _round(kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (kind, variant) pairs of one round: every pair at least once, kind-major so
    that a short run sees every kind, repeated so a round has ``_ROUND`` cases or more."""
    pairs = [(kind, VARIANTS[(k + m) % len(VARIANTS)])
             for m in range(len(VARIANTS)) for k, kind in enumerate(kinds)]
    return pairs * -(-_ROUND // len(pairs))


def corrupt_cases(base: str, seed: int | str, *, count: int, deadline: float | None = None,
                  kinds: tuple[str, ...] | None = None, timeout: float = 30.0) -> Iterator[Result]:
    """Damage copies of seeded stores and judge how each opens; one :class:`Result` per case.

    Args:
        base: a directory for the bases and the copies (a subdirectory is
            made, and removed at the end unless a case failed).
        seed: everything derives from it: the bases, the order of kinds, each damage.
        count: at least this many cases.
        deadline: a ``time.monotonic()`` value: keep going (new bases, new
            seeds derived from ``seed``) until it passes.
        kinds: the damage kinds to use (default: :data:`DAMAGE_KINDS`).
        timeout: seconds one case may take before it counts as a hang.

    Each round builds one base per variant and runs every (kind, variant)
    pair, kind-major (so the first ``len(kinds)`` cases use every kind), at
    least 80 cases in all. A result's ``repro`` names the seed, the kinds and
    the case count that reach it again.

    Example::

        bad = [r.line() for r in corrupt_cases(tmp, "s1", count=64) if not r.ok]
    """
    kinds = tuple(kinds or DAMAGE_KINDS)
    for k in kinds:
        if k not in DAMAGE_KINDS:
            raise ValueError(f"unknown damage kind {k!r}")
    seed = str(seed)
    os.makedirs(base, exist_ok=True)
    work = tempfile.mkdtemp(prefix="corrupt-", dir=base)
    failed = False
    n = 0
    try:
        with Checker(timeout=timeout) as checker:
            rnd = 0
            while n < count or (deadline is not None and time.monotonic() < deadline):
                bases: dict[str, Base] = {}
                for kind, variant in _round(kinds):
                    if n >= count and (deadline is None or time.monotonic() >= deadline):
                        break
                    if variant not in bases:
                        bases[variant] = build_base(os.path.join(work, f"base{rnd}-{variant}"),
                                                    f"{seed}/{rnd}", variant)
                    ok, detail = _case(bases[variant], kind, random.Random(f"{seed}/{rnd}/{n}"),
                                       os.path.join(work, f"case{n}"), checker)
                    result = Result("corrupt", f"{variant}/{kind}/{n}", seed, ok, detail,
                                    f"agentwal torture DIR --tier corrupt --seed {seed}"
                                    f"{_kinds_arg(kinds)} --count {n + 1}")
                    failed = failed or not result.ok
                    n += 1
                    yield result
                for b in bases.values():
                    shutil.rmtree(b.path, ignore_errors=True)
                rnd += 1
    finally:
        if not failed:
            shutil.rmtree(work, ignore_errors=True)


def _kinds_arg(kinds: tuple[str, ...]) -> str:
    """The ``--kinds`` option of a repro command ("" for every kind)."""
    for name, group in (("", DAMAGE_KINDS), ("checked", CHECKED_KINDS),
                        ("structural", LMDB_STRUCTURAL_KINDS)):
        if kinds == group:
            return f" --kinds {name}" if name else ""
    return f" --kinds {','.join(kinds)}"


def _case(b: Base, kind: str, rng: random.Random, copy: str,
          checker: Checker) -> tuple[bool, str]:
    """Copy ``b``, damage the copy, check it, judge it (the copy is kept if it fails)."""
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(b.path, copy)
    damage = apply_damage(copy, kind, rng)
    answer = checker.check(copy, b.workload.runs)
    ok, detail = judge(b, damage, answer)
    if ok:
        shutil.rmtree(copy, ignore_errors=True)
    else:
        detail += f" [copy kept at {copy}]"
    return ok, f"[{damage.what}] {detail}"

