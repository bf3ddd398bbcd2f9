"""The stat cache's directory records: an unchanged directory is not looked into, and
every change its digest covers is seen (snapshots and restores)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import cbor2
import pytest

import agentwal
from agentwal import tree_cache, tree_restore, tree_snapshot, treeio
from tests.trees import Spec, build, read
from tests.unit.test_store_trees import SPEC as BASE
from tests.unit.test_store_trees import age, counting, files_read, put

# each test with the C walk and with its pure-Python twin (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("walker")

__all__ = ["counting"]  # a fixture, used by name

SPEC: Spec = {k: BASE[k] for k in ("README.md", "src/app.py", "src/pkg/__init__.py",
                                   "src/pkg/mod.py", "bin/run")} | {
    "empty/inner": ("d",), "link": ("l", b"src/app.py")}


def no_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records and entries trusted at once: ``RACY_NS`` 0 in every tree module that
    reads it."""
    for module in (tree_cache, tree_snapshot, tree_restore, treeio):
        monkeypatch.setattr(module, "RACY_NS", 0)


@pytest.fixture
def src(tmp_path: Path) -> str:
    p = str(tmp_path / "src")
    build(p, SPEC)
    age(p)
    return p


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[bytes, bytes]]]:
    """Every per-file stat-cache lookup, as ``(directory, name)``."""
    seen: list[tuple[bytes, bytes]] = []
    real = treeio.StatCache.lookup

    def counted(self: treeio.StatCache, rel: bytes, name: bytes, st: os.stat_result
                ) -> tuple[str, bool] | None:
        seen.append((rel, name))
        return real(self, rel, name, st)

    monkeypatch.setattr(treeio.StatCache, "lookup", counted)
    yield seen


def restored(store: agentwal.Store, tmp_path: Path, name: str, at: int | None = None
             ) -> dict[str, object]:
    dest = tmp_path / name
    store.restore_tree("r", "ws", dest, at=at)
    return read(str(dest))


def test_an_unchanged_directory_is_not_looked_into(store: agentwal.Store, src: str,
                                                   lookups: list[tuple[bytes, bytes]],
                                                   counting: None) -> None:
    put(store, src)
    first = files_read()
    lookups.clear()
    with store.begin("r") as txn:
        txn.put_tree("ws", src)
    assert lookups == []  # every directory was its record: no file looked up
    assert files_read() == first
    Path(src, "src/pkg/mod.py").write_bytes(b"x = 2\n" * 100)
    with store.begin("r") as txn:
        txn.put_tree("ws", src)
    # only the changed file is looked up (its unchanged neighbour is taken from the
    # directory's old object, as its record vouches for it), and only it is read
    assert lookups == [(b"src/pkg", b"mod.py")]
    assert files_read() == first + 1
    assert txn.checkpoint is not None


def _rewrite_same_size_and_mtime(src: str) -> None:
    p = Path(src, "src/app.py")
    st = p.stat()
    p.write_bytes(b"print('HI')\n")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # only the ctime moved


def _chmod(src: str) -> None:
    os.chmod(os.path.join(src, "src/app.py"), 0o700)


def _rename(src: str) -> None:
    os.rename(os.path.join(src, "src/app.py"), os.path.join(src, "src/main.py"))


def _file_to_link(src: str) -> None:
    os.unlink(os.path.join(src, "README.md"))
    os.symlink("src/app.py", os.path.join(src, "README.md"))


def _retarget_link(src: str) -> None:
    os.unlink(os.path.join(src, "link"))
    os.symlink("bin/run", os.path.join(src, "link"))


def _new_empty_dir(src: str) -> None:
    os.makedirs(os.path.join(src, "empty/inner/deeper"))


def _remove_empty_dir(src: str) -> None:
    os.rmdir(os.path.join(src, "empty/inner"))


def _swap_file_for_dir(src: str) -> None:
    os.unlink(os.path.join(src, "src/pkg/__init__.py"))
    os.makedirs(os.path.join(src, "src/pkg/__init__.py"))


def _add_deep_file(src: str) -> None:
    Path(src, "empty/inner/new.txt").write_bytes(b"new")


@pytest.mark.parametrize("mutate", [_rewrite_same_size_and_mtime, _chmod, _rename,
                                    _file_to_link, _retarget_link, _new_empty_dir,
                                    _remove_empty_dir, _swap_file_for_dir, _add_deep_file])
def test_every_change_the_digest_covers_is_seen(store: agentwal.Store, src: str,
                                                tmp_path: Path,
                                                mutate: Callable[[str], None]) -> None:
    put(store, src)
    put(store, src)  # the directory records now stand for the directories
    mutate(src)
    put(store, src)
    assert restored(store, tmp_path, "out") == read(src)


def test_records_of_another_keys_tree_are_not_reused(store: agentwal.Store, src: str,
                                                     lookups: list[tuple[bytes, bytes]]
                                                     ) -> None:
    put(store, src, key="a")
    lookups.clear()
    put(store, src, key="b")  # the cache describes key a's tree: every file is looked up
    assert len(lookups) == 5
    with store.begin("r") as txn:  # key a goes; its tree's files stay b's
        txn.delete("a")
    store.compact(keep_last=1)
    store._engine.blobrefs.sweep()
    assert store.verify().ok


