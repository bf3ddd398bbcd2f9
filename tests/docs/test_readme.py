"""The README's set-up commands do what it says: `make demo`'s program runs and leaves the
store its `agentwal` commands then read, and every `make` target the docs name exists.

`make demo` is ``python -m agentwal.demo`` after the venv is made (the Makefile's recipe);
the commands of the README's sh block after it run on the store it leaves, as a reader
would run them, except ``ui`` (a server that runs until stopped: tests/ui runs it) and
``torture`` (minutes; tests/crash runs its tiers).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.docs.blocks import ROOT, blocks, pages

README = ROOT / "README.md"
MAKE = re.compile(r"`make ([a-z][\w.-]*)")


def _targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m[1] for m in re.finditer(r"^([\w.-]+)\s*:(?!=)", text, re.M)}


def test_every_make_target_the_docs_name_exists() -> None:
    targets = _targets()
    named = {(p.name, t) for p in pages() for t in MAKE.findall(p.read_text(encoding="utf-8"))}
    assert named, "no `make ...` found: the pattern is wrong"
    assert {(page, t) for page, t in named if t not in targets} == set()


def test_make_test_skips_the_slow_tier_and_make_test_all_runs_it() -> None:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = {m[1]: m[2] for m in re.finditer(r"^([\w-]+):[^\n]*\n((?:\t[^\n]*\n)+)", text,
                                              re.M)}
    assert '-m "not slow"' in recipe["test"] and "slow" not in recipe["test-all"]
    assert "runs every test not marked slow (make test-all: all)" in README.read_text()


def _readme_commands() -> list[list[str]]:
    """The `.venv/bin/agentwal ...` lines of the README's sh blocks, comments dropped."""
    out = []
    for b in blocks(README):
        if b.lang != "sh":
            continue
        for line in b.code.splitlines():
            if line.startswith(".venv/bin/agentwal "):
                out.append(shlex.split(line, comments=True))
    return out


def test_make_demo_runs_and_the_readme_commands_read_its_store(tmp_path: Path) -> None:
    recipe = (ROOT / "Makefile").read_text(encoding="utf-8").split("\ndemo:", 1)[1]
    assert "-m agentwal.demo" in recipe.split("\n\n", 1)[0]
    env = {**os.environ, "COLUMNS": "120"}
    done = subprocess.run([sys.executable, "-m", "agentwal.demo"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "kill" in done.stdout.lower() and "done: the store is in 'demo.awal'" in done.stdout
    commands = _readme_commands()
    assert len(commands) >= 4, commands
    ran = []
    for argv in commands:
        if argv[1] in ("ui", "torture"):
            continue
        assert "demo.awal" in argv, argv  # each reads the store `make demo` left
        cli = [sys.executable, "-m", "agentwal", *argv[1:]]
        got = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120, check=False)
        assert got.returncode == 0 and got.stdout.strip(), (argv, got.stdout, got.stderr)
        assert "Traceback" not in got.stderr, got.stderr
        ran.append(argv[1])
    assert {"inspect", "history"} <= set(ran), ran
