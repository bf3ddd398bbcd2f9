"""txn.put_tree, store.restore_tree, store.open_tree_file, tree diffs, and trees in sweeps,
verify and backups, the way an agent's harness uses them."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentwal
from agentwal import failpoints
from agentwal.codec import encode_blob_ref
from agentwal.format import TREE_DIR, TREE_FILE, TREE_LINK, TREE_MEDIA_TYPE
from agentwal.local import blobs
from agentwal.tree import Entry, Root, encode_dir, encode_root
from agentwal.types import BlobRef
from tests.helpers import Generated
from tests.trees import Spec, build, read

# each test with the C walk and with its pure-Python twin (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("walker")

SPEC: Spec = {
    "README.md": b"# project\n",
    "src/app.py": b"print('hi')\n",
    "src/pkg/__init__.py": b"",
    "src/pkg/mod.py": b"x = 1\n" * 100,
    "bin/run": ("x", b"#!/bin/sh\necho run\n"),
    "empty": ("d",),
    "deep/er/still/empty": ("d",),
    "link-rel": ("l", b"src/app.py"),
    "link-abs": ("l", b"/etc/hostname"),
    "link-dangling": ("l", b"../nowhere"),
    "ünïcødé/日本語.txt": "名前".encode(),
}


def age(root: str, seconds: int = 60) -> None:
    """Set every file's mtime ``seconds`` into the past (older than the racy window)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                st = os.stat(p)
                os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 10**9))


def blob_files(store: agentwal.Store) -> dict[str, int]:
    root = os.path.join(store.path, "blobs")
    out = {}
    for d in os.listdir(root):
        if len(d) == 2:
            for n in os.listdir(os.path.join(root, d)):
                out[d + n] = os.path.getsize(os.path.join(root, d, n))
    return out


def put(store: agentwal.Store, src: str, run: str = "r", key: str = "ws",
        **kw: object) -> agentwal.Checkpoint:
    with store.begin(run) as txn:
        txn.put_tree(key, src, **kw)  # type: ignore[arg-type]
    assert txn.checkpoint is not None
    return txn.checkpoint


@pytest.fixture
def src(tmp_path: Path) -> str:
    p = str(tmp_path / "src")
    build(p, SPEC)
    return p


@pytest.fixture
def counting() -> Iterator[None]:
    failpoints.count_hits()
    yield
    failpoints.count_hits(False)


def files_read() -> int:
    return failpoints.hits().get("tree_after_file", 0)


# -- round trips -------------------------------------------------------------------------


def test_a_tree_round_trips(store: agentwal.Store, src: str, tmp_path: Path) -> None:
    os.makedirs(os.path.join(src, b"raw-\xff".decode("utf-8", "surrogateescape")))
    put(store, src)
    ref = store.get("r", "ws")
    assert isinstance(ref, agentwal.TreeRef)
    dest = str(tmp_path / "dest")
    report = store.restore_tree("r", "ws", dest)
    assert read(dest) == read(src)
    assert report.written == report.files == 9 and report.removed == 0
    assert os.stat(os.path.join(dest, "bin/run")).st_mode & 0o777 == 0o755
    again = store.restore_tree("r", "ws", dest)
    assert again.written == 0 and again.unchanged == 9


def test_a_large_file_is_streamed_in_bounded_memory(store: agentwal.Store,
                                                    tmp_path: Path) -> None:
    src = tmp_path / "big"
    src.mkdir()
    size = 24 << 20
    with open(src / "weights.bin", "wb") as f:
        g = Generated(size, seed=3)
        while chunk := g.read(1 << 20):
            f.write(chunk)
    tracemalloc.start()
    try:
        put(store, str(src))
        with store.open_tree_file("r", "ws", "weights.bin") as r:
            h = hashlib.sha256()
            while chunk := r.read(1 << 20):
                h.update(chunk)
        store.restore_tree("r", "ws", tmp_path / "out")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert h.hexdigest() == Generated.digest(size, seed=3)
    assert peak < 8 << 20  # a few chunks, never the file
    assert os.path.getsize(tmp_path / "out" / "weights.bin") == size


