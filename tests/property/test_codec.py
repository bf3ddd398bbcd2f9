"""Property tests for the codec, the WAL reader and recovery planning.

Round trips: every value type the API promises (``DESIGN.md``, "Values")
comes back from ``encode_value``/``decode_value`` equal *and of the same
type* (tuples come back as lists, frozensets as sets; that is CBOR's data
model, documented here rather than hidden in ``==``). Deltas and commit
payloads round trip field for field, compressed or not.

One-line properties (after h11's fuzz test): any bytes give a value or
``CodecError``, nothing else; any bytes after a valid segment header give
frames and a clean/torn/corrupt verdict, never an exception; a damaged log
makes ``recovery.plan`` raise ``CorruptionError`` and nothing else; a damaged
WAL on disk makes ``agentwal.open`` either open (with a prefix of the
committed history) or raise ``CorruptionError``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import hashlib
import math
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest
import zstandard
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import agentwal
from agentwal.codec import (
    CodecError,
    CommitRecord,
    decode_commit,
    decode_delta,
    decode_value,
    encode_commit,
    encode_delta,
    encode_meta,
    encode_value,
)
from agentwal.errors import CorruptionError, UnencodableValueError
from agentwal.format import (
    COMPRESS_THRESHOLD,
    FLAG_ZSTD,
    MAX_CBOR_DEPTH,
    REC_COMMIT,
    SEGMENT_HEADER_SIZE,
    WAL_DIR,
    segment_name,
)
from agentwal.local.recovery import plan
from agentwal.local.wal.frame import SegmentHeader, encode_frame, encode_header, parse_header
from agentwal.local.wal.reader import SegmentFile, scan_segment
from agentwal.testing import crash as crash_store

# -- value strategies ---------------------------------------------------------------

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
big_ints = st.integers(min_value=-(2**200), max_value=2**200)
ints = st.one_of(st.integers(), big_ints, st.sampled_from([2**63, 2**64 - 1, 2**64, -(2**64) - 1]))
# Offsets strictly inside (-24h, 24h), down to the microsecond (CBOR tag 0 keeps them),
# except positive offsets under a minute: see test_sub_minute_positive_offset_reads_back.
_ONE_MINUTE = dt.timedelta(minutes=1)
offsets = st.one_of(
    st.just(dt.timezone.utc),
    st.builds(
        dt.timezone,
        st.timedeltas(min_value=dt.timedelta(hours=-23, minutes=-59),
                      max_value=dt.timedelta(hours=23, minutes=59)),
    ).filter(lambda tz: not dt.timedelta(0) < tz.utcoffset(None) < _ONE_MINUTE),
)
aware_datetimes = st.datetimes(timezones=offsets)
# Finite decimals (NaN / Infinity / the sign of zero are refused: see the tests below).
decimals = st.decimals(allow_nan=False, allow_infinity=False)
floats_hashable = st.floats(allow_nan=False)
uuids = st.uuids()

hashable_scalars = st.one_of(
    st.none(), st.booleans(), ints, floats_hashable, texts, st.binary(max_size=20),
    decimals, uuids, aware_datetimes,
)
hashables = st.recursive(
    hashable_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(tuple),
        st.frozensets(inner, max_size=3),
    ),
    max_leaves=6,
)
scalars = st.one_of(
    st.none(), st.booleans(), ints, st.floats(), texts, st.binary(max_size=40),
    decimals, uuids, aware_datetimes,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.one_of(texts, hashables), inner, max_size=4),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
    ),
    max_leaves=20,
)


def expected(v: Any, *, hashed: bool = False) -> Any:
    """What ``v`` decodes to: tuples become lists (except where they must be
    hashable: set members and map keys), frozensets become sets (likewise)."""
    if isinstance(v, tuple):
        items = [expected(x, hashed=hashed) for x in v]
        return tuple(items) if hashed else items
    if isinstance(v, list):
        return [expected(x, hashed=hashed) for x in v]
    if isinstance(v, (set, frozenset)):
        items = {expected(x, hashed=True) for x in v}
        return frozenset(items) if hashed else items
    if isinstance(v, dict):
        return {expected(k, hashed=True): expected(x, hashed=hashed) for k, x in v.items()}
    return v


def same(want: Any, got: Any) -> bool:
    """Strict equality: same types all the way down, NaN equals NaN, 0.0 is not -0.0."""
    if type(want) is not type(got):
        return False
    if isinstance(want, float):
        if math.isnan(want):
            return math.isnan(got)
        return want == got and math.copysign(1, want) == math.copysign(1, got)
    if isinstance(want, dt.datetime):
        return (want.utcoffset() == got.utcoffset()
                and want.replace(tzinfo=None) == got.replace(tzinfo=None))
    if isinstance(want, (list, tuple)):
        return len(want) == len(got) and all(same(a, b) for a, b in zip(want, got, strict=True))
    if isinstance(want, (set, frozenset)):
        if len(want) != len(got):
            return False
        by_value = {x: x for x in got}
        return all(x in by_value and same(x, by_value[x]) for x in want)
    if isinstance(want, dict):
        if len(want) != len(got):
            return False
        keys = {k: k for k in got}
        return all(k in keys and same(k, keys[k]) and same(v, got[k]) for k, v in want.items())
    return bool(want == got)


# -- value round trips --------------------------------------------------------------


@given(values)
@settings(max_examples=250)
def test_value_round_trip(v: Any) -> None:
    got = decode_value(encode_value("k", v))
    assert same(expected(v), got), (v, got)


@pytest.mark.parametrize(
    "v",
    [None, True, False, 0, -1, 2**64, -(2**64) - 1, 2**1000, -(2**1000), 0.0, -0.0,
     float("inf"), float("-inf"), 5e-324, "", "ünïcødé ✓", b"", b"\x00\xff",
     [], {}, set(), dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc),
     dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
     decimal.Decimal("1.50"), decimal.Decimal("-1E-1000"), uuid.UUID(int=0)],
    ids=repr,
)
def test_edge_value_round_trip(v: Any) -> None:
    assert same(expected(v), decode_value(encode_value("k", v)))


def test_nan_round_trips_as_nan() -> None:
    got = decode_value(encode_value("k", [float("nan")]))
    assert isinstance(got[0], float) and math.isnan(got[0])


def test_tuple_becomes_list_and_frozenset_becomes_set() -> None:
    assert decode_value(encode_value("k", (1, (2, 3)))) == [1, [2, 3]]
    assert type(decode_value(encode_value("k", frozenset({1})))) is set
    # ... but where hashability is needed they stay immutable
    assert decode_value(encode_value("k", {(1, 2): {(3,)}})) == {(1, 2): {(3,)}}


@pytest.mark.parametrize(
    "v",
    [dt.datetime(2020, 1, 1), object(), {"a": object()}, "\ud800", [1, {2: lambda: 0}]],
    ids=["naive-datetime", "object", "nested-object", "lone-surrogate", "lambda"],
)
def test_unencodable_values_raise_unencodable_value_error(v: Any) -> None:
    with pytest.raises(UnencodableValueError) as info:
        encode_value("the-key", v)
    assert "the-key" in str(info.value)


@pytest.mark.parametrize("text", ["NaN", "sNaN", "Infinity", "-Infinity"])
def test_decimal_specials_keep_their_type(text: str) -> None:
    try:
        data = encode_value("k", decimal.Decimal(text))
    except UnencodableValueError:
        return  # refusing them up front would be fine too
    got = decode_value(data)
    assert type(got) is decimal.Decimal, type(got)
    assert str(got) == text


def test_decimal_negative_zero_is_refused_or_keeps_its_sign() -> None:
    # Regression: Decimal('-0.00') used to come back as Decimal('0.00').
    try:
        data = encode_value("k", decimal.Decimal("-0.00"))
    except UnencodableValueError:
        return
    assert str(decode_value(data)) == "-0.00"


@pytest.mark.parametrize("offset", [dt.timedelta(seconds=30), dt.timedelta(microseconds=1)],
                         ids=["30s", "1us"])
def test_sub_minute_positive_offset_reads_back(offset: dt.timedelta) -> None:
    _accepted_reads_back(dt.datetime(2000, 1, 1, tzinfo=dt.timezone(offset)))


# Deep nesting: the decoder is bounded (MAX_CBOR_DEPTH), so encode_value must refuse
# (UnencodableValueError) whatever the decoder would refuse to read back.
_WRAP = {
    "list": lambda v: [v],
    "dict": lambda v: {"k": v},
    "tuple": lambda v: (v,),
    "key": lambda v: {v: 0},  # a map key (hashable values only)
    "frozenset": lambda v: frozenset({v}),  # (hashable values only)
}
_HASHABLE_WRAPS = ("tuple", "frozenset")


def _chain(inner: list[str], outer: list[str], leaf: Any = 0) -> Any:
    """``leaf`` wrapped in the ``inner`` kinds (hashable ones) and then ``outer`` kinds."""
    v = leaf
    for kind in [*inner, *outer]:
        v = _WRAP[kind](v)
    return v


@st.composite
def deep_values(draw: st.DrawFn, kinds: tuple[str, ...]) -> Any:
    """A chain of containers up to ~300 deep: a hashable core (tuples, frozensets,
    used as map keys) inside an outer chain (lists, dicts, tuples), cycled
    from short patterns so that depth, not variety, is what varies."""
    hashable = [k for k in _HASHABLE_WRAPS if k in kinds]
    inner: list[str] = []
    if hashable:
        pattern = draw(st.lists(st.sampled_from(hashable), min_size=1, max_size=3))
        m = draw(st.integers(0, 300))
        inner = [pattern[i % len(pattern)] for i in range(m)]
    outer_kinds = [k for k in ("list", "dict", "tuple", "key") if k in kinds]
    pattern = draw(st.lists(st.sampled_from(outer_kinds), min_size=1, max_size=3))
    n = draw(st.integers(0, 300))
    outer = [pattern[i % len(pattern)] for i in range(n)]
    if "key" in outer:  # a map key must be hashable: only as the first outer level
        outer = [k for k in outer if k != "key"]
        if draw(st.booleans()):
            outer = ["key", *outer]
    return _chain(inner, outer, draw(st.sampled_from([0, "s", decimal.Decimal("1.5")])))


def _accepted_reads_back(v: Any) -> None:
    try:
        data = encode_value("k", v)
    except UnencodableValueError:
        return  # refusing up front is fine
    assert same(expected(v), decode_value(data))


@given(deep_values(("list", "dict", "tuple")))
@settings(max_examples=150)
def test_every_accepted_deep_value_reads_back(v: Any) -> None:
    """(Sets and map keys have their own tests below.)"""
    _accepted_reads_back(v)


@pytest.mark.parametrize("depth", [MAX_CBOR_DEPTH - 10, MAX_CBOR_DEPTH, MAX_CBOR_DEPTH + 2, 1000])
@pytest.mark.parametrize("kind", ["list", "dict", "tuple"])
def test_every_accepted_deep_value_reads_back_at_the_limit(kind: str, depth: int) -> None:
    _accepted_reads_back(_chain([], [kind] * (depth - 1)))


def test_every_accepted_deeply_nested_set_reads_back() -> None:
    _accepted_reads_back(_chain(["frozenset"] * 200, []))


def test_every_accepted_deep_map_key_reads_back() -> None:
    _accepted_reads_back(_chain(["tuple"] * 300, ["key"]))


# -- deltas and commit payloads -----------------------------------------------------

keys = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@st.composite
def incompressible(draw: st.DrawFn, max_size: int = 600) -> bytes:
    n = draw(st.integers(0, max_size))
    return random.Random(draw(st.integers(0, 2**32))).randbytes(n)


delta_values = st.one_of(
    st.none(),
    st.binary(max_size=40),
    incompressible(),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=8), st.integers(1, 200)),
)
deltas = st.dictionaries(keys, delta_values, max_size=12)


@given(deltas)
@settings(max_examples=200)
def test_delta_round_trip(delta: dict[str, bytes | None]) -> None:
    blob, flags, digest = encode_delta(delta)
    raw = cbor2.dumps(delta)
    assert digest == hashlib.sha256(raw).digest()
    assert flags in (0, FLAG_ZSTD)
    if len(raw) < COMPRESS_THRESHOLD:
        assert flags == 0
    if flags:
        assert len(blob) < len(raw)
    else:
        assert blob == raw
    assert decode_delta(blob, flags) == delta


def test_delta_compressed_and_not() -> None:
    small = {"a": b"x"}
    big = {"a": b"x" * 5000, "b": None}
    noise = {"a": random.Random(1).randbytes(5000)}
    assert encode_delta(small)[1] == 0
    assert encode_delta(big)[1] == FLAG_ZSTD
    assert encode_delta(noise)[1] == 0  # compression that does not help is skipped
    for d in (small, big, noise, {}):
        blob, flags, _ = encode_delta(d)
        assert decode_delta(blob, flags) == d


meta_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), texts,
              st.floats(allow_nan=False), st.binary(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(texts, inner, max_size=3)),
    max_leaves=8,
)
commit_records = st.builds(
    CommitRecord,
    run=keys,
    id=st.integers(min_value=1, max_value=2**70),
    parent=st.one_of(st.none(), st.integers(min_value=0, max_value=2**70)),
    created_at=st.floats(allow_nan=False),
    meta=st.dictionaries(texts, meta_values, max_size=4).map(encode_meta),
    hash=st.binary(min_size=32, max_size=32),
    origin=st.one_of(st.none(), st.tuples(keys, st.integers(min_value=1, max_value=2**40))),
    delta=st.binary(max_size=200),
)


@given(commit_records)
@settings(max_examples=200)
def test_commit_round_trip(rec: CommitRecord) -> None:
    got = decode_commit(encode_commit(rec))
    assert got == rec
    assert type(got.created_at) is float


# -- any bytes: a value or CodecError -------------------------------------------------


def _mutate(data: bytes, draw: st.DrawFn) -> bytes:
    """Flip, truncate, zero-fill, overwrite or splice ``data`` a few times."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "truncate", "zero", "overwrite", "insert"]))
        n = len(buf)
        at = draw(st.integers(0, max(n - 1, 0)))
        if op == "flip" and n:
            buf[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del buf[at:]
        elif op == "zero":
            end = draw(st.integers(at, n))
            buf[at:end] = bytes(end - at)
        elif op == "overwrite":
            junk = draw(st.binary(min_size=1, max_size=9))
            buf[at : at + len(junk)] = junk
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=9))
    return bytes(buf)


