"""A coding agent whose files roll back with its conversation (docs/workspace.md).

The "agent" is scripted (no model): it plans, edits a small repository with
two tools, runs the tests, and when a change breaks them it rolls its files
*and* its state back to the checkpoint before that change, then tries a
different fix on a fork. Every step prints what it shows.

Run: ``python examples/coding_agent.py [WORKDIR]`` (a temporary directory
by default, removed at the end).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import agentwal


def write(repo: Path, rel: str, text: str) -> None:
    """Tool: write a file."""
    p = repo / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def tests_pass(repo: Path) -> bool:
    """Tool: run the repository's tests."""
    done = subprocess.run([sys.executable, "test_calc.py"], cwd=repo, capture_output=True,
                          check=False)
    return done.returncode == 0


def main(work: Path) -> None:
    repo = work / "repo"
    write(repo, "calc.py", "def add(a, b):\n    return a - b\n")  # the bug to fix
    write(repo, "test_calc.py", "from calc import add\nassert add(2, 3) == 5\n")
    write(repo, ".gitignore", "__pycache__/\n*.log\n")

    with agentwal.open(work / "agent.awal") as store:
        ws = agentwal.Workspace(store, "fix-add", repo, exclude=agentwal.GITIGNORE)

        # 1. The task arrives: state and files in one checkpoint.
        with store.begin("fix-add") as txn:
            txn["messages"] = [{"role": "user", "content": "make add() add"}]
            ws.put(txn)
        start = store.head("fix-add")
        assert start is not None
        print(f"checkpoint {start.id}: task received, tests pass: {tests_pass(repo)}")

        # 2. A bad edit, made inside modifying(): checkpoints before and after.
        with ws.modifying(tool="write", path="calc.py") as before:
            write(repo, "calc.py", "def add(a, b):\n    return a * b\n")
        with store.begin("fix-add") as txn:
            txn["messages"] = [*txn["messages"], {"role": "assistant", "content": "used *"}]
        changed = store.diff("fix-add", before.id, before.id + 1).trees["workspace"]
        print(f"checkpoints {before.id} (before) and {before.id + 1} (after): changed "
              f"{sorted(changed.modified)}, tests pass: {tests_pass(repo)}")

        # 3. Tests fail: roll files and conversation back together.
        ws.rollback_to(before.id)
        print(f"rolled back to {before.id}: calc.py says "
              f"{(repo / 'calc.py').read_text().splitlines()[1].strip()!r}, "
              f"{len(store.get('fix-add', 'messages'))} message(s) in the state")

        # 4. Try the right fix on a fork, in its own directory; the original stays.
        repo2 = work / "repo-2"
        other = ws.fork(before.id, "fix-add-2", repo2)
        write(repo2, "calc.py", "def add(a, b):\n    return a + b\n")
        done = other.checkpoint(tool="write", result="tests pass")
        print(f"fork fix-add-2 checkpoint {done.id}: tests pass: {tests_pass(repo2)}; "
              f"the original still fails: {not tests_pass(repo)}")

        # 5. What the fork changed, file by file, and one file from history.
        d = store.diff("fix-add-2", 1, done.id).trees["workspace"]
        print(f"fork diff: modified {d.modified}")
        with store.open_tree_file("fix-add", "workspace", "calc.py", at=before.id + 1) as f:
            print("the bad version, from history:", f.read().decode().splitlines()[1].strip())
        assert store.verify().ok
        print("store verified: every tree object and file checks out")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        tmp = Path(tempfile.mkdtemp(prefix="coding-agent-"))
        try:
            main(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
