"""Effect records on the simulated disk: intents are durable before the call in every mode.

The WAL lives on :class:`~agentwal.testing.SimulatedDisk`. A power cut while
``fn`` runs (``crash_image`` taken from inside ``fn``) must leave the intent
(``in_doubt``, one attempt) even with durability ``"none"`` or ``"async"``,
which sync nothing else; a cut right after ``txn.effect`` returns must leave
the outcome. The sweep cuts the power before every I/O operation of one
effect and checks the one rule that matters: if ``fn`` was called, the
ledger knows it after the cut, under every crash model.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal import EffectInDoubtError
from agentwal.testing import SimulatedCrash, SimulatedDisk
from agentwal.testing import crash as crash_store

MODELS = ("strict", "prefix", "reorder")
SEEDS = range(4)


def open_store(path: str, disk: SimulatedDisk, durability: str) -> agentwal.Store:
    return agentwal.open(path, fs=disk, durability=durability, segment_bytes=65536,
                         wal_max_bytes=1 << 20)


def ledger(path: str, image: SimulatedDisk) -> list[agentwal.EffectRecord]:
    store = open_store(path, image, "sync")
    try:
        return store.effects()
    finally:
        crash_store(store)  # LMDB (a real directory) stays as it was: no fold


@pytest.mark.parametrize("durability", ["none", "async"])
def test_intent_durable_before_the_call_and_outcome_after(tmp_path: Path,
                                                          durability: str) -> None:
    path = str(tmp_path)
    disk = SimulatedDisk()
    store = open_store(path, disk, durability)
    with store.begin("r") as txn:
        txn["warmup"] = 1  # an unsynced commit before the effect
    during: list[SimulatedDisk] = []

    def fn(ctx: agentwal.EffectContext) -> str:
        during.extend(disk.crash_image(m, seed=s) for m in MODELS for s in SEEDS)
        return "charged"

    txn = store.begin("r")
    assert txn.effect("charge", fn, mode="at_most_once") == "charged"
    after = [disk.crash_image(m, seed=s) for m in MODELS for s in SEEDS]
    txn.rollback()
    crash_store(store)
    for image in during:
        (e,) = ledger(path, image)
        assert (e.status, e.attempts) == ("in_doubt", 1)
    for image in after:
        (e,) = ledger(path, image)
        assert (e.status, e.result) == ("done", "charged")
    # and the in-doubt image behaves as the table says: at_most_once never calls again
    store = open_store(path, during[0], durability)
    try:
        with store.begin("r") as t2, pytest.raises(EffectInDoubtError):
            t2.effect("charge", fn, mode="at_most_once")
    finally:
        crash_store(store)


def _setup(path: str, disk: SimulatedDisk) -> agentwal.Store:
    store = open_store(path, disk, "none")
    with store.begin("r") as txn:
        txn["warmup"] = 1
    return store


def _one_effect(store: agentwal.Store, called: list[str]) -> Any:
    def fn(ctx: agentwal.EffectContext) -> str:
        called.append(ctx.key)
        return "sent"

    with store.begin("r") as txn:
        return txn.effect("mail", fn, mode="at_most_once")


def test_sweep_power_cut_before_every_operation_of_an_effect(tmp_path: Path) -> None:
    # Count the operations one effect (intent, call, outcome, commit) makes.
    probe_dir = tmp_path / "count"
    disk = SimulatedDisk()
    store = _setup(str(probe_dir), disk)
    before = disk.op_count
    _one_effect(store, [])
    ops = disk.op_count - before
    crash_store(store)
    assert ops >= 4  # two synced records at least
    for k in range(ops + 1):
        path = str(tmp_path / f"cut{k}")
        disk = SimulatedDisk()
        store = _setup(path, disk)
        disk.crash_at(disk.op_count + k)
        called: list[str] = []
        with contextlib.suppress(SimulatedCrash):
            _one_effect(store, called)
        crash_store(store)
        for model in MODELS:
            for seed in SEEDS:
                entries = ledger(path, disk.crash_image(model, seed=seed))
                if called:  # the world saw the call: the ledger must know it
                    assert [e.key for e in entries] == called, (k, model, seed)
                    assert entries[0].status in ("in_doubt", "done")
                else:
                    assert all(e.status == "in_doubt" for e in entries)
