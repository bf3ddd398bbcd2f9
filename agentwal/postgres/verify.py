"""``verify`` on PostgreSQL: recompute every hash chain from the rows, and check what they name.

Theory of operation: per run (one read-only, repeatable-read transaction for
the whole pass, so commits going on meanwhile are not half seen), walk the
checkpoints in id order and rebuild each one's delta from its ``deltas``
rows (a value inline, or the ``vals`` row its digest names); then check

- ids are contiguous from 1 and each parent is the id before (a checkpoint
  ``compact`` dropped keeps its row and hash; its delta is not checked);
- the delta's SHA-256 (the encoding ``commit`` hashed: keys sorted) is the
  stored ``delta_digest``;
- the checkpoint hash is ``codec.checkpoint_hash`` of the parent's hash,
  the fields and that digest (the local engine's chain);
- the ``runs`` row's head and head hash are the last checkpoint's;
- each delta row's ``until`` is the checkpoint that next writes its key
  (NULL for the key's latest), which reads of a checkpoint's state rely on;
- every ``vals`` row's data hashes to its key, and every stored value and
  ledger entry decodes;
- every blob's chunks are numbered 0.. without a gap, add up to its size and
  hash to its SHA-256 (streamed, one chunk at a time), and every blob
  reference in a checkpoint's values is listed in ``delta_blobs`` (so the
  blob cannot be collected under it);
- every append row's tail joins the list of the row it extends (that row is
  there, and the list has the count and length the append says);
- every tree value's objects decode and each of their entries is an edge in
  ``tree_edges`` (so no file of a committed tree can be collected; the
  edge's foreign key says the file's blob is there).

Nothing is repaired and nothing is written; each problem names its table and
row. A database's own damage (a page checksum) surfaces as the server's
error, like any other read.
"""

from __future__ import annotations

import bisect
import hashlib
from typing import TYPE_CHECKING, Any

import cbor2

from ..codec import CodecError, checkpoint_hash, decode_blob_ref, is_blob_ref, join_append, loads
from ..effects import decode_entry
from ..errors import CorruptionError
from ..format import TREE_MEDIA_TYPE
from ..local.verify.report import Problem, VerifyReport
from ..types import BlobRef

if TYPE_CHECKING:
    from .trees import PgTrees

__all__ = ["verify"]

_ZERO = bytes(32)


def verify(backend: Any, trees: PgTrees | None = None) -> VerifyReport:
    """Check every run's chain and the rows it names, and (given ``trees``) the tree
    values' objects and edges (module doc)."""
    problems: list[Problem] = []
    checked = {"runs": 0, "checkpoints": 0, "hashes": 0, "values": 0, "vals": 0,
               "effects": 0, "blobs": 0, "trees": 0}
    found: set[BlobRef] = set()
    where = backend.name

    def problem(table: str, key: str, what: str) -> None:
        problems.append(Problem(f"{table}[{key}]", what, where, table, key))

    with backend._conn() as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        for digest, data in conn.execute("SELECT digest, data FROM vals"):
            checked["vals"] += 1
            if hashlib.sha256(bytes(data)).digest() != bytes(digest):
                problem("vals", bytes(digest).hex()[:16], "the data does not hash to its key")
        _check_blobs(conn, checked, problem)
        runs = conn.execute("SELECT run, head, head_hash FROM runs WHERE head > 0 "
                            "ORDER BY run").fetchall()
        for run, head, head_hash in runs:
            checked["runs"] += 1
            _check_run(conn, run, int(head), head_hash, checked, problem, found)
        if trees is not None:
            _check_trees(conn, trees, found, checked, problem)
        for key, raw in conn.execute("SELECT key, entry FROM effects"):
            checked["effects"] += 1
            try:
                decode_entry(bytes(raw))
            except (CodecError, ValueError, TypeError, KeyError) as exc:
                problem("effects", repr(key), f"the ledger entry does not decode: {exc}")
    return VerifyReport(not problems, problems, checked)


def _sha_of(ref: bytes) -> str | None:
    """The hash a blob reference names (None: it does not decode, reported as a value)."""
    try:
        return decode_blob_ref(ref).sha256
    except CodecError:
        return None


def _check_blobs(conn: Any, checked: dict[str, int], problem: Any) -> None:
    """Each blob's chunks against its size and SHA-256, one chunk in memory at a time."""
    for bid, sha, size in conn.execute("SELECT id, sha256, size FROM blobs ORDER BY id"
                                       ).fetchall():
        checked["blobs"] += 1
        name = bytes(sha).hex()[:16] if sha is not None else f"id {bid}"
        h, total, expect = hashlib.sha256(), 0, 0
        gap = False
        for (n,) in conn.execute("SELECT n FROM blob_chunks WHERE blob = %s ORDER BY n",
                                 (bid,)).fetchall():
            gap = gap or n != expect
            expect = int(n) + 1
            [(data,)] = conn.execute("SELECT data FROM blob_chunks WHERE blob = %s AND n = %s",
                                     (bid, n)).fetchall()
            h.update(bytes(data))
            total += len(data)
        if sha is None or gap or total != int(size) or h.digest() != bytes(sha):
            problem("blobs", name, f"its chunks ({expect} of them, {total} bytes"
                    f"{', with a gap' if gap else ''}) are not its {size} bytes of content")


