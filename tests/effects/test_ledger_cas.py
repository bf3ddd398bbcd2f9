"""The executor's ledger writes are compare-and-set: a lost race is decided again, never
written over blindly.

Another writer of the ledger (a second host's worker, on a backend that has
one) is played by ``testing.intercept_effect_writes``: just before the
executor's own write, the backend's compare-and-set stores a competing entry
for the key.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import agentwal
from agentwal import EffectInDoubtError
from agentwal.backend import EffectRace
from agentwal.effects import EffectRecord, still_expected
from agentwal.testing import backend as backend_of
from agentwal.testing import intercept_effect_writes


@contextlib.contextmanager
def _compete(store: agentwal.Store, when: Callable[[EffectRecord], bool],
             theirs: Callable[[EffectRecord], EffectRecord]) -> Iterator[list[EffectRecord]]:
    """Before the first write that ``when`` picks, write ``theirs(entry)`` for its key."""
    raced: list[EffectRecord] = []
    seam = backend_of(store)

    def write(real: Any, entry: EffectRecord, expect: EffectRecord | None) -> EffectRecord:
        if not raced and when(entry):
            raced.append(real(theirs(entry), seam.effect(entry.key)))
        return real(entry, expect)

    with intercept_effect_writes(store, write):
        yield raced


def test_an_intent_that_loses_the_race_meets_the_winners_result(
        store: agentwal.Store) -> None:
    calls: list[int] = []

    def fn(ctx: Any) -> str:
        calls.append(1)
        return "mine"

    with (_compete(store, lambda e: e.status == "in_doubt",
                   lambda e: e.replace(status="done", result="theirs")) as raced,
          store.begin("r") as txn):
        got = txn.effect("send", fn, mode="at_least_once", key="k")
    assert raced  # the competing writer did win the key first
    assert got == "theirs" and calls == []  # decided again from the winner: no call
    assert [e.result for e in store.effects()] == ["theirs"]


def test_an_outcome_that_loses_the_race_is_in_doubt_not_overwritten(
        store: agentwal.Store) -> None:
    calls: list[int] = []

    def fn(ctx: Any) -> str:
        calls.append(1)
        return "mine"

    with (_compete(store, lambda e: e.status == "done",  # its next attempt
                   lambda e: e.replace(status="in_doubt", attempts=e.attempts + 1,
                                       result=None)) as raced,
          store.begin("r") as txn, pytest.raises(EffectInDoubtError, match="another writer")):
        txn.effect("send", fn, mode="at_least_once", key="k")
    assert raced and calls == [1]
    (entry,) = store.effects()
    assert entry.status == "in_doubt" and entry.attempts == 2  # the other writer's entry


def test_a_resolve_that_races_reads_again_and_settles(store: agentwal.Store) -> None:
    with store.begin("r") as txn, pytest.raises(RuntimeError):
        txn.effect("send", _boom, mode="at_least_once", key="k")
    (failed,) = store.effects()
    with _compete(store, lambda e: e.status == "resolved",
                  lambda e: e.replace(status="failed", error="again", resolved_by=None,
                                      resolved_at=None, result=None)) as raced:
        settled = store.resolve_effect(failed.effect_id, result="fixed", by="me")
    assert raced
    assert settled.status == "resolved" and settled.result == "fixed"
    assert store.effects()[0].error == "again"  # the re-read entry is what was settled


def test_the_engines_compare_and_set_refuses_a_stale_expectation(
        store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.effect("send", lambda ctx: 1, mode="at_least_once", key="k")
    (entry,) = store.effects()
    backend = backend_of(store)
    with pytest.raises(EffectRace) as race:
        backend.record_effect(entry.replace(result=2), expect=entry.replace(attempts=9))
    assert race.value.found == entry
    with pytest.raises(EffectRace):
        backend.record_effect(entry.replace(key="other"), expect=entry)  # "other" is absent
    assert store.effects() == [entry]


def test_a_commit_mark_added_since_is_no_lost_race() -> None:
    base = EffectRecord("ef-1", "k", "send", agentwal.effects.EffectMode.AT_LEAST_ONCE, "r",
                        1, 0, False, "in_doubt", 1, None, "d")
    marked = dataclasses.replace(base, committed_in=2)  # as a commit marks it (same time)
    assert still_expected(marked, base)  # the writer carries the mark over
    assert not still_expected(base, marked)  # an expected mark that is gone is a change
    assert not still_expected(dataclasses.replace(marked, attempts=2), base)
    assert still_expected(None, None)
    assert not still_expected(base, None) and not still_expected(None, base)


def _boom(ctx: Any) -> None:
    raise RuntimeError("boom")
