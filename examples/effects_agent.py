"""An agent whose side effects survive crashes: agentwal's effects ledger and outbox.

The agent checks out one order in one step (one transaction). The step
asks a (fake) LLM to draft the confirmation, charges the card, writes the
order row to a database, e-mails the customer, and leaves a shipping
request in the outbox. Every call goes through ``txn.effect`` under the
mode that fits the downstream:

    draft-email        at_least_once   an LLM: the recorded answer is reused, not paid twice
    charge-card        exactly_once    the payment API dedups by its Idempotency-Key header
    insert-order       exactly_once    a database write, with a probe that looks the row up
    send-confirmation  at_most_once    a mailer without idempotency: never send twice
    ship-order         outbox          txn.defer + store.dispatch, at_least_once

The agent process is killed three times, each time right after a downstream
applied a call and before agentwal could record the outcome, then once more
while it dispatches the outbox. After each crash the store is reopened and
the step runs again from the same checkpoint; the narrative shows what each
mode did and, at the end, what really reached the outside world.

The outside world is in-process and fake (no network): five little
services whose state lives in a JSON file next to the store, so it outlives
the killed process and can be counted.

Run it with ``make example`` or ``python examples/effects_agent.py [DIR]``
(DIR is recreated and kept; without it a temporary directory is used).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import agentwal

RUN = "order-1009"
ORDER = {"id": 1009, "customer": "ada@example.com", "amount": 4900, "card": "tok_visa",
         "address": "14B Harbour Street"}


# -- the outside world (fake services) -------------------------------------------------


class World:
    """Fake downstream services whose state is one JSON file (it outlives the agent).

    ``die_after`` names a service operation; right after that operation has
    been applied, the world kills the calling process with ``os._exit``, as
    a power cut or ``kill -9`` would: the service did the work, the agent
    never saw the answer, and agentwal never recorded the outcome.
    """

    def __init__(self, path: str, die_after: str | None = None) -> None:
        self.path = path
        self.die_after = die_after

    def load(self) -> dict[str, Any]:
        if not os.path.exists(self.path):
            return {"requests": {}, "charges": {}, "llm_calls": 0, "rows": {}, "mail": [],
                    "shipments": {}}
        with open(self.path) as f:
            data: dict[str, Any] = json.load(f)
            return data

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, self.path)  # a killed process leaves this file whole

    def _applied(self, operation: str, state: dict[str, Any]) -> None:
        state["requests"][operation] = state["requests"].get(operation, 0) + 1
        self._save(state)
        if operation == self.die_after:
            os._exit(137)  # dies with the answer in hand, before agentwal records it

    # The payment API honours an Idempotency-Key header: a repeated key gets
    # the first answer back and no new charge.
    def charge(self, amount: int, card: str, headers: dict[str, str]) -> dict[str, Any]:
        state = self.load()
        key = headers["Idempotency-Key"]
        if key not in state["charges"]:
            state["charges"][key] = {"charge": f"ch_{len(state['charges']) + 1}",
                                     "amount": amount, "card": card}
        answer: dict[str, Any] = state["charges"][key]
        self._applied("charge", state)
        return answer

    # An LLM: every call costs money and may answer differently.
    def complete(self, prompt: str) -> str:
        state = self.load()
        state["llm_calls"] += 1
        n = state["llm_calls"]
        self._applied("complete", state)
        return f"Thank you for your order! (draft #{n} for: {prompt[:32]}...)"

    # A database table with a unique request_id column, and a lookup by it.
    def insert_order(self, request_id: str, row: dict[str, Any]) -> dict[str, Any]:
        state = self.load()
        if request_id in state["rows"]:
            raise RuntimeError(f"unique constraint violated: request_id {request_id}")
        state["rows"][request_id] = {**row, "row_id": len(state["rows"]) + 1}
        stored: dict[str, Any] = state["rows"][request_id]
        self._applied("insert", state)
        return stored

    def find_order(self, request_id: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.load()["rows"].get(request_id)
        return found

    # A mailer with no idempotency at all: every call sends an e-mail.
    def send_mail(self, to: str, subject: str, body: str) -> dict[str, Any]:
        state = self.load()
        state["mail"].append({"to": to, "subject": subject, "body": body})
        message = {"message_id": f"<{len(state['mail'])}@mail.example>"}
        self._applied("mail", state)
        return message

    def sent_mail(self, to: str) -> list[dict[str, Any]]:
        return [m for m in self.load()["mail"] if m["to"] == to]

    # The warehouse accepts a client token and ignores a repeated one.
    def ship(self, order_id: int, address: str, token: str) -> dict[str, Any]:
        state = self.load()
        if token not in state["shipments"]:
            state["shipments"][token] = {"order": order_id, "address": address,
                                         "shipment": f"sh_{len(state['shipments']) + 1}"}
        answer: dict[str, Any] = state["shipments"][token]
        self._applied("ship", state)
        return answer


# -- the agent -------------------------------------------------------------------------


def intake(store: agentwal.Store) -> None:
    """The first step: record the order in the run's state (checkpoint 1)."""
    with store.begin(RUN) as txn:
        txn["order"] = ORDER
        txn["status"] = "received"
        txn.meta(node="intake")


