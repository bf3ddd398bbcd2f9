"""The pure effect policy: decision table, keys, ledger-entry encoding."""

from __future__ import annotations

import itertools
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentwal import NOT_APPLIED, UNKNOWN, EffectMode
from agentwal.codec import CodecError, encode_value
from agentwal.effects import (
    CALL,
    DIVERGED,
    IN_DOUBT,
    NOT_APPLIED_ERR,
    PROBE,
    RETURN,
    STATUSES,
    EffectRecord,
    after_probe,
    args_digest,
    decide,
    decode_entry,
    decode_outbox,
    derive_key,
    effect_id_for,
    encode_entry,
    encode_outbox,
    outbox_entries,
    outstanding,
)

AMO, ALO, EO = EffectMode.AT_MOST_ONCE, EffectMode.AT_LEAST_ONCE, EffectMode.EXACTLY_ONCE
DIGEST = args_digest(encode_value("args", {"n": 1}))


def entry(status: str, mode: EffectMode = ALO, **kw: object) -> EffectRecord:
    fields: dict[str, object] = dict(
        effect_id="ef-1", key="k", name="op", mode=mode, run="r", checkpoint=0, ordinal=0,
        deferred=False, status=status, attempts=1, args={"n": 1}, args_digest=DIGEST)
    fields.update(kw)
    return EffectRecord(**fields)  # type: ignore[arg-type]


def go(e: EffectRecord | None, mode: EffectMode, *, probe: bool = False,
       idempotent: bool = False, name: str = "op", digest: str = DIGEST) -> str:
    return decide(e, name=name, digest=digest, mode=mode, has_probe=probe,
                  idempotent=idempotent)


# -- the decision table, cell by cell (docs/effects.md and effects.py's docstring) ----

@pytest.mark.parametrize("mode", list(EffectMode))
def test_no_entry_calls(mode: EffectMode) -> None:
    assert go(None, mode) == CALL


@pytest.mark.parametrize("mode", list(EffectMode))
@pytest.mark.parametrize("status", ["done", "resolved"])
def test_settled_returns_without_a_call(mode: EffectMode, status: str) -> None:
    assert go(entry(status, mode), mode, probe=True, idempotent=True) == RETURN


@pytest.mark.parametrize("mode", list(EffectMode))
def test_pending_outbox_entry_calls(mode: EffectMode) -> None:
    assert go(entry("pending", mode, attempts=0), mode) == CALL


@pytest.mark.parametrize("status", ["in_doubt", "failed"])
def test_in_doubt_per_mode(status: str) -> None:
    assert go(entry(status, AMO), AMO) == IN_DOUBT
    assert go(entry(status, AMO), AMO, probe=True) == PROBE
    assert go(entry(status, ALO), ALO) == CALL
    assert go(entry(status, ALO), ALO, probe=True) == PROBE
    assert go(entry(status, EO), EO) == IN_DOUBT
    assert go(entry(status, EO), EO, idempotent=True) == CALL
    assert go(entry(status, EO), EO, probe=True, idempotent=True) == PROBE


def test_not_applied_per_mode() -> None:
    assert go(entry("not_applied", AMO), AMO, probe=True) == NOT_APPLIED_ERR
    assert go(entry("not_applied", ALO), ALO) == CALL
    assert go(entry("not_applied", EO), EO, idempotent=True) == CALL


@pytest.mark.parametrize("status", [s for s in STATUSES if s != "retired"])
def test_divergence_wins_over_every_status(status: str) -> None:
    e = entry(status, ALO)
    assert go(e, ALO, name="other") == DIVERGED
    assert go(e, ALO, digest=args_digest(encode_value("a", {"n": 2}))) == DIVERGED
    assert go(e, EO, idempotent=True) == DIVERGED  # the mode is part of the record


@pytest.mark.parametrize("mode", list(EffectMode))
def test_a_retired_entry_is_a_fresh_call_whatever_was_recorded(mode: EffectMode) -> None:
    e = entry("retired", ALO)  # set aside by retire_effect: its position is free
    assert go(e, mode, name="other", probe=True, idempotent=True) == CALL
    assert go(e, mode, digest=args_digest(encode_value("a", {"n": 2})), probe=True,
              idempotent=True) == CALL


def test_after_probe_table() -> None:
    result = {"ok": True}
    for mode, idem in itertools.product(EffectMode, (False, True)):
        assert after_probe(result, mode, idem) == RETURN
        assert after_probe(None, mode, idem) == RETURN  # None is a result, not "unknown"
    assert after_probe(NOT_APPLIED, AMO, False) == NOT_APPLIED_ERR
    assert after_probe(NOT_APPLIED, ALO, False) == CALL
    assert after_probe(NOT_APPLIED, EO, False) == CALL
    assert after_probe(UNKNOWN, AMO, True) == IN_DOUBT
    assert after_probe(UNKNOWN, ALO, False) == CALL
    assert after_probe(UNKNOWN, EO, False) == IN_DOUBT
    assert after_probe(UNKNOWN, EO, True) == CALL