def test_open_tree_file_reads_one_file_at_a_checkpoint(store: agentwal.Store, src: str) -> None:
    first = put(store, src)
    Path(src, "src/app.py").write_bytes(b"print('bye')\n")
    put(store, src)
    with store.open_tree_file("r", "ws", "src/app.py") as f:
        assert f.read() == b"print('bye')\n"
    with store.open_tree_file("r", "ws", "./src//app.py", at=first.id) as f:
        assert f.read() == b"print('hi')\n"
    for bad, why in [("src", "directory"), ("link-rel", "link"), ("nope.txt", "not in"),
                     ("link-rel/x", "not a directory"), ("../etc/passwd", "not a path"),
                     ("/etc/passwd", "not a path"), ("", "not a path")]:
        with pytest.raises(agentwal.TreePathError, match=why):
            store.open_tree_file("r", "ws", bad)


def test_tree_and_blob_values_are_told_apart(store: agentwal.Store, src: str) -> None:
    with store.begin("r") as txn:
        txn.put_tree("ws", src)
        txn.put_blob("b", Generated(10))
        txn["v"] = 1
    with pytest.raises(agentwal.NotABlobError, match="TreeRef"):
        store.open_blob("r", "ws")
    for key, kind in (("b", "BlobRef"), ("v", "int")):
        with pytest.raises(agentwal.NotATreeError, match=kind):
            store.restore_tree("r", key, src)
        with pytest.raises(agentwal.NotATreeError):
            store.open_tree_file("r", key, "x")
    with pytest.raises(agentwal.MissingKeyError):
        store.restore_tree("r", "nope", src)
    with store.begin("r") as txn:
        with pytest.raises(ValueError, match="reserved"):
            txn.put_blob("x", Generated(3), media_type=TREE_MEDIA_TYPE)
        with pytest.raises(agentwal.UnencodableValueError):
            txn["copy"] = store.get("r", "ws")


def test_bad_sources_are_typed_errors_and_commit_nothing(store: agentwal.Store, src: str,
                                                         tmp_path: Path) -> None:
    put(store, src)
    head = store.head("r")
    (tmp_path / "file").write_text("x")
    with store.begin("r") as txn:
        for bad in (tmp_path / "missing", tmp_path / "file"):
            with pytest.raises(agentwal.TreeSourceError):
                txn.put_tree("ws", bad)
        with pytest.raises(TypeError):
            txn.put_tree("ws", src, exclude=5)
        txn["ok"] = True  # still usable
    assert store.get("r", "ws") == store.get("r", "ws", at=head.id)  # type: ignore[union-attr]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file_is_a_tree_source_error(store: agentwal.Store, src: str) -> None:
    p = os.path.join(src, "secret")
    Path(p).write_text("s")
    os.chmod(p, 0)
    with store.begin("r") as txn, pytest.raises(agentwal.TreeSourceError, match="secret"):
        txn.put_tree("ws", src)


# -- dedup and the stat cache ------------------------------------------------------------


def test_unchanged_files_and_subdirectories_add_no_stored_bytes(store: agentwal.Store,
                                                                src: str) -> None:
    put(store, src)
    before = blob_files(store)
    put(store, src)  # nothing changed
    assert blob_files(store) == before
    Path(src, "src/pkg/mod.py").write_bytes(b"x = 2\n")
    put(store, src)
    new = {k: v for k, v in blob_files(store).items() if k not in before}
    # the file, and the objects of src/pkg, src, the top, and the root: nothing else
    assert len(new) == 5
    assert hashlib.sha256(b"x = 2\n").hexdigest() in new
    assert sum(new.values()) < len(b"x = 2\n") + 4096


def test_the_stat_cache_spares_reading_unchanged_files(store: agentwal.Store, src: str,
                                                       counting: None) -> None:
    age(src)
    put(store, src)
    assert files_read() == 6
    put(store, src)
    assert files_read() == 6  # none read again
    p = Path(src, "src/app.py")
    st = p.stat()
    p.write_bytes(b"print('HI')\n")  # same size; put the mtime back: the ctime still moved
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    put(store, src)
    assert files_read() == 7
    with store.open_tree_file("r", "ws", "src/app.py") as f:
        assert f.read() == b"print('HI')\n"


def test_a_recently_modified_file_is_hashed_again_despite_the_cache(
        store: agentwal.Store, src: str, counting: None) -> None:
    put(store, src)  # fresh files: within the racy window
    n = files_read()
    put(store, src)  # hashed, found equal: nothing stored again
    assert files_read() == n
    assert store.head("r").id == 2  # type: ignore[union-attr]


