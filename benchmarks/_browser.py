"""`bench_app.py --browser`: the first page and cursor steps of a saved trace in a real Chromium.

Starts `streamlit run app/streamlit_app.py` (tests/browser.py's `streamlit_server`), opens it in
Debian's /usr/bin/chromium driven by Playwright, picks "Saved trace" -> "Path", types the file's
path and times, from the Enter key:
  1. first page: until the Overview's cursor slider is shown, the script run has ended and every
     chart is drawn (target 1.5 s);
  2. cursor step: a click on "+1" until the slider shows the next position, the run has ended and
     the charts are drawn again, `steps` times (target 0.25 s each; the median is judged).
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server  # noqa: E402

FIRST_PAGE_S = 1.5
CURSOR_S = 0.25
_DRAWN = ("() => { const app = document.querySelector('[data-testid=\"stApp\"]');"
          " return app && app.getAttribute('data-test-script-state') === 'notRunning'"
          " && [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')].every("
          "c => c.querySelector('canvas, svg'))"
          " && [...document.querySelectorAll('[data-testid=\"stGraphVizChart\"]')].every(c => c.querySelector('svg'));"
          " }")
_THUMB = '[data-testid="stSliderThumbValue"]'


def _drawn(page, thumb_other_than: str | None, timeout_ms: int) -> None:
    if thumb_other_than is None:
        page.wait_for_selector(_THUMB, timeout=timeout_ms)
    else:
        page.wait_for_function("b => { const t = document.querySelector('[data-testid=\"stSliderThumbValue\"]');"
                               " return t && t.innerText !== b; }", arg=thumb_other_than, timeout=timeout_ms)
    page.wait_for_function(_DRAWN, timeout=timeout_ms)


def measure(trace_path: Path, steps: int = 5) -> dict[str, object]:
    """Time the first page and `steps` cursor steps of `trace_path` in Chromium; seconds."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"bench_app --browser: {CHROMIUM} is missing.\nTip: apt-get install chromium.")
    with tempfile.TemporaryDirectory() as folder, streamlit_server(Path(folder) / "streamlit.log") as url, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(url, timeout=120_000)
            _drawn(page, None, 300_000)  # the default built-in run, not timed
            sidebar = page.locator('[data-testid="stSidebar"]')
            sidebar.get_by_text("Saved trace", exact=True).click()
            sidebar.get_by_text("Path", exact=True).click()
            box = sidebar.get_by_label("Trace file path")
            box.fill(str(trace_path))
            before = page.locator(_THUMB).first.inner_text() if page.locator(_THUMB).count() else None
            start = time.perf_counter()
            box.press("Enter")
            page.wait_for_function("b => { const t = document.querySelector('[data-testid=\"stSliderThumbValue\"]');"
                                   " return t && t.innerText !== b && t.innerText.length > 0; }",
                                   arg=before or "", timeout=300_000)
            page.wait_for_function(_DRAWN, timeout=300_000)
            first = time.perf_counter() - start
            cursor = []
            for _ in range(steps):
                shown = page.locator(_THUMB).first.inner_text()
                start = time.perf_counter()
                page.get_by_role("button", name="+1", exact=True).click()
                _drawn(page, shown, 120_000)
                cursor.append(time.perf_counter() - start)
            errors = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]').count()
        finally:
            browser.close()
    return {"first_page_s": first, "cursor_step_s": cursor, "cursor_median_s": statistics.median(cursor),
            "errors_on_page": errors}
