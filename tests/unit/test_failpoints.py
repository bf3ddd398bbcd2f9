"""Failpoints: the registry, arming (raise, call, kill), nth/times, disarming, hit counting."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from agentwal import failpoints
from agentwal.failpoints import POINTS, FailpointFired, arm, disarm, hit, hits, names

P = "after_fsync"
Q = "before_fsync"


def fires(name: str) -> bool:
    """Hit ``name`` once; True if it raised FailpointFired."""
    try:
        hit(name)
    except FailpointFired:
        return True
    return False


# -- the registry ---------------------------------------------------------------------------


def test_names_are_sorted_and_are_the_points() -> None:
    got = names()
    assert got == sorted(got)
    assert set(got) == set(POINTS) and len(got) == len(POINTS)
    got.append("mine")  # a new list each call
    assert "mine" not in names()


def test_every_point_describes_its_crash_window() -> None:
    for name, window in POINTS.items():
        assert name.isidentifier() and name.islower()
        assert isinstance(window, str) and window


def test_the_engine_paths_have_points() -> None:
    for name in ("commit_after_encode", "before_wal_append", "before_fsync", "after_fsync",
                 "fold_before_commit", "recovery_before_replay", "before_segment_create"):
        assert name in POINTS


# -- raise ----------------------------------------------------------------------------------


def test_default_raise_is_failpoint_fired_with_the_name() -> None:
    arm(P)
    with pytest.raises(FailpointFired) as ei:
        hit(P)
    assert ei.value.name == P
    assert P in str(ei.value)
    assert isinstance(ei.value, Exception)


def test_raise_an_exception_class() -> None:
    arm(P, exc=OSError)
    with pytest.raises(OSError) as ei:
        hit(P)
    assert type(ei.value) is OSError


def test_raise_an_exception_instance() -> None:
    boom = RuntimeError("boom")
    arm(P, "raise", exc=boom)
    with pytest.raises(RuntimeError) as ei:
        hit(P)
    assert ei.value is boom


def test_raise_a_base_exception() -> None:
    class PowerCut(BaseException):
        pass

    arm(P, exc=PowerCut)
    with pytest.raises(PowerCut):
        hit(P)


# -- call -----------------------------------------------------------------------------------


def test_call_runs_fn_with_the_name() -> None:
    got: list[str] = []
    arm(P, "call", fn=got.append)
    hit(Q)
    hit(P)
    hit(P)
    assert got == [P]


def test_call_may_raise() -> None:
    def fn(name: str) -> None:
        raise KeyError(name)

    arm(P, "call", fn=fn)
    with pytest.raises(KeyError):
        hit(P)
    hit(P)  # fired once, then disarmed


def test_call_may_rearm_its_own_point() -> None:
    got: list[str] = []

    def fn(name: str) -> None:
        got.append(name)
        if len(got) < 3:
            arm(name, "call", fn=fn)  # the action runs outside the registry lock

    arm(P, "call", fn=fn)
    for _ in range(5):
        hit(P)
    assert got == [P, P, P]


# -- nth and times --------------------------------------------------------------------------


def test_fires_once_by_default_then_disarms() -> None:
    arm(P)
    assert [fires(P) for _ in range(4)] == [True, False, False, False]


def test_nth_skips_earlier_hits() -> None:
    arm(P, nth=3)
    assert [fires(P) for _ in range(5)] == [False, False, True, False, False]


def test_times_fires_that_many_hits_from_the_nth() -> None:
    arm(P, nth=2, times=3)
    assert [fires(P) for _ in range(6)] == [False, True, True, True, False, False]


def test_times_from_the_first_hit() -> None:
    arm(P, times=2)
    assert [fires(P) for _ in range(3)] == [True, True, False]


def test_hits_of_other_points_do_not_count_toward_nth() -> None:
    arm(P, nth=2)
    for _ in range(5):
        hit(Q)
    assert [fires(P) for _ in range(3)] == [False, True, False]


def test_rearming_replaces_and_restarts_the_count() -> None:
    arm(P, nth=3)
    assert not fires(P)
    assert not fires(P)
    arm(P, nth=2)  # counted from now
    assert [fires(P) for _ in range(3)] == [False, True, False]


def test_points_are_armed_independently() -> None:
    arm(P, nth=2)
    arm(Q)
    assert fires(Q)
    assert not fires(P)
    assert fires(P)


def test_concurrent_hits_fire_exactly_times() -> None:
    fired: list[str] = []
    lock = threading.Lock()

    def fn(name: str) -> None:
        with lock:
            fired.append(name)

    arm(P, "call", fn=fn, times=50)
    failpoints.count_hits()

    def worker() -> None:
        for _ in range(100):
            hit(P)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fired) == 50
    assert hits() == {P: 800}


# -- disarm ---------------------------------------------------------------------------------


def test_disarm_one_point() -> None:
    arm(P)
    arm(Q)
    disarm(P)
    assert not fires(P)
    assert fires(Q)


def test_disarm_all() -> None:
    for name in names():
        arm(name)
    disarm()
    for name in names():
        hit(name)  # nothing fires


def test_disarm_of_a_point_that_is_not_armed_is_fine() -> None:
    disarm(P)
    disarm("no_such_point")
    disarm()
    disarm()


def test_hit_on_a_disarmed_point_does_nothing() -> None:
    assert hit(P) is None
    arm(Q)  # something else is armed: hit() takes the slow path
    assert hit(P) is None
    assert fires(Q)


def test_hit_of_an_unknown_name_does_nothing() -> None:
    hit("not_a_point")
    arm(P)
    hit("not_a_point")
    assert fires(P)


# -- counting hits --------------------------------------------------------------------------


def test_hits_are_not_counted_until_asked() -> None:
    hit(P)
    assert hits() == {}


def test_count_hits() -> None:
    failpoints.count_hits()
    hit(P)
    hit(P)
    hit(Q)
    assert hits() == {P: 2, Q: 1}
    snapshot = hits()
    snapshot[P] = 99  # a copy
    assert hits()[P] == 2


def test_count_hits_counts_armed_and_fired_hits_too() -> None:
    failpoints.count_hits()
    arm(P, nth=2)
    assert [fires(P) for _ in range(3)] == [False, True, False]
    assert hits() == {P: 3}


def test_count_hits_restarts_from_zero_and_can_be_stopped() -> None:
    failpoints.count_hits()
    hit(P)
    failpoints.count_hits()  # restart
    assert hits() == {}
    hit(Q)
    failpoints.count_hits(False)
    hit(Q)
    assert hits() == {}


def test_disarm_all_stops_counting() -> None:
    failpoints.count_hits()
    hit(P)
    disarm(P)  # one point: counting goes on
    hit(P)
    assert hits() == {P: 2}
    disarm()
    assert hits() == {}
    hit(P)
    assert hits() == {}


# -- bad arguments --------------------------------------------------------------------------


def test_unknown_point_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown failpoint 'nope'"):
        arm("nope")


def test_unknown_action_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown failpoint action 'explode'"):
        arm(P, "explode")


def test_call_without_fn_is_refused() -> None:
    with pytest.raises(ValueError, match="fn="):
        arm(P, "call")


@pytest.mark.parametrize("kw", [{"nth": 0}, {"nth": -1}, {"times": 0}, {"times": -3}])
def test_bad_nth_or_times_is_refused_and_arms_nothing(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="count from 1"):
        arm(P, **kw)
    assert not fires(P)


def test_a_refused_arm_keeps_the_previous_arming() -> None:
    arm(P, nth=2)
    with pytest.raises(ValueError):
        arm(P, nth=0)
    assert [fires(P) for _ in range(2)] == [False, True]


# -- kill -----------------------------------------------------------------------------------

_KILL = """
import sys
from agentwal import failpoints
failpoints.arm({name!r}, "kill", {args})
for i in range(5):
    print("hit", i, flush=True)
    failpoints.hit({name!r})
print("survived", flush=True)
"""


def run_child(args: str) -> subprocess.CompletedProcess[str]:
    code = _KILL.format(name=P, args=args)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


def test_kill_exits_with_the_given_code_at_once() -> None:
    proc = run_child("exit_code=42")
    assert proc.returncode == 42
    assert proc.stdout.split("\n")[:-1] == ["hit 0"]  # nothing ran after the hit
    assert proc.stderr == ""  # no traceback, no atexit noise


def test_kill_on_the_nth_hit_with_the_default_code() -> None:
    proc = run_child("nth=3")
    assert proc.returncode == 137
    assert proc.stdout.split() == ["hit", "0", "hit", "1", "hit", "2"]


def test_armed_says_whether_a_point_is_armed_until_it_fired() -> None:
    assert not failpoints.armed(P)
    arm(P, "raise", nth=1)
    assert failpoints.armed(P)
    with pytest.raises(FailpointFired):
        hit(P)
    assert not failpoints.armed(P)  # fired its one time
    arm(P, "raise")
    disarm(P)
    assert not failpoints.armed(P)