def test_a_fresh_directory_record_is_not_trusted(store: agentwal.Store, tmp_path: Path,
                                                 lookups: list[tuple[bytes, bytes]]) -> None:
    src = str(tmp_path / "fresh")
    build(src, SPEC)  # files modified just now: inside the racy window
    put(store, src)
    lookups.clear()
    put(store, src)
    assert len(lookups) == 5  # no directory record vouches for files this recent


def test_a_restore_records_the_tree_for_the_next_snapshot(store: agentwal.Store, src: str,
                                                          tmp_path: Path,
                                                          lookups: list[tuple[bytes, bytes]]
                                                          ) -> None:
    ws = agentwal.Workspace(store, "r", src, key="ws")
    before = ws.checkpoint()
    Path(src, "src/app.py").write_bytes(b"changed\n")
    ws.checkpoint()
    ws.rollback_to(before.id)
    assert read(src) == restored(store, tmp_path, "expected", at=before.id)
    age(src)  # the file the rollback wrote leaves the racy window
    ws.checkpoint()
    lookups.clear()
    Path(src, "src/pkg/mod.py").write_bytes(b"y = 1\n")
    ws.checkpoint()
    assert lookups == [(b"src/pkg", b"mod.py")]  # __init__.py: as the restore recorded it
    assert restored(store, tmp_path, "out") == read(src)


def test_a_restore_the_cache_vouches_for_still_repairs_local_edits(
        store: agentwal.Store, src: str, tmp_path: Path) -> None:
    first = put(store, src)
    put(store, src)  # the directory records now describe src exactly
    want = read(src)
    _rewrite_same_size_and_mtime(src)
    _chmod(src)
    Path(src, "empty/inner/stray.txt").write_bytes(b"stray")
    report = store.restore_tree("r", "ws", src, at=first.id)
    assert read(src) == want
    assert report.written == 1 and report.removed == 1


def test_a_restore_into_an_unchanged_directory_writes_nothing(store: agentwal.Store,
                                                              src: str) -> None:
    put(store, src)
    put(store, src)
    report = store.restore_tree("r", "ws", src)
    assert (report.written, report.removed) == (0, 0)
    assert report.unchanged == report.files == 6


def test_a_damaged_cache_file_costs_reads_only(store: agentwal.Store, src: str,
                                               tmp_path: Path, counting: None) -> None:
    put(store, src)
    cache_dir = Path(store.path, "cache")
    for f in cache_dir.iterdir():
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    n = files_read()
    put(store, src)
    assert files_read() == n + 5  # every file read again, the tree the same
    assert restored(store, tmp_path, "out") == read(src)


# -- status, and record sets of several trees ------------------------------------------


def _leaves(spec: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in spec.items() if v != ("d",)}


@pytest.mark.parametrize("mutate", [_rewrite_same_size_and_mtime, _chmod, _rename,
                                    _file_to_link, _retarget_link, _new_empty_dir,
                                    _remove_empty_dir, _swap_file_for_dir, _add_deep_file])
def test_status_stands_on_the_records_and_sees_every_change(
        store: agentwal.Store, src: str, lookups: list[tuple[bytes, bytes]],
        mutate: Callable[[str], None]) -> None:
    ws = agentwal.Workspace(store, "r", src, key="ws")
    ws.checkpoint()
    ws.checkpoint()  # the directory records now stand for the directories
    lookups.clear()
    assert not ws.status()
    assert lookups == []  # nothing looked up: every directory is the head's object
    old = _leaves(read(src))
    mutate(src)
    new = _leaves(read(src))
    got = ws.status()
    assert set(got.added) == new.keys() - old.keys()
    assert set(got.removed) == old.keys() - new.keys()
    assert set(got.modified) == {k for k in old.keys() & new.keys() if old[k] != new[k]}
    assert all(d in (b"", b"src", b"src/pkg", b"empty", b"empty/inner")
               for d, _name in lookups)  # at most the changed directory's files


def test_status_looks_only_into_the_changed_directory(store: agentwal.Store, src: str,
                                                      lookups: list[tuple[bytes, bytes]],
                                                      counting: None) -> None:
    ws = agentwal.Workspace(store, "r", src, key="ws")
    ws.checkpoint()
    ws.checkpoint()
    Path(src, "src/pkg/mod.py").write_bytes(b"x = 2\n" * 100)
    lookups.clear()
    first = files_read()
    got = ws.status()
    assert list(got.modified) == ["src/pkg/mod.py"] and not got.added and not got.removed
    assert lookups == [(b"src/pkg", b"mod.py")]  # __init__.py: from the head's object
    assert files_read() == first + 1  # the changed file is hashed, nothing else is read