def test_a_cached_file_whose_blob_was_swept_is_read_again(store: agentwal.Store, src: str,
                                                          counting: None) -> None:
    age(src)
    put(store, src)
    with store.begin("r") as txn:
        txn.delete("ws")
    store.compact(keep_last=1)
    store._engine.blobrefs.sweep()
    assert blob_files(store) == {}
    put(store, src)
    assert files_read() == 12
    assert store.verify().ok


# -- files changing during a snapshot ------------------------------------------------------


def test_a_file_changing_while_read_is_read_again(store: agentwal.Store,
                                                  tmp_path: Path) -> None:
    src = tmp_path / "one"
    build(str(src), {"mod.py": b"x = 1\n" * 1000})
    target = src / "mod.py"

    def scribble(_name: str) -> None:
        with open(target, "ab") as f:
            f.write(b"# appended during the read\n")

    # the append lands while the file is being read
    failpoints.arm("tree_after_read", "call", fn=scribble, nth=1)
    put(store, str(src))
    with store.open_tree_file("r", "ws", "mod.py") as f:
        got = f.read()
    assert got == target.read_bytes()  # the whole new content, never half of it
    assert got.endswith(b"# appended during the read\n")


def test_a_file_that_keeps_changing_fails_the_call_and_commits_nothing(
        store: agentwal.Store, src: str) -> None:
    target = Path(src, "src/pkg/mod.py")
    put(store, src)
    old = store.get("r", "ws")
    target.write_bytes(b"a new version, to be read")

    def scribble(_name: str) -> None:
        with open(target, "ab") as f:
            f.write(b"#")

    with store.begin("r") as txn:
        failpoints.arm("tree_after_read", "call", fn=scribble, times=1000)
        with pytest.raises(agentwal.TreeSourceError, match="kept changing"):
            txn.put_tree("ws", src)
        failpoints.disarm()
        assert txn.get("ws") == old
    assert store.head("r").id == 1  # type: ignore[union-attr]
    store._engine.blobrefs.sweep()  # what the failed call stored is garbage, and only that
    assert store.verify().ok


# -- restore ---------------------------------------------------------------------------------


def test_restore_makes_dest_exactly_the_tree(store: agentwal.Store, src: str,
                                             tmp_path: Path) -> None:
    first = put(store, src)
    dest = str(tmp_path / "dest")
    store.restore_tree("r", "ws", dest)
    build(dest, {"added.txt": b"new", "empty/now-full": b"x", "newdir/a/b": b"y"})
    os.remove(os.path.join(dest, "README.md"))
    os.remove(os.path.join(dest, "link-rel"))
    os.symlink("elsewhere", os.path.join(dest, "link-rel"))
    os.chmod(os.path.join(dest, "bin/run"), 0o644)
    Path(dest, "src/app.py").write_bytes(b"changed")
    os.remove(os.path.join(dest, "src/pkg/mod.py"))
    os.mkdir(os.path.join(dest, "src/pkg/mod.py"))  # a directory where a file was
    Path(dest, "src/pkg/mod.py/inner").write_text("z")
    os.rmdir(os.path.join(dest, "deep/er/still/empty"))
    report = store.restore_tree("r", "ws", dest, at=first.id)
    assert read(dest) == read(src)
    assert report.removed >= 4
    assert not [n for _d, _ds, fs in os.walk(dest) for n in fs if n.startswith(".awtmp-")]


def test_restore_never_follows_a_link_out_of_dest(store: agentwal.Store, tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    build(src, {"a/victim.txt": b"from the tree"})
    put(store, src)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_bytes(b"precious")
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "a")  # planted: a link where the tree has a directory
    store.restore_tree("r", "ws", dest)
    assert (outside / "victim.txt").read_bytes() == b"precious"
    assert not os.path.islink(dest / "a")
    assert read(str(dest)) == read(src)


def _forge(store: agentwal.Store, top: list[Entry], key: str = "evil") -> None:
    """Commit a hand-made tree (objects written straight to the blob store)."""
    b = store._engine._blobs
    data = encode_dir(top)
    obj = b.put_bytes(data)
    root = b.put_bytes(encode_root(Root(obj.sha256, obj.size, 1, 0)))
    with store.begin("r") as txn:
        txn._writes[key] = encode_blob_ref(BlobRef(root.sha256, root.size, TREE_MEDIA_TYPE))
    b.unpin([obj.sha256, root.sha256])


