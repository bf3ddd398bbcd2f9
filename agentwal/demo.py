"""The showcase behind ``make demo``: an agent killed with SIGKILL resumes where it was.

Theory of operation: the parent starts a child process that runs a small
agent loop against a store (a scripted "LLM", no network). Each step is one
transaction; after each commit returns, the child prints ``ACK <step>``. The
parent SIGKILLs the child in the middle of the run, reopens the store,
checks that every acknowledged step is there (and nothing half-done), then
resumes the loop from the last checkpoint and prints the run's history.

Run it with ``python -m agentwal.demo [DIR]``; ``--agent`` is the child's mode.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from . import open as open_store
from .store import Store

RUN = "support-ticket-7"
TOTAL_STEPS = 12
KILL_AFTER = 5

_SCRIPT = [
    ("planner", "Read the ticket and decide what to look up."),
    ("tool", "search_orders(customer=42) -> order #1009, shipped 3 days ago"),
    ("llm", "The order shipped; the customer asks about a delay."),
    ("tool", "track_parcel(#1009) -> held at depot, address incomplete"),
    ("llm", "Ask the customer to confirm the street number."),
    ("human", "Approved the reply."),
    ("tool", "send_message(customer=42) -> queued"),
    ("llm", "Wait for the customer's answer."),
    ("tool", "inbox(customer=42) -> 'It is 14B'"),
    ("tool", "update_address(#1009, '14B') -> ok"),
    ("llm", "Tell the customer the parcel is on its way again."),
    ("planner", "Close the ticket."),
]


def agent_step(store: Store, step: int) -> int:
    """Run one step of the scripted agent as one transaction; returns the checkpoint id."""
    node, text = _SCRIPT[step % len(_SCRIPT)]
    with store.begin(RUN) as txn:
        done = txn.get("step", 0)
        if done != step:
            raise RuntimeError(f"state says step {done}, expected {step}")
        messages: list[dict[str, Any]] = txn.get("messages", [])
        messages.append({"role": node, "content": text, "step": step + 1})
        txn["messages"] = messages
        txn["step"] = step + 1
        txn[f"scratch/{step}"] = {"tokens": 40 + 7 * step}
        txn.meta(node=node, step=step + 1)
    assert txn.checkpoint is not None
    return txn.checkpoint.id


def _agent(path: str) -> None:
    """Child mode: run steps until killed, printing ACK after each commit returns."""
    with open_store(path, durability="sync") as store:
        step = store.get(RUN, "step", 0)
        while step < TOTAL_STEPS:
            agent_step(store, step)
            step += 1
            print(f"ACK {step}", flush=True)
            time.sleep(0.15)


def _say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the showcase; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default="demo.awal", help="store directory (recreated)")
    ap.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.agent:
        _agent(args.path)
        return 0

    shutil.rmtree(args.path, ignore_errors=True)
    _say(f"agentwal demo: store {args.path!r}, run {RUN!r}, {TOTAL_STEPS} steps\n")
    _say(f"1. start the agent in a child process; SIGKILL it after step {KILL_AFTER}")
    child = subprocess.Popen([sys.executable, "-m", "agentwal.demo", "--agent", args.path],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acked = 0
    for line in child.stdout:
        if line.startswith("ACK "):
            acked = int(line.split()[1])
            _say(f"   child: step {acked} committed (acknowledged)")
            if acked >= KILL_AFTER:
                time.sleep(0.07)  # land the kill somewhere inside the next step
                os.kill(child.pid, signal.SIGKILL)
                break
    child.wait()
    _say(f"   child killed with SIGKILL (exit {child.returncode}); last acknowledged step: "
         f"{acked}\n")

    _say("2. reopen the store: recovery replays the WAL tail")
    with open_store(args.path) as store:
        rec = store.stats()["recovery"]
        head = store.head(RUN)
        assert head is not None
        step = store.get(RUN, "step")
        _say(f"   recovered in {rec['seconds'] * 1000:.1f} ms: {rec['replayed']} log records "
             f"replayed, {rec['torn_bytes']} torn bytes repaired")
        _say(f"   head checkpoint #{head.id} (node {head.meta.get('node')!r}), state step = "
             f"{step}, messages = {len(store.get(RUN, 'messages'))}")
        if step < acked:
            _say("   FAILED: an acknowledged step was lost")
            return 1
        _say(f"   every acknowledged step is there ({step} >= {acked}); nothing half-done\n")

        _say(f"3. resume from checkpoint #{head.id}, not from scratch")
        while step < TOTAL_STEPS:
            cid = agent_step(store, step)
            step += 1
            _say(f"   step {step} -> checkpoint #{cid}")
        _say("\n4. the run's history (newest first)")
        _say(f"   {'id':>3} {'parent':>6} {'lsn':>4}  {'node':<8} hash")
        for c in store.history(RUN):
            _say(f"   {c.id:>3} {c.parent if c.parent else '-':>6} {c.lsn:>4}  "
                 f"{c.meta.get('node', ''):<8} {c.hash[:16]}")
    _say(f"\ndone: the store is in {args.path!r}; run `make demo` again to start over.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