def checkout(store: agentwal.Store, world: World) -> agentwal.Checkpoint | None:
    """The checkout step: one transaction, four effects and one outbox entry."""
    with store.begin(RUN) as txn:
        order = txn["order"]

        # An LLM call, memoized: at_least_once records the answer, and a re-run
        # of this step gets the recorded answer back instead of paying again.
        draft = txn.effect(
            "draft-email", lambda ctx: world.complete(ctx.args),
            mode="at_least_once",
            args=f"Confirm order {order['id']} of {order['amount'] / 100:.2f} EUR.")

        # A payment: the API dedups by Idempotency-Key, so calling again with the
        # same key is safe. A business key ties the charge to the order itself.
        receipt = txn.effect(
            "charge-card",
            lambda ctx: world.charge(ctx.args["amount"], ctx.args["card"],
                                     headers={"Idempotency-Key": ctx.key}),
            mode="exactly_once", idempotent=True, key=f"charge/order-{order['id']}",
            args={"amount": order["amount"], "card": order["card"]})

        # A database write: ctx.key goes into a unique column, and the probe asks
        # the database whether an attempt in doubt went through.
        def find_row(ctx: agentwal.EffectContext) -> Any:
            row = world.find_order(ctx.key)
            return row if row is not None else agentwal.NOT_APPLIED

        row = txn.effect(
            "insert-order", lambda ctx: world.insert_order(ctx.key, ctx.args),
            mode="exactly_once", probe=find_row,
            args={"order": order["id"], "charge": receipt["charge"]})

        # An e-mail through a mailer that cannot dedup: at_most_once never sends
        # twice; after a crash in the middle it is in doubt until someone decides.
        sent = txn.effect(
            "send-confirmation",
            lambda ctx: world.send_mail(ctx.args["to"], ctx.args["subject"], ctx.args["body"]),
            mode="at_most_once",
            args={"to": order["customer"], "subject": f"Order {order['id']}", "body": draft})

        # The outbox: recorded with this commit, run later by store.dispatch.
        txn.defer("ship-order", mode="at_least_once",
                  args={"order": order["id"], "address": order["address"]})

        txn["receipt"] = receipt
        txn["row"] = row
        txn["confirmation"] = sent
        txn["status"] = "confirmed"
        txn.meta(node="checkout")
    return txn.checkpoint


def ship_handler(world: World) -> Any:
    """The outbox handler for ``ship-order``: ctx.key is the warehouse's client token."""
    return lambda ctx: world.ship(ctx.args["order"], ctx.args["address"], token=ctx.key)


# -- the narrative ---------------------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


def ledger(store: agentwal.Store) -> str:
    """One line: each ledger entry of the run as name=status (attempts)."""
    return ", ".join(f"{e.name}={e.status}({e.attempts})" for e in store.effects(run=RUN))


def crash(directory: str, what: str, die_after: str) -> None:
    """Run ``what`` (checkout or dispatch) in a child process the world kills."""
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), directory, "--child", what,
         "--die-after", die_after], check=False)
    if child.returncode != 137:
        raise SystemExit(f"the child was expected to die (137), it exited {child.returncode}")
    say(f"   killed (exit 137) right after the {die_after!r} request was applied")


def child(directory: str, what: str, die_after: str) -> int:
    """Child mode: run one step (or one dispatch pass) until the world kills us."""
    world = World(os.path.join(directory, "world.json"), die_after=die_after)
    with agentwal.open(os.path.join(directory, "store.awal")) as store:
        if what == "checkout":
            checkout(store, world)
        else:
            store.dispatch({"ship-order": ship_handler(world)})
    return 0  # not reached when the world kills us


