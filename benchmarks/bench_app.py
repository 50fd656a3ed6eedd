"""How fast does the app open a big saved trace, and how fast does the time cursor move?

Writes a synthetic trace file (default 1,000,000 events, built as in
bench_trace_io.py), then drives the real app (`app/streamlit_app.py`) headless with
Streamlit's AppTest, which runs the same script code as a server session does:

1. first page: a fresh session opens the file (Trace.load + the analysis + the
   Overview page drawn); target 5 s;
2. cursor moves on every page (a step button, then a slider jump across the run);
   target 1 s each. The first visit of a page (which computes its once-per-trace
   data) is reported too, not held to the 1 s target.

    python benchmarks/bench_app.py                 # 1,000,000 events
    python benchmarks/bench_app.py --events 20000  # quick
    python benchmarks/bench_app.py --browser       # in Chromium against a real server (benchmarks/_browser.py)

Prints one line per measurement and PASS/FAIL; exits 1 when a target is missed, 2 when a
page shows an error.
Browser time (drawing the figures) is not included here; `--browser` measures it: the first page
and "+1" cursor steps in Debian's Chromium driven by Playwright (targets 1.5 s and 0.25 s).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_trace_io import build_trace  # noqa: E402

FIRST_PAGE_S = 5.0
CURSOR_S = 1.0
# every page with the cursor (not the timeline, which has its own axis, nor the glossary)
PAGES = ("views/overview.py", "views/graph.py", "views/memory.py", "views/handles.py", "views/debugger.py",
         "views/routing.py", "views/events.py", "views/compare.py")


def _timed(label: str, fn, target: float | None, results: list) -> None:
    start = time.perf_counter()
    at = fn()
    elapsed = time.perf_counter() - start
    problems = [e.value for e in at.exception] + [e.value for e in at.error]
    if not at.title:
        problems.append("no page title: the page was not drawn")
    ok = not problems and (target is None or elapsed <= target)
    results.append((label, elapsed, target, ok, bool(problems)))
    verdict = "PASS" if ok else "FAIL"
    shown = f"{elapsed:6.2f} s" + (f"  (target {target:.0f} s)" if target else "  (reported)")
    print(f"{label:<44} {shown:<24} {verdict if target or problems else ''}", flush=True)
    for problem in problems:
        print(f"    error on the page: {str(problem)[:300]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--gzip", action="store_true", help="write .json.gz instead of .json")
    parser.add_argument("--browser", action="store_true", help="time the first page and cursor steps in Chromium")
    parser.add_argument("--steps", type=int, default=5, help="cursor steps timed with --browser")
    args = parser.parse_args(argv)
    if args.browser:
        return _browser_main(args)

    from streamlit.testing.v1 import AppTest

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / ("bench_trace.json.gz" if args.gzip else "bench_trace.json")
        start = time.perf_counter()
        trace = build_trace(args.events)
        trace.save(path)
        print(f"wrote {len(trace.events):,} events, {len(trace.memory):,} memory samples, {len(trace.graphs)} graphs "
              f"to {path.name} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - start:.1f} s "
              f"(not timed); {os.cpu_count()} CPUs; load {_load()}\n")
        del trace

        os.chdir(ROOT)
        at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=300)
        at.session_state["src_kind"] = "Saved trace"
        at.session_state["src_trace_how"] = "Path"
        at.session_state["src_trace_path"] = str(path)
        results: list = []
        _timed("first page (load + index + Overview)", at.run, FIRST_PAGE_S, results)
        if at.exception or at.error:
            return 2
        n = args.events
        for page in PAGES:
            name = page.split("/")[1].removesuffix(".py")
            _timed(f"{name}: first visit", lambda page=page: at.switch_page(page).run(), None, results)
            step = "cursor_prev" if not at.button(key="cursor_prev").disabled else "cursor_next"  # at 0: "+1"
            _timed(f"{name}: cursor {'-1' if step == 'cursor_prev' else '+1'} (step button)",
                   lambda step=step: at.button(key=step).click().run(), CURSOR_S, results)
            target = n // 3 if at.slider(key="cursor_slider").value > n // 2 else 2 * n // 3
            _timed(f"{name}: cursor jump (slider to {target:,})",
                   lambda target=target: at.slider(key="cursor_slider").set_value(target).run(), CURSOR_S, results)

    broken = [label for label, *_, problem in results if problem]
    failed = [label for label, _, _, ok, _ in results if not ok]
    print("\nPASS: every target met" if not failed else f"\nFAIL: {', '.join(failed)}")
    return 2 if broken else 1 if failed else 0


def _browser_main(args: argparse.Namespace) -> int:
    from _browser import CURSOR_S, FIRST_PAGE_S, measure

    with tempfile.TemporaryDirectory() as folder:
        suffix = ".json.gz" if args.gzip else ".json"
        path, warmup = Path(folder) / f"bench_trace{suffix}", Path(folder) / f"warmup_trace{suffix}"
        build_trace(args.events).save(path)
        warmup_events = min(2_000, max(args.events // 2, 2))  # any other size: the slider's range tells them apart
        build_trace(warmup_events).save(warmup)
        print(f"wrote {args.events:,} events to {path.name} ({path.stat().st_size / 1e6:.0f} MB; not timed); "
              f"{os.cpu_count()} CPUs; Chromium + a real streamlit server; load {_load()}", flush=True)
        result = measure(path, args.events, warmup, warmup_events, args.steps)
    steps = ", ".join(f"{s:.2f}" for s in result["cursor_step_s"])
    first_ok = result["first_page_s"] <= FIRST_PAGE_S
    cursor_ok = result["cursor_median_s"] <= CURSOR_S
    print(f"first page (Enter -> Overview drawn)     {result['first_page_s']:6.2f} s  (target {FIRST_PAGE_S} s)  "
          f"{'PASS' if first_ok else 'FAIL'}")
    print(f"cursor step (+1 -> drawn), median        {result['cursor_median_s']:6.2f} s  (target {CURSOR_S} s)  "
          f"{'PASS' if cursor_ok else 'FAIL'}  [{steps}]")
    (server, chromium), (step_server, step_chromium) = result["first_page_cpu_s"], result["cursor_cpu_s"]
    print(f"CPU seconds (server + Chromium): first page {server:.2f} + {chromium:.2f}, "
          f"cursor step {step_server:.2f} + {step_chromium:.2f} (median); load {_load()}")
    if not result["server_was_quiet"]:
        print("    the server's processes did not go idle before the timing (background work overlapped it)")
    if result["errors_on_page"]:
        print(f"    {result['errors_on_page']} error(s) shown on the page")
        return 2
    return 0 if first_ok and cursor_ok else 1


def _load() -> str:
    """The 1, 5 and 15 minute load averages (the machine may be shared: say under what load a figure was made)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
