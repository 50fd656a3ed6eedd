"""Where a recorded step's extra time goes: the profile behind the README's "events only" figure.

    .venv/bin/python benchmarks/profile_recording.py            # linear8, about a minute
    .venv/bin/python benchmarks/profile_recording.py --quick    # tiny smoke run; its figures mean nothing

The step is `bench_overhead.py`'s linear8 (8 checkpointed blocks of Linear(512) + GELU, batch
64, reentrant, one thread), unrecorded and inside `record()` with the replay checks off
("events only"). Two views, both of the same process:

1. Python work by function (load-independent): bytecode instructions and calls per step,
   recorded minus unrecorded, from opcode tracing (untimed).
2. CPU time by library and symbol, where Linux `perf` can sample this process: the script
   runs itself under `perf record -e cpu-clock -k CLOCK_MONOTONIC` and alternates blocks of
   unrecorded and recorded steps; each sample is attributed to the block it fell in, so both
   cases share one process, one heap and the same load (`--blocks` pairs of `--steps` steps).
   Where `perf` is missing or not allowed, it says so and prints view 1 only.

No target: this is a profile. The figures it printed on the development machine are in the
README (Benchmarks, "What bounds each missed figure").
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import bench_overhead as overhead
from _common import stable_threads
from ckpt_viz.runtime import checkpoint as our_checkpoint

HERE = Path(__file__).resolve().parent
SAMPLE_HZ = 4000


def cases(width: int, batch: int) -> dict[str, Any]:
    model, x0 = overhead.linear8(width, batch)
    step = overhead.linear8_step(model, x0, our_checkpoint, True)
    return {"unrecorded": overhead.unrecorded(step), "recorded": overhead.recorded(step, checks=False)}


# ---------------------------------------------------------------- view 1: Python work

def python_work(run: Any, steps: int) -> tuple[collections.Counter, collections.Counter]:
    """Opcodes and calls per step of `run`, by (file, function)."""
    ops: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    prefix = str(HERE.parent) + os.sep

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        key = (frame.f_code.co_filename.replace(prefix, ""), frame.f_code.co_name)
        if event == "opcode":
            ops[key] += 1
        elif event == "call":
            calls[key] += 1
        return tracer

    run()
    run()  # warm: first-call caches are not per-step work
    sys.settrace(tracer)
    try:
        for _ in range(steps):
            run()
    finally:
        sys.settrace(None)
    return (collections.Counter({k: v / steps for k, v in ops.items()}),
            collections.Counter({k: v / steps for k, v in calls.items()}))


def report_python(steps: dict[str, Any], top: int, traced: int) -> None:
    (u_ops, u_calls), (r_ops, r_calls) = (python_work(steps[name], traced) for name in ("unrecorded", "recorded"))
    print(f"Python work per step: unrecorded {sum(u_ops.values()):,.0f} opcodes / {sum(u_calls.values()):,.0f} calls;"
          f" recorded {sum(r_ops.values()):,.0f} / {sum(r_calls.values()):,.0f}")
    rows = sorted(((r_ops[k] - u_ops[k], r_calls[k] - u_calls[k], k) for k in set(u_ops) | set(r_ops)), reverse=True)
    print(f"{'opcodes':>9} {'calls':>7}  function (recorded minus unrecorded, top {top})")
    for d_ops, d_calls, (file, name) in rows[:top]:
        print(f"{d_ops:+9.0f} {d_calls:+7.0f}  {file}:{name}")


# ---------------------------------------------------------------- view 2: perf samples by phase

def run_phases(steps: dict[str, Any], blocks: int, per_block: int, marks_path: Path) -> None:
    """The child under perf: alternate blocks of the two cases; write [case, t0, t1, cpu_s] per block."""
    for run in steps.values():
        for _ in range(3):
            run()
    marks = []
    order = list(steps.items())
    for block in range(blocks):
        for name, run in (order if block % 2 else order[::-1]):
            t0, cpu0 = time.clock_gettime(time.CLOCK_MONOTONIC), time.process_time()
            for _ in range(per_block):
                run()
            marks.append((name, t0, time.clock_gettime(time.CLOCK_MONOTONIC), time.process_time() - cpu0))
    marks_path.write_text(json.dumps(marks))


def perf_usable() -> str | None:
    """None if `perf record` can sample this user's processes here, else why not."""
    perf = shutil.which("perf")
    if perf is None:
        return "perf is not installed (Debian: apt-get install linux-perf)"
    with tempfile.TemporaryDirectory() as folder:
        probe = subprocess.run([perf, "record", "-q", "-e", "cpu-clock", "-o", f"{folder}/p", "true"],
                               capture_output=True, text=True)
    if probe.returncode != 0:
        return f"perf record failed here: {probe.stderr.strip()[:200]}"
    return None


