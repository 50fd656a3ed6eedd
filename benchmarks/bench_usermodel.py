"""How fast does the app show an uploaded model file, and a change of its mode?

Drives the real app (`app/streamlit_app.py`) headless with Streamlit's AppTest, as a user does:
pick "Model file (.py)" -> "Upload" (the session's warm sandbox starts importing torch), upload
`examples/user_model.py`, then change the mode. Each round is a fresh session (a fresh warm
process), and measures, in a shuffled order within the round:

1. first page, uploaded after the warm process is ready (a user who takes a few seconds to pick a
   file): upload -> Overview drawn; target 3 s;
2. first page, uploaded at once (the warm process's torch import still under way); reported;
3. change of mode (split-reentrant -> reentrant) on the first session: target 1.5 s;
4. baseline: one cold sandboxed run (`record_in_subprocess`: a new Python, torch imported,
   what the app paid for every run before) of the same file and mode.

The comparison warm/cold is the median of per-round ratios (benchmarks/_common.py). The
breakdown row "warm run alone" is `WarmSandbox.record` with no page: what bounds the page.

    python benchmarks/bench_usermodel.py              # 5 rounds
    python benchmarks/bench_usermodel.py --rounds 1   # quick (the smoke test)

Prints one line per figure and PASS/FAIL; exits 1 when a target is missed, 2 when a page shows an error.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "user_model.py"
FIRST_PAGE_S = 3.0
CHANGE_S = 1.5


def _problems(at) -> list[str]:
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error] + \
        ([] if at.title else ["no page title: the page was not drawn"])


def _session(AppTest):
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=300)
    at.session_state["src_kind"] = "Model file (.py)"
    at.session_state["src_file_how"] = "Upload"
    return at.run()


def _upload(at):
    return at.file_uploader(key="src_py").upload("user_model.py", EXAMPLE.read_bytes(), "text/x-python").run()


def _round(AppTest, sandbox, seed: int) -> tuple[dict[str, float], list[str]]:
    from ckpt_viz.usermodel.sandbox import record_in_subprocess

    out: dict[str, float] = {}
    problems: list[str] = []
    ready = _session(AppTest)
    ready.session_state[sandbox.KEY].warm.wait_ready()

    def first_ready() -> None:
        start = time.perf_counter()
        _upload(ready)
        out["first page (warm process ready)"] = time.perf_counter() - start
        problems.extend(_problems(ready))
        start = time.perf_counter()
        ready.selectbox(key="src_mode").set_value("reentrant").run()
        out["change of mode"] = time.perf_counter() - start
        problems.extend(_problems(ready))
        box = ready.session_state[sandbox.KEY]
        start = time.perf_counter()
        box.warm.record(str(EXAMPLE) + ":make_model", ["nonreentrant"],
                        extra={"memory": True, "graphs": True})
        out["warm run alone (WarmSandbox.record)"] = time.perf_counter() - start

    def first_at_once() -> None:
        start = time.perf_counter()
        at = _upload(_session(AppTest))
        out["first page (uploaded at once)"] = time.perf_counter() - start
        problems.extend(_problems(at))
        at.session_state[sandbox.KEY].close()

    def cold() -> None:
        start = time.perf_counter()
        record_in_subprocess(f"{EXAMPLE}:make_model", "reentrant", extra={"memory": True, "graphs": True})
        out["cold sandboxed run (baseline)"] = time.perf_counter() - start

    steps = [first_ready, first_at_once, cold]
    random.Random(seed).shuffle(steps)
    for step in steps:
        gc.collect()
        step()
    ready.session_state[sandbox.KEY].close()
    return out, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the per-round figures here")
    args = parser.parse_args(argv)

    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT / "app"))
    from streamlit.testing.v1 import AppTest

    from ui import sandbox

    rounds, problems = [], []
    for i in range(args.rounds):
        got, wrong = _round(AppTest, sandbox, i)
        rounds.append(got)
        problems += wrong
        print(f"round {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in got.items()), flush=True)
    print(f"\n{args.rounds} rounds, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    targets = {"first page (warm process ready)": FIRST_PAGE_S, "change of mode": CHANGE_S}
    failed = []
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        target = targets.get(name)
        median = statistics.median(values)
        ok = target is None or median <= target
        failed += [] if ok else [name]
        verdict = "" if target is None else ("PASS" if ok else "FAIL")
        print(f"{name:<40} median {median:5.2f} s  (range {min(values):.2f}-{max(values):.2f})"
              f"{f'  target {target:g} s' if target else ''}  {verdict}")
    ratio = statistics.median(r["change of mode"] / r["cold sandboxed run (baseline)"] for r in rounds)
    print(f"{'change of mode / cold sandboxed run':<40} paired median ratio {ratio:.2f}")
    for problem in problems:
        print(f"    error on the page: {problem[:300]}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "ratio_change_vs_cold": ratio, "problems": problems}))
    print("\nPASS: every target met" if not failed else f"\nFAIL: {', '.join(failed)}")
    return 2 if problems else 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
