"""Cost of the replay-divergence checks: recording with them / recording without them.

    .venv/bin/python benchmarks/bench_divergence.py            # about a minute
    .venv/bin/python benchmarks/bench_divergence.py --quick    # smoke run (tiny sizes, 3 rounds)
    .venv/bin/python benchmarks/bench_divergence.py --clock cpu  # CPU time: steadier where other jobs share the cores

Two workloads, each one training step (forward, loss, backward) inside `record()`:
8 blocks of Linear(512) + GELU at batch 64, every block under our checkpoint (reentrant and
non-reentrant), and the built-in `transformer` model in reentrant and split-reentrant mode
(`run_scenario`). Every case runs once per round in a shuffled order (`_common.interleaved`);
a ratio is the median of the per-round ratios, so both sides of a ratio ran seconds apart.
The checks are switched with `ckpt_viz.runtime.divergence.checks(on)`. The script exits non-zero
if the checks changed a gradient or found a divergence in these clean runs.
"""
from __future__ import annotations

import argparse
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


def _mlp(width: int, blocks: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks)))


def _mlp_step(model: nn.Module, x: torch.Tensor, reentrant: bool, checks: bool, found: list[int]) -> Callable:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        with divergence.checks(checks), record() as rec:
            h = x
            for block in model:
                h = checkpoint(block, h, use_reentrant=reentrant)
            h.square().mean().backward()
        found.append(len(rec.trace.of_kind("replay_diverged")))
    return step


def _builtin_step(name: str, mode: str, checks: bool, found: list[int], digests: dict[str, set[str]]) -> Callable:
    spec = build_builtin(name)

    def step() -> None:
        with divergence.checks(checks):
            trace = run_scenario(spec, mode)
        found.append(len(trace.of_kind("replay_diverged")))
        digests.setdefault(mode, set()).add(trace.meta["grad_sha256"])
    return step


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
    x = torch.randn(batch, width, requires_grad=True)
    found: list[int] = []
    digests: dict[str, set[str]] = {}
    workloads = {
        f"{blocks}x Linear({width})+GELU, batch {batch}, reentrant":
            lambda on: _mlp_step(model, x, True, on, found),
        f"{blocks}x Linear({width})+GELU, batch {batch}, non-reentrant":
            lambda on: _mlp_step(model, x, False, on, found),
        "transformer (built-in), reentrant": lambda on: _builtin_step("transformer", "reentrant", on, found, digests),
        "transformer (built-in), split-reentrant":
            lambda on: _builtin_step("transformer", "split-reentrant", on, found, digests),
    }
    cases = {}
    for label, make in workloads.items():
        cases[f"{label} | record"] = make(False)
        cases[f"{label} | record+checks"] = make(True)
    times = interleaved(cases, repeats=repeats, warmup=1, clock=args.clock)
    rows, results = [], []
    for label in workloads:
        off, on = times[f"{label} | record"], times[f"{label} | record+checks"]
        ratio = paired_ratio(on, off)
        rows.append([label, f"{statistics.median(off):.2f}", f"{statistics.median(on):.2f}", f"{ratio:.3f}"])
        results.append({"workload": label, "record_ms": statistics.median(off), "checks_ms": statistics.median(on),
                        "ratio": ratio})
    print(f"torch {torch.__version__}, {threads} thread(s), {repeats} interleaved rounds, {args.clock} clock")
    print(format_table(["workload", "record ms", "record+checks ms", "checks / record"], rows))
    grads = {"mlp": grad_digest(model)}
    for label, make in workloads.items():  # the same step with and without the checks: the same gradients
        if "Linear" in label:
            digest = []
            for on in (False, True):
                make(on)()
                digest.append(grad_digest(model))
            if digest[0] != digest[1]:
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