_SAMPLE = re.compile(r"\s*([\d.]+):\s+\S+\s+(.*?)\s+\((.*)\)\s*$")


def attribute(script: str, marks: list[list[Any]], per_block: int) -> dict[str, Any]:
    """Samples per step by library and by (library, symbol) for each case, from `perf script` output."""
    starts = [m[1] for m in marks]
    by_lib: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_sym: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    steps: collections.Counter = collections.Counter()
    cpu: collections.Counter = collections.Counter()
    for name, _t0, _t1, cpu_s in marks:
        steps[name] += per_block
        cpu[name] += cpu_s
    for line in script.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        at = float(match.group(1))
        i = bisect.bisect_right(starts, at) - 1
        if i < 0 or at > marks[i][2]:
            continue  # start-up, warm-up, or between blocks
        name, lib = marks[i][0], match.group(3).rsplit("/", 1)[-1]
        by_lib[name][lib] += 1
        by_sym[name][(lib, match.group(2).split("+")[0][:70])] += 1
    us = 1e6 / SAMPLE_HZ
    return {"steps": dict(steps), "cpu_ms": {n: cpu[n] / steps[n] * 1e3 for n in steps},
            "lib": {n: {k: v * us / steps[n] for k, v in c.items()} for n, c in by_lib.items()},
            "sym": {n: {k: v * us / steps[n] for k, v in c.items()} for n, c in by_sym.items()}}


def report_perf(found: dict[str, Any], top: int) -> None:
    cpu = found["cpu_ms"]
    print(f"\nCPU per step (process_time over the blocks): unrecorded {cpu['unrecorded']:.2f} ms, recorded "
          f"{cpu['recorded']:.2f} ms ({cpu['recorded'] / cpu['unrecorded']:.3f}x); {found['steps']['recorded']} "
          f"steps each, perf cpu-clock samples at {SAMPLE_HZ} Hz attributed by block")
    lib_u, lib_r = found["lib"].get("unrecorded", {}), found["lib"].get("recorded", {})
    print(f"{'library':<34} {'unrecorded us':>14} {'recorded us':>12} {'added':>8}")
    for lib in sorted(set(lib_u) | set(lib_r), key=lambda k: -(lib_r.get(k, 0) - lib_u.get(k, 0))):
        a, b = lib_u.get(lib, 0.0), lib_r.get(lib, 0.0)
        if max(a, b) >= 20:
            print(f"{lib[:34]:<34} {a:14.0f} {b:12.0f} {b - a:+8.0f}")
    sym_u, sym_r = found["sym"].get("unrecorded", {}), found["sym"].get("recorded", {})
    rows = sorted(((sym_r.get(k, 0.0) - sym_u.get(k, 0.0), k) for k in set(sym_u) | set(sym_r)), reverse=True)
    print(f"symbols that gained most (us per step, top {top}):")
    for added, (lib, sym) in rows[:top]:
        print(f"{added:+8.0f}  {lib[:24]:<24} {sym}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--blocks", type=int, default=30, help="pairs of blocks under perf")
    parser.add_argument("--steps", type=int, default=15, help="steps per block")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-perf", action="store_true", help="view 1 only")
    parser.add_argument("--child-marks", type=Path, help=argparse.SUPPRESS)  # the process perf samples
    args = parser.parse_args(argv)
    stable_threads()
    width, batch = (64, 4) if args.quick else (512, 64)
    blocks, per_block = (2, 2) if args.quick else (args.blocks, args.steps)
    steps = cases(width, batch)
    if args.child_marks is not None:
        run_phases(steps, blocks, per_block, args.child_marks)
        return 0
    print(f"linear8 width {width}, batch {batch}, {torch.get_num_threads()} thread; torch {torch.__version__}")
    report_python(steps, args.top, 1 if args.quick else 4)
    why = "--no-perf" if args.no_perf else perf_usable()
    if why is not None:
        print(f"\nCPU by library: not measured ({why}).")
        return 0
    with tempfile.TemporaryDirectory() as folder:
        data, marks_path = Path(folder) / "perf.data", Path(folder) / "marks.json"
        child = [sys.executable, str(Path(__file__).resolve()), "--child-marks", str(marks_path),
                 "--blocks", str(args.blocks), "--steps", str(args.steps)] + (["--quick"] if args.quick else [])
        subprocess.run(["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", "cpu-clock", "-F", str(SAMPLE_HZ),
                        "-o", str(data), *child], check=True, stdout=subprocess.DEVNULL)
        script = subprocess.run(["perf", "script", "-i", str(data), "-F", "time,ip,sym,dso"], check=True,
                                capture_output=True, text=True).stdout
        found = attribute(script, json.loads(marks_path.read_text()), per_block)
    report_perf(found, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
