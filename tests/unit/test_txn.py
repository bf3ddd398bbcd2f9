"""Transactions: lifecycle, read-your-writes, mapping sugar, savepoints, bad input."""

from __future__ import annotations

import datetime
import decimal
import uuid

import pytest

import agentwal
from agentwal import errors


def test_context_manager_commits_on_clean_exit(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.put("plan", {"steps": [1, 2]})
        txn["step"] = 3
    assert txn.state == "committed"
    assert txn.checkpoint is not None and txn.checkpoint.id == 1
    assert store.get("r", "plan") == {"steps": [1, 2]}
    assert store.get("r", "step") == 3


def test_context_manager_rolls_back_on_exception(store: agentwal.Store) -> None:
    with pytest.raises(RuntimeError), store.begin("r") as txn:
        txn["x"] = 1
        raise RuntimeError("boom")
    assert txn.state == "rolled_back"
    assert store.get("r", "x") is None
    assert store.head("r") is None


def test_explicit_commit_and_rollback(store: agentwal.Store) -> None:
    txn = store.begin("r")
    txn["a"] = 1
    ckpt = txn.commit()
    assert ckpt is not None and ckpt == txn.checkpoint
    txn2 = store.begin("r")
    txn2["a"] = 2
    txn2.rollback()
    assert store.get("r", "a") == 1


def test_read_your_writes_and_delete(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn["a"] = 1
        txn["b"] = 2
    with store.begin("r") as txn:
        assert txn.get("a") == 1
        txn["a"] = 10
        assert txn.get("a") == 10
        txn.delete("b")
        assert txn.get("b", "gone") == "gone"
        assert "b" not in txn
        assert "a" in txn
        del txn["a"]
        assert "a" not in txn
    assert store.state("r") == {}


def test_missing_key_error_is_a_key_error(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        with pytest.raises(KeyError):
            txn["nope"]
        with pytest.raises(errors.MissingKeyError) as ei:
            del txn["nope"]
        assert ei.value.code == "missing_key"
        assert "txn.get" in str(ei.value)


def test_items_with_prefix_merges_committed_and_buffered(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        for i in range(5):
            txn[f"messages/{i:03d}"] = i
        txn["other"] = "x"
    store.snapshot()  # some keys now in LMDB
    with store.begin("r") as txn:
        txn["messages/005"] = 5
        txn.delete("messages/000")
        got = list(txn.items(prefix="messages/"))
    assert got == [(f"messages/{i:03d}", i) for i in range(1, 6)]
    assert store.state("r")["other"] == "x"


def test_savepoints(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn["a"] = 1
        sp = txn.savepoint()
        txn["a"] = 2
        txn["b"] = 2
        sp2 = txn.savepoint()
        txn["c"] = 3
        txn.rollback_to(sp)
        assert txn.get("a") == 1 and "b" not in txn and "c" not in txn
        with pytest.raises(ValueError):
            txn.rollback_to(sp2)  # released by rolling back past it
        txn["d"] = 4
        txn.rollback_to(sp)  # still usable
        txn["e"] = 5
    assert store.state("r") == {"a": 1, "e": 5}


def test_rollback_to_a_checkpoint_id_is_the_documented_value_error(store: agentwal.Store) -> None:
    # Regression: txn.rollback_to(3), mistaking it for store.rollback_to(run, 3), raised a
    # bare AttributeError ("'int' object has no attribute '_depth'").
    with store.begin("r") as txn:
        txn["a"] = 1
    with store.begin("r") as txn:
        txn["a"] = 2
        with pytest.raises(ValueError, match=r"store\.rollback_to"):
            txn.rollback_to(1)  # type: ignore[arg-type]
        assert txn.get("a") == 2  # nothing was undone; the transaction goes on
    assert store.get("r", "a") == 2


def test_savepoint_restores_meta(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.meta(node="a")
        sp = txn.savepoint()
        txn.meta(node="b", extra=1)
        txn.rollback_to(sp)
        txn["k"] = 1
    assert txn.checkpoint is not None and txn.checkpoint.meta == {"node": "a"}


def test_finished_transaction_is_dead(store: agentwal.Store) -> None:
    txn = store.begin("r")
    txn["a"] = 1
    txn.commit()
    for call in (lambda: txn.get("a"), lambda: txn.put("a", 2), txn.commit, txn.rollback,
                 txn.savepoint, lambda: txn.delete("a"), lambda: list(txn.items())):
        with pytest.raises(errors.TransactionClosedError) as ei:
            call()
        assert ei.value.code == "transaction_closed"
    txn2 = store.begin("r")
    txn2.rollback()
    with pytest.raises(errors.TransactionClosedError):
        txn2.put("a", 1)


@pytest.mark.parametrize("key", [b"bytes", 1, None, "", "x" * 401, "é" * 201, "\ud800"])
def test_invalid_keys_change_nothing(store: agentwal.Store, key: object) -> None:
    with store.begin("r") as txn:
        txn["ok"] = 1
        with pytest.raises(errors.InvalidKeyError) as ei:
            txn.put(key, 1)  # type: ignore[arg-type]
        assert ei.value.code == "invalid_key"
        with pytest.raises(errors.InvalidKeyError):
            txn.get(key)  # type: ignore[arg-type]
    assert store.state("r") == {"ok": 1}


def test_key_of_exactly_400_bytes_is_fine(store: agentwal.Store) -> None:
    key = "é" * 200  # 400 UTF-8 bytes
    with store.begin("r") as txn:
        txn[key] = 1
    store.snapshot()
    assert store.get("r", key) == 1


@pytest.mark.parametrize("run", ["", "x" * 401, 5])
def test_invalid_run_ids(store: agentwal.Store, run: object) -> None:
    with pytest.raises(errors.InvalidKeyError):
        store.begin(run)  # type: ignore[arg-type]


class _Custom:
    pass


def _cyclic() -> list[object]:
    a: list[object] = []
    a.append(a)
    return a


@pytest.mark.parametrize("value", [_Custom(), datetime.datetime(2024, 1, 1), _cyclic(),
                                   {"f": print}, iter([1])])
def test_unencodable_values_change_nothing(store: agentwal.Store, value: object) -> None:
    with store.begin("r") as txn:
        txn["ok"] = 1
        with pytest.raises(errors.UnencodableValueError) as ei:
            txn.put("bad", value)
        assert ei.value.code == "unencodable_value"
        assert "bad" not in txn
    assert store.state("r") == {"ok": 1}


def test_unencodable_meta_is_refused(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.meta(node="a")
        with pytest.raises(errors.UnencodableValueError):
            txn.meta(node=_Custom())
        txn["k"] = 1
    assert txn.checkpoint is not None and txn.checkpoint.meta == {"node": "a"}


def test_every_supported_type_round_trips(store: agentwal.Store) -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    uid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    value = {"none": None, "bool": True, "int": -(2**70), "float": 1.5, "str": "é",
             "bytes": b"\x00\xff", "list": [1, [2]], "tuple": (1, 2), "when": when,
             "dec": decimal.Decimal("1.10"), "uuid": uid, "set": {1, 2}}
    with store.begin("r") as txn:
        txn["v"] = value
    got = store.get("r", "v")
    assert got["tuple"] == [1, 2]  # CBOR has one array type
    got["tuple"] = (1, 2)
    assert got == value


def test_values_are_copies(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        v = {"a": [1]}
        txn["v"] = v
        v["a"].append(2)  # mutating after put does not change what was put
        assert txn["v"] == {"a": [1]}
    got = store.get("r", "v")
    got["a"].append(3)
    assert store.get("r", "v") == {"a": [1]}


def test_empty_transaction_makes_no_checkpoint(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        pass
    assert txn.checkpoint is None
    with store.begin("r") as txn:
        txn["a"] = 1
    with store.begin("r") as txn2:
        txn2.get("a")
    assert txn2.checkpoint == txn.checkpoint
    with store.begin("r") as txn3:
        txn3.meta(note="only meta")
    assert txn3.checkpoint is not None and txn3.checkpoint.id == 2


def test_snapshot_isolation_within_a_transaction(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn["a"] = 1
    reader = store.begin("r")
    with store.begin("r") as w:
        w["a"] = 2
        w["b"] = 2
    store.snapshot()  # the fold must not change what the open transaction sees
    assert reader.get("a") == 1
    assert reader.get("b") is None
    assert dict(reader.items()) == {"a": 1}
    reader.rollback()
    assert store.get("r", "a") == 2
