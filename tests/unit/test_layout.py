"""The package's shape: imports flow one way, and only snapshot.py imports lmdb."""

from __future__ import annotations

import ast
from pathlib import Path

import agentwal

PKG = Path(agentwal.__file__).parent

# Lower ranks never import higher ones (STYLE.md: errors/types → io → wal →
# snapshot/effects → txn → recovery → store → cli). history.py is pure
# encoding logic beside the codec; retention.py pure planning beside it.
RANK = {
    "errors": 0, "format": 0, "failpoints": 0,
    "types": 1, "codec": 1, "history": 1, "retention": 1,
    "io": 2,
    "control": 3, "wal": 3, "blobs": 3,
    "snapshot": 4, "local": 4, "memtable": 4, "effects": 4,
    "txn": 5, "commit": 5, "ledger": 5,
    "recovery": 6, "verify": 6, "backup": 6,
    "store": 7,
    "__init__": 8, "demo": 8, "testing": 8, "cli": 8,
}


def _module_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[str, int]]:
    """(top-level agentwal module, line) for every intra-package import in ``path``."""
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(PKG).parts) - 1
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("agentwal."):
                    out.append((node.module.split(".")[1], node.lineno))
                elif node.module == "agentwal":
                    out.extend((a.name, node.lineno) for a in node.names)
                continue
            if node.level > depth + 1:
                continue
            if node.level == depth + 1:  # relative to the package root
                if node.module:
                    out.append((node.module.split(".")[0], node.lineno))
                else:
                    out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("agentwal."):
                    out.append((a.name.split(".")[1], node.lineno))
    return out


def test_every_module_has_a_rank() -> None:
    for path in PKG.rglob("*.py"):
        assert _module_of(path) in RANK, f"{path} needs a place in RANK"


def test_imports_flow_one_way() -> None:
    bad = []
    for path in PKG.rglob("*.py"):
        me = _module_of(path)
        for target, line in _imports(path):
            if target in RANK and target != me and RANK[target] > RANK[me]:
                bad.append(f"{path.relative_to(PKG)}:{line} imports {target}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_only_snapshot_imports_lmdb() -> None:
    users = []
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(n == "lmdb" or n.startswith("lmdb.") for n in names):
                users.append(str(path.relative_to(PKG)))
    assert set(users) <= {"local/snapshot/env.py"}, users


def test_only_io_and_snapshot_touch_files() -> None:
    """os-level file calls live in io.py (and LMDB's files in snapshot.py)."""
    calls = ("os.open(", "os.pwrite(", "os.fsync(", "os.fdatasync(", "os.unlink(",
             "os.replace(", "os.rename(", "os.ftruncate(")
    allowed = {"io.py", "local/snapshot/__init__.py", "local/snapshot/env.py"}
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = str(path.relative_to(PKG))
        if rel in allowed or rel.startswith("testing/"):
            continue
        text = path.read_text()
        offenders.extend(f"{rel}: {c}" for c in calls if c in text)
    assert not offenders, offenders


def test_public_api_names() -> None:
    for name in ("open", "Store", "Transaction", "Checkpoint", "Durability", "Error",
                 "ConflictError", "StoreLockedError", "ReadOnlyError", "TransactionClosedError",
                 "MissingKeyError", "InvalidKeyError", "UnencodableValueError",
                 "CorruptionError", "DiskFullError", "DurabilityError",
                 "CheckpointNotFoundError", "RunNotFoundError"):
        assert name in agentwal.__all__, name
        assert hasattr(agentwal, name)


def test_every_error_has_a_stable_code_and_root() -> None:
    from agentwal import errors

    codes = set()
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.Error)
        assert isinstance(cls.code, str) and cls.code
        codes.add(cls.code)
    assert len(codes) == len(errors.__all__)  # no two share a code
