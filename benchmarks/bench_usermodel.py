"""How fast does the app show an uploaded model file, and a change of its mode?

Drives the real app (`app/streamlit_app.py`) headless with Streamlit's AppTest, as a user does:
pick "Model file (.py)" -> "Upload", upload `examples/user_model.py`, then change the mode. Each
step is a fresh session; the steps of a round run in a shuffled order, each once the app's spare
warm sandbox has started (NOTE [ Spare sandbox ] in app/ui/sandbox.py: an app that has been up a
few seconds), so no start from an earlier step shares the CPU with it:

1. first page, uploaded at once: the session opens on "Model file (.py)" and uploads right away
   (session start -> Overview drawn; it takes the spare): target 3 s. Then a change of mode at once
   (the next spare starting meanwhile): reported;
2. the same without a spare (`SPARES = 0`, how the app was before: the session starts its own warm
   process and the upload waits for it): paired with 1 (median of per-round ratios); its warm
   start (Python, torch, torch._dynamo, the warm-up recordings; seconds to each stage) is what
   bounds it;
3. first page, uploaded after the session's own warm process is ready (no spare; a user who takes
   a few seconds to pick a file): upload -> Overview drawn; target 3 s; then a change of mode
   (split-reentrant -> reentrant): target 1.5 s; then `WarmSandbox.record` with no page ("warm run
   alone": what bounds both);
4. baseline: one cold sandboxed run (`record_in_subprocess`: a new Python, torch imported,
   what the app paid for every run before) of the same file and mode.

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


AT_ONCE = "first page, uploaded at once (spare)"
NO_SPARE = "first page, uploaded at once, no spare (before)"
START_STAGES = {"importing torch": "Python and bubblewrap start", "importing torch._dynamo": "import torch",
                "warming up": "import torch._dynamo", "ready": "warm-up recordings"}  # stage -> what came before


def _round(AppTest, sandbox, seed: int) -> tuple[dict[str, float], list[str]]:
    from ckpt_viz.usermodel.sandbox import record_in_subprocess

    out: dict[str, float] = {}
    problems: list[str] = []

    def first_ready() -> None:
        sandbox.SPARES = 0
        try:
            ready = _session(AppTest)
        finally:
            sandbox.SPARES = 1
        ready.session_state[sandbox.KEY].warm.wait_ready()
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
        box.close()

    def first_at_once() -> None:
        start = time.perf_counter()
        at = _upload(_session(AppTest))
        out[AT_ONCE] = time.perf_counter() - start
        problems.extend(_problems(at))
        start = time.perf_counter()
        at.selectbox(key="src_mode").set_value("reentrant").run()
        out["change of mode at once (next spare starting)"] = time.perf_counter() - start
        problems.extend(_problems(at))
        at.session_state[sandbox.KEY].close()

    def no_spare() -> None:
        sandbox.SPARES = 0
        try:
            start = time.perf_counter()
            at = _upload(_session(AppTest))
            out[NO_SPARE] = time.perf_counter() - start
        finally:
            sandbox.SPARES = 1
        problems.extend(_problems(at))
        warm = at.session_state[sandbox.KEY].warm
        times = warm._starting.times if warm._starting is not None else {}  # seconds from its start to each stage
        if "ready" in times:  # (a start that failed is on the page: a problem)
            for before, (stage, what) in zip(("starting", *START_STAGES), START_STAGES.items(), strict=False):
                out[f"  its warm start: {what}"] = times[stage] - times.get(before, 0.0)
            out["  its warm start, in all"] = times["ready"]
        at.session_state[sandbox.KEY].close()

    def cold() -> None:
        start = time.perf_counter()
        record_in_subprocess(f"{EXAMPLE}:make_model", "reentrant", extra={"memory": True, "graphs": True})
        out["cold sandboxed run (baseline)"] = time.perf_counter() - start

    steps = [first_ready, first_at_once, no_spare, cold]
    random.Random(seed).shuffle(steps)
    for step in steps:
        gc.collect()
        if not sandbox.spares_ready(300):
            problems.append("the spare warm sandbox did not start within 300 s")
        step()
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

    sandbox.prestart()  # the app's first page (the spare starts PRESTART_S later, or when a session needs it)
    rounds, problems = [], []
    for i in range(args.rounds):
        got, wrong = _round(AppTest, sandbox, i)
        rounds.append(got)
        problems += wrong
        print(f"round {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in got.items()), flush=True)
    print(f"\n{args.rounds} rounds, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    targets = {AT_ONCE: FIRST_PAGE_S, "first page (warm process ready)": FIRST_PAGE_S, "change of mode": CHANGE_S}
    failed = []
    for name in dict.fromkeys(k for r in rounds for k in r):
        values = [r[name] for r in rounds if name in r]
        target = targets.get(name)
        median = statistics.median(values)
        ok = target is None or median <= target
        failed += [] if ok else [name]
        verdict = "" if target is None else ("PASS" if ok else "FAIL")
        print(f"{name:<48} median {median:5.2f} s  (range {min(values):.2f}-{max(values):.2f})"
              f"{f'  target {target:g} s' if target else ''}  {verdict}")
    ratio = statistics.median(r["change of mode"] / r["cold sandboxed run (baseline)"] for r in rounds)
    print(f"{'change of mode / cold sandboxed run':<48} paired median ratio {ratio:.2f}")
    spare = statistics.median(r[AT_ONCE] / r[NO_SPARE] for r in rounds)
    print(f"{'uploaded at once: spare / no spare':<48} paired median ratio {spare:.2f}")
    for problem in problems:
        print(f"    error on the page: {problem[:300]}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "ratio_change_vs_cold": ratio,
                                         "ratio_spare_vs_none": spare, "problems": problems}))
    print("\nPASS: every target met" if not failed else f"\nFAIL: {', '.join(failed)}")
    return 2 if problems else 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
