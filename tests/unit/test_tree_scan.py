"""tree_scan: the C listing (agentwal/_treewalk.c) and its pure-Python twin give the
same listings, the signatures the stat cache always hashed, the same errors, and
leave no descriptor open; the walks map a listing's errors to their own."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentwal
from agentwal import tree_scan
from agentwal.errors import DiskFullError, RestoreError, TreeSourceError
from agentwal.tree_cache import _digest, _dir_sig, _file_sig, _link_sig
from tests.conftest import ext_required

needs_c = pytest.mark.skipif(not tree_scan.HAVE_EXTENSION and not ext_required(),
                             reason=f"the C walk: {tree_scan.WHY_NOT}")
Scan = Callable[..., tree_scan.Listing]


def test_the_c_walk_is_built_where_it_is_required() -> None:
    # CI (.ci/run) sets AGENTWAL_REQUIRE_EXT=1: an install that fell back to Python fails.
    if ext_required():
        assert tree_scan.HAVE_EXTENSION, tree_scan.WHY_NOT
        assert tree_scan.implementation() == "c"


# -- random trees: both give the same listing, and the signatures of before ---------------

_NAME = st.binary(min_size=1, max_size=12).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b".."))
_FILE = st.tuples(st.just("f"), st.binary(max_size=64), st.booleans())
_LINK = st.tuples(st.just("l"), st.binary(min_size=1, max_size=40).filter(
    lambda b: b"\0" not in b))
_LEAF = st.one_of(_FILE, _LINK, st.just(("p",)), st.just(("d", {})))
_TREE = st.recursive(st.dictionaries(_NAME, _LEAF, max_size=6),
                     lambda inner: st.dictionaries(_NAME, st.one_of(
                         _LEAF, st.tuples(st.just("d"), inner)), max_size=6), max_leaves=25)


def _make(top: bytes, tree: dict[bytes, tuple[object, ...]]) -> None:
    for name, what in tree.items():
        p = os.path.join(top, name)
        if what[0] == "f":
            with open(p, "wb") as f:
                f.write(what[1])  # type: ignore[arg-type]
            os.chmod(p, 0o755 if what[2] else 0o644)
        elif what[0] == "l":
            os.symlink(what[1], p)  # type: ignore[arg-type]
        elif what[0] == "p":
            os.mkfifo(p)
        else:
            os.mkdir(p)
            _make(p, what[1])  # type: ignore[arg-type]


def _dirs(top: bytes) -> Iterator[bytes]:
    for where, _dirnames, _files in os.walk(top):
        yield where


def _old_digest(where: bytes, skip: tuple[bytes, ...]) -> bytes:
    """A directory's digest as the walks computed it before the listing: os.lstat and
    tree_cache's signature functions, entry by entry."""
    sigs = []
    for name in os.listdir(where):
        if name in skip:
            continue
        p = os.path.join(where, name)
        st_ = os.lstat(p)
        if stat.S_ISREG(st_.st_mode):
            sigs.append(_file_sig(name, st_))
        elif stat.S_ISDIR(st_.st_mode):
            sigs.append(_dir_sig(name))
        elif stat.S_ISLNK(st_.st_mode):
            sigs.append(_link_sig(name, os.readlink(p)))
    return _digest(sigs)


@needs_c
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(tree=_TREE, data=st.data())
def test_c_and_python_give_the_same_listing_of_random_trees(
        tmp_path: Path, tree: dict[bytes, tuple[object, ...]], data: st.DataObject) -> None:
    top = os.path.join(os.fsencode(tmp_path), os.urandom(6).hex().encode())
    os.mkdir(top)
    _make(top, tree)
    for where in _dirs(top):
        names = sorted(os.listdir(where))
        skip = tuple(data.draw(st.lists(st.sampled_from(names), unique=True, max_size=2))
                     ) if names else ()
        c, py = tree_scan.c_scan(where, skip), tree_scan.py_scan(where, skip)
        assert c == py
        assert c.names == sorted(n for n in names if n not in skip)
        assert len(c.stats) == tree_scan.RECORD.size * len(c.names)
        assert not c.errors
        assert _digest([c.sigs]) == _old_digest(where, skip)
        assert tree_scan.without(tree_scan.c_scan(where), set(skip)) == c
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert tree_scan.c_scan(fd, skip) == c == tree_scan.py_scan(fd, skip)
            assert tree_scan.c_scan(fd, skip) == c  # the descriptor was left readable again
        finally:
            os.close(fd)
        _check_stats(where, c)
    # the whole-tree pass: some directories trusted as they are, some not, a stop name
    rels = [os.path.relpath(w, top) for w in _dirs(top)]
    keys = [b"" if r == b"." else r for r in rels]
    trusted = {k: _digest([tree_scan.py_scan(os.path.join(top, k) if k else top).sigs])
               for k in data.draw(st.lists(st.sampled_from(keys), unique=True))}
    trusted.update({k: os.urandom(16) for k in data.draw(st.lists(st.sampled_from(keys)))
                    if k not in trusted})
    stop = data.draw(st.sampled_from([None, next(iter(tree), None)]))
    store = data.draw(st.sampled_from([None, *keys[1:]]))
    c_walk = tree_scan._EXT.walk(top, (), trusted, store, stop)  # type: ignore[union-attr]
    py_walk = tree_scan.py_walk(top, (), trusted, store, stop)
    assert c_walk[0] == py_walk[0]
    assert {k: tree_scan.Listing(*v) for k, v in c_walk[1].items()} == py_walk[1]
    assert not c_walk[0] & c_walk[1].keys()


