"""Every way a step can be re-run, and what each effect mode promises there.

The fake downstream counts calls and applications per key; where one
*logical* effect could end up under two keys (the double charge of a retry
loop), the tests count applications per logical request (``args``) too.
``docs/effects.md`` has the table ("When a step runs again") these cases prove.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal import ConflictError, EffectDivergenceError, EffectSettledError
from agentwal.errors import EffectNotFoundError, EffectNotRetirableError

from .downstream import Downstream

MODES = ["at_most_once", "at_least_once", "exactly_once"]


def kw_for(mode: str, down: Downstream) -> dict[str, Any]:
    """What each mode needs: exactly_once gets an idempotent (deduping) downstream."""
    if mode == "exactly_once":
        down.dedup = True
        return {"idempotent": True}
    return {}


def charges(down: Downstream) -> Counter[str]:
    """Applications per logical request (the args the step asked with)."""
    return Counter(json_args(e) for e in down.events() if e["kind"] == "apply")


def json_args(event: dict[str, Any]) -> str:
    return str(event.get("args"))


class Shop(Downstream):
    """A payment API: applies a charge per key (deduping when ``dedup``), logs the amount."""

    def call(self, ctx: agentwal.EffectContext) -> dict[str, Any]:
        self._log("call", ctx.key, attempt=ctx.attempt, args=ctx.args)
        if not (self.dedup and self.applied(ctx.key)):
            self._log("apply", ctx.key, attempt=ctx.attempt, args=ctx.args)
        return {"receipt": ctx.key[-8:], "args": ctx.args}


@pytest.fixture
def shop(tmp_path: Path) -> Shop:
    return Shop(str(tmp_path / "shop"))


# -- 1. an effect in a step that writes nothing ----------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_a_write_less_effect_step_makes_a_checkpoint_and_the_next_step_calls_again(
        store: agentwal.Store, shop: Shop, mode: str) -> None:
    kw = kw_for(mode, shop)
    ids = []
    for _ in range(2):
        with store.begin("r") as txn:
            txn.effect("pay", shop.call, mode=mode, args={"amount": 4900}, **kw)
        assert txn.checkpoint is not None
        ids.append(txn.checkpoint.id)
    assert ids == [1, 2]
    assert shop.calls() == 2 and shop.applications() == 2  # two steps, two notifications
    assert [e.committed_in for e in store.effects()] == [1, 2]


def test_an_explicit_commit_of_an_effect_only_step_returns_the_new_checkpoint(
        store: agentwal.Store, shop: Shop) -> None:
    txn = store.begin("r")
    txn.effect("notify", shop.call, mode="at_least_once")
    ckpt = txn.commit()
    assert ckpt is not None and ckpt.id == 1 and store.head("r") == ckpt


def test_a_step_that_touched_nothing_still_makes_no_checkpoint(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.get("x")
    assert txn.checkpoint is None and store.head("r") is None


# -- 2. the tutorial's retry loop under a concurrent commit --------------------------------

def inbox_step(store: agentwal.Store, shop: Shop, mode: str, kw: dict[str, Any],
               interfere: list[bool]) -> Any:
    """The step: read the inbox, charge, store the receipt; a user message arrives meanwhile."""
    def step(txn: agentwal.Transaction) -> Any:
        inbox = txn.get("inbox", [])
        receipt = txn.effect("charge", shop.call, mode=mode, args={"amount": 4900}, **kw)
        if interfere:
            interfere.pop()
            with store.begin("r") as web:  # the web handler, on another code path
                web["inbox"] = [*web.get("inbox", []), "hello"]
        txn["receipt"] = receipt
        txn["seen"] = len(inbox)
        return receipt
    return step


@pytest.mark.parametrize("mode", MODES)
def test_transact_retries_a_conflicted_step_without_charging_twice(
        store: agentwal.Store, shop: Shop, mode: str) -> None:
    kw = kw_for(mode, shop)
    receipt = store.transact("r", inbox_step(store, shop, mode, kw, [True]))
    assert shop.calls() == 1 and shop.applications() == 1
    (e,) = store.effects()
    assert e.status == "done" and e.result == receipt and e.committed_in == 2
    assert store.get("r", "receipt") == receipt and store.get("r", "seen") == 1
    assert store.head("r").id == 2  # the web handler's commit, then the step's


@pytest.mark.parametrize("mode", MODES)
def test_a_hand_written_retry_loop_with_retry_of_charges_once(
        store: agentwal.Store, shop: Shop, mode: str) -> None:
    kw = kw_for(mode, shop)
    step = inbox_step(store, shop, mode, kw, [True])
    txn = store.begin("r")
    conflicts = 0
    while True:
        try:
            with txn:
                step(txn)
            break
        except ConflictError as exc:
            conflicts += 1
            assert exc.effects == ("charge",) and "retry_of" in str(exc)
            txn = store.begin("r", retry_of=txn)
    assert conflicts == 1 and txn.attempt == 2
    assert shop.calls() == 1 and shop.applications() == 1


def test_an_effect_of_a_conflicted_attempt_shows_uncommitted_until_a_retry_meets_it(
        store: agentwal.Store, shop: Shop) -> None:
    step = inbox_step(store, shop, "exactly_once", kw_for("exactly_once", shop), [True])
    with pytest.raises(ConflictError) as info, store.begin("r") as txn:
        step(txn)
    assert info.value.effects == ("charge",)
    (orphan,) = store.effects()
    assert orphan.uncommitted and orphan.committed_in is None and orphan.status == "done"
    with store.begin("r") as txn:  # a plain retry asking for the same effect meets it
        step(txn)
    assert shop.applications() == 1
    (e,) = store.effects()
    assert e.key == orphan.key and not e.uncommitted and e.committed_in == txn.checkpoint.id


def test_a_retry_that_asks_with_other_args_diverges_naming_both(
        store: agentwal.Store, shop: Shop) -> None:
    amounts = [4900, 5900]

    def step(txn: agentwal.Transaction) -> None:
        txn.get("inbox")
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": amounts.pop(0)})
        if amounts:
            with store.begin("r") as web:
                web["inbox"] = ["hello"]

    with pytest.raises(EffectDivergenceError) as info:
        store.transact("r", step)
    assert "4900" in str(info.value) and "5900" in str(info.value)
    assert shop.calls() == 1


def test_transact_gives_up_after_its_retries_with_the_last_conflict(
        store: agentwal.Store, shop: Shop) -> None:
    attempts = []

    def step(txn: agentwal.Transaction) -> None:
        attempts.append(txn.attempt)
        txn.get("inbox")
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 1})
        with store.begin("r") as web:  # a conflict every time
            web["inbox"] = len(attempts)

    with pytest.raises(ConflictError):
        store.transact("r", step, retries=2)
    assert attempts == [1, 2, 3] and shop.calls() == 1
    assert store.stats()["retries"] == 2


def test_transact_returns_what_the_step_returns_and_lets_other_errors_through(
        store: agentwal.Store) -> None:
    assert store.transact("r", lambda txn: txn.put("a", 1) or "ok") == "ok"
    assert store.get("r", "a") == 1

    def boom(txn: agentwal.Transaction) -> None:
        txn["b"] = 2
        raise RuntimeError("tool failed")

    with pytest.raises(RuntimeError):
        store.transact("r", boom)
    assert store.get("r", "b") is None  # rolled back, not retried


def test_transact_and_retry_of_check_their_arguments(store: agentwal.Store) -> None:
    async def astep(txn: agentwal.Transaction) -> None: ...

    with pytest.raises(TypeError, match="atransact"):
        store.transact("r", astep)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retries"):
        store.transact("r", lambda t: None, retries=-1)
    active = store.begin("r")
    with pytest.raises(ValueError, match="still active"):
        store.begin("r", retry_of=active)
    active["x"] = 1
    active.commit()
    with pytest.raises(ValueError, match="committed"):
        store.begin("r", retry_of=active)
    other = store.begin("q")
    other.rollback()
    with pytest.raises(ValueError, match="run 'q'"):
        store.begin("r", retry_of=other)
    with pytest.raises(TypeError):
        store.begin("r", retry_of="txn")  # type: ignore[arg-type]


def test_a_step_that_commits_inside_fn_is_retried_and_reuses_its_first_effect(
        store: agentwal.Store, shop: Shop) -> None:
    # An effect function that itself writes to the run (a tool logging into the
    # store) moves the head under the step: its next effect is refused before any
    # call, the retry reuses the first effect and calls the second once.
    def logging_call(ctx: agentwal.EffectContext) -> Any:
        with store.begin("r") as log:
            log[f"log/{ctx.attempt}"] = ctx.name
        return shop.call(ctx)

    def step(txn: agentwal.Transaction) -> None:
        txn.effect("one", logging_call, mode="at_least_once", args={"n": 1})
        txn.effect("two", shop.call, mode="at_least_once", args={"n": 2})

    store.transact("r", step)
    assert shop.per_key("call") == Counter({k: 1 for k in shop.per_key("call")})
    assert shop.calls() == 2


# -- 3. two transactions on one run from one checkpoint -----------------------------------

def test_a_second_live_step_from_the_same_checkpoint_cannot_take_the_first_ones_effects(
        store: agentwal.Store, shop: Shop) -> None:
    a = store.begin("r")
    b = store.begin("r")
    a.effect("notify", shop.call, mode="at_least_once", args={"to": "a"})
    with pytest.raises(ConflictError, match="another transaction"):
        b.effect("notify", shop.call, mode="at_least_once", args={"to": "a"})
    b.rollback()
    a.commit()
    assert shop.calls() == 1


def test_a_step_begun_before_the_run_moved_on_gets_a_conflict_not_the_other_steps_result(
        store: agentwal.Store, shop: Shop) -> None:
    stale = store.begin("r")
    with store.begin("r") as first:
        first.effect("notify", shop.call, mode="at_least_once", args={"n": 1})
    with pytest.raises(ConflictError, match="moved on"):
        stale.effect("notify", shop.call, mode="at_least_once", args={"n": 1})
    stale.rollback()
    assert shop.calls() == 1
    store.transact("r", lambda t: t.effect("notify", shop.call, mode="at_least_once",
                                           args={"n": 1}))
    assert shop.calls() == 2  # the second step really notifies


def test_concurrent_steps_through_transact_each_charge_once(
        store: agentwal.Store, shop: Shop) -> None:
    shop.dedup = True
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        def step(txn: agentwal.Transaction) -> None:
            n = txn.get("n", 0)
            txn.effect("charge", shop.call, mode="exactly_once", args={"order": i},
                       idempotent=True)
            txn["n"] = n + 1
        try:
            store.transact("r", step, retries=200)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert store.get("r", "n") == 6
    assert charges(shop) == Counter({str({"order": i}): 1 for i in range(6)})


# -- 3b. the run deleted while a step runs, or after it left an entry ------------------------

def test_a_step_whose_run_was_deleted_meanwhile_is_not_redone_and_the_new_run_starts_afresh(
        store: agentwal.Store, shop: Shop) -> None:
    def step(txn: agentwal.Transaction) -> None:
        txn.effect("charge", shop.call, mode="at_most_once", args={"n": 1})
        if store.head("r") is not None:
            store.delete_run("r")  # an operator deletes the run while the step runs
        txn["done"] = True

    with store.begin("r") as txn:
        txn["x"] = 1
    with pytest.raises(ConflictError) as info:
        store.transact("r", step)  # redoing it would make a new run of the old step
    assert info.value.deleted and "retry_of" not in str(info.value)
    assert store.head("r") is None and shop.calls() == 1
    with store.begin("r") as txn:
        txn["x"] = 1
    attempt = store.begin("r")
    with pytest.raises(ConflictError), attempt:
        step(attempt)
    with pytest.raises(ValueError, match="deleted"):  # nor by hand
        store.begin("r", retry_of=attempt)
    for _ in range(2):  # the run made again: its steps call afresh, under new keys
        store.transact("r", lambda t: t.effect("charge", shop.call, mode="at_most_once",
                                               args={"n": 1}))
    assert shop.calls() == 4 and store.head("r").id == 2  # type: ignore[union-attr]


def test_settling_an_entry_of_a_deleted_run_leaves_its_position_free(
        store: agentwal.Store, shop: Shop) -> None:
    from agentwal import failpoints

    with store.begin("r") as txn:
        txn["x"] = 1
    failpoints.arm("after_effect_call", "raise")
    with pytest.raises(failpoints.FailpointFired), store.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_most_once")  # applied; outcome lost
    failpoints.disarm()
    (old,) = store.effects(status="in_doubt")
    store.delete_run("r")
    store.resolve_effect(old.effect_id, result="settled by hand")
    with store.begin("r") as txn:  # the run made again, up to the same checkpoint
        txn["x"] = 1
    with store.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_most_once")
    assert shop.calls() == 2
    assert sorted(e.status for e in store.effects()) == ["done", "resolved"]


# -- 4. rollback_to and fork: the world is not rolled back ----------------------------------

def test_rollback_to_lists_the_effects_the_world_still_holds(
        store: agentwal.Store, shop: Shop) -> None:
    with store.begin("r") as txn:
        txn["plan"] = "a"
    for n in (1, 2):
        with store.begin("r") as txn:
            txn.effect("charge", shop.call, mode="at_least_once", args={"n": n})
    with store.begin("r") as txn:
        txn.defer("mail", mode="at_least_once", args={"to": "x"})
    back = store.rollback_to("r", 1)
    assert [e.name for e in back.effects_after] == ["charge", "charge", "mail"]
    assert back == store.head("r")  # effects_after is not part of equality
    assert store.head("r").effects_after == ()
    later = store.rollback_to("r", 2)  # the step from 2 charged n=2; 4 deferred the mail
    assert [e.args for e in later.effects_after] == [{"n": 2}, {"to": "x"}]
    assert [e.args for e in store.rollback_to("r", 3).effects_after] == [{"to": "x"}]


def test_a_step_re_run_after_rollback_to_calls_again_unless_it_has_a_business_key(
        store: agentwal.Store, shop: Shop) -> None:
    shop.dedup = True
    with store.begin("r") as txn:
        txn["plan"] = "a"
    for key in (None, "order-7"):
        with store.begin("r") as txn:
            txn.effect("charge", shop.call, mode="exactly_once", args={"k": key}, key=key,
                       idempotent=True)
    store.rollback_to("r", 1)
    for key in (None, "order-7"):
        with store.begin("r") as txn:
            txn.effect("charge", shop.call, mode="exactly_once", args={"k": key}, key=key,
                       idempotent=True)
    assert charges(shop) == Counter({str({"k": None}): 2, str({"k": "order-7"}): 1})


def test_fork_lists_the_source_runs_effects_after_the_fork_point(
        store: agentwal.Store, shop: Shop) -> None:
    with store.begin("r") as txn:
        txn["plan"] = "a"
    with store.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_least_once", args={"n": 1})
    forked = store.fork("r", 1, "r-b")
    assert [e.name for e in forked.effects_after] == ["charge"]
    with store.begin("r-b") as txn:
        txn.effect("charge", shop.call, mode="at_least_once", args={"n": 1})
    assert shop.calls() == 2  # the fork's step is a new position


# -- 5. re-runs from the same checkpoint still meet the record ------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_a_step_rolled_back_and_re_run_from_the_same_checkpoint_meets_its_record(
        store: agentwal.Store, shop: Shop, mode: str) -> None:
    kw = kw_for(mode, shop)
    with store.begin("r") as txn:
        first = txn.effect("charge", shop.call, mode=mode, args={"n": 1}, **kw)
        txn.rollback()
    with store.begin("r") as txn:
        again = txn.effect("charge", shop.call, mode=mode, args={"n": 1}, **kw)
    assert first == again and shop.calls() == 1
    assert store.effects()[0].committed_in == 1


def test_commit_marks_survive_a_fold_and_a_reopen(tmp_path: Path, shop: Shop) -> None:
    path = tmp_path / "m"
    store = agentwal.open(path, durability="sync")
    store.transact("r", inbox_step(store, shop, "at_least_once", {}, [True]))
    with store.begin("r") as txn:  # an orphan: a step that rolled back, never retried
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 1})
        txn.rollback()
    live = [(e.key, e.committed_in, e.uncommitted) for e in store.effects()]
    store.close()
    store = agentwal.open(path)  # replayed from the log
    assert [(e.key, e.committed_in, e.uncommitted) for e in store.effects()] == live
    store.snapshot()  # folded into LMDB
    store.close()
    store = agentwal.open(path)
    assert [(e.key, e.committed_in, e.uncommitted) for e in store.effects()] == live
    assert [u for _k, _c, u in live] == [False, True]
    store.close()


# -- 6. a step whose code changed on purpose ---------------------------------------------

def test_retire_effect_frees_a_diverged_position_and_keeps_the_old_entry(
        store: agentwal.Store, shop: Shop) -> None:
    with store.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 4900})
        txn.rollback()  # the step failed later; the developer fixes the amount
    with pytest.raises(EffectDivergenceError) as info, store.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 5900})
    assert "retire_effect" in str(info.value)
    (old,) = store.effects()
    retired = store.retire_effect(old.effect_id, by="alice")
    assert retired.status == "retired" and retired.retired_status == "done"
    assert retired.resolved_by == "alice"
    with store.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 5900})
    assert shop.calls() == 2
    entries = {e.args["amount"]: e for e in store.effects()}
    assert entries[4900].status == "retired" and entries[4900].retired_from == old.key
    assert entries[5900].status == "done" and entries[5900].key == old.key
    with pytest.raises(EffectNotRetirableError, match="retired already"):
        store.retire_effect(entries[4900].effect_id)
    with pytest.raises(EffectSettledError):  # nor resolved: it is history
        store.resolve_effect(entries[4900].effect_id, result="x")


def test_retire_effect_frees_a_position_held_by_another_name(
        store: agentwal.Store, shop: Shop) -> None:
    with store.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_least_once")
        txn.rollback()
    with pytest.raises(EffectDivergenceError), store.begin("r") as txn:
        txn.effect("refund", shop.call, mode="at_least_once")
    store.retire_effect(store.effects()[0].effect_id)
    with store.begin("r") as txn:
        txn.effect("refund", shop.call, mode="at_least_once")
    assert sorted(e.status for e in store.effects()) == ["done", "retired"]


def test_retire_effect_refuses_outbox_entries_and_unknown_ids(store: agentwal.Store) -> None:
    with store.begin("r") as txn:
        txn.defer("mail", mode="at_least_once")
    (e,) = store.effects()
    with pytest.raises(EffectNotRetirableError, match="resolve_effect"):
        store.retire_effect(e.effect_id)
    with pytest.raises(EffectNotFoundError):
        store.retire_effect("ef-nope")


# -- 7. a plain retry, and a crash, after the run moved on -----------------------------------

def plain_loop(store: agentwal.Store, step: Any) -> None:
    """The tutorial's loop: on ConflictError, begin again and redo the step."""
    while True:
        try:
            with store.begin("r") as txn:
                step(txn)
            return
        except ConflictError:
            continue


