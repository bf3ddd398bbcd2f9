"""Effect guarantees under process kills, per crash window and per mode.

A child process runs one agent step (``txn.effect`` then commit), or commits
an outbox entry and dispatches it, against the fake downstream of
``tests/effects/downstream.py``, whose journal (fsynced before it answers)
outlives the child. A failpoint armed with ``kill`` ends the child with
``os._exit`` exactly in one crash window; a second child resumes the agent
(a committed step is not re-run) and the parent counts calls and
applications at the downstream against what DESIGN.md's table promises
(docs/effects.md has the table these cases prove).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What every child does first: arm the kill, open the store, reach the downstream.
CHILD_HEAD = r"""
import json, sys
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
"""

CHILD = CHILD_HEAD + r"""
kw = {}
if spec.get("probe"):
    kw["probe"] = down.probe
if spec.get("idempotent"):
    kw["idempotent"] = True
if spec["flavor"] == "effect":
    if store.head("run") is not None:
        print("RESUMED", json.dumps(store.get("run", "result")), flush=True)
    else:
        try:
            with store.begin("run") as txn:
                r = txn.effect("op", down.call, mode=spec["mode"], args={"n": 1}, **kw)
                txn["result"] = r
            print("RESULT", json.dumps(r), flush=True)
        except agentwal.Error as e:
            print("ERROR", type(e).__name__, flush=True)
else:
    if store.head("run") is None:
        with store.begin("run") as txn:
            txn["ordered"] = True
            txn.defer("op", mode=spec["mode"], args={"n": 1},
                      idempotent=bool(spec.get("idempotent")))
    probes = {"op": down.probe} if spec.get("probe") else None
    report = store.dispatch({"op": down.call}, probes=probes)
    outcome = ("DONE" if report.ok else "IN_DOUBT" if report.in_doubt else
               "FAILED" if report.failed else "SKIPPED")
    print("DISPATCH", outcome, flush=True)
store.close()
"""

# name -> (mode, downstream switches, probe?, idempotent?)
CONFIGS: dict[str, tuple[str, dict[str, Any], bool, bool]] = {
    "amo": ("at_most_once", {}, False, False),
    "amo+probe": ("at_most_once", {}, True, False),
    "alo": ("at_least_once", {}, False, False),
    "alo+dedup": ("at_least_once", {"dedup": True}, False, False),
    "eo+idem": ("exactly_once", {"dedup": True}, False, True),
    "eo+probe": ("exactly_once", {}, True, False),
}

# After a kill in the window and one resumed run: (calls, applications, what the resumed
# run printed). RESUMED/RESULT are both fine where the kill may have hit after the commit.
OK = ("RESULT", "RESUMED")
EXPECT: dict[str, dict[str, tuple[int, int, tuple[str, ...]]]] = {
    # before the intent is durable: the call never happened; the re-run calls once
    "effect_before_intent": {c: (1, 1, OK) for c in CONFIGS},
    # intent durable, nothing called yet: the mode decides
    "effect_after_intent": {
        "amo": (0, 0, ("ERROR EffectInDoubtError",)),
        "amo+probe": (0, 0, ("ERROR EffectNotAppliedError",)),
        "alo": (1, 1, OK), "alo+dedup": (1, 1, OK),
        "eo+idem": (1, 1, OK), "eo+probe": (1, 1, OK),
    },
    # the downstream applied, the outcome is not durable
    "after_effect_call": {
        "amo": (1, 1, ("ERROR EffectInDoubtError",)),
        "amo+probe": (1, 1, OK),
        "alo": (2, 2, OK), "alo+dedup": (2, 1, OK),
        "eo+idem": (2, 1, OK), "eo+probe": (1, 1, OK),
    },
    # outcome durable, the transaction not committed: the record is returned
    "effect_after_outcome": {c: (1, 1, OK) for c in CONFIGS},
    # during the commit (its record written, not synced): committed or not, one call
    "after_wal_append:3": {c: (1, 1, OK) for c in CONFIGS},
}


def child(tmp: Path, spec: dict[str, Any], kill: str = "-", *,
          script: str = CHILD) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, str(ROOT), str(tmp / "store"), str(tmp / "journal"),
         json.dumps(spec), kill], capture_output=True, text=True, timeout=60)


def spec_for(config: str, flavor: str) -> dict[str, Any]:
    mode, down, probe, idem = CONFIGS[config]
    return {"mode": mode, "down": down, "probe": probe, "idempotent": idem,
            "flavor": flavor, "durability": "sync"}


def counts(tmp: Path) -> tuple[int, int]:
    from tests.effects.downstream import Downstream

    d = Downstream(str(tmp / "journal"))
    return d.calls(), d.applications()


def killed(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 137, (proc.returncode, proc.stdout, proc.stderr)


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def window_point(window: str) -> str:
    return window if ":" in window else f"{window}:1"


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("window", sorted(EXPECT))
def test_effect_killed_in_window(tmp_path: Path, window: str, config: str) -> None:
    spec = spec_for(config, "effect")
    killed(child(tmp_path, spec, window_point(window)))
    out = last_line(child(tmp_path, spec))
    calls, apps, outcomes = EXPECT[window][config]
    assert counts(tmp_path) == (calls, apps), out
    assert out.split(" ")[0] in outcomes or out in outcomes, out
    # and it stays settled: another resumed run calls nothing more
    last_line(child(tmp_path, spec))
    assert counts(tmp_path) == (calls, apps)


@pytest.mark.parametrize("config", ["amo", "alo", "eo+probe"])
def test_effect_killed_again_during_recovery(tmp_path: Path, config: str) -> None:
    """Killed after the call, then again while the next process recovers: as after one kill."""
    spec = spec_for(config, "effect")
    killed(child(tmp_path, spec, "after_effect_call:1"))
    killed(child(tmp_path, spec, "recovery_after_replay:1"))
    out = last_line(child(tmp_path, spec))
    calls, apps, outcomes = EXPECT["after_effect_call"][config]
    assert counts(tmp_path) == (calls, apps)
    assert out.split(" ")[0] in outcomes or out in outcomes, out


# Dispatch (deferred entries): the same windows, hit while dispatch runs the entry.
DISPATCH_OUT = {"RESULT": "DISPATCH DONE", "RESUMED": "DISPATCH DONE",
                "ERROR EffectInDoubtError": "DISPATCH IN_DOUBT",
                "ERROR EffectNotAppliedError": "DISPATCH IN_DOUBT"}
DISPATCH_WINDOWS = ("effect_before_intent", "effect_after_intent", "after_effect_call",
                    "effect_after_outcome")


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("window", DISPATCH_WINDOWS)
def test_dispatch_killed_in_window(tmp_path: Path, window: str, config: str) -> None:
    spec = spec_for(config, "defer")
    killed(child(tmp_path, spec, window_point(window)))
    out = last_line(child(tmp_path, spec))
    calls, apps, outcomes = EXPECT[window][config]
    assert counts(tmp_path) == (calls, apps), out
    assert out in {DISPATCH_OUT[o] for o in outcomes}, out


@pytest.mark.parametrize("config", ["amo", "alo", "eo+idem"])
def test_killed_while_committing_the_outbox(tmp_path: Path, config: str) -> None:
    """Killed before the commit carrying the entry is written: nothing was deferred."""
    spec = spec_for(config, "defer")
    killed(child(tmp_path, spec, "before_wal_append:1"))
    assert counts(tmp_path) == (0, 0)
    assert last_line(child(tmp_path, spec)) == "DISPATCH DONE"
    assert counts(tmp_path) == (1, 1)
