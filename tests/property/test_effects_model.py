"""Effect guarantees under any schedule a Hypothesis state machine finds.

Steps run effects of every mode on a few runs (some writing no key, some made
to conflict by a concurrent writer and redone through ``store.transact``,
``begin(retry_of=)`` or a plain re-begin), defer outbox entries (some with
business keys shared across runs) and dispatch them, commit or roll back, get cut
off by a simulated process crash in any effect window (a failpoint raising a
``BaseException``, then ``testing.crash()`` and a reopen: what reached the OS
survives, like after ``kill -9``), reopen cleanly, fold, and resolve entries
in doubt. After every step:

- at_most_once: every key was called at most once, ever;
- exactly_once: every key was applied at most once, and exactly once when
  the ledger says it is done;
- every mode: a key is never called more often than the ledger counts attempts;
- per *logical* effect of a redone step (whatever keys its attempts derived):
  at_most_once called at most once, exactly_once applied at most once.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections import Counter
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import agentwal
from agentwal import failpoints
from agentwal.testing import crash as crash_store

WINDOWS = ("effect_before_intent", "effect_after_intent", "after_effect_call",
           "effect_after_outcome")
# effect name -> (mode, probe?, idempotent?)
EFFECTS = {
    "amo": ("at_most_once", False, False),
    "amo_probe": ("at_most_once", True, False),
    "alo": ("at_least_once", False, False),
    "eo_idem": ("exactly_once", False, True),
    "eo_probe": ("exactly_once", True, False),
}


class _Crash(BaseException):
    pass


class EffectsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="awal-effects-")
        self.store = agentwal.open(self.dir + "/s", durability="none",
                                   wal_max_bytes=16 << 10, segment_bytes=8192)
        self.calls: Counter[str] = Counter()
        self.applied: Counter[str] = Counter()
        self.modes: dict[str, str] = {}
        # per logical effect of retried steps (whatever keys their attempts used)
        self.logical_calls: Counter[str] = Counter()
        self.logical_applied: Counter[str] = Counter()
        self.logical_modes: dict[str, str] = {}

    # -- the downstream ----------------------------------------------------------

    def call(self, ctx: agentwal.EffectContext) -> str:
        self.calls[ctx.key] += 1
        self.modes[ctx.key] = ctx.mode.value
        logical = ctx.args.get("logical") if isinstance(ctx.args, dict) else None
        if logical is not None:
            self.logical_calls[logical] += 1
            self.logical_modes[logical] = ctx.mode.value
        if not (ctx.name == "eo_idem" and self.applied[ctx.key]):  # it dedups by key
            self.applied[ctx.key] += 1
            if logical is not None:
                self.logical_applied[logical] += 1
        return f"{ctx.name}:{ctx.key}"

    def probe(self, ctx: agentwal.EffectContext) -> Any:
        return f"{ctx.name}:{ctx.key}" if self.applied[ctx.key] else agentwal.NOT_APPLIED

    # -- rules -------------------------------------------------------------------

    @rule(run=st.sampled_from(["r1", "r2"]), commit=st.booleans(),
          crash=st.none() | st.tuples(st.sampled_from(WINDOWS), st.integers(1, 3)))
    def step(self, run: str, commit: bool, crash: tuple[str, int] | None) -> None:
        # A deterministic agent: the effects of a step depend on where it starts, so
        # a step re-run from the same checkpoint asks for the same effects.
        head = self.store.head(run)
        pick = random.Random(f"{run}/{head.id if head else 0}")
        names = pick.sample(sorted(EFFECTS), pick.randint(1, 3))
        if crash is not None:
            failpoints.arm(crash[0], "raise", exc=_Crash, nth=crash[1])
        try:
            with self.store.begin(run) as txn:
                for name in names:
                    mode, probe, idem = EFFECTS[name]
                    txn.effect(name, self.call, mode=mode, probe=self.probe if probe else None,
                               idempotent=idem)
                txn["n"] = txn.get("n", 0) + 1
                if not commit:
                    txn.rollback()
        except _Crash:
            event("crashed in an effect window")
            crash_store(self.store)
            self.store = agentwal.open(self.dir + "/s", durability="none",
                                       wal_max_bytes=16 << 10, segment_bytes=8192)
        except (agentwal.EffectInDoubtError, agentwal.EffectNotAppliedError,
                agentwal.EffectDivergenceError) as exc:
            event(type(exc).__name__)
        finally:
            failpoints.disarm()

    @rule(run=st.sampled_from(["r1", "r2"]), write=st.booleans(), booked=st.booleans(),
          interfere=st.integers(0, 2), how=st.sampled_from(["transact", "retry_of", "plain"]))
    def retried_step(self, run: str, write: bool, booked: bool, interfere: int,
                     how: str) -> None:
        # One logical step (its effects fixed by where its first attempt began), which
        # a concurrent writer (a web handler adding to the inbox the step read) makes
        # conflict ``interfere`` times; redone through store.transact, begin(retry_of=)
        # or a plain re-begin. Each of its effects must reach the world as its mode says,
        # counted per logical effect, whatever keys the attempts derived. A ``booked``
        # step first makes an effect under a business key of its own.
        head = self.store.head(run)
        start = head.id if head else 0
        pick = random.Random(f"{run}/{start}/retried")
        names = pick.sample(sorted(EFFECTS), pick.randint(1, 3))
        left = [interfere]

        def body(txn: agentwal.Transaction) -> None:
            txn.get("inbox")
            if booked:
                book = f"{run}/{start}/book"
                txn.effect("book", self.call, mode="at_most_once", key=book,
                           args={"logical": book})
            for i, name in enumerate(names):
                mode, probe, idem = EFFECTS[name]
                txn.effect(name, self.call, mode=mode, probe=self.probe if probe else None,
                           idempotent=idem, args={"logical": f"{run}/{start}/{i}/{name}"})
            if left[0] > 0:
                left[0] -= 1
                with self.store.begin(run) as web:
                    web["inbox"] = web.get("inbox", 0) + 1
            if write:
                txn["n"] = txn.get("n", 0) + 1

        try:
            if how == "transact":
                self.store.transact(run, body)
            else:
                txn = self.store.begin(run)
                while True:
                    try:
                        with txn:
                            body(txn)
                        break
                    except agentwal.ConflictError:
                        txn = (self.store.begin(run, retry_of=txn) if how == "retry_of"
                               else self.store.begin(run))
        except (agentwal.EffectInDoubtError, agentwal.EffectNotAppliedError,
                agentwal.EffectDivergenceError) as exc:
            event(type(exc).__name__)
            return
        after = self.store.head(run)
        assert after is not None and after.id == start + interfere + 1  # a checkpoint always
        event(f"retried step ({how}{', booked' if booked else ''}) after {interfere} conflicts")

    @rule(run=st.sampled_from(["r1", "r2"]), what=st.sampled_from(["mail", "sms"]),
          key=st.none() | st.sampled_from(["b1", "b2"]))
    def defer(self, run: str, what: str, key: str | None) -> None:
        # A business key always names the same request here (so it never diverges).
        mode = "at_least_once" if what == "mail" else "at_most_once"
        if key is not None:
            what, mode = ("mail", "at_least_once") if key == "b1" else ("sms", "at_most_once")
        with self.store.begin(run) as txn:
            txn.defer(what, mode=mode, args={"key": key}, key=key)

    @rule(crash=st.none() | st.tuples(st.sampled_from(WINDOWS), st.integers(1, 2)))
    def dispatch(self, crash: tuple[str, int] | None) -> None:
        if crash is not None:
            failpoints.arm(crash[0], "raise", exc=_Crash, nth=crash[1])
        try:
            report = self.store.dispatch({"mail": self.call, "sms": self.call})
            event(f"dispatch: {len(report.done)} done, {len(report.in_doubt)} in doubt")
        except _Crash:
            event("crashed while dispatching")
            crash_store(self.store)
            self.store = agentwal.open(self.dir + "/s", durability="none",
                                       wal_max_bytes=16 << 10, segment_bytes=8192)
        finally:
            failpoints.disarm()

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = agentwal.open(self.dir + "/s", durability="none",
                                   wal_max_bytes=16 << 10, segment_bytes=8192)

    @rule()
    def fold(self) -> None:
        self.store.snapshot()

    @rule(data=st.data())
    def resolve(self, data: st.DataObject) -> None:
        doubt = self.store.effects(status="in_doubt")
        if not doubt:
            return
        e = data.draw(st.sampled_from(doubt))
        if self.applied[e.key]:  # the operator checked the downstream
            self.store.resolve_effect(e.effect_id, result=f"{e.name}:{e.key}")
        else:
            self.store.resolve_effect(e.effect_id, not_applied=True)
        event("resolved")

    # -- invariants --------------------------------------------------------------

    @invariant()
    def guarantees_hold(self) -> None:
        ledger = {e.key: e for e in self.store.effects()}
        for key, n in self.calls.items():
            mode = self.modes[key]
            if mode == "at_most_once":
                assert n <= 1, (key, n)
            if mode == "exactly_once":
                assert self.applied[key] <= 1, (key, self.applied[key])
            e = ledger[key]  # a call is never unknown to the ledger
            assert n <= e.attempts, (key, n, e)
            if e.status in ("done", "resolved") and mode == "exactly_once":
                assert self.applied[key] == 1
        for logical, n in self.logical_calls.items():
            mode = self.logical_modes[logical]
            if mode == "at_most_once":
                assert n <= 1, (logical, n)
            if mode == "exactly_once":
                assert self.logical_applied[logical] <= 1, (logical, self.logical_applied)

    def teardown(self) -> None:
        failpoints.disarm()
        crash_store(self.store)
        shutil.rmtree(self.dir, ignore_errors=True)


EffectsMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                            deadline=None)
test_effects_model = EffectsMachine.TestCase
