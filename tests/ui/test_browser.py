"""The viewer in a real headless Chromium (Debian's), driven by Playwright.

`agentwal ui` runs as its own process; this test process is the writer that
commits while the page is open. Screenshots go to test-artifacts/ui/ (or
$AGENTWAL_ARTIFACTS). Without Chromium these tests skip saying why, unless
AGENTWAL_REQUIRE_BROWSER=1 (set by .ci/run), where a missing browser fails.
AGENTWAL_CHROMIUM names another Chromium binary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal.errors import DiskFullError
from agentwal.local.healthfile import HealthFile

from .stores import HTML, fill

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("AGENTWAL_ARTIFACTS", ROOT / "test-artifacts")) / "ui"
CHROMIUM = (os.environ.get("AGENTWAL_CHROMIUM") or shutil.which("chromium")
            or "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
#: How long to wait for the page to show something (a ceiling, not a measurement).
WAIT_MS = 30_000


def _need_browser() -> Any:
    """Playwright's sync API, or a skip (a failure under AGENTWAL_REQUIRE_BROWSER=1)."""
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "the playwright package is not installed (pip install -e '.[dev]')"
    if why is None and not os.access(CHROMIUM, os.X_OK):
        why = f"no Chromium at {CHROMIUM} (apt-get install -y chromium chromium-driver)"
    if why is not None:
        if os.environ.get("AGENTWAL_REQUIRE_BROWSER") == "1":
            pytest.fail(f"AGENTWAL_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    return sync_playwright


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("ui") / "ui.awal")
    fill(path)
    return path


@pytest.fixture(scope="module")
def server(store_path: str) -> Iterator[str]:
    """`agentwal ui STORE --port 0` in its own process; yields its URL."""
    _need_browser()
    child = subprocess.Popen([sys.executable, "-m", "agentwal", "ui", store_path, "--port", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert child.stderr is not None
    try:
        line = child.stderr.readline()
        assert " at http://127.0.0.1:" in line, line + child.stderr.read()
        yield line.rsplit(" at ", 1)[1].strip()
    finally:
        child.terminate()
        child.wait(timeout=30)


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[Any]:
    sync_playwright = _need_browser()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1300, "height": 850})
        pg = ctx.new_page()
        pg.set_default_timeout(WAIT_MS)
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(server)
        yield pg
        ctx.close()
        assert not errors, errors


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_runs_list(page: Any) -> None:
    page.wait_for_selector('#runs tr[data-run="run-a"]')
    row = page.locator('#runs tr[data-run="run-b"]')
    assert "forked from run-a #3" in row.inner_text()
    assert row.locator(".badge.bad").inner_text() == "1"  # its in-doubt effect
    page.fill("#run-search", "run-b")
    page.wait_for_selector('#runs tr[data-run="run-a"]', state="detached")
    assert "null" not in page.inner_text("#main") and "undefined" not in page.inner_text("#main")
    shot(page, "1-runs")
    page.fill("#run-search", "")
    page.wait_for_selector('#runs tr[data-run="run-a"]')


def test_open_a_run_and_see_the_fork(page: Any) -> None:
    page.click('#runs tr[data-run="run-a"] a')
    head = page.wait_for_selector('#graph li[data-id="6"]')
    assert "HEAD" in head.inner_text() and "rollback to #2" in head.inner_text()
    fork = page.wait_for_selector('#graph li[data-id="3"] .fork')
    assert fork.inner_text().endswith("run-b")
    shot(page, "2-run-tree")


def test_open_a_checkpoint_state_and_html_stays_text(page: Any) -> None:
    page.click('#graph li[data-id="5"] a:text("#5")')
    page.wait_for_selector("#state")
    html_leaf = page.locator("#state .leaf", has_text="html")
    assert HTML in html_leaf.inner_text()
    assert page.locator("#state b").count() == 0 and page.locator("#state script").count() == 0
    assert page.evaluate("window.__pwned") is None
    page.click("#state details.branch > summary:has-text('messages')")  # collapse and open
    assert "5000" in page.locator("#state .leaf", has_text="long").inner_text().replace(",", "")
    shot(page, "3-checkpoint-state")


def test_diff_two_checkpoints(page: Any) -> None:
    page.select_option("#diff-a", "4")
    page.select_option("#diff-b", "5")
    page.click("#diff-go")
    diff = page.wait_for_selector("#diff")
    text = diff.inner_text()
    assert "1 item(s) appended at [4]" in text and "message 4" in text and "message 0" not in text
    shot(page, "4-diff")


def test_an_in_doubt_effect_first_with_its_resolve_command(page: Any, store_path: str) -> None:
    page.click("#nav-effects")
    first = page.wait_for_selector("#effects tbody tr")
    assert "in_doubt" in (first.get_attribute("class") or "")
    assert "charge-card" in first.inner_text()
    assert "uncommitted" in first.inner_text()  # its step never committed
    cmd = page.locator("#effects code.resolve").first.inner_text()
    assert cmd.startswith(f"agentwal resolve {store_path} ef-")
    assert page.locator("#effects b").count() == 0  # the HTML in its args is text
    shot(page, "5-effects")


def test_health_first_then_verify_on_demand(page: Any, store_path: str) -> None:
    with agentwal.open(store_path, readonly=True) as ro:
        record = HealthFile(store_path, ro.stats()["store_id"])
    # what a writer's failed fold leaves (tests/cli/test_health_cli.py makes a real one)
    record.failed("fold", DiskFullError(store_path, "the LMDB map is full <b>x</b>"))
    try:
        page.click("#nav-health")
        items = page.wait_for_selector("#attention-list").inner_text()
        assert "1 effect(s) in doubt: check" in items and "outbox" in items
        assert "the last fold failed" in items and "<b>x</b>" in items  # text, not markup
        facts = page.inner_text("#health-facts")
        assert "none (no process has it open for writing)" in facts
        assert "FAILED" in facts and "the LMDB map is full" in facts
        assert "64.0 MiB (the writer's setting)" in facts
        assert "last retention pass\tno failure recorded" in facts
        shot(page, "6a-health-fold-failed")
    finally:
        record.succeeded("fold")
    page.goto(page.url.split("#")[0] + "#/runs")
    page.click("#nav-health")
    assert "fold failed" not in page.wait_for_selector("#attention-list").inner_text()
    page.click("#run-verify")
    verdict = page.wait_for_selector("#verify-verdict")
    assert verdict.inner_text().startswith("OK: nothing is damaged")
    assert "checkpoints" in page.inner_text("#verify-result")
    assert "null" not in page.inner_text("#main") and "undefined" not in page.inner_text("#main")
    shot(page, "6-health-verify")


def test_a_commit_from_another_process_appears(page: Any, store_path: str) -> None:
    page.goto(page.url.split("#")[0] + "#/run/run-b")
    page.wait_for_selector('#graph li[data-id="2"]')
    assert page.locator('#graph li[data-id="3"]').count() == 0
    with agentwal.open(store_path) as writer, writer.begin("run-b") as txn:
        txn["step"] = 100  # this process writes; the viewer runs in another
    node = page.wait_for_selector('#graph li[data-id="3"]')
    assert "HEAD" in node.inner_text()
    shot(page, "7-live-commit")
