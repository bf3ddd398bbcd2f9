"""tree.py: directory and root objects, name safety, gitignore rules, listing diffs."""

from __future__ import annotations

import cbor2
import pytest

from agentwal import GITIGNORE, UnsafeTreeError
from agentwal.codec import CodecError
from agentwal.format import TREE_DIR, TREE_FILE, TREE_LINK
from agentwal.tree import (
    Entry,
    IgnoreRules,
    Root,
    check_name,
    decode_dir,
    decode_root,
    diff_listings,
    encode_dir,
    encode_root,
    exclude_spec,
    split_relpath,
)

SHA = "ab" * 32


def f(name: bytes, size: int = 3, perm: int = 0o644, sha: str = SHA) -> Entry:
    return Entry(name, TREE_FILE, perm, sha, size)


# -- directory objects -----------------------------------------------------------------


def test_a_directory_object_round_trips_sorted_by_name_bytes() -> None:
    entries = [f(b"zeta"), Entry(b"sub", TREE_DIR, 0, "cd" * 32, 40),
               Entry(b"link", TREE_LINK, 0, "", 6, b"../x/y"), f("ü".encode(), perm=0o755)]
    data = encode_dir(entries)
    got = decode_dir(data)
    assert [e.name for e in got] == sorted(e.name for e in entries)
    assert set(got) == set(entries)
    assert encode_dir(reversed(entries)) == data  # one tree, one encoding


def test_an_empty_directory_is_an_object_too() -> None:
    assert decode_dir(encode_dir([])) == []


@pytest.mark.parametrize("name", [b"", b".", b"..", b"a/b", b"/etc", b"a\0b"])
def test_unsafe_names_are_refused_on_decode(name: bytes) -> None:
    data = cbor2.dumps(["awtree", 1, [[name, TREE_FILE, 0o644, bytes(32), 1]]])
    with pytest.raises(UnsafeTreeError):
        decode_dir(data)


def test_a_name_listed_twice_is_refused() -> None:
    # a link and a directory of one name: a path through the link could be written
    data = cbor2.dumps(["awtree", 1, [[b"a", TREE_LINK, b"/etc"],
                                       [b"a", TREE_DIR, bytes(32), 10]]])
    with pytest.raises(UnsafeTreeError, match="twice"):
        decode_dir(data)


def test_entries_out_of_order_or_non_canonical_are_corrupt() -> None:
    out_of_order = cbor2.dumps(["awtree", 1, [[b"b", TREE_LINK, b"x"], [b"a", TREE_LINK, b"x"]]])
    with pytest.raises(CodecError, match="order"):
        decode_dir(out_of_order)
    good = encode_dir([f(b"a")])
    with pytest.raises(CodecError):
        decode_dir(good + b"\x00")


@pytest.mark.parametrize("item", [
    [b"a", 9, b"x"],                          # unknown kind
    [b"a", TREE_FILE, 0o644, bytes(31), 1],   # short hash
    [b"a", TREE_FILE, 0o4755, bytes(32), 1],  # setuid bit
    [b"a", TREE_FILE, 0o644, bytes(32), -1],  # negative size
    [b"a", TREE_DIR, bytes(32)],              # missing size
    "not a list",
])
def test_malformed_entries_are_corrupt(item: object) -> None:
    with pytest.raises(CodecError):
        decode_dir(cbor2.dumps(["awtree", 1, [item]]))


@pytest.mark.parametrize("target", [b"", b"a\0b"])
def test_a_link_target_must_be_non_empty_without_nul(target: bytes) -> None:
    with pytest.raises(UnsafeTreeError):
        decode_dir(cbor2.dumps(["awtree", 1, [[b"l", TREE_LINK, target]]]))


def test_other_objects_are_not_directories() -> None:
    for obj in (["awtree", 2, []], ["awroot", 1, []], {"a": 1}, 5):
        with pytest.raises(CodecError):
            decode_dir(cbor2.dumps(obj))


def test_a_root_object_round_trips() -> None:
    root = Root(SHA, 120, 7, 4096, ("*.pyc", "build/"), True)
    assert decode_root(encode_root(root)) == root
    with pytest.raises(CodecError):
        decode_root(encode_dir([]))


# -- names and paths -------------------------------------------------------------------


