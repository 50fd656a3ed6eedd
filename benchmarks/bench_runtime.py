"""How much does ckpt_viz's checkpoint runtime cost next to PyTorch's own?

Runs one model (N residual MLP blocks, each checkpointed) under every mode, interleaved
round by round (see `_common.interleaved`), and prints one table of median step times
and paired ratios, plus a table of replays per checkpointed region. torch uses one
thread (`torch.set_num_threads(1)`) so the numbers are stable on a shared machine.

    python benchmarks/bench_runtime.py                  # full run, under ~2 minutes
    python benchmarks/bench_runtime.py --quick          # tiny smoke run
    python benchmarks/bench_runtime.py --json out.json  # also write the results

Rows (a step = forward + full backward of the whole model):
  1. ours reentrant vs torch reentrant                           target <= 1.05
  2. ours + `ckpt_viz.record()` vs ours, both kinds              target <= 1.10 (reentrant)
  3. ours non-reentrant vs torch non-reentrant                   target <= 1.05
  4. split DX/DW: ours (non-reentrant + sessions, reentrant scope) vs torch's
     `stage_backward_input` / `stage_backward_weight` on torch's non-reentrant
     checkpoint: step time (informational) and replays per region (ours: exactly 1).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import ckpt_viz
from _common import format_table, interleaved, paired_ratio, stable_threads
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    recompute_handle_collector_ctx,
    reentrant_checkpoint_scope,
)

try:
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    TORCH_SPLIT_ERROR: str | None = None
except Exception as exc:  # e.g. a build without torch.distributed
    stage_backward_input = stage_backward_weight = None
    TORCH_SPLIT_ERROR = f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- the model

class ResidualMLP(nn.Module):
    """x + fc2(gelu(fc1(layer_norm(x)))); `calls` counts every forward run (original and replays)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


@dataclass(frozen=True)
class Config:
    blocks: int
    width: int
    hidden: int
    batch: int
    repeats: int
    warmup: int


FULL = Config(blocks=8, width=256, hidden=512, batch=32, repeats=120, warmup=3)
QUICK = Config(blocks=8, width=32, hidden=64, batch=4, repeats=3, warmup=1)

Wrap = Callable[[nn.Module, torch.Tensor], torch.Tensor]

WRAPS: dict[str, Wrap] = {
    "none": lambda block, x: block(x),
    "torch_reentrant": lambda block, x: torch_checkpoint(block, x, use_reentrant=True),
    "torch_nonreentrant": lambda block, x: torch_checkpoint(block, x, use_reentrant=False),
    "ours_reentrant": lambda block, x: checkpoint(block, x, use_reentrant=True),
    "ours_nonreentrant": lambda block, x: checkpoint(block, x, use_reentrant=False),
}


@dataclass(frozen=True)
class Case:
    """One way to run a training step: `forward() -> state`, then each backward stage on that state.

    Ordinary cases have one stage (the full backward); split cases have two (DX, then DW).
    """

    forward: Callable[[], Any]
    stages: tuple[Callable[[Any], None], ...]

    def step(self) -> None:
        state = self.forward()
        for stage in self.stages:
            stage(state)


class Bench:
    """The model, its input and output gradient, and the cases that run them."""

    def __init__(self, config: Config) -> None:
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(ResidualMLP(config.width, config.hidden) for _ in range(config.blocks))
        self.params = list(self.blocks.parameters())
        self.x = torch.randn(config.batch, config.width, requires_grad=True)
        self.grad_out = torch.randn(config.batch, config.width)
        self.sessions = itertools.count()
        self.dx: torch.Tensor | None = None  # the input gradient of the last step

    def run(self, wrap: Wrap) -> torch.Tensor:
        y = self.x
        for block in self.blocks:
            y = wrap(block, y)
        return y

    def reset(self) -> None:
        for p in self.params:
            p.grad = None
        self.x.grad = None

    def calls(self) -> list[int]:
        return [block.calls for block in self.blocks]

    def ordinary(self, wrap_name: str) -> Case:
        wrap = WRAPS[wrap_name]

        def forward() -> torch.Tensor:
            self.reset()
            return self.run(wrap)

        def backward(out: torch.Tensor) -> None:
            out.backward(self.grad_out)
            self.dx = self.x.grad

        return Case(forward, (backward,))

    def torch_split(self) -> Case:
        """torch's pipelining helpers on torch's non-reentrant checkpoint (what upstream users combine)."""
        def forward() -> dict[str, Any]:
            self.reset()
            return {"out": self.run(WRAPS["torch_nonreentrant"])}

        def dx(state: dict[str, Any]) -> None:
            dinputs, state["param_groups"] = stage_backward_input(
                [state["out"]], [self.grad_out], [self.x], iter(self.params))
            self.dx = dinputs[0]

        def dw(state: dict[str, Any]) -> None:
            stage_backward_weight(iter(self.params), state["param_groups"])

        return Case(forward, (dx, dw))

    def ours_split(self, kind: str) -> Case:
        """Our backward_input / backward_weight: reentrant scope, or non-reentrant frames + one session per step."""
        def forward() -> tuple[torch.Tensor, list, int | None]:
            self.reset()
            if kind == "reentrant":
                with reentrant_checkpoint_scope(self.params) as handles:
                    return self.run(WRAPS["ours_reentrant"]), handles, None
            with recompute_handle_collector_ctx() as handles:
                return self.run(WRAPS["ours_nonreentrant"]), handles, next(self.sessions)

        def dx(state: tuple[torch.Tensor, list, int | None]) -> None:
            out, handles, session_id = state
            (self.dx,) = backward_input(out, self.grad_out, [self.x], handles=handles, session_id=session_id)

        def dw(state: tuple[torch.Tensor, list, int | None]) -> None:
            out, handles, session_id = state
            backward_weight(out, self.grad_out, self.params, handles=handles, session_id=session_id)

        return Case(forward, (dx, dw))


