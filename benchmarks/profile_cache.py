"""What a recorded step's extra time is made of, counted: instructions and cache misses under callgrind.

    .venv/bin/python benchmarks/profile_cache.py             # linear8 (width 512, batch 64), about 4 minutes
    .venv/bin/python benchmarks/profile_cache.py --parts     # and the cost of each part of the recording (12 min)
    .venv/bin/python benchmarks/profile_cache.py --parts --width 32 --batch 4   # the parts' instructions, 1 min
    .venv/bin/python benchmarks/profile_cache.py --quick     # tiny smoke run; its figures mean nothing
    .venv/bin/python benchmarks/profile_cache.py --json out.json --top 40

The step is `bench_overhead.py`'s linear8 (8 checkpointed blocks of Linear(512) + GELU, batch
64, reentrant, one thread), unrecorded and inside `record()` with the replay checks off
("events only"), as `profile_recording.py` runs it. This VM has no hardware cache counters
(`perf stat` shows no cycles or cache misses), so the script runs itself under valgrind's
callgrind with its cache simulation, which counts, for every function, the instructions (Ir),
the first-level misses (I1mr instruction fetches, D1mr/D1mw data reads/writes) and the
last-level misses (ILmr, DLmr, DLmw). The simulated last level is this machine's per-core L2
(1 MiB, 8-way, 64 B lines: `lscpu`), not the shared 32 MiB L3: a step's weights (8 MiB) fit in
the L3, so what the recording's work can push out and make the next kernel fetch again is the
L2's content. Under valgrind MKL takes its AVX2 kernels (valgrind has no AVX-512).

How: the child imports torch and warms every case with the instrumentation off (valgrind then
runs at a few times native speed), turns it on with `callgrind_control -i on`, runs one more
round of each (to warm the simulated caches), then runs blocks of `--steps` steps of each case,
the cases in one order in even blocks and reversed in odd ones, calling `os.getppid()` between
blocks: `--dump-before=getppid` writes each block's counts to its own file. Every case runs in
one process on one heap; the counts do not depend on the machine's load.

Reported per step, recorded minus unrecorded: totals, by library, and the functions that added
most. `--parts` adds four cases (an empty `record()` block before the unrecorded step, the bus's
emits stubbed, the captured-parameter check off, both) and shows each part of the cost as the
difference of two cases. The estimate at the end converts the counts to cycles with a stated
model (an IPC for the added instructions and a latency per miss level, `--ipc`, `--l2-cycles`,
`--l3-cycles`): a model, not a measurement; the README sets it beside the ratio
`bench_overhead.py` measures. No target: this is a profile.
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
SHOWN = ("Ir", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
# --parts: each part of the recording's cost as the difference of two cases (an ablation: the parts interact, so
# they need not add up exactly to the whole)
PARTS = (("opening and closing the record() block", "empty record(), then unrecorded", "unrecorded"),
         ("the bus: building and keeping the events", "recorded", "emits stubbed"),
         ("the captured-parameter check", "recorded", "check off"),
         ("the runtime's other recording-only work", "emits stubbed, check off", "empty record(), then unrecorded"))
# The simulated caches: first level 32 KiB 8-way, last level this machine's per-core L2 (1 MiB, 8-way).
CACHES = {"I1": (32768, 8, 64), "D1": (32768, 8, 64), "LL": (1048576, 8, 64)}


# ---------------------------------------------------------------- the child, under callgrind

def check_off(step: Any) -> Any:
    """`step` with the captured-parameter check finding no parameters (the `captured` report then has none)."""
    from ckpt_viz.runtime import owners

    def run() -> None:
        real = owners.grad_states
        owners.grad_states = _no_parameters
        try:
            step()
        finally:
            owners.grad_states = real
    return run


def _no_parameters(_: Any) -> tuple:
    return (), (), ()


def child(width: int, batch: int, steps: int, blocks: int, parts: bool, order_path: Path) -> None:
    import torch

    import bench_overhead as overhead
    from _common import stable_threads
    from ckpt_viz.runtime import checkpoint as our_checkpoint

    stable_threads()
    model, x0 = overhead.linear8(width, batch)
    step = overhead.linear8_step(model, x0, our_checkpoint, True)
    cases = {"unrecorded": overhead.unrecorded(step), "recorded": overhead.recorded(step, checks=False)}
    if parts:
        cases.update({"empty record(), then unrecorded": overhead.empty_record_then(step),
                      "emits stubbed": overhead.recorded(overhead.emit_stubbed(step)),
                      "check off": overhead.recorded(check_off(step)),
                      "emits stubbed, check off": overhead.recorded(check_off(overhead.emit_stubbed(step)))})
    for _ in range(2):
        for run in cases.values():
            run()
    on = subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True, text=True)
    if on.returncode != 0:
        raise SystemExit(f"profile_cache: callgrind_control -i on failed: {on.stderr.strip()[:300]}")
    for run in cases.values():  # warm the simulated caches
        run()
    gc.collect()
    gc.freeze()
    order: list[str] = []
    names = list(cases)
    os.getppid()  # dump 1: the instrumentation's start and the warm-up round (not counted)
    for block in range(blocks):
        for name in (names if block % 2 == 0 else names[::-1]):
            for _ in range(steps):
                gc.collect()
                cases[name]()
            os.getppid()  # dump: this block
            order.append(name)
    order_path.write_text(json.dumps({"order": order, "steps": steps, "torch": torch.__version__}))


# ---------------------------------------------------------------- reading callgrind's files

_NAME = re.compile(r"^(ob|fl|fi|fe|fn|cob|cfi|cfl|cfn)=(?:\((\d+)\))?\s*(.*)$")
_TABLE = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn", "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl",
          "cfl": "fl"}


def self_costs(path: Path) -> dict[tuple[str, str], list[int]]:
    """(object, function) -> its self cost in `EVENTS` order, from one callgrind output file.

    Format (callgrind's manual, "Callgrind Format Specification"): `ob=`/`fn=` name the object and function
    the cost lines below belong to, with names compressed as `(id) name` once and `(id)` after; a `calls=`
    line is followed by one line of the call's inclusive cost, which is the callee's, not this function's."""
    names: dict[str, dict[str, str]] = {"ob": {}, "fl": {}, "fn": {}}
    events: list[str] = []
    ob = fn = "?"
    out: dict[tuple[str, str], list[int]] = {}
    skip = False
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if skip:
                skip = False
                continue
            if not line.strip() or line[0] == "#":
                continue
            if line.startswith("events:"):
                events = line.split()[1:]
                continue
            named = _NAME.match(line)
            if named is not None:
                kind, ident, name = named.group(1), named.group(2), named.group(3).strip()
                table = names[_TABLE[kind]]
                if ident is not None:
                    if name:
                        table[ident] = name
                    else:
                        name = table.get(ident, "?")
                if kind == "ob":
                    ob = name
                elif kind == "fn":
                    fn = name
                continue
            if line.startswith("calls="):
                skip = True
                continue
            if line[0] in "0123456789+-*":
                costs = line.split()[1:]
                entry = out.get((ob, fn))
                if entry is None:
                    entry = out[(ob, fn)] = [0] * len(EVENTS)
                for i, cost in enumerate(costs):
                    entry[EVENTS.index(events[i])] += int(cost)
    if [e for e in events if e in EVENTS] != list(EVENTS):
        raise SystemExit(f"profile_cache: {path} has events {events}, expected {list(EVENTS)}")
    return out


def per_step(dumps: list[Path], order: list[str], steps: int) -> dict[str, dict[tuple[str, str], list[float]]]:
    """Each case's self cost per step, summed over its blocks."""
    if len(dumps) != len(order):
        raise SystemExit(f"profile_cache: {len(dumps)} block dumps for {len(order)} blocks (did something else "
                         "call getppid?)")
    sums: dict[str, dict[tuple[str, str], list[float]]] = {name: {} for name in order}
    count = collections.Counter(order)
    for path, name in zip(dumps, order):
        for key, costs in self_costs(path).items():
            entry = sums[name].setdefault(key, [0.0] * len(EVENTS))
            for i, cost in enumerate(costs):
                entry[i] += cost / (steps * count[name])
    return sums


def library(key: tuple[str, str]) -> str:
    """The file name of a cost's object: "/usr/lib/libtorch_cpu.so" -> "libtorch_cpu.so"."""
    return key[0].rsplit("/", 1)[-1]


def added(sums: dict[str, dict[tuple[str, str], list[float]]], group: Any, case: str = "recorded",
          base: str = "unrecorded") -> dict[Any, list[float]]:
    """`case` minus `base`, per step, summed by `group(key)`."""
    out: dict[Any, list[float]] = collections.defaultdict(lambda: [0.0] * len(EVENTS))
    for name, sign in ((case, 1.0), (base, -1.0)):
        for key, costs in sums[name].items():
            entry = out[group(key)]
            for i, cost in enumerate(costs):
                entry[i] += sign * cost
    return out


def totals(costs: dict[Any, list[float]]) -> list[float]:
    return [sum(c[i] for c in costs.values()) for i in range(len(EVENTS))]


# ---------------------------------------------------------------- the report

def row(values: list[float], label: str) -> str:
    return " ".join(f"{values[EVENTS.index(e)]:>10,.0f}" for e in SHOWN) + f"  {label}"


def estimate(extra: list[float], ipc: float, l2: float, l3: float) -> dict[str, float]:
    """Cycles per step from the added counts: instructions at `ipc`, first-level misses served by the L2 at `l2`
    cycles, simulated-L2 misses served by the L3 at `l3` cycles (writes included: a model, not a measurement)."""
    get = dict(zip(EVENTS, extra))
    parts = {"instructions": get["Ir"] / ipc,
             "first-level misses": (get["I1mr"] + get["D1mr"] + get["D1mw"]) * l2,
             "L2 misses": (get["ILmr"] + get["DLmr"] + get["DLmw"]) * l3}
    parts["total"] = sum(parts.values())
    return parts


def report(sums: dict[str, dict[tuple[str, str], list[float]]], top: int, args: argparse.Namespace) -> dict[str, Any]:
    base, recorded = totals(sums["unrecorded"]), totals(sums["recorded"])
    extra = [r - b for r, b in zip(recorded, base)]
    head = " ".join(f"{e:>10}" for e in SHOWN)
    print(f"\nper step ({EVENTS[0]}: instructions; *1m*: first-level misses; IL/DL: simulated-L2 misses)")
    print(f"{head}  case")
    print(row(base, "unrecorded"))
    print(row(recorded, "recorded"))
    print(row(extra, "added by the recording"))
    print("added, as a share of the unrecorded step's: " + ", ".join(
        f"{e} {extra[EVENTS.index(e)] / base[EVENTS.index(e)]:+.1%}" for e in SHOWN if base[EVENTS.index(e)]))
    parts = {}
    if "emits stubbed" in sums:
        print(f"\nparts (--parts: each the difference of two cases, per step)\n{head}  part")
        for label, minuend, subtrahend in PARTS:
            parts[label] = totals(added(sums, library, minuend, subtrahend))
            print(row(parts[label], label))
    by_lib = added(sums, library)
    print(f"\nadded per step by library\n{head}  library")
    for lib, costs in sorted(by_lib.items(), key=lambda kv: -abs(kv[1][0]) - abs(kv[1][EVENTS.index("DLmr")])):
        if any(abs(c) >= 100 for c in costs):
            print(row(costs, lib))
    by_fn = added(sums, lambda key: (library(key), key[1]))
    tables: dict[str, list[list[Any]]] = {}
    for event in ("Ir", "I1mr", "DLmr"):
        i = EVENTS.index(event)
        print(f"\nfunctions that added most {event} per step (top {top})\n{head}  library: function")
        chosen = sorted(by_fn.items(), key=lambda kv: -abs(kv[1][i]))[:top]
        tables[event] = [[lib, fn, costs] for (lib, fn), costs in chosen]
        for (lib, fn), costs in chosen:
            print(row(costs, f"{lib}: {fn[:90]}"))
    cycles = estimate(extra, args.ipc, args.l2_cycles, args.l3_cycles)
    print(f"\nestimate (a model: added instructions at IPC {args.ipc:g}, first-level misses at {args.l2_cycles:g} "
          f"cycles, L2 misses at {args.l3_cycles:g} cycles):")
    for part, value in cycles.items():
        print(f"  {part:<20} {value / 1e6:6.2f} M cycles per step  = {value / args.ghz / 1e3:6.0f} us at "
              f"{args.ghz:g} GHz")
    return {"per_step": {"unrecorded": dict(zip(EVENTS, base)), "recorded": dict(zip(EVENTS, recorded)),
                         "added": dict(zip(EVENTS, extra))},
            "parts": {label: dict(zip(EVENTS, costs)) for label, costs in parts.items()},
            "by_library": {lib: dict(zip(EVENTS, c)) for lib, c in by_lib.items()},
            "top": {event: [{"library": lib, "function": fn, **dict(zip(EVENTS, c))} for lib, fn, c in chosen]
                    for event, chosen in tables.items()},
            "estimate_cycles": cycles}


# ---------------------------------------------------------------- main

def valgrind_usable() -> str | None:
    """None if callgrind and callgrind_control are here, else what to install."""
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    return None if not missing else f"{', '.join(missing)} missing (Debian: apt-get install valgrind)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--blocks", type=int, default=2, help="blocks of each case, alternated")
    parser.add_argument("--steps", type=int, default=1, help="steps per block")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--parts", action="store_true",
                        help="also run the ablation cases and show the cost of each part of the recording")
    parser.add_argument("--width", type=int, default=512, help="the blocks' width (--quick: 32)")
    parser.add_argument("--batch", type=int, default=64, help="the batch (--quick: 4)")
    parser.add_argument("--ipc", type=float, default=2.0, help="the model's instructions per cycle")
    parser.add_argument("--l2-cycles", type=float, default=14.0, help="the model's cost of a first-level miss")
    parser.add_argument("--l3-cycles", type=float, default=50.0, help="the model's cost of an L2 miss")
    parser.add_argument("--ghz", type=float, default=2.6, help="to show the model's cycles as time (this machine: 2.6)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # the process callgrind runs
    args = parser.parse_args(argv)
    width, batch = (32, 4) if args.quick else (args.width, args.batch)
    blocks, steps = (2, 1) if args.quick else (args.blocks, args.steps)
    if args.child is not None:
        child(width, batch, steps, blocks, args.parts, args.child)
        return 0
    why = valgrind_usable()
    if why is not None:
        print(f"profile_cache: cannot count here: {why}.")
        return 1
    with tempfile.TemporaryDirectory() as folder:
        out, order_path = Path(folder) / "cg.out", Path(folder) / "order.json"
        caches = [f"--{level}={size},{ways},{line}" for level, (size, ways, line) in CACHES.items()]
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--cache-sim=yes", *caches,
                   "--dump-before=getppid", "--dump-instr=no", f"--callgrind-out-file={out}",
                   sys.executable, str(Path(__file__).resolve()), "--child", str(order_path),
                   "--blocks", str(blocks), "--steps", str(steps), "--width", str(width), "--batch", str(batch)]
        command += ["--quick"] * args.quick + ["--parts"] * args.parts
        run = subprocess.run(command, capture_output=True, text=True, cwd=HERE)
        if run.returncode != 0 or not order_path.exists():
            print(f"profile_cache: the child under callgrind failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
            return 2
        made = json.loads(order_path.read_text())
        dumps = sorted(Path(folder).glob("cg.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
        sums = per_step(dumps[1:], made["order"], made["steps"])  # dumps[0]: the warm-up round
    print(f"linear8 width {width}, batch {batch}, 1 thread; torch {made['torch']}; {blocks} blocks of {steps} "
          f"step(s) per case under callgrind (caches: " + ", ".join(
              f"{level} {size // 1024} KiB {ways}-way" for level, (size, ways, _) in CACHES.items()) + ")")
    found = report(sums, args.top, args)
    if args.json is not None:
        args.json.write_text(json.dumps({"width": width, "batch": batch, "blocks": blocks, "steps": steps, **found},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