def story(directory: str) -> int:
    store_path = os.path.join(directory, "store.awal")
    world = World(os.path.join(directory, "world.json"))
    say(f"agentwal effects example: store {store_path}, run {RUN!r}\n")
    with agentwal.open(store_path) as store:
        intake(store)

    say("1. checkout: the agent is killed right after the payment API charged the card")
    crash(directory, "checkout", "charge")
    recovered(store_path, world)

    say("2. restart: the step runs again from the same checkpoint, so with the same keys:")
    say("   draft-email returns the recorded answer; charge-card (exactly_once, idempotent)")
    say("   is called again with the same Idempotency-Key. Killed after the database insert")
    crash(directory, "checkout", "insert")
    recovered(store_path, world)

    say("3. restart: insert-order (exactly_once) is in doubt; its probe finds the row, so")
    say("   the row is recorded, not inserted again. Killed after the e-mail went out")
    crash(directory, "checkout", "mail")
    recovered(store_path, world)

    say("4. restart in this process")
    with agentwal.open(store_path) as store:
        try:
            checkout(store, world)
            raise SystemExit("FAILED: an at_most_once effect in doubt was called again")
        except agentwal.EffectInDoubtError as exc:
            say(f"   send-confirmation (at_most_once) raises {type(exc).__name__}; nothing sent")
        for e in store.effects(status="in_doubt"):
            say(f"   in doubt: {e.effect_id} {e.name}, attempts {e.attempts}, key {e.key[:20]}...")
            # The operator looks at the mailer's sent folder and records what happened.
            if world.sent_mail(e.args["to"]):
                settled = store.resolve_effect(e.effect_id, result={"found_in_mail_log": True},
                                               by="ops@example.com (checked the mail log)")
            else:
                settled = store.resolve_effect(e.effect_id, not_applied=True)
            say(f"   settled by hand: {settled.status}, by {settled.resolved_by}")
        ckpt = checkout(store, world)
        assert ckpt is not None
        say(f"   the step completes on recorded results: checkpoint #{ckpt.id}, "
            f"status {store.get(RUN, 'status')!r}")
        say(f"   outbox: {[e.name for e in store.effects(run=RUN, status='pending')]} pending")

    say("5. dispatch the outbox; killed right after the warehouse accepted the shipment")
    crash(directory, "dispatch", "ship")
    with agentwal.open(store_path) as store:
        report = store.dispatch({"ship-order": ship_handler(world)})
        say(f"   dispatch again: done {len(report.done)}, ok {report.ok} (same client token, "
            "so the warehouse ignored the repeat)")
        again = store.dispatch({"ship-order": ship_handler(world)})
        say(f"   dispatch once more: done {len(again.done)}, nothing left to run")

    return tally(world)


def recovered(store_path: str, world: World) -> None:
    """Reopen the store after a crash and show the run's ledger and the world."""
    with agentwal.open(store_path) as store:
        say(f"   ledger: {ledger(store)}")
    state = world.load()
    say(f"   world:  LLM calls {state['llm_calls']}, charges {len(state['charges'])}, "
        f"rows {len(state['rows'])}, e-mails {len(state['mail'])}")


def tally(world: World) -> int:
    """What reached the outside world; 0 if it is what each mode promises."""
    state = world.load()
    req = state["requests"]
    charges, rows, mail = len(state["charges"]), len(state["rows"]), len(state["mail"])
    shipments = len(state["shipments"])
    say("\n6. what reached the outside world")
    say(f"   payment API: {req.get('charge', 0)} requests, {charges} charge -> charged once")
    say(f"   LLM: {state['llm_calls']} call -> LLM called once, its answer reused on every re-run")
    say(f"   database: {req.get('insert', 0)} insert, {rows} row -> the probe found it")
    say(f"   mailer: {req.get('mail', 0)} send, {mail} e-mail -> in doubt, then resolved by hand")
    say(f"   warehouse: {req.get('ship', 0)} requests, {shipments} shipment -> "
        "at_least_once, deduplicated by the key")
    ok = (charges, state["llm_calls"], rows, mail, shipments) == (1, 1, 1, 1, 1)
    say("\nall effects applied exactly as their modes promise" if ok else "\nFAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", nargs="?", help="work directory (recreated and kept)")
    ap.add_argument("--child", choices=["checkout", "dispatch"], help=argparse.SUPPRESS)
    ap.add_argument("--die-after", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.directory, args.child, args.die_after)
    if args.directory:
        shutil.rmtree(args.directory, ignore_errors=True)
        os.makedirs(args.directory)
        return story(args.directory)
    with tempfile.TemporaryDirectory(prefix="agentwal-effects-") as tmp:
        return story(tmp)


if __name__ == "__main__":
    sys.exit(main())