def _forge_raw(store: agentwal.Store, raw_top: bytes, key: str = "evil") -> None:
    b = store._engine._blobs
    obj = b.put_bytes(raw_top)
    root = b.put_bytes(encode_root(Root(obj.sha256, obj.size, 1, 0)))
    with store.begin("r") as txn:
        txn._writes[key] = encode_blob_ref(BlobRef(root.sha256, root.size, TREE_MEDIA_TYPE))
    b.unpin([obj.sha256, root.sha256])


@pytest.mark.parametrize("name", [b"..", b"../../etc", b"/etc/passwd", b"a/b", b"."])
def test_a_hostile_tree_is_refused_and_nothing_is_written(store: agentwal.Store,
                                                          tmp_path: Path, name: bytes) -> None:
    import cbor2

    content = store._engine._blobs.put_bytes(b"owned")
    raw = cbor2.dumps(["awtree", 1, [[b"fine", TREE_FILE, 0o644, bytes.fromhex(content.sha256),
                                      5], [name, TREE_FILE, 0o644,
                                           bytes.fromhex(content.sha256), 5]]])
    _forge_raw(store, raw)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep").write_text("k")
    with pytest.raises(agentwal.UnsafeTreeError):
        store.restore_tree("r", "evil", dest)
    assert read(str(dest)) == {"keep": ("f", 0o644 & os.stat(dest / "keep").st_mode, b"k")}
    assert not (tmp_path / "etc").exists()
    assert not store.verify().ok  # verify reports the forged object too


def test_a_link_and_a_directory_of_one_name_are_refused(store: agentwal.Store,
                                                        tmp_path: Path) -> None:
    import cbor2

    sub = store._engine._blobs.put_bytes(encode_dir([]))
    raw = cbor2.dumps(["awtree", 1, [[b"a", TREE_LINK, b"/tmp"],
                                      [b"a", TREE_DIR, bytes.fromhex(sub.sha256), sub.size]]])
    _forge_raw(store, raw)
    with pytest.raises(agentwal.UnsafeTreeError, match="twice"):
        store.restore_tree("r", "evil", tmp_path / "dest")
    assert not (tmp_path / "dest").exists() or not os.listdir(tmp_path / "dest")


def test_a_forged_but_well_formed_tree_restores(store: agentwal.Store, tmp_path: Path) -> None:
    content = store._engine._blobs.put_bytes(b"hello")
    _forge(store, [Entry(b"f", TREE_FILE, 0o600, content.sha256, 5)])
    store.restore_tree("r", "evil", tmp_path / "d")
    assert read(str(tmp_path / "d")) == {"f": ("f", 0o600, b"hello")}


# -- exclude rules -----------------------------------------------------------------------------


def test_exclude_patterns_skip_paths_and_restore_leaves_them_alone(store: agentwal.Store,
                                                                   src: str) -> None:
    build(src, {"build/out.o": b"obj", "x.pyc": b"c", "src/y.pyc": b"c", "keep.pyc": b"k"})
    put(store, src, exclude=["build/", "*.pyc", "!keep.pyc"])
    ref = store._engine.blobrefs.stored_ref("r", "ws", None, "")[1]
    listing = store._engine._trees.listing(ref)  # type: ignore[arg-type]
    assert "keep.pyc" in listing
    assert not {"build/out.o", "x.pyc", "src/y.pyc"} & listing.keys()
    Path(src, "x.pyc").write_text("changed, still excluded")
    Path(src, "stray.txt").write_text("not excluded: removed")
    store.restore_tree("r", "ws", src)
    assert Path(src, "x.pyc").read_text() == "changed, still excluded"
    assert Path(src, "build/out.o").exists()
    assert not Path(src, "stray.txt").exists()


def test_gitignore_files_are_honoured_when_asked(store: agentwal.Store, src: str) -> None:
    build(src, {".gitignore": b"*.log\n/dist/\n", "a.log": b"l", "dist/x": b"d",
                "sub/.gitignore": b"!keep.log\nlocal\n", "sub/keep.log": b"k",
                "sub/local": b"L", "sub/dist/y": b"stays: /dist/ is anchored",
                ".git/HEAD": b"ref: refs/heads/main\n"})
    put(store, src, exclude=agentwal.GITIGNORE)
    ref = store._engine.blobrefs.stored_ref("r", "ws", None, "")[1]
    assert ref is not None
    got = set(store._engine._trees.listing(ref))
    assert {".gitignore", "sub/.gitignore", "sub/keep.log", "sub/dist/y"} <= got
    assert not {"a.log", "dist/x", "sub/local", ".git/HEAD"} & got
    Path(src, "sub/local").write_text("edited")
    store.restore_tree("r", "ws", src)  # ignored paths and .git are left alone
    assert Path(src, "sub/local").read_text() == "edited"
    assert Path(src, ".git/HEAD").exists() and Path(src, "a.log").exists()
    put(store, src)  # without: everything
    assert store.diff("r", 1, 2).trees["ws"].added.keys() >= {"a.log", ".git/HEAD"}


