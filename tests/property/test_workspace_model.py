"""A Workspace against a model directory, driven by a Hypothesis state machine.

Rules edit files (write, rewrite in place keeping size and mtime, chmod,
delete, links, empty directories), age every file past the stat cache's
racy window, checkpoint (alone, or with state in the same transaction, or
just after aging: the stat cache's directory records are then trusted),
roll back to any checkpoint, restore any checkpoint into a second
directory, and ask ``status()``. The model is the directory as data (what
``tests.trees.read`` returns); after every step the workspace directory must
equal it, and every checkpoint must restore to the model recorded for it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import agentwal
from agentwal import tree_scan
from tests.trees import read

FILES = ["a", "b.txt", "d/c", "d/e/f", "g/h"]  # no file is another's directory
LINKS = ["l1", "d/l2"]
DIRS = ["empty", "d/e/hollow"]
CONTENTS = [b"", b"x", b"hello", b"HELLO", b"z" * 3000]

Model = dict[str, object]


def _parents(model: Model, rel: str) -> None:
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        model["/".join(parts[:i])] = ("d",)


class WorkspaceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="awws-"))
        self.dir = self.tmp / "ws"
        self.dir.mkdir()
        self.store = agentwal.open(self.tmp / "store", durability="none")
        self.ws = agentwal.Workspace(self.store, "agent", self.dir)
        self.model: Model = {}
        self.saved: dict[int, Model] = {}
        self.head_model: Model | None = None

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _p(self, rel: str) -> Path:
        return self.dir / rel

    # -- edits --------------------------------------------------------------------------

    @rule(rel=st.sampled_from(FILES), content=st.sampled_from(CONTENTS), exe=st.booleans())
    def write(self, rel: str, content: bytes, exe: bool) -> None:
        p = self._p(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink():
            p.unlink()
        p.write_bytes(content)
        os.chmod(p, 0o755 if exe else 0o644)
        _parents(self.model, rel)
        self.model[rel] = ("f", 0o755 if exe else 0o644, content)

    @rule(rel=st.sampled_from(FILES), data=st.data())
    def rewrite_in_place(self, rel: str, data: st.DataObject) -> None:
        """Same size, same mtime, new content: only the ctime tells."""
        old = self.model.get(rel)
        if not (isinstance(old, tuple) and old[0] == "f" and old[2]):
            return
        content = data.draw(st.binary(min_size=len(old[2]), max_size=len(old[2])))
        p = self._p(rel)
        st_ = p.stat()
        p.write_bytes(content)
        os.utime(p, ns=(st_.st_atime_ns, st_.st_mtime_ns))
        self.model[rel] = ("f", old[1], content)

    @rule(rel=st.sampled_from(FILES + LINKS))
    def delete(self, rel: str) -> None:
        if rel in self.model:
            self._p(rel).unlink()
            del self.model[rel]

    @rule(rel=st.sampled_from(LINKS), to=st.sampled_from(["a", "../g/h", "/nowhere"]))
    def link(self, rel: str, to: str) -> None:
        p = self._p(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        if rel in self.model:
            p.unlink()
        os.symlink(to, p)
        _parents(self.model, rel)
        self.model[rel] = ("l", to)

    @rule(rel=st.sampled_from(DIRS))
    def mkdir(self, rel: str) -> None:
        self._p(rel).mkdir(parents=True, exist_ok=True)
        _parents(self.model, rel)
        self.model[rel] = ("d",)

    @rule()
    def age(self) -> None:
        """Every file's mtime a minute back: the stat cache may now skip reading it."""
        for rel, what in self.model.items():
            if isinstance(what, tuple) and what[0] == "f":
                p = self._p(rel)
                st_ = p.stat()
                os.utime(p, ns=(st_.st_atime_ns, st_.st_mtime_ns - 60 * 10**9))

    # -- checkpoints --------------------------------------------------------------------

    @rule(with_state=st.booleans())
    def checkpoint(self, with_state: bool) -> None:
        if with_state:
            with self.store.begin("agent") as txn:
                txn["files"] = sorted(self.model)
                self.ws.put(txn)
            ckpt = txn.checkpoint
        else:
            ckpt = self.ws.checkpoint(step=len(self.saved))
        assert ckpt is not None
        self.saved[ckpt.id] = dict(self.model)
        self.head_model = dict(self.model)
        fresh = self.tmp / "fresh"  # what was stored, not what the cache believes
        shutil.rmtree(fresh, ignore_errors=True)
        self.store.restore_tree("agent", "workspace", fresh)
        assert read(str(fresh)) == self.model

    @rule()
    def settled_checkpoint(self) -> None:
        """Files past the racy window, then a checkpoint: the directory records it makes
        are trusted, so the next snapshot (and restore) may stand on them."""
        self.age()
        self.checkpoint(with_state=False)

    @precondition(lambda self: bool(self.saved))
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.saved)))
        ckpt = self.ws.rollback_to(cid)
        self.model = dict(self.saved[cid])
        self.saved[ckpt.id] = dict(self.model)
        self.head_model = dict(self.model)
        files = self.store.state("agent", at=cid).get("files")
        assert self.store.get("agent", "files") == files

    @precondition(lambda self: bool(self.saved))
    @rule(data=st.data())
    def restore_elsewhere(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.saved)))
        other = self.tmp / "other"
        self.store.restore_tree("agent", "workspace", other, at=cid)
        assert read(str(other)) == self.saved[cid]

    @precondition(lambda self: self.head_model is not None)
    @rule()
    def status(self) -> None:
        assert self.head_model is not None
        got = self.ws.status()

        def leaves(m: Model) -> dict[str, object]:
            return {k: v for k, v in m.items() if v != ("d",)}

        old, new = leaves(self.head_model), leaves(self.model)
        assert set(got.added) == new.keys() - old.keys()
        assert set(got.removed) == old.keys() - new.keys()
        assert set(got.modified) == {k for k in old.keys() & new.keys() if old[k] != new[k]}

    @invariant()
    def directory_matches_the_model(self) -> None:
        assert read(str(self.dir)) == self.model


class PythonWalkMachine(WorkspaceMachine):
    """The same machine with the pure-Python walk (the fallback when the C one is not
    built); WorkspaceMachine runs whichever is in use (the C one where it was built)."""

    def __init__(self) -> None:
        self._before = tree_scan.implementation()
        tree_scan.use("python")
        super().__init__()

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            tree_scan.use(self._before)


for machine in (WorkspaceMachine, PythonWalkMachine):
    machine.TestCase.settings = settings(max_examples=25, stateful_step_count=25,
                                         deadline=None)
TestWorkspace = WorkspaceMachine.TestCase
TestWorkspacePythonWalk = PythonWalkMachine.TestCase
