"""agentwal.Workspace: an agent's files checkpointed, rolled back and forked with its state."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentwal
from tests.trees import build, read

# each test with the C walk and with its pure-Python twin (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("walker")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    p = tmp_path / "repo"
    build(str(p), {"app.py": b"def main():\n    pass\n", "README.md": b"# demo\n",
                   ".gitignore": b"*.log\n", "debug.log": b"noise"})
    return p


def test_checkpoint_rollback_restores_files_and_state(store: agentwal.Store, repo: Path) -> None:
    ws = agentwal.Workspace(store, "agent", repo, exclude=agentwal.GITIGNORE)
    with store.begin("agent") as txn:
        txn["messages"] = ["fix main()"]
        ws.put(txn)
    before = store.head("agent")
    assert before is not None
    # the tool edits files; the agent records its state
    (repo / "app.py").write_text("def main():\n    return 42\n")
    (repo / "new_test.py").write_text("assert True\n")
    (repo / "README.md").unlink()
    after = ws.checkpoint(step="edit")
    with store.begin("agent") as txn:
        txn["messages"] = ["fix main()", "done"]
    assert ws.status().added == {}  # debug.log is ignored
    rolled = ws.rollback_to(before.id)
    assert rolled.meta == {"rollback_to": before.id}
    assert store.get("agent", "messages") == ["fix main()"]
    assert (repo / "app.py").read_text() == "def main():\n    pass\n"
    assert (repo / "README.md").exists() and not (repo / "new_test.py").exists()
    assert (repo / "debug.log").read_bytes() == b"noise"  # excluded: left alone
    assert store.state("agent", at=after.id)["workspace"] != store.get("agent", "workspace")


def test_modifying_checkpoints_before_and_after(store: agentwal.Store, repo: Path) -> None:
    ws = agentwal.Workspace(store, "agent", repo)
    with ws.modifying(tool="apply_patch") as before:
        (repo / "app.py").write_text("patched\n")
    head = store.head("agent")
    assert head is not None and head.id == before.id + 1
    assert before.meta == {"tool": "apply_patch", "phase": "before"}
    assert head.meta == {"tool": "apply_patch", "phase": "after", "after": before.id}
    d = store.diff("agent", before.id, head.id).trees["workspace"]
    assert list(d.modified) == ["app.py"]
    with pytest.raises(RuntimeError), ws.modifying(tool="broken") as b2:
        (repo / "app.py").write_text("half-done")
        raise RuntimeError("tool crashed")
    assert store.head("agent").id == b2.id  # type: ignore[union-attr]
    ws.rollback_to(b2.id)
    assert (repo / "app.py").read_text() == "patched\n"


def test_fork_restores_into_a_new_directory(store: agentwal.Store, repo: Path,
                                            tmp_path: Path) -> None:
    ws = agentwal.Workspace(store, "agent", repo, key="files")
    first = ws.checkpoint()
    (repo / "app.py").write_text("v2\n")
    ws.checkpoint()
    other = ws.fork(first.id, "agent-b", tmp_path / "b")
    assert other.run == "agent-b" and other.key == "files"
    assert (tmp_path / "b" / "app.py").read_text() == "def main():\n    pass\n"
    assert (repo / "app.py").read_text() == "v2\n"
    assert not other.status()


def test_status_lists_changes_since_the_head_without_storing(store: agentwal.Store,
                                                             repo: Path) -> None:
    ws = agentwal.Workspace(store, "agent", repo)
    assert set(ws.status().added) == {"app.py", "README.md", ".gitignore", "debug.log"}
    ws.checkpoint()
    assert not ws.status()
    blobs_before = sorted(Path(store.path, "blobs").rglob("*"))
    (repo / "app.py").write_text("changed\n")
    (repo / "extra.txt").write_text("x")
    (repo / "README.md").unlink()
    st = ws.status()
    assert st.added == {"extra.txt": 1} and list(st.modified) == ["app.py"]
    assert st.removed == {"README.md": 7}
    assert sorted(Path(store.path, "blobs").rglob("*")) == blobs_before


def test_restore_after_a_crash_between_state_and_files(store: agentwal.Store,
                                                       repo: Path) -> None:
    ws = agentwal.Workspace(store, "agent", repo)
    first = ws.checkpoint()
    (repo / "app.py").write_text("later\n")
    ws.checkpoint()
    store.rollback_to("agent", first.id)  # the state moved; "the process died" before files
    assert ws.status()
    ws.restore()
    assert not ws.status()
    assert read(str(repo))["app.py"] == ("f", 0o644, b"def main():\n    pass\n")


def test_a_transaction_of_another_run_is_refused(store: agentwal.Store, repo: Path) -> None:
    ws = agentwal.Workspace(store, "agent", repo)
    with store.begin("other") as txn, pytest.raises(ValueError, match="run"):
        ws.put(txn)
    assert "Workspace" in repr(ws)


def test_rollback_to_a_checkpoint_without_files_changes_nothing(store: agentwal.Store,
                                                                repo: Path) -> None:
    with store.begin("agent") as txn:
        txn["messages"] = []
    bare = store.head("agent")
    ws = agentwal.Workspace(store, "agent", repo)
    ws.checkpoint()
    head = store.head("agent")
    for bad in (bare.id,):  # type: ignore[union-attr]
        with pytest.raises(agentwal.MissingKeyError):
            ws.rollback_to(bad)
        with pytest.raises(agentwal.MissingKeyError):
            ws.fork(bad, "other", repo.parent / "other")
    assert store.head("agent") == head and store.head("other") is None
    with store.begin("agent") as txn:
        txn["workspace"] = "not a tree"
    with pytest.raises(agentwal.NotATreeError):
        ws.rollback_to(store.head("agent").id)  # type: ignore[union-attr]


def test_the_store_directory_is_never_a_tree_nor_a_destination(store: agentwal.Store,
                                                               repo: Path) -> None:
    ws = agentwal.Workspace(store, "agent", repo)
    ws.checkpoint()
    for where in (store.path, Path(store.path) / "blobs"):
        with store.begin("agent") as txn, pytest.raises(agentwal.TreeSourceError,
                                                        match="store"):
            txn.put_tree("x", where)
        with pytest.raises(agentwal.RestoreError, match="store"):
            store.restore_tree("agent", "workspace", where)
    assert store.verify().ok
