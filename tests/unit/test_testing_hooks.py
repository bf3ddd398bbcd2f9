"""``agentwal.testing``'s hooks do what they promise (the crash, property and effects
tests lean on them instead of the engine's privates, so each must be able to fail)."""

from __future__ import annotations

import io
from typing import Any

import pytest

import agentwal
from agentwal import failpoints, testing
from agentwal.backend import EffectRace


def test_fold_lock_is_taken_while_a_fold_runs(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn["k"] = 1
    seen: list[bool] = []

    def during_fold(_name: str) -> None:
        lock = testing.fold_lock(store)
        seen.append(not lock.acquire(blocking=False))  # type: ignore[attr-defined]

    failpoints.arm("fold_after_commit", "call", fn=during_fold)
    store.snapshot()
    assert seen == [True]
    with testing.fold_lock(store):  # free again: taken and released here
        pass


def test_fold_lock_is_a_no_op_on_a_store_that_does_not_fold() -> None:
    with testing.fold_lock(object()) as held:
        assert held is None


def test_sweep_blobs_removes_only_what_nothing_references(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        kept = txn.put_blob("kept", io.BytesIO(b"kept" * 100))
    with store.begin("r") as txn:
        txn.put_blob("doomed", io.BytesIO(b"doomed" * 100))
        txn.rollback()
    assert testing.blob_references(store) == {kept.sha256}
    assert len(testing.blob_files(store)) == 2  # the rolled-back put's file waits for a sweep
    removed, freed = testing.sweep_blobs(store)
    assert (removed, freed) == (1, 600)
    assert testing.blob_files(store) == {kept.sha256}


def test_run_origin_is_kept_once_the_forks_first_checkpoint_is_compacted(
        store: agentwal.Store) -> None:
    with store.begin("a") as txn:
        txn["k"] = 1
    store.fork("a", 1, "b")
    with store.begin("b") as txn:
        txn["k"] = 2
    assert testing.run_origin(store, "b") is None  # history's first checkpoint holds it
    store.compact(keep_last=1)
    assert [c.id for c in store.history("b")] == [2]
    assert testing.run_origin(store, "b") == ("a", 1)
    assert testing.run_origin(store, "a") is None
    assert testing.run_origin(store, "nobody") is None


def test_raw_snapshot_holds_what_folds_wrote(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn["k"] = 1
    with testing.raw_snapshot(store) as raw:
        assert not list(raw.entries("runs"))  # not folded yet
    store.snapshot()
    with testing.raw_snapshot(store) as raw:
        assert len(list(raw.entries("runs"))) == 1


def test_split_commits_breaks_a_transaction_in_two(store: agentwal.Store) -> None:
    testing.split_commits(store)
    with store.begin("r") as txn:
        txn["a"], txn["b"] = 1, 2
    assert len(store.history("r")) == 2  # the harness must see a crash between them
    testing.split_commits(store, False)
    with store.begin("r") as txn:
        txn["a"], txn["b"] = 3, 4
    assert len(store.history("r")) == 3


def test_effect_locks_count_the_running_effects(store: agentwal.Store) -> None:
    inside: list[int] = []
    with store.begin("r") as txn:
        txn.effect("op", lambda ctx: inside.append(testing.effect_locks(store)),
                   mode="at_least_once")
    assert inside and inside[0] > 0
    assert testing.effect_locks(store) == 0


def test_intercept_effect_writes_sees_every_write_and_ends_with_the_block(
        store: agentwal.Store) -> None:
    seen: list[str] = []

    def spy(write: Any, entry: Any, expect: Any) -> Any:
        seen.append(entry.status)
        return write(entry, expect)

    with testing.intercept_effect_writes(store, spy), store.begin("r") as txn:
        txn.effect("op", lambda ctx: 1, mode="at_least_once")
    assert seen == ["in_doubt", "done"]  # the intent, then the outcome
    with store.begin("r") as txn:
        txn.effect("op2", lambda ctx: 2, mode="at_least_once")
    assert seen == ["in_doubt", "done"]


def test_the_backend_hook_is_the_seam_the_store_runs_on(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.effect("op", lambda ctx: 1, mode="at_least_once", key="k")
    seam = testing.backend(store)
    (entry,) = store.effects()
    assert seam.effect(entry.key) == entry
    with pytest.raises(EffectRace):
        seam.record_effect(entry.replace(result=2), expect=None)  # the key is taken


@pytest.mark.parametrize("hook", [testing.sweep_blobs, testing.blob_files,
                                  testing.split_commits, testing.crash, testing.fold_error,
                                  testing.expire_effects_on_next_fold])
def test_the_engine_hooks_refuse_another_store(hook: Any) -> None:
    with pytest.raises(agentwal.BackendUnsupportedError, match="testing"):
        hook(object())
