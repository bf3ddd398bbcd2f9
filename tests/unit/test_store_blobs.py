"""Blobs through the store: put_blob, open_blob, history, errors, sweeping, memory."""

from __future__ import annotations

import gc
import hashlib
import io
import os
import resource
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal import failpoints
from agentwal.local import blobs
from agentwal.local.blobs import blob_path
from agentwal.testing import SimulatedDisk
from agentwal.testing import crash as crash_store
from tests.helpers import Generated


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob_files(path: str) -> list[str]:
    root = Path(path) / "blobs"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and p.parent.name != "tmp")


def read_blob(store: agentwal.Store, run: str, key: str, at: int | None = None) -> bytes:
    with store.open_blob(run, key, at=at) as f:
        return f.read()


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobs, "CHUNK", 4096)


# -- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
def test_round_trip_of_small_empty_and_multi_chunk_blobs(store: agentwal.Store, size: int,
                                                         small_chunks: None) -> None:
    data = os.urandom(size)
    with store.begin("r") as txn:
        ref = txn.put_blob("art", io.BytesIO(data))
        assert txn.get("art") == ref == agentwal.BlobRef(sha(data), size)
        assert "art" in txn
    assert store.get("r", "art") == ref
    assert store.state("r") == {"art": ref}
    assert read_blob(store, "r", "art") == data


def test_sources_path_pathlike_file_object_and_generator(store: agentwal.Store,
                                                         tmp_path: Path) -> None:
    data = os.urandom(10_000)
    src = tmp_path / "model.bin"
    src.write_bytes(data)
    with store.begin("r") as txn, src.open("rb") as fobj:
        a = txn.put_blob("a", str(src), media_type="application/octet-stream")
        b = txn.put_blob("b", src)
        c = txn.put_blob("c", fobj)
        assert not fobj.closed  # the caller's stream is not closed
        gen = Generated(3 << 20, seed=7)
        d = txn.put_blob("d", gen)
    assert a.media_type == "application/octet-stream" and b.media_type is None
    assert a.sha256 == b.sha256 == c.sha256 == sha(data)
    assert d == agentwal.BlobRef(gen.sha256, 3 << 20)
    assert read_blob(store, "r", "b") == data
    assert sha(read_blob(store, "r", "d")) == gen.sha256
    with store.open_blob("r", "a") as f:
        assert f.ref == a and isinstance(f, agentwal.BlobReader) and isinstance(f, io.RawIOBase)


def test_a_stream_is_read_from_its_position(store: agentwal.Store) -> None:
    stream = io.BytesIO(b"headerPAYLOAD")
    stream.seek(6)
    with store.begin("r") as txn:
        txn.put_blob("p", stream)
    assert read_blob(store, "r", "p") == b"PAYLOAD"


def test_identical_artifacts_are_stored_once(store: agentwal.Store, path: str) -> None:
    data = os.urandom(50_000)
    for run in ("r1", "r2"):
        with store.begin(run) as txn:
            txn.put_blob("w", io.BytesIO(data))
            txn.put_blob("copy", io.BytesIO(data))
    with store.begin("r1") as txn:
        txn.put_blob("other", io.BytesIO(b"different"))
    assert blob_files(path) == sorted(f"{h[:2]}/{h[2:]}" for h in (sha(data), sha(b"different")))
    assert (Path(path) / "blobs" / "tmp").exists() and not any((Path(path) / "blobs" / "tmp")
                                                             .iterdir())


def test_a_blob_ref_links_an_existing_blob(store: agentwal.Store, path: str) -> None:
    with store.begin("r") as txn:
        ref = txn.put_blob("w", io.BytesIO(b"weights"))
    with store.begin("r2") as txn:
        assert txn.put_blob("w", store.get("r", "w")) == ref
        txn.put_blob("w2", ref, media_type="x/y")
    assert len(blob_files(path)) == 1
    assert read_blob(store, "r2", "w") == b"weights"
    assert store.get("r2", "w2").media_type == "x/y"


# -- history -------------------------------------------------------------------------


