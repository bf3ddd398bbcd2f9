"""Issue #10, case 7: what cannot come back as it was put is refused; long keys are cut in messages.

A ``str``-subclass enum used to be stored and read back as a plain ``str``.
Now every value ``put`` accepts reads back with the same types (tuples as
lists and bytearrays as bytes, as documented), and subclasses of the scalar
types and enum members are refused at the call, naming what to store instead.
"""

from __future__ import annotations

import enum
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentwal
from agentwal.codec import check_value, decode_value, encode_value
from agentwal.errors import InvalidKeyError, UnencodableValueError


class Color(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Plain(enum.Enum):
    ONE = 1


class Name(str):
    pass


class Count(int):
    pass


@pytest.mark.parametrize("value", [Color.RED, Level.HIGH, Plain.ONE, Name("x"), Count(2),
                                   {"nested": [Color.RED]}, {Color.RED: 1}, (Level.HIGH,)],
                         ids=repr)
def test_values_that_would_change_type_are_refused(tmp_path: Path, value: object) -> None:
    with agentwal.open(tmp_path / "s") as store:
        with store.begin("r") as txn:
            with pytest.raises(UnencodableValueError) as info:
                txn["k"] = value
            assert "value" in str(info.value) or "plain" in str(info.value)
            txn["other"] = 1  # the transaction goes on; nothing of the refused put is in it
            assert "k" not in txn
        assert store.state("r") == {"other": 1}


def test_the_message_says_what_to_store(tmp_path: Path) -> None:
    with pytest.raises(UnencodableValueError, match=r"read back as a plain str: store its \.value"):
        check_value("k", Color.RED)
    with pytest.raises(UnencodableValueError, match=r"store int\(x\)"):
        check_value("k", Count(1))
    check_value("k", Color.RED.value)  # the plain value is fine


_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8),
                     st.binary(max_size=8), st.floats(allow_nan=False))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12)


def _types(v: object) -> object:
    if isinstance(v, dict):
        return ("dict", sorted((k, _types(x)) for k, x in v.items()))
    if isinstance(v, list):
        return ("list", [_types(x) for x in v])
    return type(v).__name__


@settings(max_examples=150, deadline=None)
@given(_values)
def test_what_is_accepted_reads_back_with_the_same_types(value: object) -> None:
    back = decode_value(encode_value("k", value))
    assert back == value and _types(back) == _types(value)


def test_a_long_invalid_key_is_cut_in_the_message(tmp_path: Path) -> None:
    with agentwal.open(tmp_path / "s") as store, store.begin("r") as txn, \
            pytest.raises(InvalidKeyError) as info:
        txn["k" * 1000] = 1
    message = str(info.value)
    assert len(message) < 250 and "(1000 characters)" in message and "over 400" in message
    assert info.value.key == "k" * 1000  # the attribute keeps it whole
