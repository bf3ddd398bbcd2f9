"""A worker process for the failover tests: it prints one JSON event per line.

``python -m tests.postgres.worker DSN SCHEMA WORKER_ID TTL MODE [ARG]``

- ``loop RUN``: wait for the run's lease, then commit steps forever
  (``n`` += 1, ``last`` = worker id), printing ``{"commit": id}`` each time.
- ``durable RUN``: ``durability="sync"``; commit steps forever, printing
  ``{"commit": id}`` once each is acknowledged, and ``{"error": code}`` (then
  trying again) while the server is away.
- ``step RUN``: take the lease, begin, put ``who`` = worker id, print
  ``{"ready": epoch}``; on a ``commit`` line from stdin commit and print
  ``{"committed": id}`` or ``{"error": code}``.
- ``effect RUN``: take the lease, begin, and call an at_least_once effect
  whose function prints ``{"calling": attempt}`` and then waits for a line on
  stdin before it returns; then print ``{"committed": id}`` or ``{"error": code}``.
- ``frozen RUN``: take the lease, begin, put ``who``, and stop itself
  (SIGSTOP) inside the commit transaction, after its statements and before
  COMMIT, printing ``{"frozen": true}`` first; once continued, print the outcome.
- ``race RUN``: print ``{"ready": true}``, wait for a ``go`` line, try the
  lease once, print ``{"won": epoch}`` or ``{"held": holder}``; keep it until
  the next line.
- ``partition RUN CALLS``: commit one step, begin the next and put ``who``,
  print ``{"ready": epoch}``; on a line from stdin (the test has cut the
  link by then) wait one TTL, so the local deadline has passed, then try an
  effect whose function appends a line to the file CALLS, printing
  ``{"effect": result or error code, "token": fencing token seen}``, then
  commit, printing ``{"committed": id}`` or ``{"error": code}``.
- ``hold RUN``: take the lease, print ``{"ready": epoch}``; on a line from
  stdin commit a step, printing ``{"committed": id}`` or ``{"error": code}``.
- ``txeffect RUN``: take the lease, begin, and call a transactional
  exactly_once effect whose function inserts a row into ``orders`` through
  ``ctx.conn``, prints ``{"inserted": true}`` and waits for a line on stdin
  (the test kills it there); if it gets one, commit and print the outcome.
- ``claim N``: claim up to N runs at a time until a claim returns none,
  printing ``{"claimed": [...], "epochs": {...}}`` per claim, then ``{"done": true}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from agentwal import Error, LeaseHeldError, failpoints
from agentwal.postgres import open_postgres


def say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def commit_and_say(txn: Any) -> None:
    """Commit ``txn``; print ``{"committed": id}`` or ``{"error": code}``."""
    try:
        ckpt = txn.commit()
        say(committed=ckpt.id if ckpt else None)
    except Error as exc:
        say(error=exc.code)


def main() -> None:
    dsn, schema, worker, ttl, mode, *rest = sys.argv[1:]
    store = open_postgres(dsn, schema=schema, worker_id=worker, lease_ttl=float(ttl),
                          durability="async", pool_size=2)
    if mode == "loop":
        run = rest[0]
        while True:
            try:
                store.lease(run)
                break
            except LeaseHeldError:
                time.sleep(0.05)
        say(leased=True)
        while True:
            with store.begin(run) as txn:
                txn["n"] = txn.get("n", 0) + 1
                txn["last"] = worker
            assert txn.checkpoint is not None
            say(commit=txn.checkpoint.id)
    elif mode == "durable":
        run = rest[0]
        store.close()
        store = open_postgres(dsn, schema=schema, worker_id=worker, lease_ttl=float(ttl),
                              durability="sync", pool_size=2)
        while True:
            try:
                with store.begin(run) as txn:
                    txn["n"] = txn.get("n", 0) + 1
                assert txn.checkpoint is not None
                say(commit=txn.checkpoint.id)
            except Error as exc:
                say(error=exc.code)
                time.sleep(0.1)
    elif mode == "step":
        run = rest[0]
        txn = store.begin(run)
        txn["who"] = worker
        say(ready=txn._view.fence.epoch)
        sys.stdin.readline()
        commit_and_say(txn)
    elif mode == "effect":
        run = rest[0]
        txn = store.begin(run)

        def call(ctx: Any) -> str:
            say(calling=ctx.attempt)
            sys.stdin.readline()
            return "sent"

        try:
            txn["result"] = txn.effect("send", call, mode="at_least_once", args={"to": "x"})
        except Error as exc:
            say(error=exc.code)
        else:
            commit_and_say(txn)
    elif mode == "frozen":
        run = rest[0]
        txn = store.begin(run)
        txn["who"] = worker

        def freeze(_name: str) -> None:  # inside the commit transaction, holding the row lock
            say(frozen=True)
            os.kill(os.getpid(), signal.SIGSTOP)

        failpoints.arm("pg_commit_before_commit", "call", fn=freeze)
        commit_and_say(txn)
    elif mode == "race":
        run = rest[0]
        say(ready=True)
        sys.stdin.readline()
        try:
            say(won=store.lease(run))
        except LeaseHeldError as exc:
            say(held=exc.holder)
        sys.stdin.readline()  # hold the lease until every racer has reported
    elif mode == "partition":
        run, calls = rest
        with store.begin(run) as txn:
            txn["who"] = worker
        txn = store.begin(run)
        txn["who"] = worker + " (late)"
        say(ready=txn._view.fence.epoch)
        sys.stdin.readline()
        time.sleep(float(ttl))
        tokens: list[int | None] = []

        def call(ctx: Any) -> str:
            tokens.append(ctx.fencing_token)
            with open(calls, "a") as f:
                f.write(f"called with token {ctx.fencing_token}\n")
            return "sent"

        try:
            say(effect=txn.effect("send", call, mode="at_least_once"), token=tokens)
        except Error as exc:
            say(effect=exc.code, token=tokens)
        commit_and_say(txn)
    elif mode == "hold":
        run = rest[0]
        say(ready=store.lease(run))
        sys.stdin.readline()
        txn = store.begin(run)
        txn["who"] = worker
        commit_and_say(txn)
    elif mode == "txeffect":
        run = rest[0]
        txn = store.begin(run)

        def order(ctx: Any) -> str:
            ctx.conn.execute("INSERT INTO orders (key, who) VALUES (%s, %s)", (ctx.key, worker))
            say(inserted=True)
            sys.stdin.readline()
            return "ordered"

        txn["order"] = txn.effect("order", order, mode="exactly_once", transactional=True)
        commit_and_say(txn)
    elif mode == "claim":
        n = int(rest[0])
        while True:
            got = store.claim_runs(n)
            if not got:
                break
            epochs = {r: store._b.leases.held(r).epoch for r in got}  # type: ignore[union-attr]
            say(claimed=got, epochs=epochs)
        say(done=True)
    store.close()


if __name__ == "__main__":
    main()