def test_a_store_inside_the_tree_is_skipped_and_never_removed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    build(str(ws), {"a.txt": b"a"})
    with agentwal.open(ws / ".agentwal", durability="none") as store:
        put(store, str(ws))
        ref = store._engine.blobrefs.stored_ref("r", "ws", None, "")[1]
        assert set(store._engine._trees.listing(ref)) == {"a.txt"}  # type: ignore[arg-type]
        store.restore_tree("r", "ws", ws)
        assert (ws / ".agentwal").is_dir()
        assert store.get("r", "ws") == store.get("r", "ws", at=1)


# -- diffs ---------------------------------------------------------------------------------------


def test_diff_lists_file_changes_of_tree_values(store: agentwal.Store, src: str) -> None:
    with store.begin("r") as txn:
        txn["ws"] = "not a tree yet"
    put(store, src)
    Path(src, "README.md").write_bytes(b"# renamed project\n")
    os.remove(os.path.join(src, "src/app.py"))
    Path(src, "NEW").write_bytes(b"12345")
    put(store, src)
    d = store.diff("r", 2, 3)
    td = d.trees["ws"]
    assert td.added == {"NEW": 5}
    assert td.removed == {"src/app.py": len(b"print('hi')\n")}
    assert td.modified == {"README.md": (10, 18)}
    assert len(store.diff("r", 1, 2).trees["ws"].added) == 9  # from a plain value
    assert not store.diff("r", 3, 3).trees


# -- sweeps, retention, verify, backup ---------------------------------------------------------


def test_compaction_releases_only_the_files_dropped_checkpoints_used(
        store: agentwal.Store, src: str, tmp_path: Path) -> None:
    put(store, src)
    Path(src, "only-in-1.txt").write_bytes(b"dropped with checkpoint 2")
    put(store, src)
    os.remove(os.path.join(src, "only-in-1.txt"))
    Path(src, "README.md").write_bytes(b"v3")
    put(store, src)
    gone = hashlib.sha256(b"dropped with checkpoint 2").hexdigest()
    kept = hashlib.sha256(SPEC["src/app.py"]).hexdigest()  # type: ignore[arg-type]
    assert gone in blob_files(store)
    store.compact(keep_last=1)
    store._engine.blobrefs.sweep()
    files = blob_files(store)
    assert gone not in files and kept in files
    assert hashlib.sha256(b"# project\n").hexdigest() not in files  # the old README
    store.restore_tree("r", "ws", tmp_path / "after")
    assert read(str(tmp_path / "after")) == read(src)
    assert store.verify().ok


def test_verify_checks_every_tree_object_and_file(store: agentwal.Store, src: str) -> None:
    put(store, src)
    report = store.verify()
    assert report.ok
    # 7 distinct file contents + 1 empty file, 9 directory objects, 1 root
    assert report.checked["blobs"] >= 15
    victim = hashlib.sha256(SPEC["src/app.py"]).hexdigest()  # type: ignore[arg-type]
    p = os.path.join(store.path, "blobs", victim[:2], victim[2:])
    os.chmod(p, 0o644)
    with open(p, "r+b") as f:
        f.write(b"P")
    bad = store.verify()
    assert not bad.ok and any(victim[2:] in pr.file for pr in bad.problems)


def test_verify_reports_a_missing_tree_object_and_checks_the_rest(store: agentwal.Store,
                                                                  src: str) -> None:
    put(store, src)
    ref = store._engine.blobrefs.stored_ref("r", "ws", None, "")[1]
    root, dirs = store._engine._trees.load(ref)  # type: ignore[arg-type]
    sub = next(e for e in dirs[root.sha256] if e.name == b"src")
    os.remove(os.path.join(store.path, "blobs", sub.sha256[:2], sub.sha256[2:]))
    report = store.verify()
    assert not report.ok
    assert any("missing" in pr.what for pr in report.problems)
    assert report.checked["blobs"] > 3
    store.close()
    with agentwal.open(store.path) as again, pytest.raises(agentwal.CorruptionError):
        again._engine.blobrefs.sweep()  # a sweep does not guess what a missing object named


