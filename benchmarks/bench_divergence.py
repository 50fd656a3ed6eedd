"""Cost of the replay-divergence checks: recording with them / recording without them.

    .venv/bin/python benchmarks/bench_divergence.py            # about a minute
    .venv/bin/python benchmarks/bench_divergence.py --quick    # smoke run (tiny sizes, 3 rounds)
    .venv/bin/python benchmarks/bench_divergence.py --clock cpu  # CPU time: steadier where other jobs share the cores

Two workloads, each one training step (forward, loss, backward) inside a fresh `record()`
(how a user who wraps each training step records): 8 blocks of Linear(512) + GELU at batch
64, every block under our checkpoint (reentrant and non-reentrant), and the built-in
`transformer` model in reentrant and split-reentrant mode (`run_scenario`). Four cases per
workload: checks off (events only), the same again (A/A: two identical cases, so their ratio is
the noise of this run), checks "all" (every replay checked: the behaviour before sampling) and
`record()` as it comes (checks "sampled", the default: NOTE [ Sampled replay
checks ] in ckpt_viz/runtime/divergence_sampling.py). Each case runs its own copy of the model
(the transformer: its own build), so its regions start unchecked like a user's: the sampled
case's first FIRST_CHECKS steps check every replay (they are in the rounds; the median is the
steady state), and the table says which share of its replays were checked. Every case runs
once per round in a shuffled order (`_common.interleaved`); a ratio is the median of the
per-round ratios, so both sides of a ratio ran seconds apart. The script exits non-zero if the
checks changed a gradient or found a divergence in these clean runs.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CLOCKS, format_table, interleaved, paired_ratio, stable_threads
from ckpt_viz.recording import record
from ckpt_viz.run.harness import grad_digest
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin
from ckpt_viz.runtime import checkpoint, divergence

# case -> the checks' setting; "record again" is the same as "record" on its own copy: their ratio is the noise.
CASES = {"record": False, "record again": False, "record+checks all": "all", "record as it comes": "sampled"}


def _mlp(width: int, blocks: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks)))


def _counted(trace: object, found: list[int], checked: list[int]) -> None:
    found.append(len(trace.of_kind("replay_diverged")))
    counts = trace.meta.get("replay_checks") or {}
    checked[0] += counts.get("checked", 0)
    checked[1] += counts.get("checked", 0) + counts.get("skipped", 0)


def _mlp_step(model: nn.Module, x: torch.Tensor, reentrant: bool, checks: bool | str, found: list[int],
              checked: list[int]) -> Callable:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        with divergence.checks(checks), record() as rec:
            h = x
            for block in model:
                h = checkpoint(block, h, use_reentrant=reentrant)
            h.square().mean().backward()
        _counted(rec.trace, found, checked)
    return step


def _builtin_step(name: str, mode: str, checks: bool | str, found: list[int], checked: list[int],
                  digests: dict[str, set[str]]) -> Callable:
    spec = build_builtin(name)

    def step() -> None:
        with divergence.checks(checks):
            trace = run_scenario(spec, mode)
        _counted(trace, found, checked)
        digests.setdefault(mode, set()).add(trace.meta["grad_sha256"])
    return step


def _calls_per_step(run: Callable[[], None], steps: int) -> float:
    """Python and C function calls per step (`sys.setprofile`), after the timed rounds: load-independent work."""
    count = [0]

    def profile(frame: object, event: str, arg: object) -> None:
        if event in ("call", "c_call"):
            count[0] += 1

    sys.setprofile(profile)
    try:
        for _ in range(steps):
            run()
    finally:
        sys.setprofile(None)
    return count[0] / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 3 rounds (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="time each case by the wall clock or by this process's CPU time")
    args = parser.parse_args()
    threads = stable_threads()
    width, batch, blocks = (64, 8, 2) if args.quick else (512, 64, 8)
    repeats = 3 if args.quick else args.repeats
    model = _mlp(width, blocks)
    # Each (workload, case) runs its own copy of the model: its regions start unchecked, and no case's checks
    # count for another's.
    copies = {(reentrant, case): copy.deepcopy(model) for reentrant in (True, False) for case in CASES}
    x = torch.randn(batch, width, requires_grad=True)
    found: list[int] = []
    digests: dict[str, set[str]] = {}
    checked: dict[str, list[int]] = {}

    def mlp(reentrant: bool) -> Callable:
        return lambda label, case: _mlp_step(copies[reentrant, case], x, reentrant, CASES[case], found,
                                             checked.setdefault(label, [0, 0]))

    def builtin(mode: str) -> Callable:
        return lambda label, case: _builtin_step("transformer", mode, CASES[case], found,
                                                 checked.setdefault(label, [0, 0]), digests)

    workloads = {
        f"{blocks}x Linear({width})+GELU, batch {batch}, reentrant": mlp(True),
        f"{blocks}x Linear({width})+GELU, batch {batch}, non-reentrant": mlp(False),
        "transformer (built-in), reentrant": builtin("reentrant"),
        "transformer (built-in), split-reentrant": builtin("split-reentrant"),
    }
    cases = {f"{label} | {case}": make(f"{label} | {case}", case)
             for label, make in workloads.items() for case in CASES}
    times = interleaved(cases, repeats=repeats, warmup=1, clock=args.clock)
    checked = {name: list(counts) for name, counts in checked.items()}  # the timed rounds' (and warmup's) share
    counted = ("record", "record+checks all", "record as it comes")
    calls = {name: _calls_per_step(run, 2 if args.quick else 20) for name, run in cases.items()
             if name.rpartition(" | ")[2] in counted}
    rows, results = [], []
    for label in workloads:
        off, again, every, sampled = (times[f"{label} | {case}"] for case in CASES)
        done, runs = checked[f"{label} | record as it comes"]
        aa, all_ratio, sampled_ratio = paired_ratio(again, off), paired_ratio(every, off), paired_ratio(sampled, off)
        per_step = [calls[f"{label} | {case}"] for case in counted]
        rows.append([label, f"{statistics.median(off):.2f}", f"{aa:.3f}", f"{all_ratio:.3f}", f"{sampled_ratio:.3f}",
                     f"{done}/{runs}", " / ".join(f"{n:.0f}" for n in per_step)])
        results.append({"workload": label, "record_ms": statistics.median(off), "aa_ratio": aa,
                        "checks_all_ms": statistics.median(every), "as_it_comes_ms": statistics.median(sampled),
                        "ratio": sampled_ratio, "ratio_all": all_ratio, "checked": done, "runs": runs,
                        "python_calls_per_step": dict(zip(counted, per_step))})
    print(f"torch {torch.__version__}, {threads} thread(s), {repeats} interleaved rounds, {args.clock} clock")
    print(format_table(["workload", "record ms", "A/A: again / record", "checks all / record", "as it comes / record",
                        "as it comes: runs checked", "Python calls per step: off / all / as it comes"], rows))
    grads = {"mlp": grad_digest(copies[True, "record as it comes"])}
    for label, make in workloads.items():  # the same step with and without the checks: the same gradients
        if "Linear" in label:
            digest = []
            for case in CASES:
                make(label, case)()
                digest.append(grad_digest(copies["non-reentrant" not in label, case]))
            if len(set(digest)) != 1:
                print(f"FAILED: the checks changed the gradients ({label})")
                return 1
    if any(len(d) != 1 for d in digests.values()):
        print(f"FAILED: the checks changed the transformer's gradients: {digests}")
        return 1
    if any(found):
        print(f"FAILED: clean runs reported {sum(found)} divergences")
        return 1
    print("gradients: the same with and without the checks; no divergence in these clean runs")
    if args.json:
        args.json.write_text(json.dumps({"config": {"width": width, "batch": batch, "blocks": blocks,
                                                    "repeats": repeats, "threads": threads, "clock": args.clock,
                                                    "torch": torch.__version__},
                                         "rows": results, "grad_sha256": grads}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
