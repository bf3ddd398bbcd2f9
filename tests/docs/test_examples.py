"""Every ```python block of README.md and docs/*.md runs, and prints what its comments say.

Each block runs in a fresh process in a fresh temporary directory (its relative paths land
there). The rules for the ``# output`` comments and the ``<!-- not-run: why -->`` marker are
in blocks.py. The tutorial's programs run in test_tutorial.py, as a reader runs them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import POSTGRES_RUNNER, Block, blocks, pages, run_block

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
    # blocks that need a PostgreSQL server run in tests/postgres/test_doc_examples.py instead
    skipped = [b for b in skipped if POSTGRES_RUNNER not in (b.not_run or "")]
    assert len(skipped) <= 6, [b.id for b in skipped]


@pytest.mark.parametrize("block", [b for b in _python_blocks() if b.not_run is None],
                         ids=lambda b: b.id)
def test_python_block_runs_and_prints_what_it_says(block: Block, tmp_path: Path) -> None:
    wrong = run_block(block, tmp_path)
    assert not wrong, f"{block.id}:\n" + "\n".join(wrong)
