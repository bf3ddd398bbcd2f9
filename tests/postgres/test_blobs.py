"""Blobs on PostgreSQL: streamed in chunks, read back, kept once, collected with runs, verified."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

import agentwal
from agentwal import BlobRef
from agentwal.local.blobs import CHUNK
from agentwal.postgres import PostgresStore
from agentwal.postgres import blobs as pg_blobs


def _sql(dsn: str, schema: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        cur = conn.execute(query, args)
        return cur.fetchall() if cur.description else []


class Trickle(io.RawIOBase):
    """A stream that hands out at most 1000 bytes per read and counts what was asked."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return self._data.read(min(n, 1000) if n >= 0 else 1000)


def test_a_blob_round_trips_in_chunks(pgstore: PostgresStore, tmp_path: Path,
                                      pg_dsn: str, pg_schema: str) -> None:
    data = os.urandom(2 * CHUNK + 3)
    with pgstore.begin("r") as txn:
        ref = txn.put_blob("weights", io.BytesIO(data), media_type="application/x-bin")
        txn["epoch"] = 1
    assert ref == BlobRef(hashlib.sha256(data).hexdigest(), len(data), "application/x-bin")
    assert pgstore.get("r", "weights") == ref
    assert _sql(pg_dsn, pg_schema, "SELECT n, length(data) FROM blob_chunks ORDER BY n") == [
        (0, CHUNK), (1, CHUNK), (2, 3)]
    with pgstore.open_blob("r", "weights") as f:
        assert f.ref == ref
        assert f.read(10) == data[:10]
        f.seek(CHUNK - 5)
        assert f.read(10) == data[CHUNK - 5:CHUNK + 5]  # across a chunk boundary
        f.seek(0)
        assert f.read() == data  # to the end: hashed and checked
        buf = bytearray(7)
        f.seek(-4, io.SEEK_END)
        assert f.readinto(buf) == 4 and bytes(buf[:4]) == data[-4:]
        f.verify()
    (tmp_path / "small.bin").write_bytes(b"second")
    with pgstore.begin("r") as txn:
        txn.put_blob("weights", tmp_path / "small.bin")
    with pgstore.open_blob("r", "weights") as f:
        assert f.read() == b"second"
    with pgstore.open_blob("r", "weights", at=1) as f:
        assert f.read() == data  # the older checkpoint's blob
    with pgstore.begin("r") as txn:
        txn.put_blob("empty", io.BytesIO(b""))
    with pgstore.open_blob("r", "empty") as f:
        assert f.read() == b""


def test_equal_content_is_stored_once(pgstore: PostgresStore, pg_dsn: str,
                                      pg_schema: str) -> None:
    data = b"x" * (CHUNK + 1)
    with pgstore.begin("a") as txn:
        first = txn.put_blob("k", io.BytesIO(data))
    with pgstore.begin("b") as txn:
        again = txn.put_blob("k", Trickle(data), media_type="text/plain")  # small reads
        same = txn.put_blob("k2", first)  # a BlobRef of this store: nothing copied
    assert again.sha256 == first.sha256 == same.sha256 and again.media_type == "text/plain"
    assert _sql(pg_dsn, pg_schema, "SELECT count(*) FROM blobs") == [(1,)]
    assert _sql(pg_dsn, pg_schema, "SELECT count(*) FROM blob_chunks") == [(2,)]
    with pgstore.open_blob("b", "k2") as f:
        assert f.read() == data


def test_bad_sources_are_refused_and_store_nothing(pgstore: PostgresStore, tmp_path: Path,
                                                   pg_dsn: str, pg_schema: str) -> None:
    class Breaks(io.RawIOBase):
        def __init__(self) -> None:
            self.calls = 0

        def readable(self) -> bool:
            return True

        def read(self, n: int = -1) -> bytes:
            self.calls += 1
            if self.calls > 2:
                raise OSError("the network went away")
            return b"y" * CHUNK

    txn = pgstore.begin("r")
    txn["kept"] = 1
    with pytest.raises(agentwal.BlobSourceError):
        txn.put_blob("k", tmp_path / "missing.bin")
    with pytest.raises(agentwal.BlobSourceError):
        txn.put_blob("k", io.StringIO("text"))
    with pytest.raises(agentwal.BlobSourceError):
        txn.put_blob("k", Breaks())  # mid-way: its chunks roll back with the upload
    with pytest.raises(agentwal.BlobSourceError):
        txn.put_blob("k", BlobRef("0" * 64, 3))  # no such blob here
    with pytest.raises(TypeError):
        txn.put_blob("k", b"bytes")
    txn.commit()  # still usable
    assert _sql(pg_dsn, pg_schema, "SELECT count(*) FROM blob_chunks") == [(0,)]
    assert _sql(pg_dsn, pg_schema, "SELECT count(*) FROM blobs") == [(0,)]
    assert pgstore.state("r") == {"kept": 1}
    with pytest.raises(agentwal.NotABlobError):
        pgstore.open_blob("r", "kept")
    with pytest.raises(agentwal.MissingKeyError):
        pgstore.open_blob("r", "nothing")
    with pytest.raises(agentwal.RunNotFoundError):
        pgstore.open_blob("nope", "k")


