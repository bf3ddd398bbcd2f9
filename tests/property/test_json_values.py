"""The CLI's JSON for values round-trips: ``from_jsonable(json(jsonable(v)))`` is ``v``.

Every type the codec stores (the strategies of test_codec), read back from the
codec first, so the value is what a command actually prints; then through JSON
text and back, compared strictly (same types all the way down).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings

from agentwal.codec import decode_value, encode_value
from agentwal.types import BlobRef, TreeRef
from agentwal.views import from_jsonable, jsonable

from .test_codec import same, values


def through_json(v: Any) -> Any:
    return from_jsonable(json.loads(json.dumps(jsonable(v), sort_keys=True)))


@given(values)
@settings(max_examples=300)
def test_every_storable_value_round_trips_through_json(v: Any) -> None:
    stored = decode_value(encode_value("k", v))
    assert same(stored, through_json(stored)), (stored, jsonable(stored))


@pytest.mark.parametrize("v", [
    {"$bytes": "not bytes"}, {"$x": 1}, {"$dict": {"$dict": 2}}, {"$": None},
    {"$bytes": "AAE=", "other": 1}, [{"$set": []}], {("$a", 1): {"$uuid": "x"}},
    {1: "one", "1": "text one"}, {frozenset({(1, 2)}): {frozenset(): 0}},
])
def test_stored_data_never_reads_as_a_tag(v: Any) -> None:
    stored = decode_value(encode_value("k", v))
    assert same(stored, through_json(stored)), jsonable(stored)


def test_the_tags_are_the_documented_ones() -> None:
    import datetime as dt
    import decimal
    import uuid

    when = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert jsonable({"b": b"\x00\x01", "t": when, "d": decimal.Decimal("12.50"),
                     "u": uuid.UUID(int=7), "n": float("nan"), "s": {3, "a"},
                     "m": {(1, 2): "x"}, "e": {"$bytes": "no"}}) == {
        "b": {"$bytes": "AAE="}, "t": {"$datetime": "2024-05-01T12:00:00+02:00"},
        "d": {"$decimal": "12.50"}, "u": {"$uuid": "00000000-0000-0000-0000-000000000007"},
        "n": {"$float": "nan"}, "s": {"$set": ["a", 3]}, "m": {"$map": [[[1, 2], "x"]]},
        "e": {"$dict": {"$bytes": "no"}}}
    ref = BlobRef("ab" * 32, 5, "text/plain")
    assert jsonable(ref) == {"$blob": {"sha256": "ab" * 32, "size": 5,
                                       "media_type": "text/plain"}}
    assert through_json(ref) == ref
    tree = TreeRef("cd" * 32, 90)
    assert jsonable(tree) == {"$tree": {"sha256": "cd" * 32, "size": 90}}
    assert through_json(tree) == tree
    assert from_jsonable({**jsonable(tree), "files": []}) == tree  # `show` lists files beside


@pytest.mark.parametrize("bad", [
    {"$nope": 1}, {"$bytes": "not base64!"}, {"$datetime": "2024-05-01T12:00:00"},
    {"$datetime": 5}, {"$decimal": "twelve"}, {"$uuid": "x"}, {"$float": "1.5"},
    {"$set": [[1, {"a": 1}]]}, {"$map": [[1]]}, {"$blob": {"sha256": "x", "size": 1}},
    {"$dict": [1]},
])
def test_malformed_tags_are_a_value_error(bad: Any) -> None:
    with pytest.raises(ValueError):
        from_jsonable(bad)
