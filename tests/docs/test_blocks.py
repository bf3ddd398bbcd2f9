"""The doc-block checker itself: it finds the comments and refuses a wrong output."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs import blocks as b


def test_expectations_come_from_the_print_lines_and_following_comment_lines() -> None:
    code = ("x = 1  # not a print\n"
            "print(x)  # 1\n"
            "print({'a': 1,\n"
            "       'b': 2})  # {'a': 1, 'b': 2}\n"
            "print(list(range(30)))\n"
            "# [0, 1, 2, ...,\n"
            "#  29]\n")
    got = [(e.first, e.last, e.text) for e in b.expectations(code)]
    assert got == [(2, 2, "1"), (3, 4, "{'a': 1, 'b': 2}"), (5, 5, "[0, 1, 2, ..., 29]")]


@pytest.mark.parametrize(("printed", "said", "ok"), [
    (["1\n"], "1", True),
    (["2\n"], "1", False),
    (["1\n"], "1: nothing was applied", True),
    (["11\n"], "1: nothing was applied", False),
    (["[]\n"], "calls a crash left unknown: []", True),
    (["[1]\n"], "calls a crash left unknown: []", False),
    (["BlobRef(sha256='ab12', size=3)\n"], "BlobRef(sha256='...', size=3)", True),
    (["BlobRef(sha256='ab12', size=4)\n"], "BlobRef(sha256='...', size=3)", False),
    (["a 1\n", "b 2\n"], "a 1, b 2", True),
    (["a 1\n", "b 3\n"], "a 1, b 2", False),
    ([], "1", False),
])
def test_matches(printed: list[str], said: str, ok: bool) -> None:
    assert b.matches(printed, said) is ok


def test_an_unclosed_fence_is_reported_where_it_opens(tmp_path: Path, monkeypatch:
                                                      pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(b, "ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("```python\nprint(1)\n\n```text\nsig\n```\n")
    with pytest.raises(ValueError, match=r"page\.md:4: a fence opens inside the block "
                                         r"opened at line 1"):
        b.blocks(page)
    page.write_text("text\n\n<!-- not-run: a fragment -->\n\n```python\nx\n```\n")
    (block,) = b.blocks(page)
    assert (block.line, block.lang, block.code, block.not_run) == (5, "python", "x\n",
                                                                  "a fragment")