@pytest.mark.parametrize("mode", MODES)
def test_a_plain_re_begin_after_a_conflict_meets_the_uncommitted_attempts_effect(
        store: agentwal.Store, shop: Shop, mode: str) -> None:
    kw = kw_for(mode, shop)
    plain_loop(store, inbox_step(store, shop, mode, kw, [True]))
    assert shop.calls() == 1 and shop.applications() == 1
    (e,) = store.effects()
    assert e.committed_in == 2 and not e.uncommitted


def test_a_plain_re_begin_meets_the_uncommitted_attempt_whose_first_effect_has_a_business_key(
        store: agentwal.Store, shop: Shop) -> None:
    # The step books under its order's key, then notifies (positional, at most once).
    interfere = [True]

    def step(txn: agentwal.Transaction) -> None:
        txn.get("inbox")
        txn.effect("book", shop.call, mode="at_most_once", key="order-7/book")
        txn.effect("notify", shop.call, mode="at_most_once", args={"to": "ada"})
        if interfere:
            interfere.pop()
            with store.begin("r") as web:
                web["inbox"] = ["hello"]

    plain_loop(store, step)
    assert shop.calls() == 2 and shop.applications() == 2  # book once, notify once
    assert [e.committed_in for e in store.effects()] == [2, 2]


