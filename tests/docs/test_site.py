"""The documentation site builds with `mkdocs build --strict` (a broken link, anchor or
reference fails it), and its API reference has an entry for everything public."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import agentwal
import agentwal.errors
import agentwal.testing
from tests.docs.blocks import ROOT


def test_the_site_builds_strict_with_the_whole_api_reference(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "index.html").read_text().count("agentwal") > 0  # README, the landing page
    for page in ("tutorial", "design", "when-not-to-use", "api", "cli"):
        assert (site / page / "index.html").exists(), page

    reference = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'id="(agentwal\.[\w.]+)"', reference))
    errors = [n for n, v in vars(agentwal.errors).items()
              if isinstance(v, type) and issubclass(v, agentwal.errors.Error)]
    wanted = ([f"agentwal.{n}" for n in agentwal.__all__]
              + [f"agentwal.errors.{n}" for n in errors]
              + [f"agentwal.testing.{n}" for n in agentwal.testing.__all__])
    missing = [n for n in wanted if n not in ids]
    assert not missing, f"not in the API reference: {missing}"