def test_blobs_are_collected_with_the_last_run_that_references_them(
        pgstore: PostgresStore, pg_dsn: str, pg_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_blobs, "GRACE", 0.0)
    with pgstore.begin("a") as txn:
        shared = txn.put_blob("shared", io.BytesIO(b"shared" * 100))
        own = txn.put_blob("own", io.BytesIO(b"own" * 100))
    with pgstore.begin("b") as txn:
        txn.put_blob("shared", shared)
    abandoned = pgstore.begin("c")
    lost = abandoned.put_blob("k", io.BytesIO(b"never committed"))
    abandoned.rollback()
    pgstore.delete_run("a")
    left = {bytes(r[0]).hex() for r in _sql(pg_dsn, pg_schema, "SELECT sha256 FROM blobs")}
    assert left == {shared.sha256}  # a's own blob, and the orphan, are gone
    assert own.sha256 not in left and lost.sha256 not in left
    with pgstore.open_blob("b", "shared") as f:
        assert f.read() == b"shared" * 100
    pgstore.delete_run("b")
    assert _sql(pg_dsn, pg_schema, "SELECT count(*) FROM blob_chunks") == [(0,)]


def test_a_commit_naming_a_collected_blob_is_a_conflict(pgstore: PostgresStore, pg_dsn: str,
                                                        pg_schema: str) -> None:
    txn = pgstore.begin("r")
    txn.put_blob("k", io.BytesIO(b"gone before the commit"))
    _sql(pg_dsn, pg_schema, "DELETE FROM blobs")  # what a collection would do after GRACE
    with pytest.raises(agentwal.ConflictError) as info:
        txn.commit()
    assert "put the blob again" in str(info.value).lower()
    assert pgstore.head("r") is None


def test_damaged_chunks_are_found_when_read_and_by_verify(pgstore: PostgresStore, pg_dsn: str,
                                                          pg_schema: str) -> None:
    data = os.urandom(CHUNK + 10)
    with pgstore.begin("r") as txn:
        txn.put_blob("k", io.BytesIO(data))
    assert pgstore.verify().ok
    _sql(pg_dsn, pg_schema, "UPDATE blob_chunks SET data = overlay(data PLACING '\\x00'::bytea "
         "FROM 5) WHERE n = 0")
    with pgstore.open_blob("r", "k") as f, pytest.raises(agentwal.CorruptionError):
        f.read()
    with pgstore.open_blob("r", "k", verify=False) as f:
        assert len(f.read()) == len(data)  # verify=False reads what is there
    report = pgstore.verify()
    assert not report.ok and [p.db for p in report.problems] == ["blobs"]
    _sql(pg_dsn, pg_schema, "DELETE FROM blob_chunks WHERE n = 1")
    with pgstore.open_blob("r", "k") as f, pytest.raises(agentwal.CorruptionError):
        f.read()
    _sql(pg_dsn, pg_schema, "DELETE FROM delta_blobs")
    problems = {p.db for p in pgstore.verify().problems}
    assert problems == {"blobs", "deltas"}  # the reference is no longer listed either


def test_forks_and_rollbacks_keep_their_blobs_referenced(
        pgstore: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_blobs, "GRACE", 0.0)
    with pgstore.begin("r") as txn:
        txn.put_blob("k", io.BytesIO(b"v1"))
    with pgstore.begin("r") as txn:
        txn["k"] = "plain"
    pgstore.fork("r", 1, "f")
    pgstore.rollback_to("r", 1)
    pgstore.delete_run("r")
    with pgstore.open_blob("f", "k") as f:  # the fork's first checkpoint references it
        assert f.read() == b"v1"
    assert pgstore.verify().ok