def recorded(case: Case) -> Case:
    """The same case with a fresh `ckpt_viz.record()` open around its forward and backward."""
    def step(_: Any) -> None:
        with ckpt_viz.record():
            case.step()

    return Case(lambda: None, (step,))


# ---------------------------------------------------------------- rows

@dataclass(frozen=True)
class Row:
    name: str
    baseline: str | None  # the case this row is divided by
    target: float | None  # max ratio; None = informational


ROWS = (
    Row("torch_reentrant", None, None),
    Row("ours_reentrant", "torch_reentrant", 1.05),
    Row("ours_reentrant+record", "ours_reentrant", 1.10),
    Row("torch_nonreentrant", None, None),
    Row("ours_nonreentrant", "torch_nonreentrant", 1.05),
    Row("ours_nonreentrant+record", "ours_nonreentrant", None),
    Row("torch_split_nonreentrant", None, None),
    Row("ours_split_nonreentrant", "torch_split_nonreentrant", None),
    Row("ours_split_reentrant", "torch_split_nonreentrant", None),
)
ROW_NAMES = tuple(row.name for row in ROWS)


def build_cases(bench: Bench) -> dict[str, Case]:
    cases = {
        "torch_reentrant": bench.ordinary("torch_reentrant"),
        "ours_reentrant": bench.ordinary("ours_reentrant"),
        "ours_reentrant+record": recorded(bench.ordinary("ours_reentrant")),
        "torch_nonreentrant": bench.ordinary("torch_nonreentrant"),
        "ours_nonreentrant": bench.ordinary("ours_nonreentrant"),
        "ours_nonreentrant+record": recorded(bench.ordinary("ours_nonreentrant")),
        "ours_split_nonreentrant": bench.ours_split("nonreentrant"),
        "ours_split_reentrant": bench.ours_split("reentrant"),
    }
    if TORCH_SPLIT_ERROR is None:
        cases["torch_split_nonreentrant"] = bench.torch_split()
    return cases


def check_gradients(bench: Bench, cases: dict[str, Case]) -> float:
    """Every case must produce the un-checkpointed model's gradients; return the max abs difference.

    assert_close, not equal: torch's stage_backward_weight sums per parameter group,
    so its accumulation order differs from one ordinary backward.
    """
    bench.ordinary("none").step()
    want = [p.grad.clone() for p in bench.params] + [bench.dx.clone()]
    worst = 0.0
    for name, case in cases.items():
        case.step()
        got = [p.grad for p in bench.params] + [bench.dx]
        for g, w in zip(got, want):
            if g is None:
                raise SystemExit(f"bench_runtime: case {name} left a gradient unset")
            torch.testing.assert_close(g, w, msg=lambda m, name=name: f"bench_runtime: case {name}: {m}")
            worst = max(worst, (g - w).abs().max().item())
    return worst


def count_replays(bench: Bench, cases: dict[str, Case]) -> list[dict[str, Any]]:
    """Forward runs of each block during each backward stage (block counter), cross-checked for
    our cases against `replay_started` events per handle in a `ckpt_viz.record()` trace."""
    results = []
    for name in ROW_NAMES:
        if name not in cases or name.endswith("+record"):
            continue
        case = cases[name]
        with ckpt_viz.record() as rec:
            state = case.forward()
            per_stage = []
            for stage in case.stages:
                before = bench.calls()
                stage(state)
                per_stage.append([after - b for b, after in zip(before, bench.calls())])
        per_block = [sum(counts) for counts in zip(*per_stage)]
        recorder = None
        if name.startswith("ours"):
            per_handle = {event.handle_id: 0 for event in rec.trace.of_kind("handle_created")}
            for event in rec.trace.of_kind("replay_started"):
                per_handle[event.handle_id] = per_handle.get(event.handle_id, 0) + 1
            recorder = sorted(per_handle.values())
        expect_one = name.startswith("ours_split")
        results.append({
            "name": name,
            "replays_per_block": per_block,
            "replays_per_region": statistics.mean(per_block),
            "replays_per_region_by_stage": [statistics.mean(counts) for counts in per_stage],
            "recorder_replays_per_handle": recorder,
            "agree": None if recorder is None else sorted(per_block) == recorder,
            "target": 1 if expect_one else None,
            "passed": (per_block == [1] * len(per_block) and recorder == per_block) if expect_one else None,
        })
    return results


