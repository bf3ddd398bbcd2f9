"""Code blocks of the markdown docs, and the comparison of what they print with what they say.

A ```python block runs as it stands unless a ``<!-- not-run: why -->`` comment stands just
before its fence (blank lines between are allowed). On a line that calls ``print(...)``, a
trailing comment is the output that call prints: ``print(x)  # 42``. The comment may go on
with words after the output, set off by a colon, a comma, a semicolon or an opening
parenthesis (``# 1: nothing was applied``), or begin with words that end in ": " (``# calls
left unknown: []``); ``...`` in it matches any text. A print with no comment on its own lines
followed directly by comment-only lines expects those lines, joined (a long output).
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("_run_block.py")
# a not-run marker naming this test: the block needs a PostgreSQL server and runs there
POSTGRES_RUNNER = "tests/postgres/test_doc_examples.py"
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<why>.+?)\s*-->")
FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,})(?P<lang>[\w+-]*)\s*$")


@dataclass
class Block:
    page: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None = None  # the reason given by a not-run marker
    before: list[str] = field(default_factory=list)  # the page's lines before the fence

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`; raises ValueError for a fence that is never closed."""
    lines = page.read_text(encoding="utf-8").splitlines()
    rel = str(page.relative_to(ROOT))
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks = len(m["indent"]), m["ticks"]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != ticks:
            if FENCE.match(lines[i]) and FENCE.match(lines[i])["lang"]:
                raise ValueError(f"{rel}:{i + 1}: a fence opens inside the block opened at line "
                                 f"{start + 1}: that block is probably not closed")
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{rel}:{start + 1}: the code fence opened here is never closed")
        marker = None
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0 and (nm := NOT_RUN.search(lines[j])):
            marker = nm["why"]
        found.append(Block(rel, start + 1, m["lang"], "\n".join(body) + "\n", marker,
                           lines[:start]))
        i += 1
    return found


@dataclass
class Expectation:
    first: int  # lines of the print call, 1-based within the block
    last: int
    text: str  # what the comment says it prints


def expectations(code: str) -> list[Expectation]:
    """The `# output` comments of the print calls in `code`."""
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string[1:].strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    found = []
    for node in ast.walk(ast.parse(code)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "print"):
            continue
        first, last = node.lineno, node.end_lineno or node.lineno
        said = [comments[n] for n in range(first, last + 1) if n in comments]
        if said:
            found.append(Expectation(first, last, said[-1]))
            continue
        following = []
        n = last + 1
        while n in comments and n not in code_lines:
            following.append(comments[n])
            n += 1
        if following:
            found.append(Expectation(first, last, " ".join(following)))
    return sorted(found, key=lambda e: e.first)


def _squash(text: str) -> str:
    return " ".join(text.split())


def matches(printed: list[str], said: str) -> bool:
    """Whether the outputs `printed` (one per call) are what `said` says (see the module doc)."""
    exp = _squash(said)
    if len(printed) > 1 and matches([", ".join(p.rstrip("\n") for p in printed)], said):
        return True  # a print in a loop: the comment lists its outputs, comma-separated
    out = _squash("".join(printed))
    pattern = ".*".join(re.escape(part) for part in exp.split("..."))
    if re.fullmatch(pattern, out):
        return True
    if exp.startswith(out) and (exp[len(out):][:1] in (":", ",", ";")
                                or exp.startswith(out + " (")):
        return True
    return exp.endswith(": " + out)


def run_block(block: Block, tmp_path: Path, code: str | None = None,
              env: dict[str, str] | None = None) -> list[str]:
    """Run ``block`` (or ``code`` in its place) in a fresh process in a fresh directory; the
    outputs that differ from its comments (empty when all match). Fails if the block raises."""
    code = block.code if code is None else code
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    record = tmp_path / "printed.json"
    work = tmp_path / "work"
    work.mkdir()
    # the pages make their stores with tempfile.mkdtemp(): keep those under tmp_path, which
    # pytest removes when the test passes, instead of leaving them in /tmp
    done = subprocess.run([sys.executable, str(RUNNER), str(script), str(record)], cwd=work,
                          env={**os.environ, "TMPDIR": str(work), **(env or {})},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout}\n{done.stderr}"
    printed: dict[int, list[str]] = {}
    for line, text in json.loads(record.read_text()):
        printed.setdefault(line, []).append(text)
    wrong = []
    for exp in expectations(code):
        out = [t for n in range(exp.first, exp.last + 1) for t in printed.get(n, [])]
        if not matches(out, exp.text):
            wrong.append(f"line {block.line + exp.first}: printed {out!r}, the page says "
                         f"{exp.text!r}")
    return wrong