def test_a_new_step_with_other_args_does_not_adopt_an_uncommitted_attempt(
        store: agentwal.Store, shop: Shop) -> None:
    with store.begin("r") as txn:
        txn["x"] = 0
    with pytest.raises(ConflictError), store.begin("r") as txn:
        txn.get("inbox")
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 1})
        with store.begin("r") as web:
            web["inbox"] = ["hi"]
    with store.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 2})
    assert shop.calls() == 2
    orphan, fresh = store.effects()
    assert orphan.uncommitted and not fresh.uncommitted


def test_an_uncommitted_attempt_is_not_adopted_across_a_committed_effect_step_or_a_rollback(
        store: agentwal.Store, shop: Shop) -> None:
    with store.begin("r") as txn:
        txn["x"] = 0
    with store.begin("r") as txn:  # an attempt from 1 that never commits
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 1})
        txn.rollback()
    with store.begin("r") as txn:  # the run moves on without effects: 2
        txn["x"] = 1
    store.rollback_to("r", 1)  # 3: re-runs from here are new positions
    with store.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 1})
    assert shop.calls() == 2
    with store.begin("r") as txn:  # an effect step from 4 committed: 5
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 1})
    assert shop.calls() == 3


def test_a_new_step_is_not_taken_for_an_abandoned_attempt_past_an_effect_step(
        store: agentwal.Store, shop: Shop) -> None:
    # A committed effect step whose first effect was a business key recorded elsewhere
    # leaves position 0 of its checkpoint empty; the walk must still stop at it.
    with store.begin("r") as txn:
        txn["x"] = 0
    with store.begin("other") as txn:
        txn.effect("profile", shop.call, mode="at_least_once", key="profile/ada")
    with pytest.raises(ConflictError), store.begin("r") as txn:  # abandoned after this
        txn.get("inbox")
        txn.effect("notify", shop.call, mode="at_least_once", args={"to": "ada"})
        with store.begin("r") as web:
            web["inbox"] = ["hi"]
    with store.begin("r") as txn:  # the next step: the shared profile, then a charge
        txn.effect("profile", shop.call, mode="at_least_once", key="profile/ada")
        txn.effect("charge", shop.call, mode="at_least_once", args={"amount": 1})
    with store.begin("r") as txn:  # a new step that notifies: it really does
        txn.effect("notify", shop.call, mode="at_least_once", args={"to": "ada"})
    assert shop.calls() == 4


