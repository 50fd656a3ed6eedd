"""`bench_app.py --browser`: the first page and cursor steps of a saved trace in a real Chromium.

Starts `streamlit run app/streamlit_app.py` (tests/browser.py's `streamlit_server`) and opens it
in Debian's /usr/bin/chromium driven by Playwright (never `playwright install`).

Warm-up, not timed: the browser opens the Glossary page (it reads no run, so no built-in model is
recorded), picks "Saved trace" -> "Path", opens a small trace on the Overview (the server imports
the chart libraries, the browser loads Vega), then waits until the server's processes are idle (the
app starts a spare warm sandbox, which imports torch, a few seconds after its first page: this is the
steady state of an app up for a while). Then it types the big file's path and times:
  1. first page: from the Enter key until the Overview's slider spans the big trace's events,
     the script run has ended, every chart is drawn on a new canvas (not the small trace's) and
     two animation frames have passed (the browser painted): Trace.load + the index + the
     Overview, server and browser (target 1.5 s);
  2. cursor step: from a click on "+1" until the slider shows the next position, the cursor line
     names the next event, the run has ended and two frames have passed, `steps` times (target
     0.25 s each; the median is judged). On a big trace one step moves the chart's cursor rule by
     less than a pixel: what the user sees change is the slider, the line and the tables.
Both are timed on the page's own clock, from the key press or the mouse press (a listener the page
runs) to the painted result: Playwright's checks before it presses are not counted. While it waits,
the harness checks the page every POLL_MS ms on a timer (not at every animation frame, which makes
Chromium draw 60 frames a second the page would not draw, on the cores the app uses).
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server  # noqa: E402

FIRST_PAGE_S = 1.5
CURSOR_S = 0.25
# While it times, the harness checks the page every POLL_MS on a timer, not at every animation frame (Playwright's
# default): a check per frame makes Chromium draw 60 frames a second that the page itself would not draw (measured
# on the first page: about 0.1 s of the renderer's CPU and as much of the compositor's per second of waiting, taken
# from the 2 cores the server and the page share). Noticing the result up to POLL_MS late counts against the app.
POLL_MS = 20
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


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process (Linux /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            found[int(entry)] = (int(stat.rpartition(")")[2].split()[1]), cmdline)
    return found


def _tree(marker: str) -> list[int]:
    """The processes whose command line holds `marker`, and all their descendants."""
    procs = _processes()
    roots = {pid for pid, (_, cmd) in procs.items() if marker in cmd}
    tree, grew = set(roots), True
    while grew:
        grew = False
        for pid, (parent, _) in procs.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sorted(tree)


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system, with reaped children) the processes used so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


class _CpuMeter:
    """CPU seconds that the streamlit server and Chromium use over an interval (`with meter:`; then
    `meter.used`). On a shared machine the wall time includes waiting for a core; these do not, and
    the two mostly run one after the other, so their sum bounds what the wall time would be alone."""

    def __init__(self, server_marker: str, browser_marker: str) -> None:
        self.markers = (server_marker, browser_marker)
        self.start: list[float] = []
        self.used: tuple[float, float] = (0.0, 0.0)

    def __enter__(self) -> _CpuMeter:
        self.start = [_cpu(_tree(m)) for m in self.markers]
        return self

    def __exit__(self, *exc: object) -> None:  # processes started meanwhile count whole
        server, browser = (_cpu(_tree(m)) - s for m, s in zip(self.markers, self.start))
        self.used = (server, browser)


def _quiet(marker: str, timeout_s: float, idle_share: float = 0.05, window_s: float = 1.0) -> bool:
    """Wait until the processes of `marker` use under `idle_share` of a core over `window_s` (the app has
    finished what it starts in the background, e.g. a spare warm sandbox importing torch); False on timeout."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        before = _cpu(_tree(marker))
        time.sleep(window_s)
        if _cpu(_tree(marker)) - before < idle_share * window_s:
            return True
    return False


def _open(page, box, path: Path, events: int, timeout_ms: int) -> float:
    """Type `path` in the trace path box, press Enter, wait for its Overview of `events` events drawn;
    the seconds from the Enter key to the painted page, on the page's clock."""
    box.fill(str(path))
    box.press("Enter")
    page.wait_for_function(_SLIDER_SPANS, arg=f"{events - 1:,}", timeout=timeout_ms, polling=POLL_MS)
    page.wait_for_function(_DRAWN, timeout=timeout_ms, polling=POLL_MS)
    return (page.evaluate(_TWO_FRAMES) - page.evaluate(_INPUT_AT)) / 1000


def measure(trace_path: Path, events: int, warmup_path: Path, warmup_events: int, steps: int = 5,
            timeout_s: float = 300) -> dict[str, object]:
    """Time the first page of `trace_path` (`events` events) and `steps` cursor steps in Chromium; seconds.
    Also the CPU seconds (server, Chromium) of the first page and, median per process, of a step."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"bench_app --browser: {CHROMIUM} is missing.\nTip: apt-get install chromium.")
    timeout_ms = int(timeout_s * 1000)
    with tempfile.TemporaryDirectory() as folder, streamlit_server(Path(folder) / "streamlit.log") as url, \
            sync_playwright() as p:
        marker = f"--ckpt-viz-bench={uuid.uuid4().hex}"  # a switch Chromium ignores: finds its processes
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, marker], headless=True)
        meter = _CpuMeter(f"--server.port {url.rpartition(':')[2]} ", marker)
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
            page.wait_for_timeout(4_000)  # the app starts background work a few seconds after its first page ...
            quiet = _quiet(meter.markers[0], timeout_s)  # ... (a spare sandbox): time the app once it is done
            page.evaluate(_MARK_OLD)
            page.evaluate(_LISTEN)
            with meter:
                first = _open(page, box, trace_path, events, timeout_ms)
            first_cpu = meter.used
            cursor, cursor_cpu = [], []
            for _ in range(steps):
                thumb = page.locator(_THUMB).first.inner_text()
                line = page.locator('[data-testid="stCode"]').first.inner_text()
                with meter:
                    page.get_by_role("button", name="+1", exact=True).click()
                    page.wait_for_function(_STEPPED, arg=[str(int(thumb) + 1), line], timeout=timeout_ms,
                                           polling=POLL_MS)
                    page.wait_for_function(_DRAWN, timeout=timeout_ms, polling=POLL_MS)
                    cursor.append((page.evaluate(_TWO_FRAMES) - page.evaluate(_INPUT_AT)) / 1000)
                cursor_cpu.append(meter.used)
            errors = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]').count()
        finally:
            browser.close()
    return {"first_page_s": first, "cursor_step_s": cursor, "cursor_median_s": statistics.median(cursor),
            "first_page_cpu_s": first_cpu, "cursor_cpu_s": tuple(statistics.median(c) for c in zip(*cursor_cpu)),
            "server_was_quiet": quiet, "errors_on_page": errors}
