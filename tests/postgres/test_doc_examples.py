"""The docs' examples that need a PostgreSQL server run on the tests' server.

A ```python block whose not-run marker names this file (tests/docs/blocks.py's
POSTGRES_RUNNER) is skipped by tests/docs/test_examples.py and runs here instead: its
placeholder DSN (the first ``"postgresql://..."`` string) becomes the tests' server and
every ``schema="..."`` this test's fresh schema; then it must run and print what its
comments say, like any other block.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.blocks import POSTGRES_RUNNER, Block, blocks, pages, run_block

DSN = re.compile(r"\"postgres(?:ql)?://[^\"]*\"")
SCHEMA = re.compile(r"schema=\"[^\"]*\"")


def _postgres_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)
            if b.lang == "python" and POSTGRES_RUNNER in (b.not_run or "")]


def test_there_are_postgres_examples() -> None:
    ids = [b.id for b in _postgres_blocks()]
    assert any(i.startswith("docs/leases.md:") for i in ids), ids
    assert any(i.startswith("docs/postgres.md:") for i in ids), ids


@pytest.mark.parametrize("block", _postgres_blocks(), ids=lambda b: b.id)
def test_postgres_block_runs_and_prints_what_it_says(block: Block, pg_dsn: str, pg_schema: str,
                                                     tmp_path: Path) -> None:
    assert DSN.search(block.code), f"{block.id}: no postgresql:// placeholder to replace"
    code = DSN.sub(lambda _: repr(pg_dsn), block.code)
    code = SCHEMA.sub(lambda _: f"schema={pg_schema!r}", code)
    wrong = run_block(block, tmp_path, code=code)
    assert not wrong, f"{block.id}:\n" + "\n".join(wrong)