def test_an_abandoned_attempt_is_not_adopted_across_a_rollback_that_compaction_dropped(
        store: agentwal.Store, shop: Shop) -> None:
    with store.begin("r") as txn:
        txn["x"] = 0
    with pytest.raises(ConflictError), store.begin("r") as txn:  # abandoned after this
        txn.get("inbox")
        txn.effect("notify", shop.call, mode="at_least_once", args={"to": "ada"})
        with store.begin("r") as web:
            web["inbox"] = ["hi"]
    store.rollback_to("r", 1)
    with store.begin("r") as txn:
        txn["y"] = 1
    store.compact(keep_last=1)  # drops the rollback_to checkpoint, the walk's boundary
    with store.begin("r") as txn:  # the step re-run after the rollback really runs
        txn.effect("notify", shop.call, mode="at_least_once", args={"to": "ada"})
    assert shop.calls() == 2


def test_a_read_only_store_sees_commit_marks_after_refresh(tmp_path: Path, shop: Shop) -> None:
    path = tmp_path / "ro"
    writer = agentwal.open(path)
    reader = agentwal.open(path, readonly=True)
    with pytest.raises(agentwal.ReadOnlyError):
        reader.begin("r")
    with writer.begin("r") as txn:
        txn.effect("charge", shop.call, mode="at_least_once")
        txn.rollback()
    reader.refresh()
    assert [e.uncommitted for e in reader.effects()] == [True]
    with writer.begin("r") as txn:  # re-run from the same checkpoint: meets and commits it
        txn.effect("charge", shop.call, mode="at_least_once")
    reader.refresh()
    assert [e.committed_in for e in reader.effects()] == [1] and shop.calls() == 1
    reader.close()
    writer.close()


