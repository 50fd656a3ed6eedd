"""The app in a real browser: a `streamlit run` server, driven by Playwright on Debian's chromium.

Visits every page through the sidebar navigation, steps the time cursor and checks
that the page changed, and saves a screenshot of every page to artifacts/screenshots/
(with CKPT_VIZ_UPDATE_SCREENSHOTS=1 also to docs/screenshots/, for the README).
Skipped only when /usr/bin/chromium is missing (CI installs it).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "artifacts" / "screenshots"
DOCS_SHOTS = ROOT / "docs" / "screenshots"
PAGES = [  # (navigation label, page title, file name of its screenshot)
    ("Overview", "Overview", "01_overview.png"),
    ("Autograd graph", "Autograd graph", "02_graph.png"),
    ("Memory", "Memory", "03_memory.png"),
    ("Handles", "Handles", "04_handles.png"),
    ("Routing (DX/DW)", "Routing (DX/DW)", "05_routing.png"),
    ("Events", "Events", "06_events.png"),
    ("Compare modes", "Compare modes", "07_compare.png"),
]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `streamlit run app/streamlit_app.py` subprocess on a free local port; killed at the end."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "streamlit.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app/streamlit_app.py", "--server.port", str(port),
             "--server.headless", "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                    if reply.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit did not start (exit {proc.poll()}):\n{log_path.read_text()[-3000:]}")
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode is not None


def _settle(page, timeout_ms: int = 60_000) -> None:
    """Wait until the script run ended and the figures are drawn."""
    page.wait_for_function(
        "() => { const app = document.querySelector('[data-testid=\"stApp\"]');"
        " return app && app.getAttribute('data-test-script-state') === 'notRunning'; }", timeout=timeout_ms)
    page.wait_for_function(  # graphviz (wasm) and vega draw after the script ends
        "() => [...document.querySelectorAll('[data-testid=\"stGraphVizChart\"]')].every(c => c.querySelector('svg'))"
        " && [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')].every("
        "c => c.querySelector('canvas, svg'))", timeout=timeout_ms)
    page.wait_for_timeout(500)  # let the last transitions finish before a screenshot


def _screenshot(page, path: Path) -> None:
    """The whole page: the viewport grows to the main area's scroll height (Streamlit scrolls inside it)."""
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": 1500, "height": min(max(int(height), 1000), 4000)})
    page.wait_for_timeout(700)  # charts re-layout to the new size
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1500, "height": 1000})


def _cursor_text(page) -> str:
    return page.locator('[data-testid="stSliderThumbValue"]').first.inner_text()


def _handle_picker_agrees_with_the_lifecycle(page) -> None:
    """What the browser draws in the Handles page's picker: h0, its block's qualified name, and its state at
    the cursor, which must be what the lifecycle of the same default run (recorded here, independently) says."""
    import re

    from ckpt_viz import DEFAULT_MODEL, RunRequest, lifecycle, obtain_trace

    picker = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').first
    shown = " ".join(i.input_value() for i in picker.locator("input").all())  # the chosen option is the input's value
    match = re.search(r"h0 · (\S+) · (\w+) at seq (\d+)", shown)
    assert match, shown
    trace = obtain_trace(RunRequest("builtin", DEFAULT_MODEL, mode="split-reentrant"))
    name = next(e.data["function"] for e in trace.of_kind("handle_created") if e.handle_id == 0)
    assert match[1] == name == "blocks.0"
    assert match[2] == lifecycle(trace).state_at(0, int(match[3])), shown


def test_every_page_in_a_real_browser(server: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1500, "height": 1000})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(server, timeout=60_000)
            _settle(page, 120_000)  # the first run records the default model
            # Put the cursor at the first replay: every page then shows the middle of a backward pass.
            page.locator(".st-key-cursor_first button").click()
            _settle(page)
            page.locator(".st-key-cursor_next_replay button").click()
            _settle(page)
            assert "replay_started" in page.locator('[data-testid="stCode"]').first.inner_text()
            for label, title, shot in PAGES:
                page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=label, exact=True).click()
                expect(page.get_by_role("heading", name=title, exact=True)).to_be_visible(timeout=60_000)
                _settle(page)
                assert page.locator('[data-testid="stException"]').count() == 0, title
                assert page.locator('[data-testid="stAlertContentError"]').count() == 0, title
                _screenshot(page, SHOTS / shot)
                if title == "Handles":
                    _handle_picker_agrees_with_the_lifecycle(page)

                # Step the cursor back one event: the slider and the page's content change.
                before_value, before_main = _cursor_text(page), page.locator('[data-testid="stMain"]').inner_text()
                page.locator(".st-key-cursor_prev button").click()
                expect(page.locator('[data-testid="stSliderThumbValue"]').first).to_have_text(
                    str(int(before_value) - 1), timeout=30_000)
                _settle(page)
                assert page.locator('[data-testid="stMain"]').inner_text() != before_main, title
                page.locator(".st-key-cursor_next button").click()  # and back: the next page starts there too
                expect(page.locator('[data-testid="stSliderThumbValue"]').first).to_have_text(before_value,
                                                                                            timeout=30_000)
                _settle(page)
                assert page.locator('[data-testid="stMain"]').inner_text() == before_main, title
            assert not errors, errors
        finally:
            context.close()
    assert {shot for *_, shot in PAGES} <= {p.name for p in SHOTS.glob("*.png")}
    if os.environ.get("CKPT_VIZ_UPDATE_SCREENSHOTS") == "1":
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        for *_, shot in PAGES:
            shutil.copy2(SHOTS / shot, DOCS_SHOTS / shot)