def test_open_blob_at_an_old_checkpoint(store: agentwal.Store) -> None:
    versions = [os.urandom(2000 + i) for i in range(40)]  # past a manifest (every 32)
    for i, data in enumerate(versions):
        with store.begin("train") as txn:
            txn.put_blob("weights", io.BytesIO(data))
            txn["epoch"] = i
        if i == 20:
            store.snapshot()  # some checkpoints folded, some in the memtable
    for cid in (1, 2, 21, 32, 33, 40):
        assert read_blob(store, "train", "weights", at=cid) == versions[cid - 1]
        assert store.get("train", "weights", at=cid).size == 2000 + cid - 1
    store.snapshot()
    assert read_blob(store, "train", "weights", at=7) == versions[6]
    assert read_blob(store, "train", "weights") == versions[-1]


def test_rollback_to_and_fork_carry_blob_references(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.put_blob("w", io.BytesIO(b"v1"))
    with store.begin("r") as txn:
        txn.put_blob("w", io.BytesIO(b"v2"))
    store.rollback_to("r", 1)
    assert read_blob(store, "r", "w") == b"v1"
    store.fork("r", 2, "r-b")
    assert read_blob(store, "r-b", "w") == b"v2"
    d = store.diff("r", 1, 2)
    assert set(d.changed) == {"w"}


def test_blobs_survive_folds_and_reopen(path: str) -> None:
    data = os.urandom(30_000)
    with agentwal.open(path) as s, s.begin("r") as txn:
        txn.put_blob("w", io.BytesIO(data))
    with agentwal.open(path) as s:  # folded at close
        assert read_blob(s, "r", "w") == data
        with s.begin("r") as txn:
            txn.put_blob("w", io.BytesIO(b"new"))
        crash_store(s)  # a crash: the commit is only in the WAL
    with agentwal.open(path) as s:
        assert read_blob(s, "r", "w") == b"new"
        assert read_blob(s, "r", "w", at=1) == data


def test_a_read_only_store_opens_blobs(path: str) -> None:
    data = os.urandom(5000)
    with agentwal.open(path) as s:
        with s.begin("r") as txn:
            txn.put_blob("w", io.BytesIO(data))
        with agentwal.open(path, readonly=True) as ro:
            assert read_blob(ro, "r", "w") == data


# -- rollback and abort ------------------------------------------------------------------


def test_rollback_and_abort_leave_no_reference(store: agentwal.Store, path: str) -> None:
    with store.begin("r") as txn:
        txn["x"] = 1
    txn = store.begin("r")
    txn.put_blob("w", io.BytesIO(b"rolled back"))
    txn.rollback()
    with pytest.raises(RuntimeError), store.begin("r") as txn2:
        txn2.put_blob("w", io.BytesIO(b"aborted"))
        raise RuntimeError("step failed")
    with store.begin("r") as txn3:
        sp = txn3.savepoint()
        txn3.put_blob("w", io.BytesIO(b"undone"))
        txn3.rollback_to(sp)
        txn3["y"] = 2
    assert store.state("r") == {"x": 1, "y": 2}
    assert store._engine.blobrefs.references() == set()
    assert len(blob_files(path)) == 3  # garbage until a sweep
    assert store._engine.blobrefs.sweep() == (
        3, len(b"rolled back") + len(b"aborted") + len(b"undone"))
    assert blob_files(path) == []


def test_a_conflicting_commit_unpins_its_blob(store: agentwal.Store) -> None:
    t1, t2 = store.begin("r"), store.begin("r")
    t1["k"] = 1
    t2.put_blob("k", io.BytesIO(b"loser"))
    t1.commit()
    with pytest.raises(agentwal.ConflictError):
        t2.commit()
    assert store._engine._blobs.pinned() == set()
    assert store._engine.blobrefs.sweep() == (1, 5)


def test_a_commit_of_unknown_outcome_keeps_its_blob_pinned(path: str) -> None:
    s = agentwal.open(path)
    try:
        txn = s.begin("r")
        ref = txn.put_blob("w", io.BytesIO(b"maybe committed"))
        failpoints.arm("before_fsync")  # the batch is written, its fate unknown
        with pytest.raises(failpoints.FailpointFired):
            txn.commit()
        assert s._engine._blobs.pinned() == {ref.sha256}  # the log may hold the commit
        with pytest.raises(agentwal.DurabilityError):
            s._engine.blobrefs.sweep()  # and a stopped writer sweeps nothing
    finally:
        crash_store(s)
    with agentwal.open(path) as s:
        if s.head("r") is not None:  # the record made it: the blob did too
            assert read_blob(s, "r", "w") == b"maybe committed"


def test_an_abandoned_transaction_releases_its_pin(store: agentwal.Store) -> None:
    txn = store.begin("r")
    txn.put_blob("w", io.BytesIO(b"dropped"))
    del txn
    gc.collect()
    assert store._engine.blobrefs.sweep() == (1, 7)


# -- errors --------------------------------------------------------------------------


def test_open_blob_errors(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.put_blob("w", io.BytesIO(b"w"))
        txn["plain"] = {"not": "a blob"}
    with store.begin("r") as txn:
        txn.delete("w")
    with pytest.raises(agentwal.RunNotFoundError):
        store.open_blob("nope", "w")
    with pytest.raises(agentwal.RunNotFoundError):
        store.open_blob("nope", "w", at=1)
    with pytest.raises(agentwal.MissingKeyError):
        store.open_blob("r", "w")  # deleted at the head
    assert read_blob(store, "r", "w", at=1) == b"w"
    with pytest.raises(agentwal.MissingKeyError):
        store.open_blob("r", "missing", at=1)
    with pytest.raises(agentwal.CheckpointNotFoundError):
        store.open_blob("r", "w", at=9)
    with pytest.raises(agentwal.NotABlobError, match="holds a dict, not a blob") as info:
        store.open_blob("r", "plain")
    assert isinstance(info.value, TypeError) and info.value.code == "not_a_blob"
    with pytest.raises(agentwal.InvalidKeyError):
        store.open_blob("r", "")
    with pytest.raises(TypeError):
        store.open_blob("r", "w", at="1")  # type: ignore[arg-type]


def test_put_blob_errors_change_nothing(store: agentwal.Store, path: str,
                                        tmp_path: Path) -> None:
    with store.begin("r") as txn:
        txn["w"] = "before"
        with pytest.raises(agentwal.BlobSourceError, match="No such file") as info:
            txn.put_blob("w", str(tmp_path / "missing.bin"))
        assert info.value.code == "blob_source"
        with pytest.raises(agentwal.BlobSourceError, match="text stream"):
            txn.put_blob("w", io.StringIO("text"))
        with pytest.raises(TypeError):
            txn.put_blob("w", b"bytes")
        with pytest.raises(ValueError, match="media_type"):
            txn.put_blob("w", io.BytesIO(b"x"), media_type="")
        with pytest.raises(agentwal.InvalidKeyError):
            txn.put_blob("", io.BytesIO(b"x"))
        assert txn.get("w") == "before"
    assert store.get("r", "w") == "before"
    assert blob_files(path) == []
    with pytest.raises(agentwal.TransactionClosedError):
        txn.put_blob("w", io.BytesIO(b"x"))


def test_a_blob_ref_cannot_be_put_as_a_value(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        ref = txn.put_blob("w", io.BytesIO(b"x"))
    with store.begin("r") as txn:
        with pytest.raises(agentwal.UnencodableValueError, match="put_blob"):
            txn.put("w2", ref)
        with pytest.raises(agentwal.UnencodableValueError, match="put_blob"):
            txn["list"] = [ref]
        with pytest.raises(agentwal.UnencodableValueError):
            txn.meta(artifact=ref)


def test_disk_full_during_put_blob(tmp_path: Path, small_chunks: None) -> None:
    disk = SimulatedDisk()
    path = str(tmp_path / "s")
    store = agentwal.open(path, fs=disk, segment_bytes=65536)
    try:
        with store.begin("r") as txn:
            txn["a"] = 1
        used = sum(len(disk.inspect()[p].volatile or b"") for p in disk.files())
        disk.faults.budget = used + 10_000
        with store.begin("r") as txn:
            with pytest.raises(agentwal.DiskFullError, match="nothing was stored"):
                txn.put_blob("big", io.BytesIO(os.urandom(50_000)))
            assert "big" not in txn
            txn["b"] = 2  # the transaction goes on
        assert store.state("r") == {"a": 1, "b": 2}
        assert not [p for p in disk.files() if "/blobs/" in p and not p.endswith("/")]
        disk.faults.budget = None
        with store.begin("r") as txn:
            txn.put_blob("big", io.BytesIO(b"fits now"))
        assert read_blob(store, "r", "big") == b"fits now"
    finally:
        crash_store(store)


def test_a_failed_blob_fsync_stops_the_writer(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    store = agentwal.open(str(tmp_path / "s"), fs=disk, segment_bytes=65536)
    try:
        txn = store.begin("r")
        txn["a"] = 1
        disk.fail_fsync(disk.fsync_count)
        with pytest.raises(agentwal.DurabilityError, match="cannot sync a blob file"):
            txn.put_blob("w", io.BytesIO(b"x"))
        with pytest.raises(agentwal.DurabilityError):
            txn.commit()  # as after a failed WAL fsync: no more commits until reopened
        with pytest.raises(agentwal.DurabilityError), store.begin("r") as t2:
            t2.put_blob("w", io.BytesIO(b"y"))
    finally:
        crash_store(store)


# -- corruption --------------------------------------------------------------------------


@pytest.fixture
def damaged(store: agentwal.Store, path: str) -> tuple[agentwal.Store, str, bytes]:
    data = os.urandom(9000)
    with store.begin("r") as txn:
        ref = txn.put_blob("w", io.BytesIO(data))
    return store, blob_path(os.path.join(path, "blobs"), ref.sha256), data


def test_a_flipped_byte_is_corruption(damaged: Any) -> None:
    store, file, data = damaged
    with open(file, "r+b") as f:
        f.seek(4321)
        byte = f.read(1)
        f.seek(4321)
        f.write(bytes([byte[0] ^ 0x40]))
    with store.open_blob("r", "w") as r, pytest.raises(agentwal.CorruptionError) as info:
        r.read()
    assert info.value.path == file and "SHA-256" in str(info.value)
    with store.open_blob("r", "w", verify=False) as r:
        assert len(r.read()) == len(data)
    with store.open_blob("r", "w", verify=False) as r, pytest.raises(agentwal.CorruptionError):
        r.verify()


def test_a_truncated_blob_is_corruption(damaged: Any) -> None:
    store, file, _data = damaged
    os.truncate(file, 100)
    with pytest.raises(agentwal.CorruptionError, match="100 bytes; its reference says 9000"):
        store.open_blob("r", "w")


def test_a_missing_blob_file_is_corruption_naming_it(damaged: Any) -> None:
    store, file, _data = damaged
    os.unlink(file)
    with pytest.raises(agentwal.CorruptionError, match="is missing") as info:
        store.open_blob("r", "w")
    assert info.value.path == file


def test_a_read_only_store_says_to_refresh_when_a_blob_is_gone(damaged: Any, path: str
                                                               ) -> None:
    store, file, _data = damaged
    store.snapshot()
    with agentwal.open(path, readonly=True) as ro:
        os.unlink(file)
        with pytest.raises(agentwal.CorruptionError, match="refresh"):
            ro.open_blob("r", "w")


# -- sweeping ----------------------------------------------------------------------------


def test_sweep_keeps_every_referenced_blob_in_state_and_history(store: agentwal.Store,
                                                                path: str) -> None:
    with store.begin("r") as txn:
        old = txn.put_blob("w", io.BytesIO(b"old"))
    with store.begin("r") as txn:
        new = txn.put_blob("w", io.BytesIO(b"new"))
    store.fork("r", 1, "f")
    assert store._engine.blobrefs.references() == {old.sha256, new.sha256}  # memtable
    store.snapshot()
    assert store._engine.blobrefs.references() == {old.sha256, new.sha256}  # LMDB: state and deltas
    for _ in range(70):  # manifests too
        with store.begin("r") as txn:
            txn["n"] = txn.get("n", 0) + 1
    store.snapshot()
    assert store._engine.blobrefs.sweep() == (0, 0)
    assert read_blob(store, "r", "w", at=1) == b"old"
    assert len(blob_files(path)) == 2


def test_sweep_spares_a_blob_put_by_an_open_transaction(store: agentwal.Store) -> None:
    txn = store.begin("r")
    txn.put_blob("w", io.BytesIO(b"in flight"))
    assert store._engine.blobrefs.sweep() == (0, 0)
    txn.commit()
    assert store._engine.blobrefs.sweep() == (0, 0)
    assert read_blob(store, "r", "w") == b"in flight"


def test_sweep_keep_and_read_only_and_closed(store: agentwal.Store, path: str) -> None:
    txn = store.begin("r")
    ref = txn.put_blob("w", io.BytesIO(b"x"))
    txn.rollback()
    assert store._engine.blobrefs.sweep(keep={ref.sha256}) == (0, 0)
    with agentwal.open(path, readonly=True) as ro, pytest.raises(agentwal.ReadOnlyError):
        ro._engine.blobrefs.sweep()
    assert store._engine.blobrefs.sweep() == (1, 1)


# -- memory: never held whole ----------------------------------------------------------


def _stream_through(store: agentwal.Store, size: int) -> tuple[int, int]:
    """Put a generated ``size``-byte blob and read it back; returns (peak traced, rss growth)."""
    gc.collect()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        gen = Generated(size, seed=size)
        with store.begin("big") as txn:
            ref = txn.put_blob("artifact", gen)
        assert ref == agentwal.BlobRef(gen.sha256, size)
        h = hashlib.sha256()
        n = 0
        with store.open_blob("big", "artifact") as f:  # verifies the hash at the end too
            while chunk := f.read(1 << 20):
                h.update(chunk)
                n += len(chunk)
        assert n == size and h.hexdigest() == gen.sha256
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0  # KiB on Linux
    return peak, rss * 1024


def test_a_64_mib_blob_streams_in_and_out_in_bounded_memory(tmp_path: Path) -> None:
    try:
        with agentwal.open(str(tmp_path / "s"), durability="none") as store:
            peak, rss = _stream_through(store, 64 << 20)
    finally:
        shutil.rmtree(tmp_path / "s", ignore_errors=True)
    assert peak < 8 << 20, peak  # a few 1 MiB chunks, not 64 MiB
    assert rss < 32 << 20, rss


def test_a_1_gib_blob_streams_in_and_out_in_bounded_memory(tmp_path: Path) -> None:
    # About 9 s here (sync mode: the 1 GiB is fsynced), under the ~20 s that
    # would make it a slow test; the store is removed at once (pytest keeps tmp_path).
    try:
        with agentwal.open(str(tmp_path / "s")) as store:
            peak, rss = _stream_through(store, 1 << 30)
    finally:
        shutil.rmtree(tmp_path / "s", ignore_errors=True)
    assert peak < 8 << 20, peak
    assert rss < 32 << 20, rss


def test_blob_refs_lists_every_reference_with_its_size(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        a = txn.put_blob("a", io.BytesIO(b"aaa"), media_type="x/a")
        b = txn.put_blob("b", io.BytesIO(b"aaa"))
    with store.begin("r") as txn:
        c = txn.put_blob("a", io.BytesIO(b"cc"))
    assert store._engine.blobrefs.refs() == {a, b, c}  # history included; one hash, two media types
    store.snapshot()
    assert store._engine.blobrefs.refs() == {a, b, c}
    for ref in store._engine.blobrefs.refs():  # what a verify can do with them
        with store._engine._blobs.open(ref) as f:
            f.verify()


def test_puts_commits_forks_and_sweeps_in_threads(store: agentwal.Store) -> None:
    """Writers put, commit, roll back and fork while another thread sweeps, over and over.

    Every reference any run ends with must read back, and after a last
    sweep exactly the referenced files remain.
    """
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []
    swept = [0]

    def writer(w: int) -> None:
        try:
            for i in range(25):
                run = f"w{w}"
                data = f"{w}-{i % 6}".encode() * 300  # repeats: dedup under a sweep too
                with store.begin(run) as txn:
                    txn.put_blob("art", io.BytesIO(data))
                    txn.put_blob(f"k{i % 3}", io.BytesIO(data[::-1]))
                if i % 4 == 1:
                    t = store.begin(run)
                    t.put_blob("art", io.BytesIO(b"rolled back %d %d" % (w, i)))
                    t.rollback()
                if i % 8 == 2:
                    store.fork(run, store.head(run).id, f"{run}-f{i}")  # type: ignore[union-attr]
        except BaseException as exc:
            errors.append(exc)

    def sweeper() -> None:
        try:
            while not stop.is_set():
                swept[0] += store._engine.blobrefs.sweep()[0]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    sweep_thread = threading.Thread(target=sweeper)
    sweep_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    sweep_thread.join()
    assert not errors, errors
    for run in store.runs():
        for key, ref in store.state(run).items():
            with store.open_blob(run, key) as f:
                assert sha(f.read()) == ref.sha256
    store._engine.blobrefs.sweep()
    assert set(store._engine._blobs.files()) == store._engine.blobrefs.references()
    assert swept[0] > 0  # the sweeps ran while the writers did


def test_verify_checks_every_referenced_blob_file(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    data = os.urandom(300_000)
    with agentwal.open(path) as store:
        with store.begin("r") as txn:
            ref = txn.put_blob("weights", io.BytesIO(data))
        with store.begin("r") as txn:
            txn.put_blob("other", io.BytesIO(b"small artifact"))
        report = store.verify()
        assert report.ok and report.checked["blobs"] == 2
        assert report.checked["blob_bytes"] == len(data) + len(b"small artifact")
        file = blob_path(os.path.join(path, "blobs"), ref.sha256)
        with open(file, "r+b") as f:  # one flipped byte in the middle
            f.seek(150_000)
            b = f.read(1)
            f.seek(150_000)
            f.write(bytes([b[0] ^ 0x01]))
        report = store.verify()
        assert not report.ok
        (p,) = report.problems
        assert p.file == os.path.relpath(file, path) and "SHA-256" in p.what.upper()
        os.unlink(file)
        (p,) = store.verify().problems
        assert "missing" in p.what


def test_a_damaged_delta_is_reported_once_and_the_other_blobs_are_still_checked(
        tmp_path: Path) -> None:
    """The blob-reference scan meets a damaged record the snapshot checks report at its
    entry: verify says so once (no second "blob references" problem), skips that record
    and still checks the blob files the other records reference."""
    from tests.stores import Raw

    path = str(tmp_path / "s")
    with agentwal.open(path) as store:
        with store.begin("r") as txn:
            kept = txn.put_blob("kept", io.BytesIO(b"a kept artifact"))
        with store.begin("r") as txn:
            txn["note"] = "x" * 40
        store.snapshot()
    with Raw(path) as raw:
        k, v = next((k, v) for k, v in raw.entries("delta") if b"x" * 40 in v)
        raw.put_raw("delta", k, v[:-1] + bytes([v[-1] ^ 0x01]))
    os.unlink(blob_path(os.path.join(path, "blobs"), kept.sha256))
    with agentwal.open(path, readonly=True) as store:
        report = store.verify()
    assert [p.db for p in report.problems if p.db is not None] == ["delta"], report.problems
    assert not [p for p in report.problems if p.where == "blob references"], report.problems
    (missing,) = [p for p in report.problems if p.db is None]
    assert "missing" in missing.what and kept.sha256 in missing.what
    assert any("not scanned for blob references" in n for n in report.notes), report.notes


def test_a_folded_blob_reference_verifies_ok(tmp_path: Path) -> None:
    """A blob reference in LMDB's state is a value like any other (regression: verify
    decoded it as plain CBOR and reported every folded one as damage)."""
    with agentwal.open(str(tmp_path / "s")) as store:
        with store.begin("r") as txn:
            txn.put_blob("kept", io.BytesIO(b"a kept artifact"))
        store.snapshot()
        report = store.verify()
    assert report.ok and report.checked["blobs"] == 1, report.problems
