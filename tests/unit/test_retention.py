"""retention.py, pure: what compaction keeps, the plan that keeps it readable, the records."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentwal import history
from agentwal.codec import CodecError
from agentwal.local.records import decode_delete_run, encode_delete_run
from agentwal.retention import (
    KeepFor,
    KeepLast,
    check_args,
    choose,
    plan_run,
    policy_args,
)

# -- choose ----------------------------------------------------------------------------


def _ckpts(n: int) -> list[tuple[int, float]]:
    return [(i, 1000.0 + i) for i in range(1, n + 1)]


def test_no_criterion_keeps_everything() -> None:
    assert choose(_ckpts(5), keep_last=None, cutoff=None) == {1, 2, 3, 4, 5}
    assert choose([], keep_last=3, cutoff=None) == set()


def test_keep_last_counts_ids_back_from_the_head() -> None:
    assert choose(_ckpts(10), keep_last=3, cutoff=None) == {8, 9, 10}
    assert choose(_ckpts(2), keep_last=5, cutoff=None) == {1, 2}
    gappy = [(3, 0.0), (40, 0.0), (41, 0.0), (42, 0.0)]  # an earlier compaction's gap
    assert choose(gappy, keep_last=2, cutoff=None) == {41, 42}


def test_the_head_is_kept_whatever_its_age() -> None:
    assert choose(_ckpts(4), keep_last=None, cutoff=99999.0) == {4}


def test_cutoff_keeps_those_created_at_or_after_it() -> None:
    assert choose(_ckpts(10), keep_last=None, cutoff=1007.0) == {7, 8, 9, 10}


def test_either_criterion_keeps() -> None:
    assert choose(_ckpts(10), keep_last=2, cutoff=1005.0) == {5, 6, 7, 8, 9, 10}
    assert choose(_ckpts(10), keep_last=6, cutoff=1009.0) == {5, 6, 7, 8, 9, 10}


def test_protected_ids_are_kept() -> None:
    assert choose(_ckpts(10), keep_last=1, cutoff=None, protected={2, 99}) == {2, 10}


# -- plan_run ----------------------------------------------------------------------------


def test_plan_drops_and_writes_a_manifest_for_the_first_kept() -> None:
    plan = plan_run(list(range(1, 101)), set(range(90, 101)), {32, 64, 96})
    assert plan.drop == tuple(range(1, 90))
    assert plan.orphans == (90,) and plan.manifests == (90,)


def test_an_orphan_that_has_a_manifest_needs_no_new_one() -> None:
    plan = plan_run(list(range(1, 101)), set(range(64, 101)), {32, 64, 96})
    assert plan.orphans == (64,) and plan.manifests == ()


def test_an_isolated_kept_checkpoint_gets_its_own_manifest() -> None:
    plan = plan_run(list(range(1, 51)), {7, 49, 50}, {32})
    assert plan.orphans == (7, 49) and plan.manifests == (7, 49)
    assert 32 in plan.drop


def test_a_block_starting_at_one_needs_no_manifest() -> None:
    plan = plan_run(list(range(1, 11)), {1, 2, 9, 10}, set())
    assert plan.orphans == (9,) and plan.manifests == (9,)


def test_earlier_gaps_are_not_orphans_again() -> None:
    # 3 and 40.. were kept by an earlier compaction (and have manifests)
    plan = plan_run([3, 40, 41, 42], {3, 41, 42}, {3, 40})
    assert plan.drop == (40,) and plan.orphans == (41,) and plan.manifests == (41,)


@given(st.integers(1, 120).flatmap(lambda n: st.tuples(
    st.just(n), st.sets(st.integers(1, n)), st.sets(st.integers(1, n)))))
def test_every_kept_checkpoint_rebuilds_from_kept_records(
        case: tuple[int, set[int], set[int]]) -> None:
    """After the plan, each kept id reaches a manifest (or 1) through kept deltas only,
    within MANIFEST_EVERY - 1 deltas, given the store's invariant before it."""
    n, earlier_drop, keep = case
    # before: a store that an earlier compaction left consistent
    ids = [c for c in range(1, n + 1) if c not in earlier_drop or c == n]
    manifests = {c for c in ids if history.is_manifest(c)}
    manifests |= {c for c in ids if c > 1 and c - 1 not in ids}  # earlier orphans
    keep = {c for c in keep if c in ids} | {n}
    plan = plan_run(ids, keep, manifests)
    after_ids = set(ids) - set(plan.drop)
    assert after_ids == keep
    after_manifests = (manifests - set(plan.drop)) | set(plan.manifests)
    assert set(plan.manifests) <= keep
    for c in keep:
        steps = 0
        at = c
        while at not in after_manifests and at != 1:
            assert at - 1 in after_ids, (c, at)  # the delta chain stays whole
            at -= 1
            steps += 1
        assert steps < history.MANIFEST_EVERY
    for c in plan.orphans:  # exactly the kept ids whose parent this plan drops
        assert c - 1 in plan.drop


# -- arguments and policies ----------------------------------------------------------------


def test_check_args() -> None:
    check_args(None, None)
    check_args(1, dt.timedelta(0))
    for bad, exc in ((0, ValueError), (True, TypeError), ("3", TypeError)):
        with pytest.raises(exc):
            check_args(bad, None)
    for bad_age, exc in ((3600, TypeError), (dt.timedelta(seconds=-1), ValueError)):
        with pytest.raises(exc):
            check_args(None, bad_age)


def test_policy_args() -> None:
    week = dt.timedelta(days=7)
    assert policy_args(None) == (None, None)
    assert policy_args(KeepLast(4)) == (4, None)
    assert policy_args(KeepFor(week)) == (None, week)
    assert policy_args((KeepLast(4), KeepFor(week))) == (4, week)
    assert policy_args([KeepFor(week)]) == (None, week)
    with pytest.raises(TypeError):
        policy_args(4)
    with pytest.raises(ValueError):
        policy_args((KeepLast(1), KeepLast(1)))


# -- the delete-run record -------------------------------------------------------------------


def test_delete_record_bytes_are_pinned() -> None:
    assert encode_delete_run("r1", 7) == bytes.fromhex("82627231 07".replace(" ", ""))
    assert decode_delete_run(encode_delete_run("ü/run", 300)) == ("ü/run", 300)


@pytest.mark.parametrize("payload", [b"", b"\x80", b"\x82\x60\x01", b"\x82\x62r1\x00",
                                     b"\x82\x62r1\xf5", b"\x83\x62r1\x01\x01", b"\xa0",
                                     b"\x82\x01\x02", b"\xff"])
def test_a_malformed_delete_record_is_a_codec_error(payload: bytes) -> None:
    with pytest.raises(CodecError):
        decode_delete_run(payload)