@st.composite
def cbor_blobs(draw: st.DrawFn) -> bytes:
    """Arbitrary bytes, or a valid encoding (value, delta or commit) with damage."""
    kind = draw(st.sampled_from(["random", "value", "delta", "commit"]))
    if kind == "random":
        return draw(st.binary(max_size=64))
    if kind == "value":
        v = draw(values)
        try:
            data = encode_value("k", v)
        except UnencodableValueError:  # refused values still make fine raw bytes
            data = cbor2.dumps(v)
    elif kind == "delta":
        data = cbor2.dumps(draw(deltas))
    else:
        data = encode_commit(draw(commit_records))
    return _mutate(data, draw) if draw(st.booleans()) else data


@st.composite
def zstd_blobs(draw: st.DrawFn) -> bytes:
    """zstd frames of (possibly damaged) CBOR, possibly damaged themselves."""
    data = zstandard.ZstdCompressor(level=1).compress(draw(cbor_blobs()))
    return _mutate(data, draw) if draw(st.booleans()) else data


def _only_codec_error(fn: Any, *args: Any) -> None:
    with contextlib.suppress(CodecError):
        fn(*args)


@given(cbor_blobs())
@settings(max_examples=300)
def test_any_bytes_decode_value_gives_value_or_codec_error(data: bytes) -> None:
    _only_codec_error(decode_value, data)


