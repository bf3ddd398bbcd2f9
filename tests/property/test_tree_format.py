"""Property tests for tree objects: round trips, one encoding per tree, and safe decoding.

One-line properties: any directory of safe, distinct names round trips and
encodes the same whatever the order it was given in; any bytes decode to
checked entries or raise ``CodecError`` / ``UnsafeTreeError`` (a
``CorruptionError``), nothing else; and a decoded entry's name is always
safe to join to a destination path.
"""

from __future__ import annotations

import os

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from agentwal import UnsafeTreeError
from agentwal.codec import CodecError
from agentwal.format import TREE_DIR, TREE_FILE, TREE_LINK
from agentwal.tree import Entry, Root, decode_dir, decode_root, encode_dir, encode_root

names = st.binary(min_size=1, max_size=12).filter(
    lambda b: b not in (b".", b"..") and b"/" not in b and b"\0" not in b)
hexes = st.binary(min_size=32, max_size=32).map(bytes.hex)
sizes = st.integers(min_value=0, max_value=1 << 40)


@st.composite
def entries(draw: st.DrawFn) -> list[Entry]:
    chosen = draw(st.lists(names, unique=True, max_size=12))
    out = []
    for name in chosen:
        kind = draw(st.sampled_from([TREE_FILE, TREE_LINK, TREE_DIR]))
        if kind == TREE_FILE:
            out.append(Entry(name, TREE_FILE, draw(st.integers(0, 0o777)), draw(hexes),
                             draw(sizes)))
        elif kind == TREE_DIR:
            out.append(Entry(name, TREE_DIR, 0, draw(hexes), draw(sizes)))
        else:
            target = draw(st.binary(min_size=1, max_size=20).filter(lambda b: b"\0" not in b))
            out.append(Entry(name, TREE_LINK, 0, "", len(target), target))
    return out


@given(entries(), st.randoms(use_true_random=False))
def test_directory_objects_round_trip_with_one_encoding(es: list[Entry], rnd: object) -> None:
    data = encode_dir(es)
    shuffled = list(es)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert encode_dir(shuffled) == data
    assert decode_dir(data) == sorted(es, key=lambda e: e.name)


@given(hexes, sizes, sizes, sizes, st.lists(st.text(max_size=10), max_size=4), st.booleans())
def test_root_objects_round_trip(sha: str, size: int, files: int, nbytes: int,
                                 exclude: list[str], gitignore: bool) -> None:
    root = Root(sha, size, files, nbytes, tuple(exclude), gitignore)
    assert decode_root(encode_root(root)) == root


def _safe(name: bytes) -> bool:
    joined = os.path.normpath(os.path.join(b"/dest", name))
    return os.path.dirname(joined) == b"/dest"


@settings(max_examples=300)
@given(st.one_of(
    st.binary(max_size=200),
    st.lists(st.one_of(
        st.tuples(st.binary(max_size=6), st.just(TREE_FILE), st.integers(-1, 0o1000),
                  st.binary(min_size=31, max_size=33), st.integers(-1, 10)).map(list),
        st.tuples(st.binary(max_size=6), st.just(TREE_LINK), st.binary(max_size=4)).map(list),
        st.tuples(st.binary(max_size=6), st.sampled_from([TREE_DIR, 7]),
                  st.binary(min_size=32, max_size=32), st.integers(0, 9)).map(list),
    ), max_size=5).map(lambda items: cbor2.dumps(["awtree", 1, items])),
))
def test_any_bytes_give_safe_entries_or_a_typed_error(data: bytes) -> None:
    try:
        got = decode_dir(data)
    except (CodecError, UnsafeTreeError):
        return
    assert all(_safe(e.name) for e in got)
    assert len({e.name for e in got}) == len(got)
