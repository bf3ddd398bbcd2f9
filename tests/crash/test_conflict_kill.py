"""A step redone after a conflict, killed in each new window: one charge, every mode.

The child runs the tutorial's step: read the inbox, call the effect, and (once,
across all processes: a flag file says it happened) let a "web handler" commit
a new inbox message, so the step's commit conflicts. It redoes the step with
``store.transact`` or with a plain re-``begin`` loop. A failpoint ends the
child with ``os._exit``:

- ``effect_after_outcome:1``: the effect is recorded, the run has not moved;
- ``commit_before_validate:2``: the effect is recorded and the web handler has
  committed (the run moved on), the step's own commit not yet validated;
- ``step_before_retry:1``: the commit conflicted and rolled back, the retry
  not begun (``store.transact`` only).

A second child resumes the agent (the step re-run from whatever head it
finds) and the parent counts calls and applications at the downstream: the
outcome was durable before each kill, so every mode calls once and applies
once, although the resumed step starts from a later checkpoint than the
attempt that made the call (``docs/effects.md``, "When a step runs again").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import agentwal
from agentwal import failpoints
from tests.effects.downstream import Downstream

root, path, journal, spec, kill = sys.argv[1:6]
spec = json.loads(spec)
flag = spec.get("flag") or path + ".web-done"
if kill != "-":
    name, nth = kill.split(":")
    failpoints.arm(name, "kill", nth=int(nth))
store = agentwal.open(path, **spec.get("open", {"durability": "sync"}))
down = Downstream(journal, **spec["down"])
kw = {}
if spec.get("probe"):
    kw["probe"] = down.probe
if spec.get("idempotent"):
    kw["idempotent"] = True

def step(txn):
    txn.get("inbox")
    r = txn.effect("charge", down.call, mode=spec["mode"], args={"amount": 4900}, **kw)
    if not os.path.exists(flag):
        with store.begin("run") as web:
            web["inbox"] = ["a user message"]
        open(flag, "w").close()
    txn["receipt"] = r
    return r

if store.get("run", "receipt") is not None:
    print("RESUMED", json.dumps(store.get("run", "receipt")), flush=True)
else:
    try:
        if spec["flavor"] == "transact":
            r = store.transact("run", step)
        else:
            while True:
                try:
                    with store.begin("run") as txn:
                        r = step(txn)
                    break
                except agentwal.ConflictError:
                    continue
        print("RESULT", json.dumps(r), flush=True)
    except agentwal.Error as e:
        print("ERROR", type(e).__name__, e, flush=True)
store.close()
"""

CONFIGS: dict[str, tuple[str, dict[str, Any], bool, bool]] = {
    "amo": ("at_most_once", {}, False, False),
    "alo": ("at_least_once", {}, False, False),
    "eo+idem": ("exactly_once", {"dedup": True}, False, True),
    "eo+probe": ("exactly_once", {}, True, False),
}
CASES = [("effect_after_outcome:1", "transact"), ("commit_before_validate:2", "transact"),
         ("commit_before_validate:2", "plain"), ("step_before_retry:1", "transact")]


def child(tmp: Path, spec: dict[str, Any], kill: str = "-",
          store: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the agent in a child on ``store`` (default: a local store in ``tmp``)."""
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), store or str(tmp / "store"),
         str(tmp / "journal"), json.dumps(spec), kill], capture_output=True, text=True,
        timeout=60)


def counts(tmp: Path) -> tuple[int, int]:
    from tests.effects.downstream import Downstream

    d = Downstream(str(tmp / "journal"))
    return d.calls(), d.applications()


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize(("window", "flavor"), CASES)
def test_conflicted_step_killed_in_window_charges_once(tmp_path: Path, window: str,
                                                        flavor: str, config: str) -> None:
    mode, down, probe, idem = CONFIGS[config]
    spec = {"mode": mode, "down": down, "probe": probe, "idempotent": idem, "flavor": flavor}
    first = child(tmp_path, spec, window)
    assert first.returncode == 137, (first.returncode, first.stdout, first.stderr)
    assert counts(tmp_path) == (1, 1)
    resumed = child(tmp_path, spec)
    assert resumed.returncode == 0, resumed.stderr
    out = resumed.stdout.strip().splitlines()[-1]
    assert out.startswith(("RESULT", "RESUMED")), out
    assert counts(tmp_path) == (1, 1), out
    # the ledger agrees: one entry, done, committed in the step's checkpoint
    import agentwal

    with agentwal.open(tmp_path / "store", readonly=True) as store:
        (e,) = store.effects()
        assert e.status == "done" and e.committed_in == store.head("run").id
        assert store.get("run", "inbox") == ["a user message"]