@given(cbor_blobs())
@settings(max_examples=200)
def test_any_bytes_decode_delta_plain_gives_delta_or_codec_error(data: bytes) -> None:
    _only_codec_error(decode_delta, data, 0)


@given(st.one_of(zstd_blobs(), st.binary(max_size=64)))
@settings(max_examples=200)
def test_any_bytes_decode_delta_zstd_gives_delta_or_codec_error(data: bytes) -> None:
    _only_codec_error(decode_delta, data, FLAG_ZSTD)


@given(cbor_blobs())
@settings(max_examples=200)
def test_any_bytes_decode_commit_gives_record_or_codec_error(data: bytes) -> None:
    _only_codec_error(decode_commit, data)


# -- WAL segments ---------------------------------------------------------------------

STORE_ID = uuid.UUID(int=0xA11CE)
SALT = 0x5EED5EED


def _header(first_lsn: int, number: int = 0, salt: int = SALT) -> SegmentHeader:
    return SegmentHeader(STORE_ID, number, first_lsn, salt)


def _valid_payload(lsn: int) -> bytes:
    blob, _, _ = encode_delta({f"k{lsn}": encode_value("v", lsn), "gone": None})
    return encode_commit(CommitRecord("run", lsn, lsn - 1 or None, 1.0, encode_meta({}),
                                      bytes(32), None, blob))


