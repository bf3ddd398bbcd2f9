"""What the docs name exists: every repository path (``bench/report.py``, ``tests/pg.py``,
``docs/x.md`` ...), every dotted ``agentwal.module.NAME``, and every page in the README's list.

So a file moved or a module renamed fails here, not in a reader's shell; the strict site
build checks links, this checks the names in the text.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, pages

PATH = re.compile(r"(?<![\w/.])((?:bench|tests|agentwal|docs|examples|\.ci)/[\w./*-]*\w)")
DOTTED = re.compile(r"`(agentwal(?:\.\w+)+)")


def _resolves(name: str) -> bool:
    """True if ``name`` is a module, or an attribute path inside the longest module prefix."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    named = set(PATH.findall(page.read_text(encoding="utf-8")))
    missing = sorted(p for p in named if not any(ROOT.glob(p)))
    assert not missing, f"{page.name} names paths that are not in the repository: {missing}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_dotted_agentwal_name_a_page_uses_resolves(page: Path) -> None:
    named = set(DOTTED.findall(page.read_text(encoding="utf-8")))
    wrong = sorted(n for n in named if not _resolves(n))
    assert not wrong, f"{page.name} names what agentwal does not have: {wrong}"


def test_the_readme_lists_every_page_and_no_page_cites_a_file_outside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in sorted((ROOT / "docs").glob("*.md"))
                if f"](docs/{p.name})" not in readme]
    assert not unlisted, f"README.md's Documentation list lacks {unlisted}"
    for page in pages():
        assert "DESIGN.md" not in page.read_text(encoding="utf-8"), page.name
