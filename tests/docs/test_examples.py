"""Every ```python block of README.md and docs/*.md runs, and prints what its comments say.

Each block runs in a fresh process in a fresh temporary directory (its relative paths land
there). The rules for the ``# output`` comments and the ``<!-- not-run: why -->`` marker are
in blocks.py. The tutorial's programs run in test_tutorial.py, as a reader runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import Block, blocks, expectations, matches, pages

RUNNER = Path(__file__).with_name("_run_block.py")
TUTORIAL = "docs/tutorial.md"


def _python_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)
            if b.lang == "python" and b.page != TUTORIAL]


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_code_fence_is_closed(page: Path) -> None:
    blocks(page)  # raises for a fence left open


def test_blocks_that_do_not_run_are_few_and_say_why() -> None:
    skipped = [b for b in _python_blocks() if b.not_run is not None]
    assert all(b.not_run for b in skipped)
    assert len(skipped) <= 7, [b.id for b in skipped]


@pytest.mark.parametrize("block", [b for b in _python_blocks() if b.not_run is None],
                         ids=lambda b: b.id)
def test_python_block_runs_and_prints_what_it_says(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    record = tmp_path / "printed.json"
    work = tmp_path / "work"
    work.mkdir()
    # the pages make their stores with tempfile.mkdtemp(): keep those under tmp_path, which
    # pytest removes when the test passes, instead of leaving them in /tmp
    env = {**os.environ, "TMPDIR": str(work)}
    done = subprocess.run([sys.executable, str(RUNNER), str(script), str(record)], cwd=work,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout}\n{done.stderr}"
    printed: dict[int, list[str]] = {}
    for line, text in json.loads(record.read_text()):
        printed.setdefault(line, []).append(text)
    wrong = []
    for exp in expectations(block.code):
        out = [t for n in range(exp.first, exp.last + 1) for t in printed.get(n, [])]
        if not matches(out, exp.text):
            wrong.append(f"line {block.line + exp.first}: printed {out!r}, the page says "
                         f"{exp.text!r}")
    assert not wrong, f"{block.id}:\n" + "\n".join(wrong)
