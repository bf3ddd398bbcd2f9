"""docs/cli.md matches the commands' help; every command has help ending with real examples."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest

from agentwal.cli import main
from agentwal.cli.docs import MARKER, command_help, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_generated_from_the_current_help() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert MARKER in text
    assert render(text) == text, "docs/cli.md is stale: run `make docs`"


def _examples(name: str) -> list[list[str]]:
    """Each example line of a command's help as arguments after ``agentwal``."""
    lines = command_help(name).split("Examples:", 1)[1].strip().splitlines()
    out = []
    for line in lines:
        cmd = line.split("|", 1)[0].split("#", 1)[0].strip()
        words = shlex.split(cmd.replace("$(date +%F)", "DATE"))
        if words[:3] == ["python", "-m", "agentwal"]:
            words = words[2:]
        assert words[0] == "agentwal", line
        out.append(words[1:])
    return out


@pytest.mark.parametrize("name", sorted(main.commands))
def test_every_command_has_help_with_examples_and_is_in_the_docs(name: str) -> None:
    cmd = main.commands[name]
    assert cmd.help and cmd.get_short_help_str(), name
    examples = _examples(name)
    assert examples, f"{name}: no example in its help"
    known = {opt for p in cmd.params if isinstance(p, click.Option) for opt in p.opts}
    for args in examples:
        assert args[0] == name, args
        unknown = [a for a in args if a.startswith("-") and a not in known]
        assert not unknown, f"{name}: example uses {unknown}"
    assert f"### agentwal {name}\n" in DOC.read_text(encoding="utf-8")


def test_the_group_help_has_examples() -> None:
    assert _examples("")
