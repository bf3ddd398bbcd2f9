"""The package's shape: imports flow one way, the neutral layers reach the engine only
through agentwal.backend, and only local/snapshot/env.py imports lmdb."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import agentwal

PKG = Path(agentwal.__file__).parent

# Lower ranks never import higher ones (STYLE.md: errors/types → io → wal →
# snapshot/effects → txn → recovery → store → cli). history.py is pure
# encoding logic beside the codec; retention.py pure planning beside it; postgres/
# (the PostgreSQL backend) and transfer (copy_runs across backends) sit beside
# store. Modules under agentwal/local/ (the embedded engine) are ranked one by
# one ("local.snapshot" covers the package); every other package as a whole.
# docs/development.md shows this table (test_the_docs_show_this_table).
RANK = {
    "errors": 0, "format": 0, "failpoints": 0, "forks": 0,
    "types": 1, "codec": 1, "handout": 1, "history": 1, "retention": 1, "tree": 1, "leases": 1,
    "io": 2, "aio": 2,
    "local.control": 3, "local.wal": 3, "local.blobs": 3, "local.blobread": 3,
    "local.blobgate": 3, "treeio": 3, "tree_cache": 3, "tree_snapshot": 3,
    "tree_restore": 3, "tree_scan": 3,
    "local.logmark": 3, "local.opening": 3, "local.background": 3, "local.healthfile": 3,
    "effects": 4, "backend": 4, "local": 4, "local.records": 4, "local.memtable": 4,
    "local.reads": 4, "local.snapshot": 4,
    "txn": 5, "txn_effects": 5, "ledger": 5, "local.commit": 5,
    "local.recovery": 6, "local.apply": 6, "local.verify": 6, "local.backup": 6,
    "store": 7, "store_steps": 7, "store_history": 7, "store_blobs": 7, "store_effects": 7,
    "postgres": 7, "transfer": 7,
    # the engine and its parts (each references Engine, for typing only)
    "local.engine": 7, "local.fold": 7, "local.maintenance": 7, "local.blobrefs": 7,
    "local.effectlog": 7, "local.audit": 7, "local.runs": 7, "local.startup": 7,
    "local.backend": 7,
    "__init__": 8, "__main__": 8, "views": 8, "ui": 8, "demo": 8, "testing": 8, "cli": 8,
    "workspace": 8, "snapshot": 8, "health": 8, "local.salvage": 8,
    "integrations": 9,
}
#: Old import paths kept as re-exports of their new place (nothing in the package uses them).
SHIMS = {"snapshot"}
#: The neutral layers: they reach the engine only through agentwal.backend.
NEUTRAL = ("txn", "txn_effects", "ledger", "store", "store_steps", "store_history",
           "store_blobs", "store_effects")


def _dotted(path: Path) -> str:
    """``agentwal``-relative dotted name of the module at ``path`` (a package: its name)."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    """The RANK key of a dotted module name."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "local" else parts[0]


def _module_of(path: Path) -> str:
    return _unit(_dotted(path))