def test_check_name_accepts_ordinary_and_non_utf8_names() -> None:
    for name in (b"a", b".hidden", b"...", b"\xff\xfe", "日本".encode()):
        assert check_name(name) == name
    with pytest.raises(UnsafeTreeError):
        check_name("str")


def test_split_relpath() -> None:
    assert split_relpath("a/b/c.txt") == ["a", "b", "c.txt"]
    assert split_relpath("./a//b") == ["a", "b"]
    for bad in ("/etc/passwd", "a/../b", "..", "", ".", "a\0b"):
        with pytest.raises(ValueError):
            split_relpath(bad)


# -- ignore rules ----------------------------------------------------------------------


@pytest.mark.parametrize(("patterns", "path", "is_dir", "ignored"), [
    (["*.pyc"], "a.pyc", False, True),
    (["*.pyc"], "deep/down/a.pyc", False, True),
    (["*.pyc"], "a.py", False, False),
    (["build/"], "build", True, True),
    (["build/"], "build", False, False),          # a file named build stays
    (["build/"], "src/build", True, True),        # no slash inside: any level
    (["/build"], "src/build", True, False),       # anchored at the top
    (["doc/*.txt"], "doc/a.txt", False, True),
    (["doc/*.txt"], "doc/sub/a.txt", False, False),  # * does not cross '/'
    (["doc/**/*.txt"], "doc/sub/deeper/a.txt", False, True),
    (["doc/**/*.txt"], "doc/a.txt", False, True),
    (["**/cache"], "x/y/cache", True, True),
    (["logs/**"], "logs/a/b", False, True),
    (["logs/**"], "logs", True, False),
    (["*.log", "!keep.log"], "keep.log", False, False),
    (["*.log", "!keep.log"], "other.log", False, True),
    (["!keep.log", "*.log"], "keep.log", False, True),  # the last match decides
    (["fil?.txt"], "file.txt", False, True),
    (["[ab].txt"], "b.txt", False, True),
    (["[!ab].txt"], "b.txt", False, False),
    (["[!ab].txt"], "c.txt", False, True),
    (["# comment", ""], "# comment", False, False),
    (["\\#hash"], "#hash", False, True),
    (["\\!bang"], "!bang", False, True),
    (["trailing   "], "trailing", False, True),
    (["a[b"], "a[b", False, True),                # an unclosed bracket is literal
    (["*"], "anything/at/all", False, True),
])
def test_gitignore_semantics(patterns: list[str], path: str, is_dir: bool, ignored: bool) -> None:
    assert IgnoreRules.of(patterns).ignored(path, is_dir) is ignored


def test_a_nested_gitignore_applies_below_its_directory_only() -> None:
    rules = IgnoreRules.of(["*.tmp"]).extended(["/local.cfg", "!important.tmp"], "sub")
    assert rules.ignored("sub/local.cfg", False)
    assert not rules.ignored("local.cfg", False)
    assert not rules.ignored("sub/deeper/local.cfg", False)  # anchored to sub/
    assert not rules.ignored("sub/important.tmp", False)
    assert rules.ignored("important.tmp", False)
    assert rules.ignored("sub/x.tmp", False)


def test_exclude_spec() -> None:
    assert exclude_spec(None) == ((), False)
    assert exclude_spec("*.o") == (("*.o",), False)
    assert exclude_spec(GITIGNORE) == ((), True)
    assert exclude_spec(["*.o", GITIGNORE, "tmp/"]) == (("*.o", "tmp/"), True)
    for bad in (b"*.o", 5, {"a": 1}, ["ok", 3]):
        with pytest.raises(TypeError):
            exclude_spec(bad)
    assert repr(GITIGNORE) == "agentwal.GITIGNORE"


def test_diff_listings() -> None:
    old = {"a": (TREE_FILE, 0o644, "1", 3), "b": (TREE_FILE, 0o644, "2", 4),
           "c": (TREE_FILE, 0o644, "3", 5)}
    new = {"a": (TREE_FILE, 0o644, "1", 3), "b": (TREE_FILE, 0o755, "2", 4),
           "d": (TREE_LINK, 0, "ff", 1)}
    d = diff_listings(old, new)
    assert d.added == {"d": 1} and d.removed == {"c": 5} and d.modified == {"b": (4, 4)}
    assert not diff_listings(old, old)