def _check_stats(where: bytes, c: tree_scan.Listing) -> None:
    for i, name in enumerate(c.names):
        got, real = tree_scan.stat_at(c, i), os.lstat(os.path.join(where, name))
        if stat.S_ISDIR(real.st_mode):
            assert got.st_mode == stat.S_IFDIR
            continue
        assert (got.st_size, got.st_mtime_ns, got.st_ctime_ns, got.st_ino, got.st_mode) == (
            real.st_size, real.st_mtime_ns, real.st_ctime_ns, real.st_ino, real.st_mode)


@needs_c
@given(st.binary(max_size=300))
def test_the_c_digest_is_sha256s(data: bytes) -> None:
    assert tree_scan._EXT is not None
    assert tree_scan._EXT.digest(data) == _digest([data])


# -- errors, descriptors, races -----------------------------------------------------------

IMPLS = [pytest.param(tree_scan.py_scan, id="python"),
         pytest.param(tree_scan.c_scan, id="c", marks=needs_c)]


def _error_cases(tmp_path: Path) -> list[object]:
    (tmp_path / "file").write_bytes(b"x")
    os.symlink("loop", tmp_path / "loop")
    fd_file = os.open(tmp_path / "file", os.O_RDONLY)
    closed = 900  # a descriptor number nothing has open
    while _is_open(closed):
        closed += 1
    return [os.fsencode(tmp_path / "missing"), os.fsencode(tmp_path / "file"),
            os.fsencode(tmp_path / "loop"), fd_file, closed]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _outcome(scan: Scan, where: object) -> tuple[type[BaseException], int | None]:
    with pytest.raises((OSError, ValueError)) as got:
        scan(where)
    exc = got.value
    return type(exc), exc.errno if isinstance(exc, OSError) else None


@needs_c
def test_both_raise_the_same_errors(tmp_path: Path) -> None:
    cases = _error_cases(tmp_path)
    try:
        outcomes = [(_outcome(tree_scan.c_scan, w), _outcome(tree_scan.py_scan, w))
                    for w in cases]
    finally:
        os.close(cases[3])  # type: ignore[arg-type]
    for c, py in outcomes:
        assert c == py
    assert [o[0] for o in outcomes] == [
        (FileNotFoundError, errno.ENOENT), (NotADirectoryError, errno.ENOTDIR),
        (OSError, errno.ELOOP), (NotADirectoryError, errno.ENOTDIR), (OSError, errno.EBADF)]
    for scan in (tree_scan.c_scan, tree_scan.py_scan):
        with pytest.raises(ValueError):
            scan(b"a\0b")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("scan", IMPLS)
def test_no_descriptor_is_left_open(tmp_path: Path, scan: Scan) -> None:
    _make(os.fsencode(tmp_path), {b"a": ("f", b"x", False), b"d": ("d", {}),
                                  b"l": ("l", b"a"), b"p": ("p",)})
    cases = _error_cases(tmp_path)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    before = _open_fds()
    for _ in range(50):
        scan(os.fsencode(tmp_path))
        scan(dfd, (b"a",))
        for where in cases:
            with pytest.raises(OSError):
                scan(where)
    assert _open_fds() == before
    os.close(dfd)
    os.close(cases[3])  # type: ignore[arg-type]


