"""`bench_app.py --browser`: the first page and cursor steps of a saved trace in a real Chromium.

Starts `streamlit run app/streamlit_app.py` (tests/browser.py's `streamlit_server`) and opens it
in Debian's /usr/bin/chromium driven by Playwright (never `playwright install`).

Warm-up, not timed: the browser opens the Glossary page (it reads no run, so no built-in model is
recorded), picks "Saved trace" -> "Path", opens a small trace on the Overview (the server imports
the chart libraries, the browser loads Vega). Then it types the big file's path and times:
  1. first page: from the Enter key until the Overview's slider spans the big trace's events,
     the script run has ended, every chart is drawn on a new canvas (not the small trace's) and
     two animation frames have passed (the browser painted): Trace.load + the index + the
     Overview, server and browser (target 1.5 s);
  2. cursor step: from a click on "+1" until the slider shows the next position, the cursor line
     names the next event, the run has ended and two frames have passed, `steps` times (target
     0.25 s each; the median is judged). On a big trace one step moves the chart's cursor rule by
     less than a pixel: what the user sees change is the slider, the line and the tables.
Both are timed on the page's own clock, from the key press or the mouse press (a listener the page
runs) to the painted result: Playwright's checks before it presses are not counted.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server  # noqa: E402

FIRST_PAGE_S = 1.5
CURSOR_S = 0.25
_THUMB = '[data-testid="stSliderThumbValue"]'
_IDLE = ("() => { const app = document.querySelector('[data-testid=\"stApp\"]');"
         " return app && app.getAttribute('data-test-script-state') === 'notRunning'; }")
# Every chart drawn, on a canvas/svg that `_mark_old` did not mark; graphviz charts drawn.
_DRAWN = ("() => { const app = document.querySelector('[data-testid=\"stApp\"]');"
          " return app && app.getAttribute('data-test-script-state') === 'notRunning'"
          " && [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')].every("
          "c => { const d = c.querySelector('canvas, svg'); return d && !d.__ckptOld; })"
          " && [...document.querySelectorAll('[data-testid=\"stGraphVizChart\"]')].every(c => c.querySelector('svg'));"
          " }")
_MARK_OLD = ("() => document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas,"
             " [data-testid=\"stVegaLiteChart\"] svg').forEach(d => { d.__ckptOld = true; })")
# Resolves with the page's clock after two animation frames (the browser has painted what it holds).
_TWO_FRAMES = ("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame("
               "() => r(performance.now()))))")
# The page's clock at the user's last key press or click, read by the page itself (a listener in the capture
# phase): Playwright's own work before it dispatches the event (waiting until the button can be clicked) is
# no part of the app's latency.
_LISTEN = ("() => { window.__ckptInput = null; for (const type of ['keydown', 'mousedown']) document.addEventListener("
           "type, () => { window.__ckptInput = performance.now(); }, {capture: true}); }")
_INPUT_AT = "() => window.__ckptInput"
_SLIDER_SPANS = ("n => [...document.querySelectorAll('[data-testid=\"stSlider\"] label')].some("
                 "l => l.innerText.includes('(0 to ' + n + ')'))")
_STEPPED = ("([thumb, line]) => { const t = document.querySelector('[data-testid=\"stSliderThumbValue\"]');"
            " const c = document.querySelector('[data-testid=\"stCode\"]');"
            " return t && t.innerText === thumb && c && c.innerText !== line; }")


def _open(page, box, path: Path, events: int, timeout_ms: int) -> float:
    """Type `path` in the trace path box, press Enter, wait for its Overview of `events` events drawn;
    the seconds from the Enter key to the painted page, on the page's clock."""
    box.fill(str(path))
    box.press("Enter")
    page.wait_for_function(_SLIDER_SPANS, arg=f"{events - 1:,}", timeout=timeout_ms)
    page.wait_for_function(_DRAWN, timeout=timeout_ms)
    return (page.evaluate(_TWO_FRAMES) - page.evaluate(_INPUT_AT)) / 1000


def measure(trace_path: Path, events: int, warmup_path: Path, warmup_events: int, steps: int = 5,
            timeout_s: float = 300) -> dict[str, object]:
    """Time the first page of `trace_path` (`events` events) and `steps` cursor steps in Chromium; seconds."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"bench_app --browser: {CHROMIUM} is missing.\nTip: apt-get install chromium.")
    timeout_ms = int(timeout_s * 1000)
    with tempfile.TemporaryDirectory() as folder, streamlit_server(Path(folder) / "streamlit.log") as url, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"{url}/glossary", timeout=timeout_ms)  # a page that reads no run: nothing is recorded
            page.wait_for_function(_IDLE, timeout=timeout_ms)
            sidebar = page.locator('[data-testid="stSidebar"]')
            sidebar.get_by_text("Saved trace", exact=True).click(timeout=timeout_ms)
            sidebar.get_by_text("Path", exact=True).click(timeout=timeout_ms)
            box = sidebar.get_by_label("Trace file path")
            box.fill(str(warmup_path))
            box.press("Enter")
            page.wait_for_function(_IDLE, timeout=timeout_ms)
            page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name="Overview", exact=True).click()
            page.wait_for_function(_SLIDER_SPANS, arg=f"{warmup_events - 1:,}", timeout=timeout_ms)
            page.wait_for_function(_DRAWN, timeout=timeout_ms)  # warm-up: not timed
            page.evaluate(_MARK_OLD)
            page.evaluate(_LISTEN)
            first = _open(page, box, trace_path, events, timeout_ms)
            cursor = []
            for _ in range(steps):
                thumb = page.locator(_THUMB).first.inner_text()
                line = page.locator('[data-testid="stCode"]').first.inner_text()
                page.get_by_role("button", name="+1", exact=True).click()
                page.wait_for_function(_STEPPED, arg=[str(int(thumb) + 1), line], timeout=timeout_ms)
                page.wait_for_function(_DRAWN, timeout=timeout_ms)
                cursor.append((page.evaluate(_TWO_FRAMES) - page.evaluate(_INPUT_AT)) / 1000)
            errors = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]').count()
        finally:
            browser.close()
    return {"first_page_s": first, "cursor_step_s": cursor, "cursor_median_s": statistics.median(cursor),
            "errors_on_page": errors}
