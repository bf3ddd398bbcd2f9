"""docs/tutorial.md, run as a reader runs it: every program saved under its name in one fresh
directory, every command of the transcripts in order, each output compared with the page's.

The transcripts' `$ python x.py` lines run the saved program; `python agent.py & sleep 1.5;
kill -9 $!` runs it and kills it with SIGKILL once it has printed the lines shown (what the
sleep stands for, without depending on the machine's speed); a `sleep` before a second program
waits for the background program's first commit instead. `agentwal ...` commands run the
installed CLI, except `torture` (a minute or more). Times, hashes, ids and pids are masked; an
output block marked `<!-- output-varies: why -->` has every number masked too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.docs.blocks import ROOT, Block, blocks

PAGE = ROOT / "docs" / "tutorial.md"
SAVE_AS = re.compile(r"Save as `(?P<name>[\w.-]+\.py)`")
VARIES = re.compile(r"<!--\s*output-varies:\s*(?P<why>.+?)\s*-->")
MASKS = [
    re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\+00:00)?"),  # ISO times
    re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),  # store ids
    re.compile(r"\b[0-9a-f]{12,}\b"),  # hashes
    re.compile(r"\d+\.\d+"),  # seconds, created_at
    re.compile(r"(?<=pid )\d+"),
    re.compile(r"[─-]{3,}"),  # a table's rule: its length follows the widest cell
]
BIN = Path(sys.executable).parent
TIMEOUT = 120


def _last_text(block: Block) -> str:
    return next((line for line in reversed(block.before) if line.strip()), "")


def _mask(lines: list[str], varies: bool) -> list[str]:
    out = []
    for line in lines:
        for mask in MASKS:
            line = mask.sub("<*>", line)
        if varies:
            line = re.sub(r"\d+", "<n>", line)
        out.append(" ".join(line.split()))
    return [line for line in out if line]


class Reader:
    """Runs the transcript's commands in `work` and collects the differences from the page."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.env = {name: value for name, value in os.environ.items()
                    if name not in ("COLUMNS", "LINES")}  # the page's tables: no terminal
        self.env.update(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", PYTHONUNBUFFERED="1")
        self.background: subprocess.Popen[bytes] | None = None
        self.background_log: Path | None = None
        self.last_rc = 0
        self.ran: list[str] = []
        self.skipped: list[str] = []
        self.wrong: list[str] = []

    def _python(self, name: str) -> list[str]:
        done = subprocess.run([sys.executable, name], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=TIMEOUT, check=False)
        assert done.returncode == 0, f"python {name} failed:\n{done.stdout}{done.stderr}"
        self.ran.append(name)
        return done.stdout.splitlines()

    def _python_killed(self, name: str, lines: int) -> list[str]:
        child = subprocess.Popen([sys.executable, name], cwd=self.work, env=self.env,
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        got = []
        while len(got) < lines:
            line = child.stdout.readline()
            assert line, f"python {name} ended after {got} before the kill"
            got.append(line.rstrip("\n"))
        child.kill()
        child.wait(TIMEOUT)
        child.stdout.close()
        self.ran.append(name)
        return got

    def _wait_for_first_commit(self) -> None:
        assert self.background_log is not None
        deadline = time.monotonic() + TIMEOUT
        while "committed" not in self.background_log.read_text():
            assert time.monotonic() < deadline, "the background program never committed"
            time.sleep(0.05)

    def run(self, command: str, shown: list[str], varies: bool) -> None:
        out: list[str] | None = None
        if m := re.fullmatch(r"python (\S+\.py)", command):
            out = self._python(m[1])
        elif m := re.fullmatch(r"python (\S+\.py) & sleep [\d.]+; kill -9 \$!", command):
            out = self._python_killed(m[1], len(shown))
        elif m := re.fullmatch(r"python (\S+\.py) > (\S+) &", command):
            self.background_log = self.work / m[2]
            with open(self.background_log, "wb") as log:
                self.background = subprocess.Popen([sys.executable, m[1]], cwd=self.work,
                                                   env=self.env, stdout=log)
            self.ran.append(m[1])
        elif m := re.fullmatch(r"sleep [\d.]+; python (\S+\.py)", command):
            self._wait_for_first_commit()
            out = self._python(m[1])
        elif command == "wait":
            assert self.background is not None
            assert self.background.wait(TIMEOUT) == 0
        elif command.startswith("rm -rf "):
            for target in shlex.split(command)[2:]:
                shutil.rmtree(self.work / target)
        elif command.startswith("agentwal ") and " torture " not in command:
            done = subprocess.run(shlex.split(command), cwd=self.work, env=self.env,
                                  capture_output=True, text=True, timeout=TIMEOUT, check=False)
            self.last_rc = done.returncode
            out = (done.stdout + done.stderr).splitlines()
        elif command == "echo $?":
            out = [str(self.last_rc)]
        else:
            self.skipped.append(command)
        if out is not None and _mask(out, varies) != _mask(shown, varies):
            self.wrong.append(f"$ {command}\n  the page shows:\n    " + "\n    ".join(shown)
                              + "\n  it printed:\n    " + "\n    ".join(out))


def _transcript(block: Block) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].strip(), []))
        elif steps and not re.match(r"\[\d+\][+-]? ", line):  # job control: the shell's
            steps[-1][1].append(line)
    return steps


def test_the_tutorial_runs_verbatim(tmp_path: Path) -> None:
    work = tmp_path / "agentwal-tutorial"
    work.mkdir()
    reader = Reader(work)
    saved: list[str] = []
    try:
        for block in blocks(PAGE):
            if block.lang == "python":
                m = SAVE_AS.search(_last_text(block))
                assert m, f"{block.id}: a program the page does not say to save"
                (work / m["name"]).write_text(block.code, encoding="utf-8")
                saved.append(m["name"])
            elif block.code.startswith("$ "):
                varies = bool(VARIES.search(_last_text(block)))
                for command, shown in _transcript(block):
                    reader.run(command, shown, varies)
    finally:
        if reader.background is not None and reader.background.poll() is None:
            reader.background.kill()
            reader.background.wait()
    assert not reader.wrong, "\n".join(reader.wrong)
    assert sorted(set(reader.ran)) == sorted(saved), "a saved program is never run"
    assert all(c.split()[0] in ("agentwal", "make", "source", "mkdir") for c in reader.skipped)