def _is_module(dotted: str) -> bool:
    base = PKG.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(dotted agentwal module, line, at module level) for every intra-package import.

    "At module level" means executed on import: not inside a function and not
    under ``if TYPE_CHECKING``.
    """
    tree = ast.parse(path.read_text())
    me = _dotted(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    lazy: set[int] = set()
    for node in ast.walk(tree):
        function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        typing_only = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body if function or typing_only else []:  # type: ignore[attr-defined]
            lazy.update(id(n) for n in ast.walk(stmt))
    out = []
    for node in ast.walk(tree):
        eager = id(node) not in lazy
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if not node.module or node.module.split(".")[0] != "agentwal":
                    continue
                base = node.module.partition(".")[2]
            else:
                up = package.split(".") if package else []
                if node.level > 1:
                    up = up[: len(up) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for a in node.names:
                sub = f"{base}.{a.name}" if base else a.name
                target = sub if _is_module(sub) else base
                if target:
                    out.append((target, node.lineno, eager))
        elif isinstance(node, ast.Import):
            out.extend((a.name.partition(".")[2], node.lineno, eager) for a in node.names
                       if a.name.startswith("agentwal."))
    return out


def test_every_module_has_a_rank() -> None:
    for path in PKG.rglob("*.py"):
        assert _module_of(path) in RANK, f"{path} needs a place in RANK"


def test_imports_flow_one_way() -> None:
    bad = []
    for path in PKG.rglob("*.py"):
        me = _module_of(path)
        for target, line, _eager in _imports(path):
            unit = _unit(target)
            if unit in RANK and unit != me and RANK[unit] > RANK[me]:
                bad.append(f"{path.relative_to(PKG)}:{line} imports {target}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def _local_imports(module: str) -> list[str]:
    path = PKG / f"{module}.py"
    return [f"{module}.py:{line} imports {target}" for target, line, eager in _imports(path)
            if eager and target.split(".")[0] == "local"]


@pytest.mark.parametrize("module", [m for m in NEUTRAL if m != "store"])
def test_the_neutral_layers_import_nothing_from_local(module: str) -> None:
    assert not _local_imports(module)


def test_the_store_facade_imports_nothing_from_local() -> None:
    assert not _local_imports("store")


def test_the_seam_imports_only_types_codec_effects_and_errors() -> None:
    found = {_unit(t) for t, _line, _eager in _imports(PKG / "backend.py")}
    assert found <= {"types", "codec", "effects", "errors"}, found


def test_nothing_in_the_package_imports_an_old_path() -> None:
    users = [f"{path.relative_to(PKG)}:{line} imports {t}"
             for path in PKG.rglob("*.py") if _module_of(path) not in SHIMS
             for t, line, _eager in _imports(path) if _unit(t) in SHIMS]
    assert not users, users


def test_old_paths_only_re_export() -> None:
    for name in SHIMS:
        path = PKG / f"{name}.py"
        for node in ast.parse(path.read_text()).body:
            ok = (isinstance(node, ast.ImportFrom) and node.level == 1
                  and (node.module or "").startswith("local")) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) or (
                isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__")
            assert ok, f"{name}.py:{node.lineno} is more than a re-export"


def test_the_docs_show_this_table() -> None:
    """docs/development.md's rank table lists every RANK entry at its rank, and no other."""
    text = (PKG.parent / "docs" / "development.md").read_text()
    section = text.split("### Ranks", 1)[1].split("\n#", 1)[0]
    shown: dict[str, int] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for name in re.findall(r"`([^`]+)`", cells[1]):
                shown[name.removesuffix(".py").replace("/", ".")] = int(cells[0])
    assert shown == RANK


#: Tests outside these reach the engine only through ``agentwal.testing``'s hooks: the
#: engine's own unit tests (and the hooks themselves, in the package) may reach inside.
ENGINE_TESTS = ("unit",)
_ENGINE_REACH = re.compile(r"""\._engine\b|["']_engine["']""")
_PRIVATE_IMPORT = re.compile(r"from agentwal\.local[\w.]* import [^\n]*\b_[a-z]\w*")


def test_tests_reach_the_engine_only_through_the_testing_hooks() -> None:
    """No test module outside the engine's own unit tests names ``store._engine`` (in code
    or in a child process's script) or imports a private name from ``agentwal.local``."""
    tests = PKG.parent / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        if path.relative_to(tests).parts[0] in ENGINE_TESTS:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _ENGINE_REACH.search(line) or _PRIVATE_IMPORT.search(line):
                found.append(f"{path.relative_to(tests)}:{n}: {line.strip()}")
    assert not found, "use agentwal.testing's hooks instead:\n" + "\n".join(found)


def test_only_the_snapshot_env_imports_lmdb() -> None:
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
    """os-level file calls live in io.py (and LMDB's files in local/snapshot/).

    treeio.py and its parts (tree_*.py) are the modules that read and write the
    *user's* directories (put_tree, restore_tree; and the stat cache's hint files):
    through directory descriptors and O_NOFOLLOW, which the store's FileSystem seam
    does not model. The store's own files still go
    through io.py (local/blobs.py) there.
    """
    calls = ("os.open(", "os.pwrite(", "os.fsync(", "os.fdatasync(", "os.unlink(",
             "os.replace(", "os.rename(", "os.ftruncate(")
    allowed = {"io.py", "local/snapshot/__init__.py", "local/snapshot/env.py", "treeio.py",
               "tree_cache.py", "tree_snapshot.py", "tree_restore.py", "tree_scan.py"}
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