@st.composite
def segment_images(draw: st.DrawFn, first_lsn: int = 1, number: int = 0
                   ) -> tuple[SegmentHeader, bytes, list[tuple[int, int, int]]]:
    """A valid segment: header, frames, zero padding. Returns the frames'
    ``(offset, end, synced_lsn)`` too."""
    header = _header(first_lsn, number)
    out = bytearray(encode_header(header))
    spans = []
    for i in range(draw(st.integers(0, 6))):
        lsn = first_lsn + i
        # synced LSN: anything below the record's own LSN (0 = nothing known durable)
        synced = draw(st.one_of(st.just(lsn - 1), st.integers(0, lsn - 1)))
        payload = (draw(st.binary(min_size=1, max_size=60)) if draw(st.integers(0, 9)) == 0
                   else _valid_payload(lsn))
        frame = encode_frame(SALT, lsn, synced, REC_COMMIT, 0, payload)
        spans.append((len(out), len(out) + len(frame), synced))
        out += frame
    out += bytes(draw(st.integers(0, 200)))
    return header, bytes(out), spans


@st.composite
def damage(draw: st.DrawFn, data: bytes) -> bytes:
    """Flip bits, truncate, or zero-fill ranges of a segment image (header spared)."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        n = len(buf)
        if n <= SEGMENT_HEADER_SIZE:
            break
        op = draw(st.sampled_from(["flip", "truncate", "zero"]))
        at = draw(st.integers(SEGMENT_HEADER_SIZE, n - 1))
        if op == "flip":
            buf[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del buf[at:]
        else:
            end = draw(st.integers(at, min(n, at + 64)))
            buf[at:end] = bytes(end - at)
    return bytes(buf)


def _check_scan_shape(data: bytes, header: SegmentHeader) -> Any:
    scan = scan_segment(data, header)
    assert scan.state in ("clean", "torn", "corrupt")
    assert [f.lsn for f in scan.frames] == list(
        range(header.first_lsn, header.first_lsn + len(scan.frames)))
    assert SEGMENT_HEADER_SIZE <= scan.end <= len(data)
    if scan.frames:
        assert scan.frames[-1].end == scan.end
    if scan.state == "clean":
        assert not data[scan.end :].strip(b"\x00")
    return scan


@given(st.binary(max_size=400), st.integers(1, 2**40))
@settings(max_examples=200)
def test_any_bytes_after_a_header_give_frames_or_a_verdict(tail: bytes, first_lsn: int) -> None:
    header = _header(first_lsn)
    _check_scan_shape(encode_header(header) + tail, header)


@given(st.data())
@settings(max_examples=200)
def test_mangled_segment_never_raises(data: st.DataObject) -> None:
    """Arbitrary damage (also inserting and splicing bytes): frames or a verdict."""
    header, image, _ = data.draw(segment_images())
    mangled = image[:SEGMENT_HEADER_SIZE] + _mutate(image[SEGMENT_HEADER_SIZE:], data.draw)
    _check_scan_shape(mangled, header)


@given(st.data())
@settings(max_examples=300)
def test_damaged_segment_verdict(data: st.DataObject) -> None:
    """Flip / truncate / zero-fill: the reader keeps exactly the undamaged prefix of
    frames, and calls the stop corrupt iff an intact later frame's synced LSN proves
    the first damaged record had been durable."""
    header, image, spans = data.draw(segment_images())
    damaged = data.draw(damage(image))
    scan = _check_scan_shape(damaged, header)

    def intact(span: tuple[int, int, int]) -> bool:
        start, end, _ = span
        return damaged[start:end] == image[start:end]

    k = next((i for i, sp in enumerate(spans) if not intact(sp)), len(spans))
    assert len(scan.frames) == k
    assert [f.offset for f in scan.frames] == [sp[0] for sp in spans[:k]]
    end = spans[k - 1][1] if k else SEGMENT_HEADER_SIZE
    lost_lsn = header.first_lsn + k
    proof = any(intact(sp) and sp[2] >= lost_lsn for sp in spans[k + 1 :])
    if not damaged[end:].strip(b"\x00"):
        want = "clean"
    elif proof:
        want = "corrupt"
    else:
        want = "torn"
    assert scan.state == want, (scan.state, scan.reason)
    event(f"verdict: {want}")


@st.composite
def segment_sets(draw: st.DrawFn) -> tuple[list[SegmentFile], int]:
    """Up to three consecutive segments, some damaged, and an applied LSN."""
    segs: list[SegmentFile] = []
    start = first = draw(st.integers(1, 5))
    for number in range(draw(st.integers(0, 3))):
        _, image, spans = draw(segment_images(first, number))
        if draw(st.integers(0, 2)) == 0:
            image = draw(damage(image))
        if draw(st.integers(0, 19)) == 0:  # now and then, damage the header too
            image = _mutate(image, draw)
        name = segment_name(first)
        parsed = parse_header(image)
        path = f"/wal/{name}"
        if isinstance(parsed, str):
            segs.append(SegmentFile(name, path, first, None, parsed, image))
        elif parsed.first_lsn != first:
            segs.append(SegmentFile(name, path, first, None, "first LSN mismatch", image))
        else:
            segs.append(SegmentFile(name, path, first, parsed, "", image))
        first += len(spans) + (draw(st.integers(0, 9)) == 0)  # now and then, a gap
    applied = draw(st.one_of(st.just(start - 1), st.integers(0, first + 1)))
    return segs, applied


@given(segment_sets(),
       st.integers(0, 9).map(lambda i: uuid.UUID(int=7) if i == 0 else STORE_ID))
@settings(max_examples=250)
def test_recovery_plan_raises_only_corruption_error(
    case: tuple[list[SegmentFile], int], store_id: uuid.UUID
) -> None:
    segs, applied = case
    try:
        p = plan(segs, applied, store_id)
    except CorruptionError as exc:
        event("plan: CorruptionError")
        assert exc.code
        return
    event(f"plan: {len(p.records)} records")
    lsns = [r.lsn for r in p.records]
    assert lsns == list(range(applied + 1, applied + 1 + len(lsns)))
    assert p.next_lsn == applied + 1 + len(lsns)


# -- the same through agentwal.open on a real directory --------------------------------

N_COMMITS = 8


@pytest.fixture(scope="module")
def wal_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict]]]:
    """A store whose every commit is still in one WAL segment, and the state after each."""
    path = tmp_path_factory.mktemp("tmpl") / "store.awal"
    # sync mode, so each frame's synced LSN proves its predecessors durable
    store = agentwal.open(path, durability="sync", segment_bytes=16384)
    states: list[dict[str, Any]] = [{}]
    for i in range(N_COMMITS):
        with store.begin("run") as txn:
            txn[f"k{i % 3}"] = [i, "x" * (i * 40)]
            if i % 4 == 3:
                del txn["k0"]
        states.append(store.state("run"))
    crash_store(store)  # no fold: everything stays in the WAL
    yield path, states


# function_scoped_fixture: tmp_path is shared by the examples on purpose; each one
# works in its own mkdtemp() below it.
@given(st.data())
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_open_damaged_wal_opens_a_prefix_or_raises_corruption(
    wal_template: tuple[Path, list[dict]], tmp_path: Path, data: st.DataObject
) -> None:
    template, states = wal_template
    case = Path(tempfile.mkdtemp(dir=tmp_path)) / "store.awal"
    shutil.copytree(template, case)
    seg = case / WAL_DIR / segment_name(1)
    image = seg.read_bytes()
    used = len(image.rstrip(b"\x00")) + 8
    damaged = data.draw(damage(image[:used])) + image[used:]
    assume(damaged != image)
    seg.write_bytes(damaged)
    try:
        store = agentwal.open(case, durability="none", segment_bytes=16384)
    except CorruptionError:
        event("refused: CorruptionError")
        return
    try:
        head = store.head("run")
        n = head.id if head is not None else 0
        event(f"opened with {n} of {N_COMMITS} commits")
        assert [c.id for c in store.history("run")] == list(range(n, 0, -1))
        if n:
            assert store.state("run") == states[n]
        with store.begin("run") as txn:  # and the log keeps working after repair
            txn["after"] = True
        assert store.state("run") == {**states[n], "after": True}
    finally:
        store.close()
    store = agentwal.open(case, durability="none", segment_bytes=16384)
    try:
        assert store.state("run") == {**states[n], "after": True}
    finally:
        store.close()
