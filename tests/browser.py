"""Shared pieces of the browser tests (tests/app/test_browser*.py): Debian's chromium driven by Playwright
against a real `streamlit run` server. The `server` and `browser_page` fixtures are in tests/app/conftest.py.

Each browser test file owns its own pages and assertions; these helpers only start, wait, pick a source, read
what a person reads and photograph.
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
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "artifacts" / "screenshots"
DOCS_SHOTS = ROOT / "docs" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def streamlit_server(log_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A `streamlit run app/streamlit_app.py` subprocess on a free local port; killed on exit. Yields its URL."""
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app/streamlit_app.py", "--server.port", str(port),
             "--server.headless", "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, **(env or {})})
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
                raise RuntimeError(f"streamlit did not start (exit {proc.poll()}):\n{log_path.read_text()[-3000:]}")
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def settle(page, timeout_ms: int = 60_000, *, pause_ms: int = 500) -> None:
    """Wait until the script run ended and the figures are drawn; then `pause_ms` more for the last transitions (a
    caller that waits for what its action changed, rather than for a screenshot, passes 0)."""
    page.wait_for_function(
        "() => { const app = document.querySelector('[data-testid=\"stApp\"]');"
        " return app && app.getAttribute('data-test-script-state') === 'notRunning'; }", timeout=timeout_ms)
    page.wait_for_function(  # vega draws after the script ends, and images decode
        "() => [...document.querySelectorAll('[data-testid=\"stGraphVizChart\"]')].every(c => c.querySelector('svg'))"
        " && [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')].every("
        "c => c.querySelector('canvas, svg'))"
        " && [...document.querySelectorAll('img.ckpt-graph')].every(i => i.complete && i.naturalWidth > 0)",
        timeout=timeout_ms)  # and the graphs' images (app/ui/graphview.py)
    if pause_ms:
        page.wait_for_timeout(pause_ms)  # let the last transitions finish before a screenshot


def screenshot(page, path: Path) -> None:
    """The whole page: the viewport grows to the main area's scroll height (Streamlit scrolls inside it).
    A shot in SHOTS is also copied to docs/screenshots/ when CKPT_VIZ_UPDATE_SCREENSHOTS=1."""
    path.parent.mkdir(parents=True, exist_ok=True)
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": 1500, "height": min(max(int(height), 1000), 4000)})
    page.wait_for_timeout(700)  # charts re-layout to the new size
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1500, "height": 1000})
    if os.environ.get("CKPT_VIZ_UPDATE_SCREENSHOTS") == "1" and path.parent == SHOTS:  # for the README
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, DOCS_SHOTS / path.name)


def cursor_text(page) -> str:
    return page.locator('[data-testid="stSliderThumbValue"]').first.inner_text()


def goto_page(page, label: str, title: str | None = None, *, pause_ms: int = 500) -> None:
    """Click `label` in the sidebar navigation and wait for the page's heading and figures (`settle`)."""
    from playwright.sync_api import expect

    page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=label, exact=True).click()
    expect(page.get_by_role("heading", name=title or label, exact=True)).to_be_visible(timeout=60_000)
    settle(page, pause_ms=pause_ms)


def pick_option(page, key: str, option: str) -> None:
    """Pick `option` in the sidebar selectbox of widget key `key` (the caller waits for the run)."""
    choose(page, page.locator(f'[data-testid="stSidebar"] .st-key-{key} [data-testid="stSelectbox"]'), option)


def choose(page, box, option: str, *, tries: int = 3) -> None:
    """Open the selectbox `box` and click `option` in its list. The box is scrolled into view first (a box below the
    fold does not open its list); a script run that redraws the box closes an open list, so a list that shows no
    `option` within 10 s is opened again, up to `tries` times (the last try's timeout is the error)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    wanted = page.get_by_role("option", name=option, exact=True)
    for attempt in range(tries):
        box.scroll_into_view_if_needed()
        box.click()
        try:
            wanted.wait_for(state="visible", timeout=10_000 if attempt < tries - 1 else 30_000)
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise
            page.keyboard.press("Escape")
            settle(page, pause_ms=0)
            continue
        wanted.click()
        return


def open_saved_trace(page, path: str) -> None:
    """Pick "Saved trace" by path in the sidebar and wait for the run."""
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Saved trace", exact=True).click()
    settle(page)
    sidebar.locator('[data-testid="stRadio"]').filter(has_text="Upload").get_by_text("Path", exact=True).click()
    settle(page)
    box = sidebar.get_by_label("Trace file path", exact=True)
    box.fill(path)
    box.press("Enter")
    settle(page, 120_000)


def shown_text(element) -> str:
    """The element's text as a person reads it: without the invisible word joiners that keep links from forming
    (NOTE [ Text as text ] in app/ui/text.py)."""
    return element.inner_text().replace("\u2060", "")


def table_rows(page, index: int) -> list[list[str]]:
    """The cells of the main area's `index`-th table (st.table), row by row, without the header row, as a person
    reads them (`shown_text`)."""
    table = page.locator('[data-testid="stMain"] [data-testid="stTable"]').nth(index)
    rows = table.locator("tbody tr").all_inner_texts()
    return [[c.strip().replace("\u2060", "") for c in row.split("\t")] for row in rows]
