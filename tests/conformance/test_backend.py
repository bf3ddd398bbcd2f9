"""Every backend meets the contracts written on ``agentwal.backend``'s Protocols."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentwal.backend import Backend, Change, EffectRace, Maintenance, View
from agentwal.codec import encode_value
from agentwal.effects import EffectMode, EffectRecord, effect_id_for
from agentwal.errors import (
    CheckpointNotFoundError,
    ConflictError,
    RunExistsError,
    RunNotFoundError,
)


def enc(value: Any) -> bytes:
    return encode_value("k", value)


def commit(backend: Any, run: str, /, **writes: Any) -> Any:
    """One change of ``writes`` (values encoded) to ``run`` from a fresh view."""
    view = backend.begin(run)
    try:
        return backend.commit(view, Change(run=run, writes={k: enc(v) for k, v in writes.items()}))
    finally:
        backend.end(view)


def test_it_implements_the_protocols(backend: Any) -> None:
    assert isinstance(backend, Backend) and isinstance(backend, Maintenance)
    view = backend.begin("r")
    try:
        assert isinstance(view, View)
        assert (view.run, view.base, view.epoch) == ("r", 0, 0)
    finally:
        backend.end(view)
    assert isinstance(backend.name, str) and backend.store_id.version == 4


def test_commits_number_checkpoints_and_a_view_reads_as_of_begin(backend: Any) -> None:
    c1 = commit(backend, "r", a=1, b=2)
    assert (c1.id, c1.parent) == (1, None) and backend.head("r") == c1
    old = backend.begin("r")
    try:
        assert old.base == 1
        c2 = commit(backend, "r", a=10)
        assert (c2.id, c2.parent) == (2, 1)
        assert backend.read(old, "a") == enc(1)  # the view still reads checkpoint 1
        assert backend.scan(old, "") == {"a": enc(1), "b": enc(2)}
    finally:
        backend.end(old)
    new = backend.begin("r")
    try:
        assert backend.read(new, "a") == enc(10) and backend.read(new, "zzz") is None
        assert backend.scan(new, "b") == {"b": enc(2)}
    finally:
        backend.end(new)
    backend.end(new)  # idempotent


def test_an_empty_change_applies_nothing_and_returns_the_head(backend: Any) -> None:
    view = backend.begin("r")
    assert backend.commit(view, Change(run="r", writes={})) is None
    backend.end(view)
    c1 = commit(backend, "r", a=1)
    view = backend.begin("r")
    try:
        assert backend.commit(view, Change(run="r", writes={})) == c1
    finally:
        backend.end(view)
    assert backend.head("r") == c1


@pytest.mark.parametrize("how", ["read", "write", "prefix"])
def test_the_commit_rule_refuses_a_stale_view_and_applies_nothing(backend: Any,
                                                                  how: str) -> None:
    commit(backend, "r", **{"msg/a": 1})
    stale = backend.begin("r")
    try:
        head = commit(backend, "r", **{"msg/a": 2})
        change = {"read": Change(run="r", writes={"x": enc(1)}, reads=frozenset({"msg/a"})),
                  "write": Change(run="r", writes={"msg/a": enc(3)}),
                  "prefix": Change(run="r", writes={"x": enc(1)},
                                   prefixes=frozenset({"msg/"}))}[how]
        with pytest.raises(ConflictError):
            backend.commit(stale, change)
    finally:
        backend.end(stale)
    assert backend.head("r") == head
    assert backend.state_at("r", head.id) == {"msg/a": enc(2)}


def test_a_disjoint_change_from_a_stale_view_commits(backend: Any) -> None:
    commit(backend, "r", a=1)
    stale = backend.begin("r")
    try:
        commit(backend, "r", a=2)
        c = backend.commit(stale, Change(run="r", writes={"b": enc(1)},
                                         reads=frozenset({"b"})))
    finally:
        backend.end(stale)
    assert c.id == 3 and backend.state_at("r", 3) == {"a": enc(2), "b": enc(1)}


def test_a_run_deleted_after_the_view_refuses_its_commit(backend: Any) -> None:
    commit(backend, "r", a=1)
    view = backend.begin("r")
    try:
        backend.delete_run("r")
        with pytest.raises(ConflictError):
            backend.commit(view, Change(run="r", writes={"b": enc(1)}))
    finally:
        backend.end(view)
    assert backend.head("r") is None and backend.runs() == []
    with pytest.raises(RunNotFoundError):
        backend.delete_run("r")
    again = backend.begin("r")
    try:
        assert again.base == 0 and again.epoch > 0  # a new incarnation of the id
    finally:
        backend.end(again)
    assert commit(backend, "r", a=5).id == 1


def test_an_origin_makes_a_first_checkpoint_only(backend: Any) -> None:
    commit(backend, "r", a=1)
    view = backend.begin("f")
    try:
        c = backend.commit(view, Change(run="f", writes=backend.state_at("r", 1),
                                        prefixes=frozenset({""}), origin=("r", 1)))
    finally:
        backend.end(view)
    assert (c.id, c.origin) == (1, ("r", 1))
    view = backend.begin("f")
    try:
        with pytest.raises(RunExistsError):
            backend.commit(view, Change(run="f", writes={}, origin=("r", 1)))
    finally:
        backend.end(view)


def test_history_reads(backend: Any) -> None:
    for i in range(1, 6):
        commit(backend, "r", step=i)
    commit(backend, "q", x=1)
    assert [c.id for c in backend.checkpoints("r")] == [5, 4, 3, 2, 1]
    assert [c.id for c in backend.checkpoints("r", limit=2)] == [5, 4]
    assert [c.id for c in backend.checkpoints("r", before=3)] == [2, 1]
    assert backend.state_at("r", 2) == {"step": enc(2)}
    assert backend.state_at("r", 4, key="step") == {"step": enc(4)}
    assert backend.state_at("r", 4, key="nope") == {}
    assert backend.runs() == ["q", "r"]
    with pytest.raises(RunNotFoundError):
        backend.state_at("nope", 1)
    with pytest.raises(CheckpointNotFoundError):
        backend.state_at("r", 6)


def _entry(key: str, status: str = "pending", attempts: int = 1) -> EffectRecord:
    now = time.time()
    return EffectRecord(effect_id_for(key), key, "send", EffectMode.AT_MOST_ONCE, "r", 0, 0,
                        False, status, attempts, {"to": "a"}, "00" * 32, created_at=now,
                        updated_at=now)


def test_record_effect_is_compare_and_set(backend: Any) -> None:
    first = backend.record_effect(_entry("k1"), expect=None)
    assert backend.effect("k1") == first and backend.effect_at("r", 0, 0) == "k1"
    with pytest.raises(EffectRace) as ei:
        backend.record_effect(_entry("k1", attempts=2), expect=None)  # not absent any more
    assert ei.value.found == first
    done = backend.record_effect(first.replace(status="done", result=7), expect=first)
    assert backend.effect("k1") == done and done.result == 7
    with pytest.raises(EffectRace):
        backend.record_effect(first.replace(status="failed"), expect=first)  # stale expect
    assert backend.effect("k1") == done
    assert [e.key for e in backend.effects()] == ["k1"]
    assert backend.outbox() == []


def test_a_commit_mark_added_since_is_no_lost_race_and_stays(backend: Any) -> None:
    intent = backend.record_effect(_entry("k1", status="in_doubt"), expect=None)
    view = backend.begin("r")
    try:
        backend.commit(view, Change(run="r", writes={"a": enc(1)}, effects=("k1",)))
    finally:
        backend.end(view)
    assert backend.effect("k1").committed_in == 1  # the commit marked it
    done = backend.record_effect(intent.replace(status="done", result=7), expect=intent)
    assert (done.status, done.result, done.committed_in) == ("done", 7, 1)
    assert backend.effect("k1") == done
    with pytest.raises(EffectRace):  # an expected mark that is gone is a change
        backend.record_effect(done.replace(status="failed"),
                              expect=done.replace(committed_in=2))


def test_maintenance(backend: Any) -> None:
    commit(backend, "r", a=1)
    backend.sync()
    assert isinstance(backend.stats(), dict)
