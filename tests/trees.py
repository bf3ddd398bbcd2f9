"""Helpers for tree tests: build a directory from a spec, read one back as a spec."""

from __future__ import annotations

import os
import stat

#: A directory as data: ``{relpath: bytes (a 0644 file) | ("x", bytes) (0755)
#: | ("l", target) | ("d",) (a directory, needed only when empty)}``.
Spec = dict[str, bytes | tuple[str, bytes] | tuple[str]]


def build(root: str, spec: Spec) -> None:
    """Create the entries of ``spec`` under ``root`` (which may exist)."""
    os.makedirs(root, exist_ok=True)
    for rel, what in sorted(spec.items()):
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if isinstance(what, bytes):
            with open(p, "wb") as f:
                f.write(what)
            os.chmod(p, 0o644)
        elif what[0] == "x":
            with open(p, "wb") as f:
                f.write(what[1])  # type: ignore[misc]
            os.chmod(p, 0o755)
        elif what[0] == "l":
            os.symlink(what[1], p)  # type: ignore[misc]
        else:
            os.makedirs(p, exist_ok=True)


def read(root: str, skip: tuple[str, ...] = ()) -> dict[str, object]:
    """``root`` as ``{relpath: ("f", perm, bytes) | ("l", target) | ("d",)}``, links unfollowed."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in list(dirnames):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel.split(os.sep)[0] in skip:
                dirnames.remove(name)
                continue
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                out[rel] = ("l", os.readlink(p))
            else:
                out[rel] = ("d",)
        for name in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel.split(os.sep)[0] in skip:
                continue
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(p))
            else:
                with open(p, "rb") as f:
                    out[rel] = ("f", st.st_mode & 0o777, f.read())
    return out
