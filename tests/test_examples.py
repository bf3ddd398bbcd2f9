"""The runnable examples in examples/: each runs to the end, exits 0 and says what it proved."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_effects_agent_runs_and_keeps_each_mode_promise(tmp_path: Path) -> None:
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, str(EXAMPLES / "effects_agent.py"), str(work)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # four kills, each right after a downstream applied a call
    assert out.count("killed (exit 137)") == 4
    assert "charge-card=in_doubt(1)" in out
    assert "send-confirmation (at_most_once) raises EffectInDoubtError; nothing sent" in out
    assert "settled by hand: resolved" in out
    assert "payment API: 2 requests, 1 charge -> charged once" in out
    assert "LLM: 1 call -> LLM called once" in out
    assert "all effects applied exactly as their modes promise" in out

    # the world the example left behind agrees with what it printed
    world = json.loads((work / "world.json").read_text())
    assert len(world["charges"]) == 1 and world["requests"]["charge"] == 2
    assert world["llm_calls"] == 1
    assert len(world["rows"]) == 1 and world["requests"]["insert"] == 1
    assert len(world["mail"]) == 1
    assert len(world["shipments"]) == 1 and world["requests"]["ship"] == 2


def test_effects_agent_cleans_up_its_temporary_directory() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLES / "effects_agent.py")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    store = done.stdout.split("store ", 1)[1].split(",", 1)[0]
    assert not Path(store).exists()


def test_coding_agent_rolls_files_back_with_its_state(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLES / "coding_agent.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "rolled back to 2: calc.py says 'return a - b', 1 message(s)" in out
    assert "tests pass: True; the original still fails: True" in out
    assert (tmp_path / "repo" / "calc.py").read_text().endswith("return a - b\n")
    assert (tmp_path / "repo-2" / "calc.py").read_text().endswith("return a + b\n")
    assert "store verified" in out