@pytest.mark.parametrize("scan", IMPLS)
def test_entries_vanishing_mid_scan_are_left_out(tmp_path: Path, scan: Scan) -> None:
    top = os.fsencode(tmp_path)
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            p = os.path.join(top, b"n%d" % (i % 40))
            if i % 3 == 0:
                os.symlink(b"t", p + b".l")
                os.unlink(p + b".l")
            elif i % 3 == 1:
                os.mkdir(p + b".d")
                os.rmdir(p + b".d")
            else:
                with open(p, "wb") as f:
                    f.write(b"x")
                os.unlink(p)
            i += 1

    for i in range(30):
        (tmp_path / f"keep{i}").write_bytes(b"k")
    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(300):
            ls = scan(top)
            assert not ls.errors
            assert sorted(f"keep{i}".encode() for i in range(30)) == [
                n for n in ls.names if n.startswith(b"keep")]
            assert ls.names == sorted(ls.names)
            assert len(ls.stats) == tree_scan.RECORD.size * len(ls.names)
            assert set(ls.dirs) <= set(ls.names)
    finally:
        stop.set()
        t.join()


@pytest.mark.skipif(os.geteuid() == 0, reason="root looks into directories whatever their mode")
@needs_c
def test_an_entry_that_cannot_be_stat_ed_is_an_error_of_the_listing(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").write_bytes(b"x")
    d.chmod(0o600)  # listable, not searchable: every lstat fails
    try:
        c, py = tree_scan.c_scan(os.fsencode(d)), tree_scan.py_scan(os.fsencode(d))
    finally:
        d.chmod(0o755)
    assert c == py
    assert c.errors == [(b"f", errno.EACCES, False)] and c.names == []


# -- the walks map a listing's errors to their own ---------------------------------------


def _patch(monkeypatch: pytest.MonkeyPatch, scan: Scan) -> None:
    """Every listing from ``scan`` (the whole-tree pass then knows nothing)."""
    monkeypatch.setattr(tree_scan, "_scan", scan)
    monkeypatch.setattr(tree_scan, "walk", lambda *args: (set(), {}))


def _with_error(link: bool) -> Scan:
    real = tree_scan._scan
    return lambda w, s=(): real(w, s)._replace(errors=[(b"bad", errno.EIO, link)])


def _failing_listing(monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    def scan(where: int | bytes, skip: tuple[bytes, ...] = ()) -> tree_scan.Listing:
        raise OSError(err, os.strerror(err))

    _patch(monkeypatch, scan)


def _put(store: agentwal.Store, src: Path) -> None:
    with store.begin("r") as txn:
        txn.put_tree("ws", src)


def _store_and_tree(tmp_path: Path) -> tuple[agentwal.Store, Path]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    store = agentwal.open(tmp_path / "s.awal", durability="none")
    with store.begin("r") as txn:
        txn.put_tree("ws", src)
    return store, src


@pytest.mark.usefixtures("walker")
def test_a_snapshot_maps_listing_errors_to_tree_source_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, src = _store_and_tree(tmp_path)
    try:
        _patch(monkeypatch, _with_error(False))
        with pytest.raises(TreeSourceError, match=r"bad.*cannot stat it: Input/output error"):
            _put(store, src)
        _patch(monkeypatch, _with_error(True))
        with pytest.raises(TreeSourceError, match="cannot read the link"):
            _put(store, src)
        _failing_listing(monkeypatch, errno.EACCES)
        with pytest.raises(TreeSourceError, match="cannot list it: Permission denied"):
            _put(store, src)
    finally:
        store.close()


@pytest.mark.usefixtures("walker")
def test_a_restore_maps_listing_errors_to_restore_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _src = _store_and_tree(tmp_path)
    dest = tmp_path / "dest"
    try:
        real = tree_scan._scan
        _patch(monkeypatch, _with_error(False))
        with pytest.raises(RestoreError, match="bad"):
            store.restore_tree("r", "ws", dest)
        _failing_listing(monkeypatch, errno.EACCES)
        with pytest.raises(RestoreError, match="Permission denied"):
            store.restore_tree("r", "ws", dest)
        _failing_listing(monkeypatch, errno.ENOSPC)
        with pytest.raises(DiskFullError):
            store.restore_tree("r", "ws", dest)
        monkeypatch.setattr(tree_scan, "_scan", real)
        store.restore_tree("r", "ws", dest)
        assert (dest / "a").read_bytes() == b"a"
    finally:
        store.close()


def test_use_names_the_implementations() -> None:
    before = tree_scan.implementation()
    try:
        tree_scan.use("python")
        assert tree_scan.implementation() == "python"
        with pytest.raises(ValueError):
            tree_scan.use("rust")
        if tree_scan.HAVE_EXTENSION:
            tree_scan.use("c")
            assert tree_scan.implementation() == "c"
        else:
            with pytest.raises(RuntimeError):
                tree_scan.use("c")
    finally:
        tree_scan.use(before)
