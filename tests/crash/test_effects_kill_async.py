"""``txn.aeffect`` keeps the promises of ``txn.effect`` under process kills.

The same windows and expectations as ``test_effects_kill.py``, with the
agent step written for asyncio: ``async with store.abegin(...)``, an async
``fn`` and an async probe, the ledger writes and the commit running in
executor threads (a kill there ends the process as a kill on the loop does).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_effects_kill import (
    CHILD_HEAD,
    CONFIGS,
    EXPECT,
    child,
    counts,
    killed,
    last_line,
    spec_for,
    window_point,
)

CHILD = CHILD_HEAD + r"""
import asyncio


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


@pytest.mark.parametrize("config", sorted(set(CONFIGS) - {"alo+dedup"}))  # alo covers it
@pytest.mark.parametrize("window", WINDOWS)
def test_aeffect_killed_in_window(tmp_path: Path, window: str, config: str) -> None:
    spec = spec_for(config, "effect")
    killed(child(tmp_path, spec, window_point(window), script=CHILD))
    out = last_line(child(tmp_path, spec, script=CHILD))
    calls, apps, outcomes = EXPECT[window][config]
    assert counts(tmp_path) == (calls, apps), out
    assert out.split(" ")[0] in outcomes or out in outcomes, out
    last_line(child(tmp_path, spec, script=CHILD))  # and it stays settled
    assert counts(tmp_path) == (calls, apps)