def test_a_backup_holds_the_trees(store: agentwal.Store, src: str, tmp_path: Path) -> None:
    put(store, src)
    store.backup(tmp_path / "copy")
    with agentwal.open(tmp_path / "copy", readonly=True) as copy:
        assert copy.verify().ok
        copy.restore_tree("r", "ws", tmp_path / "from-backup")
    assert read(str(tmp_path / "from-backup")) == read(src)


def test_blob_chunk_size_does_not_matter(monkeypatch: pytest.MonkeyPatch,
                                         store: agentwal.Store, src: str,
                                         tmp_path: Path) -> None:
    monkeypatch.setattr(blobs, "CHUNK", 7)
    put(store, src)
    store.restore_tree("r", "ws", tmp_path / "d")
    assert read(str(tmp_path / "d")) == read(src)


# -- files of the key's current tree are not pinned: the commit's conflict check covers them --


def test_a_tree_whose_base_was_replaced_and_swept_cannot_commit(store: agentwal.Store,
                                                                src: str) -> None:
    age(src)
    put(store, src)
    Path(src, "new.txt").write_text("only in the new tree")
    txn = store.begin("r")
    txn.put_tree("ws", src)  # the unchanged files are the current tree's: not pinned
    with store.begin("r") as other:  # meanwhile the key is replaced, its tree dropped
        other.delete("ws")
    store.compact(keep_last=1)
    store._engine.blobrefs.sweep()
    with pytest.raises(agentwal.ConflictError):
        txn.commit()
    assert store.verify().ok  # no reference to a swept file was committed


def test_a_tree_whose_base_stays_commits_whole_after_a_sweep(store: agentwal.Store, src: str,
                                                             tmp_path: Path) -> None:
    age(src)
    put(store, src)
    Path(src, "new.txt").write_text("only in the new tree")
    with store.begin("r") as txn:
        txn.put_tree("ws", src)
        with store.begin("r") as other:  # another key of the run: no conflict
            other["note"] = "hi"
        store.compact(keep_last=1)
        store._engine.blobrefs.sweep()
    store.restore_tree("r", "ws", tmp_path / "d")
    assert read(str(tmp_path / "d")) == read(src)
    assert store.verify().ok


def test_a_tree_entry_where_the_store_lives_is_refused(tmp_path: Path) -> None:
    ws, other = tmp_path / "ws", tmp_path / "other"
    build(str(ws), {"a.txt": b"a"})
    build(str(other), {".agentwal": b"a file named like the store", "b/c": b"c"})
    with agentwal.open(ws / ".agentwal", durability="none") as store:
        put(store, str(other))
        with pytest.raises(agentwal.RestoreError, match="store"):
            store.restore_tree("r", "ws", ws)
        assert (ws / ".agentwal").is_dir() and store.verify().ok
        build(str(ws), {"b/.agentwal-not": b"x"})
        put(store, str(ws), key="self")  # its own tree skips it: restoring it is fine
        store.restore_tree("r", "self", ws)
        assert (ws / ".agentwal").is_dir()


def test_snapshots_and_restores_race_sweeps_safely(store: agentwal.Store, tmp_path: Path) -> None:
    """One thread snapshots a changing tree, another restores old checkpoints, a third
    compacts and sweeps; every committed tree stays whole."""
    import threading

    src = tmp_path / "src"
    build(str(src), {f"d{i % 4}/f{i}": b"%d" % i * 200 for i in range(40)})
    errors: list[BaseException] = []
    stop = threading.Event()
    committed: list[int] = []

    def snapshots() -> None:
        try:
            for n in range(12):
                Path(src, f"d{n % 4}/f{n}").write_bytes(b"v%d" % n * 300)
                Path(src, f"new{n % 5}").write_bytes(b"n%d" % n)
                committed.append(put(store, str(src)).id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    def restores() -> None:
        try:
            while not stop.wait(0.002):
                if committed:
                    with contextlib.suppress(agentwal.CheckpointNotFoundError):
                        store.restore_tree("r", "ws", tmp_path / "out", at=committed[-1])
        except BaseException as exc:
            errors.append(exc)

    def sweeps() -> None:
        try:
            while not stop.wait(0.005):
                store.compact(keep_last=2)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (snapshots, restores, sweeps)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    store.restore_tree("r", "ws", tmp_path / "final")
    assert read(str(tmp_path / "final")) == read(str(src))
    store.compact(keep_last=2)
    assert store.verify().ok
