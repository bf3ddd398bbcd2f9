"""Hatchling build hook: compile the optional C walk ``agentwal/_treewalk.c``.

Why a hook and not setuptools: the project builds with hatchling, and the
extension is one C file with no library to link (its SHA-256 is its own, which
the tests check against ``hashlib``), so a compiler call is all it needs. The
hook compiles it with the linker command and shared-object flags the running
Python was built with (``sysconfig``'s ``LDSHARED`` and ``CCSHARED``, plus
``-O2 -Wall``; ``CC`` from the environment wins, as with setuptools). If that fails (no
compiler, no Python headers) the install still succeeds, without it:
``agentwal.tree_scan`` then uses its pure-Python twin, which gives the same
results, slower (``docs/workspace.md``). ``AGENTWAL_NO_EXT_BUILD=1`` skips the
compile on purpose.

- ``pip install .`` / a wheel: the module is compiled into a temp directory and
  added to the wheel, which is then tagged for this platform;
- ``pip install -e .`` (what ``make`` does): compiled next to the source, in
  ``agentwal/`` (ignored by git), where the editable install imports it from.
  ``make`` reinstalls when the C file changes (the Makefile's stamp depends on it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = os.path.join("agentwal", "_treewalk.c")


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles ``agentwal/_treewalk.c`` for wheels, editable or not."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("AGENTWAL_NO_EXT_BUILD"):
            return
        name = "_treewalk" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")
        if version == "editable":
            out_dir = os.path.join(self.root, "agentwal")
        else:
            out_dir = self._tmp = tempfile.mkdtemp(prefix="agentwal-build-")
        out = os.path.join(out_dir, name)
        why = _compile(os.path.join(self.root, SOURCE), out)
        if why is not None:
            sys.stderr.write(f"agentwal: the C walk (agentwal/_treewalk.c) was not built: {why}"
                             "\nagentwal: installing without it; the pure-Python walk "
                             "will be used (same results, slower).\n")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["force_include"][out] = f"agentwal/{name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _compile(source: str, out: str) -> str | None:
    """Compile ``source`` into the extension module ``out``; None, or why not."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    ldshared = sysconfig.get_config_var("LDSHARED") or f"{cc} -shared"
    if os.environ.get("CC"):  # the compiler asked for, with the linking flags of Python's
        ldshared = " ".join([cc, *shlex.split(ldshared)[1:]])
    cmd = [*shlex.split(ldshared), *shlex.split(sysconfig.get_config_var("CCSHARED") or ""),
           "-O2", "-Wall",
           "-I", sysconfig.get_paths()["include"], source, "-o", out + ".tmp"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{shlex.join(cmd)}: {exc}"
    if done.returncode != 0:
        return f"{shlex.join(cmd)} exited with {done.returncode}:\n{done.stderr.strip()}"
    os.replace(out + ".tmp", out)  # an editable install's module is replaced whole
    return None