def test_two_keys_alternating_on_one_directory_each_find_their_records(
        store: agentwal.Store, src: str, lookups: list[tuple[bytes, bytes]],
        counting: None) -> None:
    put(store, src, key="a")
    put(store, src, key="b")
    lookups.clear()
    put(store, src, key="a")
    put(store, src, key="b")
    assert lookups == []  # each key's tree has its own record set
    Path(src, "src/pkg/mod.py").write_bytes(b"x = 3\n" * 100)
    first = files_read()
    put(store, src, key="a")
    put(store, src, key="b")
    assert lookups == [(b"src/pkg", b"mod.py")] * 2  # __init__.py: from each key's object
    assert files_read() == first + 1  # b found the file a read in a's record set
    assert store.get("r", "a") == store.get("r", "b")
    with store.begin("r") as txn:  # key a goes; b's tree keeps every file
        txn.delete("a")
    store.compact(keep_last=1)
    store._engine.blobrefs.sweep()
    assert store.verify().ok


def test_a_snapshot_after_restoring_another_checkpoint_looks_only_where_it_wrote(
        store: agentwal.Store, src: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        lookups: list[tuple[bytes, bytes]], counting: None) -> None:
    no_racy_window(monkeypatch)  # what the restore writes is trusted at once
    ws = agentwal.Workspace(store, "r", src, key="ws")
    before = ws.checkpoint()
    Path(src, "src/app.py").write_bytes(b"print('changed')\n")
    ws.checkpoint()
    store.restore_tree("r", "ws", src, at=before.id)  # the files only, no rollback
    lookups.clear()
    first = files_read()
    ws.checkpoint()  # the head's record set, except where the restore wrote
    assert lookups == [(b"src", b"app.py")]
    assert files_read() == first  # its entry is in the restore's record set
    assert store.get("r", "ws") == store.state("r", at=before.id)["ws"]


def test_the_cache_keeps_the_newest_record_sets_only(
        store: agentwal.Store, src: str, monkeypatch: pytest.MonkeyPatch,
        lookups: list[tuple[bytes, bytes]]) -> None:
    no_racy_window(monkeypatch)  # records trusted at once
    keys = [f"k{i}" for i in range(tree_cache._CACHE_SETS + 1)]
    for key in keys:
        Path(src, "README.md").write_bytes(key.encode())  # a tree of its own for each
        put(store, src, key=key)
    lookups.clear()
    put(store, src, key=keys[1])  # README.md differs from k1's: its directory is looked up
    assert len(lookups) == 1
    lookups.clear()
    put(store, src, key=keys[0])  # evicted: no record stands for any directory
    assert len(lookups) == 5


def _set_files(store: agentwal.Store) -> list[Path]:
    return sorted(Path(store.path, "cache").iterdir())


def test_an_unchanged_snapshot_writes_no_record_set(store: agentwal.Store, src: str) -> None:
    put(store, src)
    put(store, src)
    [before] = _set_files(store)
    ino = before.stat().st_ino
    put(store, src)  # every record carried as read: the file is not rewritten
    [after] = _set_files(store)
    assert after == before and after.stat().st_ino == ino


def test_a_rehash_drops_every_other_record_set(store: agentwal.Store, src: str) -> None:
    put(store, src, key="a")
    Path(src, "README.md").write_bytes(b"b's\n")
    put(store, src, key="b")
    assert len(_set_files(store)) == 2
    put(store, src, key="a", rehash=True)  # no entry of any set survives a rehash
    assert len(_set_files(store)) == 1


def test_file_entries_written_as_cbor_by_earlier_releases_are_still_read(
        store: agentwal.Store, src: str, counting: None) -> None:
    put(store, src)
    for f in Path(store.path, "cache").iterdir():  # every record's file entries as CBOR
        data = f.read_bytes()
        obj = cbor2.loads(data[16:])
        for rec in obj[4].values():
            rec[7] = cbor2.dumps(tree_cache._decode_files(rec))
        body = cbor2.dumps(obj)
        f.write_bytes(hashlib.sha256(body).digest()[:16] + body)
    first = files_read()
    Path(src, "src/pkg/mod.py").write_bytes(b"x = 4\n" * 100)
    put(store, src)
    assert files_read() == first + 1  # __init__.py's CBOR entry vouched for it


def test_packed_file_entries_round_trip_and_a_damaged_one_is_empty() -> None:
    entries = {f"f{i}".encode(): [i, 10**18 + i, 10**18 - i, 2**40 + i,
                                   hashlib.sha256(b"%d" % i).digest(), 10**18 + 5]
               for i in range(20)}
    blob = tree_cache._encode_files(entries)
    record = [b"", 0, 0, b"", 0, 0, 0]
    assert tree_cache._decode_files([*record, blob]) == entries
    assert tree_cache._decode_files([*record, tree_cache._encode_files({})]) == {}
    assert tree_cache._decode_files([*record, blob[:-1]]) == {}  # torn: costs reads only
    # an entry a damaged set carried over is left out, the others kept
    bad = {**entries, b"bad": ["not", "an", "entry"]}
    assert tree_cache._decode_files([*record, tree_cache._encode_files(bad)]) == entries