# -- 8. the same for asyncio steps --------------------------------------------------------

def test_atransact_retries_a_conflicted_async_step_without_charging_twice(
        store: agentwal.Store, shop: Shop) -> None:
    import asyncio

    shop.dedup = True
    interfere = [True]

    async def step(txn: agentwal.Transaction) -> Any:
        txn.get("inbox")
        receipt = await txn.aeffect("charge", shop.call, mode="exactly_once",
                                    args={"amount": 4900}, idempotent=True)
        if interfere:
            interfere.pop()
            with store.begin("r") as web:
                web["inbox"] = ["hello"]
        txn["receipt"] = receipt
        return receipt

    receipt = asyncio.run(store.atransact("r", step))
    assert shop.calls() == 1 and store.get("r", "receipt") == receipt
    assert store.stats()["retries"] == 1
    with pytest.raises(TypeError, match=r"store\.transact"):
        asyncio.run(store.atransact("r", lambda txn: None))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="atransact"):
        store.transact("r", step)  # type: ignore[arg-type]


# -- 9. effects that belong to no transaction: store.effect ------------------------------

def test_store_effect_is_keyed_listed_under_its_run_and_never_uncommitted(
        store: agentwal.Store, shop: Shop) -> None:
    first = store.effect("thread-7", "charge", shop.call, key="charge/task-1",
                         mode="at_least_once", args={"amount": 1})
    again = store.effect("thread-7", "charge", shop.call, key="charge/task-1",
                         mode="at_least_once", args={"amount": 1})
    assert first == again and shop.calls() == 1
    (e,) = store.effects(run="thread-7")
    assert e.ordinal is None and e.keyed and not e.uncommitted and e.committed_in is None
    with pytest.raises(EffectDivergenceError):
        store.effect("thread-7", "charge", shop.call, key="charge/task-1",
                     mode="at_least_once", args={"amount": 2})
    with pytest.raises(TypeError, match="business key"):
        store.effect("thread-7", "charge", shop.call, key=None,  # type: ignore[arg-type]
                     mode="at_least_once")
    assert store.head("thread-7") is None  # no checkpoint: it is no step of the run


def test_store_aeffect_awaits_an_async_fn_and_a_read_only_store_refuses(
        store: agentwal.Store, shop: Shop, tmp_path: Path) -> None:
    import asyncio

    async def call(ctx: agentwal.EffectContext) -> Any:
        return shop.call(ctx)

    r = asyncio.run(store.aeffect("t", "notify", call, key="n/1", mode="at_least_once"))
    assert r["args"] is None and shop.calls() == 1
    with pytest.raises(TypeError, match="aeffect"):
        store.effect("t", "notify", call, key="n/2", mode="at_least_once")
    store.close()
    with agentwal.open(store.path, readonly=True) as ro, pytest.raises(agentwal.ReadOnlyError):
        ro.effect("t", "notify", shop.call, key="n/3", mode="at_least_once")