def _check_trees(conn: Any, trees: PgTrees, refs: set[BlobRef], checked: dict[str, int],
                 problem: Any) -> None:
    """Each tree value's objects decode, and every edge of them is in ``tree_edges`` (else
    a collection could delete a file of a committed tree)."""
    edges = {(bytes(p).hex(), bytes(c).hex())
             for p, c in conn.execute("SELECT parent, child FROM tree_edges")}
    seen: set[str] = set()
    for ref in sorted(refs, key=lambda r: r.sha256):
        checked["trees"] += 1
        try:
            for parent, child in trees.edges(ref, seen):
                if (parent, child) not in edges:
                    problem("tree_edges", f"{parent[:16]}->{child[:16]}", "an entry of a "
                            "stored tree object is not recorded (a collection could delete it)")
        except CorruptionError as exc:
            problem("blobs", ref.sha256[:16], f"a tree object is missing or damaged: {exc}")


def _check_run(conn: Any, run: str, head: int, head_hash: Any, checked: dict[str, int],
               problem: Any, trees: set[BlobRef]) -> None:
    deltas: dict[int, dict[str, bytes | None]] = {}
    listed = {(run, int(c), bytes(b).hex()) for c, b in conn.execute(
        "SELECT ckpt, sha256 FROM delta_blobs WHERE run = %s", (run,))}
    rows = conn.execute(
        "SELECT d.ckpt, d.key, d.inline, d.digest, v.data, d.until, lead(d.ckpt) OVER "
        "(PARTITION BY d.key ORDER BY d.ckpt), d.base, d.base_count, d.base_len FROM deltas d "
        "LEFT JOIN vals v ON v.digest = d.digest WHERE d.run = %s ORDER BY d.ckpt, d.key",
        (run,))
    whole: dict[tuple[str, int], bytes | None] = {}  # each row's value, its chain joined
    dropped = sorted(int(r[0]) for r in conn.execute(
        "SELECT id FROM checkpoints WHERE run = %s AND dropped", (run,)))
    for cid, key, inline, digest, data, until, after, base, base_count, base_len in rows:
        # Compaction deletes the rows no kept checkpoint reads: between a row's until
        # and the next row left of its key, every checkpoint is then a dropped one.
        gap = (until is not None and after is not None and until < after
               and bisect.bisect_left(dropped, after) - bisect.bisect_left(dropped, until)
               == after - until)
        if until != after and not gap:
            problem("deltas", f"{run!r}/{cid}/{key!r}", f"it is marked live until checkpoint "
                    f"{until}, but the key is next written at {after} (reads of the state "
                    "between them would be wrong)")
        value: bytes | None = None
        if inline is not None:
            value = bytes(inline)
        elif digest is not None:
            if data is None:
                problem("deltas", f"{run!r}/{cid}/{key!r}", "names a value missing from vals")
                continue
            value = bytes(data)
        if base is not None:  # an append row: the list it extends, then its tail
            under = whole.get((key, int(base)))
            joined = None if under is None or value is None else join_append(
                under, (int(base_count), int(base_len), value))
            if joined is None:
                problem("deltas", f"{run!r}/{cid}/{key!r}", f"its append to the row of "
                        f"checkpoint {base} is missing that row, or does not fit its list")
                continue
            value = joined.whole()
        whole[(key, int(cid))] = value
        if is_blob_ref(value) and (run, int(cid), _sha_of(value)) not in listed:
            problem("deltas", f"{run!r}/{cid}/{key!r}", "its blob reference is not listed in "
                    "delta_blobs (a collection could delete the blob under it)")
        if value is not None:
            checked["values"] += 1
            try:
                if is_blob_ref(value):
                    ref = decode_blob_ref(value)
                    if ref.media_type == TREE_MEDIA_TYPE:
                        trees.add(ref)
                else:
                    loads(value)
            except CodecError as exc:
                problem("deltas", f"{run!r}/{cid}/{key!r}", f"the value does not decode: {exc}")
        deltas.setdefault(int(cid), {})[key] = value
    prev_hash, expect = _ZERO, 1
    last: tuple[int, bytes] | None = None
    for (cid, parent, created, meta, hsh, digest, outbox, origin_run, origin_id,
         dropped) in conn.execute(
            "SELECT id, parent, created_at, meta, hash, delta_digest, outbox, origin_run, "
            "origin_id, dropped FROM checkpoints WHERE run = %s ORDER BY id", (run,)):
        checked["checkpoints"] += 1
        name = f"{run!r}/{cid}"
        if cid != expect or parent != (cid - 1 or None):
            problem("checkpoints", name, f"expected checkpoint {expect} with parent "
                    f"{expect - 1 or None}, found id {cid} with parent {parent}")
        if dropped:  # compacted: its delta is gone, its hash is what the next one chains to
            prev_hash, expect = bytes(hsh), int(cid) + 1
            continue
        delta = deltas.get(int(cid), {})
        want_digest = hashlib.sha256(cbor2.dumps(dict(sorted(delta.items())))).digest()
        if want_digest != bytes(digest):
            problem("checkpoints", name, "its deltas rows are not the delta it committed "
                    "(their SHA-256 is not delta_digest)")
        origin = (origin_run, int(origin_id)) if origin_run is not None else None
        want = checkpoint_hash(prev_hash, run, int(cid), parent, float(created), bytes(meta),
                               origin, bytes(digest),
                               bytes(outbox) if outbox is not None else None)
        checked["hashes"] += 1
        if want != bytes(hsh):
            problem("checkpoints", name, "hash chain broken: the stored hash is not the "
                    "SHA-256 of the parent's hash, this checkpoint's fields and its delta")
        prev_hash, expect = bytes(hsh), int(cid) + 1
        last = (int(cid), bytes(hsh))
    if last is None or last[0] != head or bytes(head_hash or b"") != last[1]:
        problem("runs", repr(run), f"the head is {head}, the last checkpoint "
                f"{last[0] if last else 'none'}, or their hashes differ")
