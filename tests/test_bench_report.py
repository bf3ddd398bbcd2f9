"""bench/report.py keeps working: a --quick run measures everything, draws every plot and
rewrites only its own section of a copy of docs/benchmarks.md (timings are never checked).

And the committed page is what a full run produced: every plot its section shows exists
under docs/, and the section is not a quick run's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- bench-report:begin"
END = "<!-- bench-report:end -->"
PNG = b"\x89PNG\r\n\x1a\n"
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+\.png)\)")


def _section(text: str) -> str:
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def _medians(node: Any) -> list[float]:
    """Every ``median`` in a measurements tree."""
    if isinstance(node, dict):
        found = [node["median"]] if "median" in node else []
        return found + [m for v in node.values() for m in _medians(v)]
    if isinstance(node, list):
        return [m for v in node for m in _medians(v)]
    return []


def test_a_quick_report_measures_draws_and_rewrites_only_its_section(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    page = tmp_path / "benchmarks.md"
    hand = "## Written by hand\n\nThis paragraph must survive.\n"
    page.write_text(f"# Benchmarks\n\nIntro.\n\n{BEGIN} -->\nstale\n{END}\n\n{hand}")
    images, data = tmp_path / "img", tmp_path / "report.json"
    try:  # the PostgreSQL workers run on the tests' server when there is one
        pg = ["--pg-dsn", request.getfixturevalue("pg_dsn")]
    except pytest.skip.Exception:
        pg = ["--no-postgres"]
    env = {**os.environ, "AGENTWAL_BENCH_DIR": str(tmp_path / "stores"), "MPLBACKEND": "Agg",
           "MPLCONFIGDIR": str(tmp_path / "mpl")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "report.py"), "--quick", "--page", str(page),
         "--images", str(images), "--json", str(data), *pg],
        capture_output=True, text=True, timeout=600, check=False, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]

    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nIntro.\n\n") and text.endswith(hand)
    section = _section(text)
    assert "stale" not in section and "A quick run" in section
    assert ".venv/bin/python bench/report.py --quick" in section
    shown = IMAGE.findall(section)
    assert len(shown) >= 6 and len(set(shown)) == len(shown)
    for rel in shown:
        png = (page.parent / rel).read_bytes()
        assert png.startswith(PNG) and len(png) < 200_000, rel
    assert sorted(p.name for p in images.iterdir()) == sorted(Path(r).name for r in shown)

    res = json.loads(data.read_text())
    assert res["quick"] is True
    for name in ("compare", "threads", "open", "conversation", "get", "effects", "workspace",
                 "workspace_goals", "langgraph", "blobs", "postgres", "langgraph_postgres",
                 "failover"):
        assert name in res, name
    # the open issues' own benchmarks run as parts, and their goals join the goals table
    assert set(res["langgraph"]["series"]) == {"AgentWALSaver", "SqliteSaver"}
    assert "LangGraph savers on a local disk: issue #13's benchmark" in section
    assert "| #13 | LangGraph, 2 threads x 4 steps: checkpoints/s vs SqliteSaver |" in section
    if res["machine"]["git"]:
        assert "Workspace checkpoints: issue #15's benchmark" in section
        assert "| #15 | workspace, 200 files: snapshot, 100 files changed vs git (wall) |" \
            in section
    if pg[0] == "--pg-dsn":
        assert all(res["postgres"]["series"].values()) and "postgres-workers.png" in section
        # LangGraph's PostgresSaver beside AgentWALSaver on the same server and workload
        lp = res["langgraph_postgres"]
        assert set(lp["series"]) == {"AgentWALSaver (PostgreSQL)", "PostgresSaver"}
        assert "langgraph-postgres.png" in section
        assert {"LangGraph PostgresSaver", "LangGraph AgentWALSaver (PostgreSQL)"} <= set(
            res["conversation"]["systems"])
        # one kill -9 per TTL, each run taken over by a standby worker
        fo = res["failover"]
        assert [len(s) for s in fo["series"].values()] == [len(fo["ttls"])] * 3
        assert "failover-vs-ttl.png" in section
    assert len(res["conversation"]["systems"]) >= 2  # agentwal and a whole-state baseline
    medians = _medians(res)
    assert len(medians) > 50 and all(m > 0 for m in medians)
    assert not (tmp_path / "stores").exists() or not any((tmp_path / "stores").iterdir())

    # the page says when the machine was busy (the run's own verdict first, then the
    # other one), and redrawing needs no new measurement
    ran_busy = bool(res["run"]["loaded"])
    assert ("Warning: a busy machine" in section) is ran_busy
    for busy in (not ran_busy,):
        res["run"]["loaded"], res["run"]["load_before"][0] = busy, 9.5 if busy else 0.1
        data.write_text(json.dumps(res))
        again = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "report.py"), "--render-only", "--page",
             str(page), "--images", str(images), "--json", str(data)],
            capture_output=True, text=True, timeout=300, check=False, env=env, cwd=tmp_path)
        assert again.returncode == 0, again.stderr[-4000:]
        warned = "Warning: a busy machine" in _section(page.read_text())
        assert warned is busy and ("load average was 9.50" in page.read_text()) is busy


def test_a_run_on_a_busy_machine_is_flagged() -> None:
    saved = sys.path[:]
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import report_render as report
    finally:
        sys.path[:] = saved  # report.py puts bench/ and the repository first
    assert report.loaded((1.5, 0.2, 0.1), 2) and report.loaded((0.6, 0, 0), 1)
    assert not report.loaded((0.9, 5.0, 5.0), 2) and not report.loaded((0.0, 0, 0), None)


def test_the_committed_page_is_a_full_run_and_shows_its_plots() -> None:
    section = _section(PAGE.read_text())
    assert "A quick run" not in section and "`make bench-report`" in section
    shown = IMAGE.findall(section)
    assert len(shown) >= 6
    for rel in shown:
        png = PAGE.parent / rel
        assert png.is_file(), rel
        assert png.read_bytes().startswith(PNG) and png.stat().st_size < 100_000, rel
