"""The lease contract both backends keep for one worker (``agentwal/leases.py``).

A local store's writer process is the one worker that holds all its runs;
on PostgreSQL the same calls take and give back rows' leases on the server
(``tests/postgres/test_leases.py`` has the contests between workers). A
program written against these calls runs unchanged on either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import agentwal
from agentwal import EffectContext

Opener = Callable[..., Any]


def test_lease_keeps_its_epoch_while_held_and_grows_after_release(open_store: Opener) -> None:
    store = open_store(worker_id="w1")
    assert store.worker_id == "w1"
    first = store.lease("r")
    assert isinstance(first, int) and first > 0
    assert store.lease("r") == first
    assert store.release("r") and not store.release("r")
    second = store.lease("r")
    assert second > first
    assert store.lease("other") > 0 and store.lease("r") == second


def test_begin_takes_the_lease_and_effects_see_its_epoch(open_store: Opener) -> None:
    store = open_store()
    seen: list[int | None] = []

    def call(ctx: EffectContext) -> None:
        seen.append(ctx.fencing_token)

    with store.begin("r") as txn:
        txn.effect("send", call, mode="at_least_once")
        txn.defer("later", mode="at_least_once")
    store.effect("r", "standalone", call, key="k/1", mode="at_least_once")
    store.dispatch({"later": call})
    held = store.lease("r")
    assert seen == [held, held, held]


def test_a_released_lease_fences_the_transactions_begun_under_it(open_store: Opener) -> None:
    store = open_store()
    with store.begin("r") as txn:
        txn["k"] = 1
    txn = store.begin("r")
    txn["k"] = 2
    stale = store.begin("r")
    assert store.release("r")
    with pytest.raises(agentwal.LeaseLostError) as info:
        txn.commit()
    assert info.value.code == "lease_lost" and isinstance(info.value, agentwal.ConflictError)
    calls: list[int] = []
    with pytest.raises(agentwal.LeaseLostError):
        stale.effect("send", lambda ctx: calls.append(1), mode="at_least_once")
    assert calls == [] and store.get("r", "k") == 1 and store.head("r").id == 1
    stale.rollback()
    # transact begins again, under a new lease, and commits
    store.transact("r", lambda t: t.__setitem__("k", 3))
    assert store.get("r", "k") == 3


def test_claim_runs_finds_nothing_orphaned_and_checks_its_argument(open_store: Opener) -> None:
    store = open_store()
    with store.begin("r") as txn:
        txn["k"] = 1
    assert store.claim_runs() == [] and store.claim_runs(0) == []
    for bad in (-1, True, "3"):
        with pytest.raises(ValueError):
            store.claim_runs(bad)


def test_bad_ids_read_only_and_closed_stores_are_refused(open_store: Opener) -> None:
    store = open_store()
    with store.begin("r") as txn:
        txn["k"] = 1
    with pytest.raises(agentwal.InvalidKeyError):
        store.lease("")
    with pytest.raises(agentwal.InvalidKeyError):
        store.release("")
    reader = open_store(readonly=True)
    with pytest.raises(agentwal.ReadOnlyError):
        reader.lease("r")
    with pytest.raises(agentwal.ReadOnlyError):
        reader.claim_runs()
    assert not reader.release("r")
    txn = store.begin("r")
    store.close()
    with pytest.raises(agentwal.StoreClosedError):
        store.lease("r")
    with pytest.raises(agentwal.Error):
        txn.commit()
