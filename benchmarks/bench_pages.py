"""Every page of the app on a big saved trace, in Chromium: from the click in the sidebar to the page drawn.

What an ML engineer with a long trace does: open the file (the Overview; `bench_app.py --browser` times
that), then click through every page in the sidebar. For each page this times, on the page's own clock
(benchmarks/_browser.py), from the mouse press on the page's link until the page is drawn:
  - the page's title is shown and the script run has ended,
  - every chart is drawn on a canvas/svg the previous page did not have, every graph frame holds its
    SVG, every table has its canvas, and two animation frames have passed (the browser painted);
and the CPU seconds the streamlit server's processes and Chromium used meanwhile. Before each click it
waits until the server is idle, so that one page's background work is not counted against the next.
`--rounds 2` clicks through twice: the second round is a return visit (what each page computes once
per trace is cached by then).

    python benchmarks/bench_pages.py --gzip            # 1,000,000 events (target 1.5 s a page)
    python benchmarks/bench_pages.py --quick           # a tiny trace: every page opens, nothing timed against

The Lessons page records its own small runs (it does not read the trace): reported, not held to the target.
Exits 1 when a trace page misses the target, 2 when a page shows an error or is not drawn.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _browser import (  # noqa: E402
    _DRAWN,
    _IDLE,
    _LISTEN,
    _MARK_OLD,
    _SLIDER_SPANS,
    _TWO_FRAMES,
    CHROMIUM,
    CHROMIUM_ARGS,
    POLL_MS,
    _CpuMeter,
    _quiet,
    streamlit_server,
)
from bench_trace_io import build_trace  # noqa: E402

PAGE_S = 1.5  # the first page's target, for every page
# The sidebar's pages in its order (app/streamlit_app.py): link name -> the title the page shows.
PAGES = {"Autograd graph": "Autograd graph", "Memory": "Memory", "Handles": "Handles", "Debugger": "Debugger",
         "Routing (DX/DW)": "Routing (DX/DW)", "Schedule timeline": "Schedule timeline", "Events": "Events",
         "Compare": "Compare two runs", "Lessons": "Lessons", "Glossary": "Glossary", "Overview": "Overview"}
NOT_TRACE = {"Lessons"}  # records its own runs: not a figure of the trace
# The page `title` drawn: its heading shown, the run ended, every chart new and drawn, every graph frame and
# table drawn.
_PAGE_DRAWN = ("title => { const h = document.querySelector('[data-testid=\"stMain\"] h1');"
               " if (!h || h.innerText.trim() !== title) return false;"
               " if (!(" + _DRAWN + ")()) return false;"
               " const frames = [...document.querySelectorAll('[data-testid=\"stMain\"] iframe')];"
               " if (!frames.every(f => { try { const d = f.contentDocument; return d && d.readyState === 'complete'"
               " && (!d.querySelector('.ckpt-graph') || d.querySelector('.ckpt-graph svg')); }"
               " catch (e) { return true; } })) return false;"
               " return [...document.querySelectorAll('[data-testid=\"stDataFrame\"]')].every("
               "t => !t.checkVisibility() || t.querySelector('canvas')); }")
_WHAT = ("() => ({h1: [...document.querySelectorAll('[data-testid=\"stMain\"] h1')].map(h => h.innerText),"
         " state: document.querySelector('[data-testid=\"stApp\"]')?.getAttribute('data-test-script-state'),"
         " charts: [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')].map("
         "c => { const d = c.querySelector('canvas, svg'); return d ? (d.__ckptOld ? 'old' : 'new') : 'none'; }),"
         " frames: document.querySelectorAll('[data-testid=\"stMain\"] iframe').length,"
         " tables: [...document.querySelectorAll('[data-testid=\"stDataFrame\"]')].map("
         "t => !!t.querySelector('canvas'))})")
_ERRORS = '[data-testid="stException"]'  # an exception (st.error boxes are findings: the debugger shows them)


def visit(page, name: str, title: str, meter: _CpuMeter, timeout_ms: int) -> tuple[float, tuple[float, float], int]:
    """Click the sidebar link `name`; (seconds to its page `title` drawn, (server, Chromium) CPU seconds, errors)."""
    page.evaluate(_MARK_OLD)
    link = page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=name, exact=True)
    link.wait_for(timeout=timeout_ms)
    with meter:
        link.click()
        try:
            page.wait_for_function(_PAGE_DRAWN, arg=title, timeout=timeout_ms, polling=POLL_MS)
        except Exception:
            print(f"{name}: not drawn; the page shows: {page.evaluate(_WHAT)}", flush=True)
            raise
        elapsed = (page.evaluate(_TWO_FRAMES) - page.evaluate("() => window.__ckptInput")) / 1000
    return elapsed, meter.used, page.locator(_ERRORS).count()


def measure(path: Path, events: int, warmup: Path, warmup_events: int, rounds: int,
            timeout_s: float = 120) -> list[tuple[int, str, float, tuple[float, float], int]]:
    """Open `path` on the Overview (after a warm-up on `warmup`), then visit every page `rounds` times."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"bench_pages: {CHROMIUM} is missing.\nTip: apt-get install chromium.")
    timeout_ms = int(timeout_s * 1000)
    results = []
    with tempfile.TemporaryDirectory() as folder, streamlit_server(Path(folder) / "streamlit.log") as url, \
            sync_playwright() as p:
        marker = f"--ckpt-viz-bench={uuid.uuid4().hex}"
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, marker], headless=True)
        meter = _CpuMeter(f"--server.port {url.rpartition(':')[2]} ", marker)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"{url}/glossary", timeout=timeout_ms)  # reads no run: nothing is recorded
            page.wait_for_function(_IDLE, timeout=timeout_ms)
            sidebar = page.locator('[data-testid="stSidebar"]')
            sidebar.get_by_text("Saved trace", exact=True).click(timeout=timeout_ms)
            sidebar.get_by_text("Path", exact=True).click(timeout=timeout_ms)
            box = sidebar.get_by_label("Trace file path")
            page.evaluate(_LISTEN)
            box.fill(str(warmup))  # the warm-up (not timed): the server imports the chart libraries, ...
            box.press("Enter")
            page.wait_for_function(_IDLE, timeout=timeout_ms)
            visit(page, "Overview", "Overview", meter, timeout_ms)
            page.wait_for_function(_SLIDER_SPANS, arg=f"{warmup_events - 1:,}", timeout=timeout_ms)
            page.wait_for_timeout(4_000)  # ... the app starts a spare sandbox a few seconds after its first page
            _quiet(meter.markers[0], timeout_s)
            page.evaluate(_MARK_OLD)
            box.fill(str(path))  # the big trace's first page (bench_app.py --browser times it)
            box.press("Enter")
            page.wait_for_function(_SLIDER_SPANS, arg=f"{events - 1:,}", timeout=timeout_ms, polling=POLL_MS)
            page.wait_for_function(_DRAWN, timeout=timeout_ms, polling=POLL_MS)
            for round_ in range(rounds):
                for name, title in PAGES.items():
                    _quiet(meter.markers[0], 60)
                    elapsed, cpu, errors = visit(page, name, title, meter, timeout_ms)
                    results.append((round_, name, elapsed, cpu, errors))
                    print(f"round {round_ + 1}  {name:<20} {elapsed:6.2f} s   CPU server {cpu[0]:5.2f} + "
                          f"Chromium {cpu[1]:5.2f} s{'   ERRORS ON THE PAGE' if errors else ''}", flush=True)
        finally:
            browser.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="a 3,000-event trace, one round (the smoke test)")
    parser.add_argument("--gzip", action="store_true", help="write .json.gz instead of .json")
    parser.add_argument("--rounds", type=int, default=1, help="click through every page this many times")
    args = parser.parse_args(argv)
    events = 3_000 if args.quick else args.events
    with tempfile.TemporaryDirectory() as folder:
        suffix = ".json.gz" if args.gzip else ".json"
        path, warmup = Path(folder) / f"bench_trace{suffix}", Path(folder) / f"warmup_trace{suffix}"
        build_trace(events).save(path)
        warmup_events = min(2_000, max(events // 2, 2))  # another size: the slider's range tells them apart
        build_trace(warmup_events).save(warmup)
        print(f"wrote {events:,} events to {path.name} ({path.stat().st_size / 1e6:.1f} MB; not timed); "
              f"{os.cpu_count()} CPUs; Chromium + a real streamlit server; load {_load()}", flush=True)
        results = measure(path, events, warmup, warmup_events, args.rounds)
    errors = [name for _, name, _, _, e in results if e]
    slow = sorted({name for _, name, s, _, _ in results if s > PAGE_S and name not in NOT_TRACE})
    print(f"load {_load()}")
    if errors:
        print(f"FAIL: error(s) shown on {', '.join(sorted(set(errors)))}")
        return 2
    if args.quick:
        print(f"every page drawn ({len(results)} visits)")
        return 0
    print("PASS: every page drawn within 1.5 s" if not slow else f"FAIL (over {PAGE_S} s): {', '.join(slow)}")
    return 1 if slow else 0


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