def measure(config: Config) -> dict[str, Any]:
    threads = stable_threads()
    bench = Bench(config)
    cases = build_cases(bench)
    max_diff = check_gradients(bench, cases)
    replays = count_replays(bench, cases)
    times = interleaved({name: case.step for name, case in cases.items()}, repeats=config.repeats, warmup=config.warmup)
    rows = []
    for row in ROWS:
        if row.name not in times:
            rows.append({"name": row.name, "skipped": TORCH_SPLIT_ERROR})
            continue
        has_baseline = row.baseline is not None and row.baseline in times
        ratio = paired_ratio(times[row.name], times[row.baseline]) if has_baseline else None
        rows.append({
            "name": row.name,
            "median_ms": statistics.median(times[row.name]),
            "baseline": row.baseline if has_baseline else None,
            "ratio": ratio,
            "target": row.target,
            "passed": None if row.target is None or ratio is None else ratio <= row.target,
        })
    return {
        "config": config.__dict__,
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "machine": platform.machine(), "torch_threads": threads},
        "torch_split_available": TORCH_SPLIT_ERROR is None,
        "torch_split_error": TORCH_SPLIT_ERROR,
        "max_abs_grad_diff_vs_no_checkpoint": max_diff,
        "rows": rows,
        "replays": replays,
    }


def _verdict(passed: bool | None) -> str:
    return "-" if passed is None else ("PASS" if passed else "FAIL")


def report(results: dict[str, Any]) -> str:
    c = results["config"]
    lines = [
        f"bench_runtime: {c['blocks']} residual MLP blocks, width {c['width']}, hidden {c['hidden']}, "
        f"batch {c['batch']}; torch {results['environment']['torch']}, "
        f"torch.set_num_threads({results['environment']['torch_threads']})",
        f"{c['repeats']} interleaved rounds; ratio = median over rounds of (row / baseline) from the same round",
        f"gradients: every case matches the un-checkpointed model (max abs diff "
        f"{results['max_abs_grad_diff_vs_no_checkpoint']:.2e})",
        "",
    ]
    if c["repeats"] < 10:
        lines.insert(2, f"note: only {c['repeats']} rounds (--quick?): a smoke run, the ratios are not measurements")
    table = []
    for row in results["rows"]:
        if "skipped" in row:
            table.append([row["name"], "skipped", "-", "-", "-", "-"])
            continue
        table.append([
            row["name"], f"{row['median_ms']:.2f}", row["baseline"] or "-",
            "-" if row["ratio"] is None else f"{row['ratio']:.3f}",
            "-" if row["target"] is None else f"<= {row['target']:.2f}", _verdict(row["passed"]),
        ])
    lines.append(format_table(["name", "median ms", "baseline", "ratio", "target", "result"], table))
    if not results["torch_split_available"]:
        lines.append(f"torch split helpers unavailable on this build ({results['torch_split_error']}); "
                     "split rows show ours only")
    lines += ["", "replays per checkpointed region during backward: block counter; by stage = dx + dw for split "
                  "cases; recorder = replay_started per handle in a ckpt_viz.record() trace"]
    table = []
    for item in results["replays"]:
        per_block = item["replays_per_block"]
        recorder = item["recorder_replays_per_handle"]
        table.append([
            item["name"], f"{item['replays_per_region']:.2f}", f"{min(per_block)}..{max(per_block)}",
            " + ".join(f"{n:g}" for n in item["replays_per_region_by_stage"]),
            "-" if recorder is None else f"{statistics.mean(recorder):.2f}",
            "-" if item["agree"] is None else ("yes" if item["agree"] else "NO"),
            "-" if item["target"] is None else f"== {item['target']}", _verdict(item["passed"]),
        ])
    header = ["name", "replays/region", "min..max", "by stage", "recorder", "agree", "target", "result"]
    lines.append(format_table(header, table))
    return "\n".join(lines)


def profile(config: Config, name: str) -> None:
    """cProfile `config.repeats` steps of case `name` (after warmup); print the top 30 by own time."""
    import cProfile
    import pstats

    stable_threads()
    bench = Bench(config)
    cases = build_cases(bench)
    if name not in cases:
        raise SystemExit(f"bench_runtime: case {name!r} is not available ({TORCH_SPLIT_ERROR})")
    case = cases[name]
    for _ in range(config.warmup):
        case.step()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(config.repeats):
        case.step()
    profiler.disable()
    print(f"bench_runtime --profile {name}: {config.repeats} steps")
    pstats.Stats(profiler).sort_stats(os.environ.get("CKPT_VIZ_PROFILE_SORT", "tottime")).print_stats(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help=f"interleaved rounds (default {FULL.repeats})")
    parser.add_argument("--quick", action="store_true", help="tiny model and 3 rounds: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--profile", metavar="CASE", choices=ROW_NAMES,
                        help="instead of the tables: cProfile --repeats steps of one case and print the top functions")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else FULL
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be at least 1")
        config = Config(**{**config.__dict__, "repeats": args.repeats})
    if args.profile:
        profile(config, args.profile)
        return 0
    results = measure(config)
    print(report(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
