"""``txn.aeffect`` keeps the promises of ``txn.effect`` under process kills.

The same windows and expectations as ``test_effects_kill.py``, with the
agent step written for asyncio: ``async with store.abegin(...)``, an async
``fn`` and an async probe, the ledger writes and the commit running in
executor threads (a kill there ends the process as a kill on the loop does).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .test_effects_kill import (
    CONFIGS,
    EXPECT,
    ROOT,
    counts,
    killed,
    last_line,
    spec_for,
    window_point,
)

CHILD = r"""
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
import agentwal
from agentwal import failpoints
from tests.effects.downstream import Downstream

root, path, journal, spec, kill = sys.argv[1:6]
spec = json.loads(spec)
if kill != "-":
    name, nth = kill.split(":")
    failpoints.arm(name, "kill", nth=int(nth))
store = agentwal.open(path, durability=spec["durability"])
down = Downstream(journal, **spec["down"])


async def call(ctx):
    await asyncio.sleep(0)
    return down.call(ctx)


async def probe(ctx):
    await asyncio.sleep(0)
    return down.probe(ctx)


async def step():
    kw = {}
    if spec.get("probe"):
        kw["probe"] = probe
    if spec.get("idempotent"):
        kw["idempotent"] = True
    async with store.abegin("run") as txn:
        r = await txn.aeffect("op", call, mode=spec["mode"], args={"n": 1}, **kw)
        txn["result"] = r
    return r


if store.head("run") is not None:
    print("RESUMED", json.dumps(store.get("run", "result")), flush=True)
else:
    try:
        print("RESULT", json.dumps(asyncio.run(step())), flush=True)
    except agentwal.Error as e:
        print("ERROR", type(e).__name__, flush=True)
store.close()
"""

# The windows of one step: the intent (1st effect record), the call, the outcome (2nd),
# and the commit (the 3rd append), each killed in a thread or on the loop.
WINDOWS = ("effect_before_intent", "effect_after_intent", "after_effect_call",
           "effect_after_outcome", "after_wal_append:3")


def child(tmp: Path, spec: dict[str, Any], kill: str = "-") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(tmp / "store"), str(tmp / "journal"),
         json.dumps(spec), kill], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("config", sorted(set(CONFIGS) - {"alo+dedup"}))  # alo covers it
@pytest.mark.parametrize("window", WINDOWS)
def test_aeffect_killed_in_window(tmp_path: Path, window: str, config: str) -> None:
    spec = spec_for(config, "effect")
    killed(child(tmp_path, spec, window_point(window)))
    out = last_line(child(tmp_path, spec))
    calls, apps, outcomes = EXPECT[window][config]
    assert counts(tmp_path) == (calls, apps), out
    assert out.split(" ")[0] in outcomes or out in outcomes, out
    last_line(child(tmp_path, spec))  # and it stays settled
    assert counts(tmp_path) == (calls, apps)