def test_outstanding() -> None:
    assert outstanding(entry("pending")) and outstanding(entry("failed"))
    assert outstanding(entry("in_doubt"))
    assert not outstanding(entry("done")) and not outstanding(entry("resolved"))
    assert not outstanding(entry("not_applied", AMO))
    assert outstanding(entry("not_applied", ALO))  # an operator said: it never happened


def test_sentinels_repr() -> None:
    assert repr(NOT_APPLIED) == "agentwal.NOT_APPLIED" and repr(UNKNOWN) == "agentwal.UNKNOWN"
    assert NOT_APPLIED is not UNKNOWN


# -- keys ------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=40)


@given(names, names, st.integers(0, 2**40), st.integers(0, 1000), st.booleans())
def test_derived_keys_are_short_ascii_and_deterministic(run: str, name: str, ckpt: int,
                                                        n: int, deferred: bool) -> None:
    sid = uuid.UUID(int=7)
    k = derive_key(sid, run, ckpt, name, n, deferred=deferred)
    assert k.isascii() and len(k) <= 64
    assert k == derive_key(sid, run, ckpt, name, n, deferred=deferred)
    assert k != derive_key(sid, run, ckpt + 1, name, n, deferred=deferred)
    assert k != derive_key(sid, run, ckpt, name, n + 1, deferred=deferred)
    assert k != derive_key(uuid.UUID(int=8), run, ckpt, name, n, deferred=deferred)
    assert k != derive_key(sid, run + "x", ckpt, name, n, deferred=deferred)
    assert k != derive_key(sid, run, ckpt, name, n, deferred=not deferred)
    assert effect_id_for(k) == effect_id_for(k) and effect_id_for(k) != effect_id_for(k + "x")


# -- encoding --------------------------------------------------------------------------

def test_entry_round_trip() -> None:
    e = entry("done", EO, result={"receipt": b"\x00\x01", "tags": {1, 2}}, error=None,
              idempotent=True, created_at=1.5, updated_at=2.5, resolved_by="ops@host pid 1",
              order=(7, 2), ordinal=None, deferred=True, resolved_at=3.0)
    assert decode_entry(encode_entry(e)) == e


@pytest.mark.parametrize("damage", [
    lambda m: m.pop("status"),
    lambda m: m.update(status="exploded"),
    lambda m: m.update(mode="twice"),
    lambda m: m.update(attempts="1"),
    lambda m: m.update(order=[1]),
    lambda m: m.update(v=2),
    lambda m: m.update(args="not bytes"),
])
def test_malformed_entries_are_codec_errors(damage: object) -> None:
    import cbor2

    m = cbor2.loads(encode_entry(entry("done")))
    damage(m)  # type: ignore[operator]
    with pytest.raises(CodecError):
        decode_entry(cbor2.dumps(m))


def test_outbox_round_trip_and_entries() -> None:
    items = [("mail", "at_least_once", encode_value("a", {"to": "x"}), None, False),
             ("mail", "at_most_once", encode_value("a", 2), None, False),
             ("pay", "exactly_once", encode_value("a", 3), "order-9", True)]
    assert decode_outbox(encode_outbox(items)) == items
    made = outbox_entries(uuid.UUID(int=1), "r", 4, 10.0, 99, items)
    assert [e.order for e in made] == [(99, 0), (99, 1), (99, 2)]
    assert made[0].key != made[1].key  # same name, next ordinal
    assert made[2].key == "order-9" and made[2].idempotent
    assert all(e.status == "pending" and e.attempts == 0 and e.deferred for e in made)
    assert made == outbox_entries(uuid.UUID(int=1), "r", 4, 10.0, 99, items)  # replay agrees
    with pytest.raises(CodecError):
        decode_outbox(encode_outbox([("mail", "sometimes", b"\xf6", None, False)]))


def test_entry_without_later_optional_fields_decodes() -> None:
    import cbor2

    m = cbor2.loads(encode_entry(entry("done")))
    del m["resolved_at"]  # entries written before the field existed
    assert decode_entry(cbor2.dumps(m)).resolved_at is None


def test_args_digest_ignores_set_and_dict_order() -> None:
    # Regression: the digest hashed cbor2's bytes, which put sets in hash-seed
    # order and dicts in insertion order, so a re-run in another process diverged.
    import subprocess
    import sys

    code = ("from agentwal.codec import encode_value; from agentwal.effects import args_digest; "
            "print(args_digest(encode_value('a', {'tags': {'x', 'y', 'z', 'w'}, 'n': 1})))")
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={"PYTHONHASHSEED": str(seed)}, check=True).stdout
               for seed in (1, 2, 3, 4)}
    assert len(digests) == 1
    a = args_digest(encode_value("a", {"x": 1, "y": [1, {2, 3}]}))
    assert a == args_digest(encode_value("a", {"y": [1, {3, 2}], "x": 1}))
    assert a != args_digest(encode_value("a", {"x": 1, "y": [{2, 3}, 1]}))  # list order counts
    assert args_digest(encode_value("a", [1, 2])) != args_digest(encode_value("a", {1, 2}))
