"""Process tiers: SIGKILL at chosen moments (``kill``) and a full disk (``enospc``).

Theory of operation: a *child* process (``python -m agentwal.testing.proc
SPEC``, :func:`child_main`) opens a real store directory and runs the seeded
:class:`~.workload.Workload` with :func:`~.workload.drive`. It reports on
stdout, one flushed line per event: ``READY`` once the store is open, ``ACK
i`` after ``commit()`` of op ``i`` returned, ``ERR``/``FOLDERR``/``RERR``
when the engine refused something, ``CLOSED`` at the end. The parent never
trusts a line the kill cut short: :func:`parse_report` keeps only complete,
well-formed lines, so an acknowledgement counts only if its newline arrived.

Tier ``kill`` (:func:`kill_rounds`): several rounds on one store, each one
kill of a given *kind* -- ``ack`` (SIGKILL right after the k-th
acknowledgement), ``commit`` (a failpoint armed with action ``"kill"`` on the
commit, group-commit, rotation or fold path ends the child from inside the
engine), ``random`` (SIGKILL at a random moment), ``recovery`` (a random kill,
then a second child that only opens the store dies at a ``recovery_*``
failpoint). The parent then opens the store itself and the
:class:`~.workload.Oracle` judges it: every acknowledged commit, or those plus
the one in flight. That holds in ``async`` mode too, because an acknowledged
commit has reached the OS, which a process kill does not take back. The next
round resumes the workload from :meth:`~.workload.Workload.resume_index` of
what was recovered. Kill timing depends on the scheduler, so a seed fixes
the plan of a round (kind, point, n-th hit, delay) but not the exact byte the
kill lands on.

Tier ``enospc`` (:func:`enospc_case`): the child runs under
``RLIMIT_FSIZE`` (``SIGXFSZ`` ignored, so an oversized write fails with
``EFBIG`` or comes back short) and commits until the first refusal. Each
*place* (:data:`ENOSPC_PLACES`) sizes the limit from the store's files so the
refusal lands where it names: creating the first segment or LMDB's files,
rotating to a new segment, a segment sized for one big value, a background
fold (LMDB growing past the limit, or starting right at it), the fold in
``close()``. Then the child lifts the limit and tries
again in the same process: after ``DiskFullError`` the store must take
commits again; after ``DurabilityError`` it must refuse them (a stopped
writer is never silently restarted). Finally the parent, which never had the
limit, opens the store, has the oracle judge it (nothing acknowledged lost;
nothing of a ``DiskFullError`` commit visible), commits more, closes (a fold
that must now succeed) and judges the reopened store again.

Nothing here runs at import; only :func:`child_main` changes process limits.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from .. import failpoints
from .. import open as open_store
from ..errors import DiskFullError, DurabilityError, Error
from ..store import Store
from .hooks import crash as crash_store
from .hooks import fold_error
from .tiers import Result
from .workload import Oracle, Verdict, Workload, drive, read_all

__all__ = [
    "ENOSPC_PLACES",
    "KILL_KINDS",
    "KILL_OPTIONS",
    "KILL_POINTS",
    "RECOVERY_POINTS",
    "ChildReport",
    "child_main",
    "enospc_case",
    "enospc_cases",
    "kill_cases",
    "kill_rounds",
    "parse_report",
]

KILL_KINDS = ("ack", "commit", "random", "recovery")

#: Failpoints a ``commit`` kill arms: the commit, group-commit, rotation and fold paths.
# The kill workload makes commits only; the points of other paths are never hit by it
# and have their own kill tests: effects (tests/crash/test_effects_kill.py), blobs
# (test_blob_crash.py), deletion, compaction and vacuum (test_retention_kill.py),
# trees and restores (test_tree_crash.py), the PostgreSQL backend's commit and the
# LangGraph step (tests/postgres, test_conflict_kill.py); recovery has its own rounds.
KILL_POINTS = tuple(sorted(p for p in failpoints.POINTS
                           if not p.startswith(("recovery", "delete_run", "compact", "vacuum",
                                                "blob", "tree", "restore", "pg_", "step_"))
                           and "effect" not in p))
#: Failpoints a ``recovery`` kill arms in a child that only opens the store.
RECOVERY_POINTS = tuple(sorted(p for p in failpoints.POINTS if p.startswith("recovery")))

#: Store options of the kill tier: the smallest segments and a tiny WAL, so
#: about every 20th commit rotates a segment and every 50th folds into LMDB
#: and removes old segments.
KILL_OPTIONS: dict[str, Any] = {"segment_bytes": 4 << 10, "wal_max_bytes": 8 << 10}

_FAILPOINT_EXIT = 137  # failpoints.arm(..., "kill") exits with this status
_CHILD_TIMEOUT = 60.0  # seconds; a child still running then is reported as hung
_KiB = 1 << 10


# -- the child's report --------------------------------------------------------------

# tag -> positions of the integer fields, and the field count
_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "READY": ((), 0), "ACK": ((0,), 1), "DONE": ((0,), 1), "LIFTED": ((), 0),
    "ERR": ((0,), 4), "RERR": ((0,), 4), "FOLDERR": ((), 3), "SNAP": ((), 1),
    "CLOSED": ((), 1),
}


@dataclass
class ChildReport:
    """What a child process said (complete lines only) and how it ended.

    Attributes:
        events: well-formed lines in order, split into words (``("ACK", "7")``).
        returncode: the exit status (negative: killed by that signal).
        stderr: the end of the child's standard error, for failure details.
        garbled: lines dropped because a kill cut them short or they were malformed.
    """

    events: list[tuple[str, ...]] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""
    garbled: int = 0

    def acks(self, *, after: str | None = None) -> list[int]:
        """Op indexes acknowledged, in order (only those after the first ``after`` event)."""
        seen = after is None
        out = []
        for ev in self.events:
            if ev[0] == after:
                seen = True
            elif seen and ev[0] == "ACK":
                out.append(int(ev[1]))
        return out

    def first(self, tag: str) -> tuple[str, ...] | None:
        """The first event with ``tag``, or None."""
        return next((ev for ev in self.events if ev[0] == tag), None)


def parse_report(data: bytes, returncode: int | None = None, stderr: str = "") -> ChildReport:
    """Parse a child's stdout: complete, well-formed lines only.

    A last line without its newline was cut short by the kill and is not an
    event (an ``ACK`` the parent never fully received is no acknowledgement).

    Example::

        >>> parse_report(b"READY\\nACK 0\\nACK 2\\nAC").acks()
        [0, 2]
    """
    rep = ChildReport(returncode=returncode, stderr=stderr)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        lines.pop()  # no newline: cut short
        rep.garbled += 1
    for raw in lines:
        words = tuple(raw.decode("ascii", "replace").split())
        shape = _SHAPES.get(words[0]) if words else None
        if shape is None or len(words) != shape[1] + 1 or not all(
                _is_int(words[1 + i]) for i in shape[0]):
            rep.garbled += 1
            continue
        rep.events.append(words)
    return rep


def _is_int(word: str) -> bool:
    return word.lstrip("-").isdigit()


# -- running a child -------------------------------------------------------------------


class _Child:
    """One child process: its stdout read line by line, a watchdog against hangs."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in finish()
        # The child imports the same agentwal as this process, installed or not.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentwal.testing.proc", json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._err, env=env)
        self.buf = bytearray()
        self.hung = False
        self._timer = threading.Timer(_CHILD_TIMEOUT, self._hang)
        self._timer.daemon = True
        self._timer.start()

    def _hang(self) -> None:
        self.hung = True
        self.kill()

    def wait_for(self, tag: str, n: int = 1) -> bool:
        """Read until the n-th complete line starting with ``tag``; False at end of output."""
        assert self.proc.stdout is not None
        seen = 0
        want = tag.encode()
        while True:
            line = self.proc.stdout.readline()
            self.buf += line
            if not line.endswith(b"\n"):
                return False
            if line.split(b" ")[0].strip() == want:
                seen += 1
                if seen >= n:
                    return True

    def kill(self) -> None:
        """SIGKILL the child (if it still runs)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)

    def finish(self) -> ChildReport:
        """Read the rest of its output, reap it, and parse everything it said."""
        assert self.proc.stdout is not None
        self.buf += self.proc.stdout.read()
        self.proc.stdout.close()
        rc = self.proc.wait()
        self._timer.cancel()
        self._err.seek(0)
        err = self._err.read().decode("utf-8", "replace")
        self._err.close()
        tail = " | ".join(err.strip().splitlines()[-3:])
        if self.hung:
            tail = f"hung for {_CHILD_TIMEOUT:.0f} s; {tail}"
        return parse_report(bytes(self.buf), rc, tail)


def _spec(path: str, w: Workload, durability: str, options: dict[str, Any],
          **extra: Any) -> dict[str, Any]:
    return {"path": path, "durability": durability, "options": options,
            "workload": _workload_spec(w), **extra}


class _Incompressible(Workload):
    """A workload whose large values are random bytes, so they stay large on disk."""

    def _value(self, rng: random.Random, i: int, key: str) -> Any:
        value = super()._value(rng, i, key)
        if len(value["pad"]) >= self.big_bytes:
            value["pad"] = rng.randbytes(len(value["pad"]))
        return value


def _workload_spec(w: Workload) -> dict[str, Any]:
    return {"seed": w.seed, "big": w.big, "big_bytes": w.big_bytes,
            "incompressible": isinstance(w, _Incompressible)}


def _make_workload(spec: dict[str, Any]) -> Workload:
    cls = _Incompressible if spec.get("incompressible") else Workload
    return cls(spec["seed"], big=spec["big"], big_bytes=spec["big_bytes"])


def _judge(path: str, w: Workload, acked: int, in_flight: bool, durability: str,
           options: dict[str, Any]) -> Verdict:
    """Open the store here (recovering it), read every run, and ask the oracle.

    The store is released without a fold, so the next round recovers the same log.
    """
    try:
        store = open_store(path, durability=durability, **options)
    except Error as exc:
        return Verdict(False, -1, "unrecoverable", f"recovery failed: {exc}")
    try:
        states, history = read_all(store, w.runs)
    except Error as exc:
        return Verdict(False, -1, "unrecoverable", f"reading failed: {exc}")
    finally:
        crash_store(store)
    return Oracle(w).check(states, history, acked, in_flight)


# -- tier kill ---------------------------------------------------------------------------


@dataclass
class _Plan:
    """What one kill round does."""

    kind: str
    case: str
    count: int  # ops the child may run
    acks: int = 0  # ack: kill after this many acknowledgements
    delay: float = 0.0  # random / recovery: seconds after READY
    arm: tuple[str, int] | None = None  # commit: (failpoint, n-th hit)
    recovery_point: str = ""


def _plan(rng: random.Random, kind: str, durability: str) -> _Plan:
    if kind == "ack":
        k = rng.randint(1, 30)
        return _Plan(kind, f"ack#{k}", 200, acks=k)
    if kind == "commit":
        point = rng.choice(KILL_POINTS)
        # once per fold or rotation; in async mode fsyncs come from the flusher and folds
        rare = "fold" in point or "segment" in point or (durability != "sync"
                                                        and "fsync" in point)
        nth = rng.randint(1, 2 if rare else 25)
        return _Plan(kind, f"commit@{point}#{nth}", 300, arm=(point, nth))
    delay = round(rng.uniform(0.0, 0.2), 3)
    if kind == "random":
        return _Plan(kind, f"random@{delay}s", 600, delay=delay)
    point = rng.choice(RECOVERY_POINTS)
    return _Plan(kind, f"recovery@{point}", 600, delay=delay, recovery_point=point)


def _unexpected_exit(rep: ChildReport, allowed: tuple[int, ...]) -> str:
    if rep.returncode in allowed:
        return ""
    return f"child exited with status {rep.returncode}: {rep.stderr or 'no stderr'}"


def _child_failure(rep: ChildReport, allowed: tuple[int, ...]) -> Verdict | None:
    """A verdict for a child that ended in a way no kill explains, else None."""
    problem = _unexpected_exit(rep, allowed)
    if not problem:
        return None
    refused = rep.first("ERR")
    if refused is not None and int(refused[1]) < 0:  # it could not open the store
        return Verdict(False, -1, "unrecoverable", f"{refused[2]} on open; {problem}")
    return Verdict(False, -1, "child_error", problem)


def _kill_round(path: str, w: Workload, plan: _Plan, commits: int,
                durability: str, *, ack_early: bool = False) -> tuple[Verdict, str]:
    """Run one child to its kill, then judge. Returns the verdict and a short note."""
    start = w.resume_index(commits)
    spec = _spec(path, w, durability, KILL_OPTIONS, mode="work", start=start,
                 count=plan.count, arm=plan.arm, ack_early=ack_early)
    child = _Child(spec)
    if plan.kind == "ack":
        child.wait_for("ACK", plan.acks)
        child.kill()
    elif plan.kind in ("random", "recovery"):
        if child.wait_for("READY"):
            time.sleep(plan.delay)
        child.kill()
    rep = child.finish()  # commit: runs until the failpoint ends it (or the ops run out)
    finished = rep.first("CLOSED") is not None
    failed = _child_failure(rep, (0, -signal.SIGKILL, _FAILPOINT_EXIT) if plan.arm else
                            (0, -signal.SIGKILL))
    if failed is not None:
        return failed, ""
    acks = rep.acks()
    expected = [w.commit_op(commits + j) for j in range(len(acks))]
    if acks != expected:
        return Verdict(False, -1, "harness", f"child acknowledged ops {acks[:5]}..., "
                       f"expected {expected[:5]}..."), ""
    note = f"{len(acks)} acked" + (", ran out of ops" if finished else ", killed")
    if plan.kind == "recovery":
        opener = _Child(_spec(path, w, durability, KILL_OPTIONS, mode="work", start=0, count=0,
                              arm=(plan.recovery_point, 1), open_only=True))
        orep = opener.finish()
        if orep.returncode != _FAILPOINT_EXIT:
            failed = _child_failure(orep, ()) or Verdict(False, -1, "harness", "")
            return Verdict(False, -1, failed.failure, f"recovery child did not die at "
                           f"{plan.recovery_point}: {failed.detail}"), ""
    verdict = _judge(path, w, commits + len(acks), not finished, durability, KILL_OPTIONS)
    return verdict, note


def kill_rounds(base: str, seed: str, *, durability: str = "sync", rounds: int = 8,
                kinds: tuple[str, ...] = KILL_KINDS, deadline: float | None = None,
                ack_early: bool = False) -> Iterator[Result]:
    """Kill a child running the workload, recover, judge; ``rounds`` times on one store.

    Each round's kind cycles through ``kinds`` (a seeded rotation), so every
    kind occurs once ``rounds >= len(kinds)``. Stops after the first failed
    round (the store is then no longer a known state), or at ``deadline``
    (a ``time.monotonic()`` instant). ``ack_early`` makes the child print each
    acknowledgement *before* committing: a deliberately broken engine that
    proves the tier catches a lost acknowledgement.

    Yields:
        One :class:`~.tiers.Result` per round; ``case`` is
        ``kind@detail/durability/seed/roundN``.
    """
    rng = random.Random(f"kill/{seed}/{durability}")
    w = Workload(seed)
    path = os.path.join(base, f"kill-{durability}-{seed}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    offset = rng.randrange(len(kinds))
    repro = f"agentwal torture DIR --tier kill --seed {seed} --durability {durability}"
    commits = 0
    for rnd in range(rounds):
        if deadline is not None and time.monotonic() >= deadline:
            return
        plan = _plan(rng, kinds[(rnd + offset) % len(kinds)], durability)
        case = f"{plan.case}/{durability}/{seed}/round{rnd}"
        verdict, note = _kill_round(path, w, plan, commits, durability, ack_early=ack_early)
        detail = f"{verdict}: {verdict.commits} commits ({note})" if verdict.ok else str(verdict)
        yield Result("kill", case, seed, verdict.ok, detail, repro)
        if not verdict.ok:
            return
        commits = verdict.commits


def kill_cases(base: str, seed: int | str, *, cases: int | None = 32,
               deadline: float | None = None, rounds: int = 8,
               durabilities: tuple[str, ...] = ("sync",)) -> Iterator[Result]:
    """Kill rounds on fresh stores (seeds derived from ``seed``) until a bound is reached.

    Args:
        base: directory the stores are made in (one subdirectory per store).
        seed: the stores' seeds are ``f"{seed}-{n}"``.
        cases: stop after this many results (None: no count bound).
        deadline: stop at this ``time.monotonic()`` instant (None: no time bound).
        rounds: kill/recover rounds per store.
        durabilities: each store seed runs once per mode.

    Raises:
        ValueError: neither bound given, or ``rounds`` < 1.
    """
    if cases is None and deadline is None:
        raise ValueError("kill_cases needs cases= or deadline=")
    if rounds < 1:
        raise ValueError("rounds counts from 1")
    done = 0
    n = 0
    while True:
        for durability in durabilities:
            for result in kill_rounds(base, f"{seed}-{n}", durability=durability, rounds=rounds,
                                      deadline=deadline):
                yield result
                done += 1
                if cases is not None and done >= cases:
                    return
            if deadline is not None and time.monotonic() >= deadline:
                return
        n += 1


# -- tier enospc ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Place:
    """Where a full disk should strike, and the workload that gets it there."""

    where: str  # where the refusal must land: "wal", "lmdb", or "close" (the fold in close())
    full_errno: bool  # the failing call reports EFBIG: strict mode wants DiskFullError
    fresh: bool = False  # the limit applies from store creation on
    durability: str = "sync"
    big: float = 0.01
    big_bytes: int = (1 << 20) + 4096
    incompressible: bool = False


_SETUP: dict[str, Any] = {"segment_bytes": 16 * _KiB, "wal_max_bytes": 48 * _KiB}

#: Where the enospc tier makes the disk fill up (see :func:`enospc_case`). In
#: ``fold`` and ``close-fold`` LMDB's write usually comes back short, which
#: LMDB reports as ``EIO``, so ``DurabilityError`` is right there even in
#: strict mode; in ``fold-edge`` the limit is LMDB's file size, so its first
#: new page fails whole with ``EFBIG`` (a ``DiskFullError`` once that errno is
#: mapped, after which commits must go on and a later fold succeed).
ENOSPC_PLACES: dict[str, _Place] = {
    "create-segment": _Place("wal", True, fresh=True),
    "create-lmdb": _Place("lmdb", True, fresh=True),
    "rotation": _Place("wal", True),
    "rotation-async": _Place("wal", True, durability="async"),
    "big-value": _Place("wal", True, big=0.05, big_bytes=2 << 20, incompressible=True),
    "fold": _Place("lmdb", False),
    "fold-edge": _Place("lmdb", False),
    "close-fold": _Place("close", False, big=0.5, big_bytes=12 * _KiB, incompressible=True),
}

_RETRY_OPS = 4  # ops the child retries once the limit is lifted
_MORE_OPS = 4  # ops the parent commits after the child, without a limit


def _file_sizes(path: str) -> dict[str, int]:
    out = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with contextlib.suppress(OSError):
                out[os.path.relpath(full, path)] = os.path.getsize(full)
    return out


def _round_up(n: int, unit: int = 4096) -> int:
    return -(-n // unit) * unit


def _limit_for(place: str, path: str, w: Workload) -> tuple[int, dict[str, Any], int]:
    """(file-size limit, the child's store options, max ops) for ``place``.

    Writes at or past the limit fail even inside an existing file, so the
    limit stays above every file the child may rewrite (LMDB's lock file,
    its data file, the current segment) plus a margin sized for the place.
    """
    sizes = _file_sizes(path)
    biggest = max(sizes.values(), default=0)
    data = sizes.get(os.path.join("snapshot", "data.mdb"), 0)
    if place == "create-segment":  # LMDB's files fit, the first segment does not
        return 128 * _KiB, {"segment_bytes": 256 * _KiB, "wal_max_bytes": 1 << 20}, 50
    if place == "create-lmdb":  # not even LMDB's lock file fits
        return 16 * _KiB, dict(_SETUP), 50
    if place.startswith("rotation"):  # the current segment fits, the next one not
        limit = _round_up(biggest + 64 * _KiB)
        return limit, {"segment_bytes": 2 * limit, "wal_max_bytes": 8 * limit}, 400
    if place == "big-value":  # small segments fit, one sized for a big value not
        limit = _round_up(biggest + 128 * _KiB)
        return limit, {"segment_bytes": 64 * _KiB, "wal_max_bytes": 4 << 20}, 200
    if place == "fold-edge":  # LMDB may not grow at all: its next new page starts at the limit
        limit = max(data, _round_up(_biggest_wal(sizes) + 1))
        return limit, {"segment_bytes": 16 * _KiB, "wal_max_bytes": 32 * _KiB}, 2000
    if place == "fold":  # segments fit; LMDB outgrows the limit in a background fold
        limit = _round_up(max(biggest, data + 48 * _KiB) + 1)
        return limit, {"segment_bytes": 16 * _KiB, "wal_max_bytes": 32 * _KiB}, 2000
    # close-fold: no fold while committing; the one in close() outgrows the limit
    limit = _round_up(max(biggest, data + 16 * _KiB) + 1)
    return limit, {"segment_bytes": 64 * _KiB, "wal_max_bytes": 64 << 20}, 120


def _biggest_wal(sizes: dict[str, int]) -> int:
    """The largest WAL segment among ``sizes`` (0 if none)."""
    return max((n for name, n in sizes.items() if name.startswith("wal")), default=0)


def _setup_ops(place: _Place, w: Workload) -> int:
    """Ops the parent runs before the child: 20, or half the ops before the first big value.

    So a big value first meets the disk under the limit, after a few commits
    of the child.
    """
    if place.fresh:
        return 0
    n = 0
    while n < 40 and not any(len(v["pad"]) >= w.big_bytes for v in w.op(n).puts.values()):
        n += 1
    return min(20, n // 2)


def enospc_case(base: str, seed: str, place: str, *, strict: bool = True) -> Result:
    """Fill the disk at ``place`` in a child under ``RLIMIT_FSIZE``; judge what survived.

    Checks, in order: the child refused with ``DiskFullError`` or
    ``DurabilityError`` and never crashed (no raw ``OSError``, no signal);
    the refusal happened at all (the place's limit was reached); once the
    limit is lifted in the same process, a ``DiskFullError`` store commits
    again and a ``DurabilityError`` store refuses; a new process opens the
    store with every acknowledged commit (plus a ``DurabilityError`` commit
    in flight, never a ``DiskFullError`` one), commits more, folds and
    closes, and the reopened store holds all of it.

    Args:
        place: a key of :data:`ENOSPC_PLACES`.
        strict: also require ``DiskFullError`` where the errno says the disk
            is full (``EFBIG``/``EDQUOT`` as well as ``ENOSPC``).
    """
    spec_place = ENOSPC_PLACES[place]
    wcls = _Incompressible if spec_place.incompressible else Workload
    w = wcls(seed, big=spec_place.big, big_bytes=spec_place.big_bytes)
    path = os.path.join(base, f"enospc-{place}-{seed}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    repro = f"agentwal torture DIR --tier enospc --seed {seed} --case {place}"
    durability = spec_place.durability
    n_setup = _setup_ops(spec_place, w)
    commits = 0
    if not spec_place.fresh:
        with open_store(path, durability=durability, **_SETUP) as store:
            commits = drive(store, w, 0, n_setup)
    limit, options, max_ops = _limit_for(place, path, w)
    child = _Child(_spec(path, w, durability, options, mode="fill", start=n_setup,
                         count=max_ops, fsize=limit,
                         close_under_limit=spec_place.where == "close"))
    rep = child.finish()
    ok, detail, acked, in_flight = _judge_fill(rep, w, commits, spec_place, strict)
    if ok:
        ok, detail = _after_fill(path, w, acked, in_flight, durability, options, detail)
    return Result("enospc", f"{place}/{durability}/{seed}", seed, ok,
                  f"{detail} (limit {limit // _KiB} KiB)", repro)


def _judge_fill(rep: ChildReport, w: Workload, commits: int, place: _Place,
                strict: bool) -> tuple[bool, str, int, bool]:
    """Judge the child's report: (ok, detail, acknowledged commits, one in flight)."""
    problem = _unexpected_exit(rep, (0,))
    if problem:
        return False, problem, 0, False
    err = rep.first("ERR") or rep.first("FOLDERR")
    closed = rep.first("CLOSED")
    if err is None and (closed is None or closed[1] == "ok"):
        return False, "the limit was never reached: the case tests nothing", 0, False
    if err is not None:
        cls, where = err[-3], err[-1]
    else:
        assert closed is not None
        cls, where = closed[1], "close"
    detail = f"{cls} at {where}"
    if where != place.where:
        return False, f"{detail}, not at {place.where}: the limit is mis-sized", 0, False
    if strict and place.full_errno and cls != "DiskFullError":
        return False, f"{detail}: EFBIG means no space; expected DiskFullError", 0, False
    acks = rep.acks()
    retried = rep.acks(after="LIFTED")
    rerr, snap = rep.first("RERR"), rep.first("SNAP")
    if rep.first("LIFTED") is not None:
        reopened = err is not None and err[0] == "ERR" and int(err[1]) < 0
        if (cls == "DiskFullError" or reopened) and rerr is not None:
            return False, (f"{detail}, then {rerr[2]} once space returned: the store must "
                           "take commits again"), 0, False
        if cls == "DiskFullError" and snap is not None and snap[1] != "ok":
            return False, f"{detail}, then the fold failed with {snap[1]} once space "\
                          "returned", 0, False
        if cls == "DurabilityError" and not reopened and retried:
            return False, f"{detail}, then {len(retried)} commits acknowledged: a stopped "\
                          "writer must refuse commits until reopened", 0, False
        detail += f"; {len(retried)} acked after lifting"
    in_flight = err is not None and err[0] == "ERR" and int(err[1]) >= 0 \
        and cls != "DiskFullError"
    return True, detail, commits + len(acks), in_flight


def _after_fill(path: str, w: Workload, acked: int, in_flight: bool, durability: str,
                options: dict[str, Any], detail: str) -> tuple[bool, str]:
    """Without a limit: judge, commit more, close (fold), reopen, judge again."""
    verdict = _judge(path, w, acked, in_flight, durability, options)
    if not verdict.ok:
        return False, f"{detail}; after the child: {verdict}"
    more = 0
    try:
        with open_store(path, durability=durability, **options) as store:
            more = drive(store, w, w.resume_index(verdict.commits), _MORE_OPS)
    except Error as exc:
        return False, f"{detail}; committing with space again failed: {exc}"
    again = _judge(path, w, verdict.commits + more, False, durability, options)
    if not again.ok:
        return False, f"{detail}; after committing {more} more and folding: {again}"
    return True, f"{detail}; {verdict.commits} commits kept, {more} more after"


def enospc_cases(base: str, seed: int | str, *, seeds: int = 1,
                 places: tuple[str, ...] = tuple(ENOSPC_PLACES), strict: bool = True,
                 deadline: float | None = None) -> Iterator[Result]:
    """Every place in ``places`` for ``seeds`` seeds derived from ``seed`` (``f"{seed}-{n}"``).

    Stops early at ``deadline`` (a ``time.monotonic()`` instant); ``strict``
    as in :func:`enospc_case`.
    """
    for n in range(seeds):
        for place in places:
            if deadline is not None and time.monotonic() >= deadline:
                return
            yield enospc_case(base, f"{seed}-{n}", place, strict=strict)


# -- the child ----------------------------------------------------------------------------


def _emit(*words: object) -> None:
    sys.stdout.write(" ".join(str(x) for x in words) + "\n")
    sys.stdout.flush()


def _where(exc: Error, store_path: str) -> str:
    """Which part of the store ``exc`` names: ``wal``, ``lmdb`` (the snapshot) or ``store``."""
    path = str(getattr(exc, "path", "") or "")
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(store_path)) if path else ""
    top = rel.split(os.sep)[0]
    return {"wal": "wal", "snapshot": "lmdb"}.get(top, "store")


def _refusal(tag: str, op: int, exc: Error, store_path: str) -> None:
    _emit(tag, op, type(exc).__name__, exc.code, _where(exc, store_path))


def _set_limit(limit: int | None) -> None:
    """Soft ``RLIMIT_FSIZE`` (None: lift it to the hard limit); ``SIGXFSZ`` ignored."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard if limit is None else limit, hard))


def child_main(argv: list[str]) -> int:
    """Entry point of a child process: ``python -m agentwal.testing.proc SPEC_JSON``.

    ``SPEC_JSON`` (built by the tiers) names the store, its options, the
    workload, the op range, and what to arm: ``mode`` ``"work"`` runs the
    workload (kill tier), ``"fill"`` runs it under a file-size limit until
    the first refusal (enospc tier). Returns the exit status.
    """
    spec = json.loads(argv[0])
    if spec.get("fsize"):
        _set_limit(int(spec["fsize"]))
    if spec.get("arm"):
        failpoints.arm(spec["arm"][0], "kill", nth=int(spec["arm"][1]),
                       exit_code=_FAILPOINT_EXIT)
    w = _make_workload(spec["workload"])
    if spec["mode"] == "fill":
        return _fill(spec, w)
    return _work(spec, w)


def _open(spec: dict[str, Any]) -> Store:
    return open_store(spec["path"], durability=spec["durability"], **spec["options"])


def _work(spec: dict[str, Any], w: Workload) -> int:
    try:
        store = _open(spec)
    except Error as exc:
        _refusal("ERR", -1, exc, spec["path"])
        return 3
    _emit("READY")
    if spec.get("open_only"):
        crash_store(store)
        return 0
    start = int(spec["start"])
    for i in range(start, start + int(spec["count"])):
        if spec.get("ack_early") and w.op(i).commit:
            _emit("ACK", i)  # harness self-test: a lie the tier must catch
            drive(store, w, i, 1)
        else:
            drive(store, w, i, 1, on_ack=_ack)
    store.close()
    _emit("CLOSED", "ok")
    return 0


def _ack(i: int) -> None:
    _emit("ACK", i)


def _commit_until_refused(store: Store, w: Workload, start: int, count: int) -> tuple[int, str]:
    """Run ops until the engine refuses; (next op to try, ``"commit"``/``"fold"``/``"none"``)."""
    for i in range(start, start + count):
        try:
            drive(store, w, i, 1, on_ack=_ack)
        except (DiskFullError, DurabilityError) as exc:
            _refusal("ERR", i, exc, store.path)
            return i, "commit"
        fe = fold_error(store)  # a background fold failed; commits go on
        if isinstance(fe, Error):
            _emit("FOLDERR", type(fe).__name__, fe.code, _where(fe, store.path))
            return i + 1, "fold"
    return start + count, "none"


def _fill(spec: dict[str, Any], w: Workload) -> int:
    store: Store | None = None
    nxt, outcome = int(spec["start"]), "open"
    try:
        store = _open(spec)
        _emit("READY")
    except (DiskFullError, DurabilityError) as exc:
        _refusal("ERR", -1, exc, spec["path"])
    if store is not None:
        nxt, outcome = _commit_until_refused(store, w, nxt, int(spec["count"]))
        if outcome == "none" or spec.get("close_under_limit"):
            _close(store)  # the refusal, if any, comes from the fold in close()
            return 0
    _set_limit(None)
    _emit("LIFTED")
    if store is None:
        try:
            store = _open(spec)
        except Error as exc:
            _refusal("RERR", -1, exc, spec["path"])
            return 0
        _emit("READY")
    for j in range(nxt, nxt + _RETRY_OPS):
        try:
            drive(store, w, j, 1, on_ack=_ack)
        except Error as exc:
            _refusal("RERR", j, exc, spec["path"])
            break
    if outcome == "fold":
        try:
            store.snapshot()
            _emit("SNAP", "ok")
        except Error as exc:
            _emit("SNAP", type(exc).__name__)
    _close(store)
    return 0


def _close(store: Store) -> None:
    try:
        store.close()
        _emit("CLOSED", "ok")
    except Error as exc:
        _emit("CLOSED", type(exc).__name__)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
