"""How well does the planner predict recompute time, and how fast does it plan?

1. Recompute time: every built-in model in every kind (and the pipeline model in mode
   "pipeline", 1F1B, 4 micro-batches), HF GPT-2 and Llama (4 layers, random init), up to 10
   block subsets each (every non-empty subset of 3 blocks, else 10 random ones with all blocks
   among them). The process first measures its
   replay costs once (`ckpt_viz.plan.calibrate`, NOTE [ Replay cost ]: a tiny model of its own,
   nothing of the models below), then runs paired interleaved rounds: in each round, for each
   model, one profile (`profile_spec`: a warm-up step, two timed steps, the profiled step; each
   block's forward the fastest of the three; and each block's replay in each kind, measured in
   recorded runs of the model: ckpt_viz/plan/profile.py NOTE [ Plan profile ], rule 7), then its
   runs in a shuffled order, each run (a) predicted from that profile (`predict(...).recompute_ns`),
   then (b) run right after (`run_scenario`: a warm-up run, then three runs) and measured: each
   block's replays (its handles' `replay_started` to `replay_finished` in the trace, summed over a
   pipeline's micro-batches) the fastest of the three runs, summed over the blocks. The round's
   ratio is predicted / measured; a run's figure is the median of its rounds' ratios. Both sides
   run without the recording's divergence checks (`divergence.unchecked`): a plan is for training,
   which runs no check; a checked replay is slower, and which runs a sampled recording checks is
   random. Before the rounds every model runs each kind once.
   Targets: every run within 20 %, the median over runs within 10 %.
2. Planning speed: the whole trade-off curve of a 32-layer model (HF Llama, random init; a
   32-block residual MLP without transformers), per kind, from the profile (the timeline
   built afresh each time). Target: <= 1 s.

    python benchmarks/bench_plan.py                  # full run
    python benchmarks/bench_plan.py --rounds 9       # more rounds, steadier medians
    python benchmarks/bench_plan.py --quick          # smoke run; its figures mean little
    python benchmarks/bench_plan.py --json out.json  # also write the results
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
import zlib
from typing import Any

import msgspec
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "plan"))

from _common import format_table, stable_threads
from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.lifecycle import recompute_time
from ckpt_viz.plan.calibrate import replay_costs
from ckpt_viz.plan.model import forget_timelines, predict
from ckpt_viz.plan.profile import profile_spec
from ckpt_viz.plan.schema import KINDS, Policy
from ckpt_viz.plan.search import curve, recommend
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import MLPBlock, ModelSpec, Stack, build_builtin
from ckpt_viz.runtime.divergence import unchecked

MODELS = ("mlp", "transformer", "dropout", "closure", "excluded", "pipeline")
MICROBATCHES = 4
MEASURED_RUNS = 3  # each block's replay: the fastest of these (the profile's forward: of its three steps)


def _subsets(names: list[str], count: int, seed: int) -> list[tuple[str, ...]]:
    """The non-empty block subsets a model runs: every one when there are at most `count`, else `count`
    distinct random ones with all blocks among them (the rule of tests/plan/test_predict.py's `subsets`)."""
    if 2 ** len(names) - 1 <= count:
        every = itertools.product((0, 1), repeat=len(names))
        return [tuple(n for n, bit in zip(names, bits) if bit) for bits in every if any(bits)]
    rnd = random.Random(seed)
    chosen = {tuple(names)}
    while len(chosen) < count:
        pick = tuple(n for n in names if rnd.random() < 0.5)
        if pick:
            chosen.add(pick)
    return sorted(chosen)


def _specs(quick: bool) -> dict[str, ModelSpec]:
    specs = {name: build_builtin(name) for name in (MODELS[:2] if quick else MODELS)}
    if not quick:
        try:
            from plan_models import hf_spec

            specs["hf-gpt2"] = hf_spec("gpt2", layers=4)
            specs["hf-llama"] = hf_spec("llama", layers=4)
        except ImportError:
            pass
    return specs


def replays_by_block(trace: Any) -> dict[str, int]:
    """Each block's replay time in `trace`: its handles' replays (`recompute_time(trace).by_handle`), summed."""
    labels = handle_labels(trace)
    out: dict[str, int] = {}
    for handle, ns in recompute_time(trace).by_handle.items():
        label = labels.get(handle, str(handle)).split("#", 1)[0]
        out[label] = out.get(label, 0) + ns
    return out


def _run(spec: ModelSpec, mode: str, blocks: tuple[str, ...]) -> Any:
    for param in spec.model.parameters():
        param.grad = None
    with unchecked():  # replays as a training run without a recording runs them, as the profile measures them
        return run_scenario(dataclasses.replace(spec, checkpoint=blocks), mode, microbatches=MICROBATCHES)


def measure(spec: ModelSpec, mode: str, blocks: tuple[str, ...], runs: int = MEASURED_RUNS) -> int:
    """Replay time of the policy: a warm-up run, then each block's fastest over `runs` runs, summed."""
    _run(spec, mode, blocks)
    best: dict[str, int] = {}
    for _ in range(runs):
        for label, ns in replays_by_block(_run(spec, mode, blocks)).items():
            best[label] = min(best.get(label, ns), ns)
    return sum(best.values())


def recompute_rows(rounds: int, quick: bool, subsets: int) -> list[dict[str, Any]]:
    rows = []
    for name, spec in _specs(quick).items():
        names = list(spec.checkpoint)
        modes = list(KINDS[:2] if quick else KINDS) + (["pipeline"] if spec.stages and not quick else [])
        runs = [(mode, blocks) for mode in modes for blocks in _subsets(names, subsets, zlib.crc32(name.encode()))]
        for mode in modes:  # warm: each kind once (lazy initialisation)
            _run(spec, mode, tuple(names))
        ratios: dict[tuple, list[float]] = {run: [] for run in runs}
        pred: dict[tuple, list[int]] = {run: [] for run in runs}
        meas: dict[tuple, list[int]] = {run: [] for run in runs}
        for _ in range(rounds):
            order = list(runs)
            random.shuffle(order)
            profiles = {"single": profile_spec(spec)}  # one profile per round predicts every policy of the model
            if spec.stages and "pipeline" in modes:
                profiles["pipeline"] = profile_spec(spec, microbatch=MICROBATCHES)
            for run in order:
                mode, blocks = run
                if mode == "pipeline":
                    profile = profiles["pipeline"]
                    policy = Policy(frozenset(blocks), "split-reentrant", schedule="1F1B", microbatches=MICROBATCHES)
                else:
                    profile = profiles["single"]
                    policy = Policy(frozenset(blocks), mode)
                p = predict(profile, policy).recompute_ns
                m = measure(spec, mode, blocks)
                pred[run].append(p)
                meas[run].append(m)
                if m > 0:
                    ratios[run].append(p / m)
        for run in runs:
            mode, blocks = run
            rows.append({"model": name, "kind": mode, "blocks": len(blocks), "of": len(names),
                         "subset": list(blocks), "predicted_ms": statistics.median(pred[run]) / 1e6,
                         "measured_ms": statistics.median(meas[run]) / 1e6,
                         "ratio": statistics.median(ratios[run]) if ratios[run] else float("nan"),
                         "rounds": [[p, m] for p, m in zip(pred[run], meas[run])]})
    return rows


def _big_profile(quick: bool) -> tuple[str, Any]:
    layers = 8 if quick else 32
    try:
        from plan_models import hf_spec

        spec = hf_spec("llama", layers=layers)
        label = f"HF Llama, {layers} layers"
    except ImportError:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = Stack([MLPBlock(64, 128) for _ in range(layers)], 64)
            x = torch.randn(256, 64)
        spec = ModelSpec("stack", model, (x,), checkpoint=tuple(f"blocks.{i}" for i in range(layers)))
        label = f"residual MLP, {layers} blocks"
    return label, profile_spec(spec)


def planning_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    label, profile = _big_profile(quick)
    rows = []
    for kind in KINDS:
        times = []
        points = 0
        for _ in range(repeats):
            forget_timelines()  # the timeline is built afresh: planning from a loaded profile
            start = time.perf_counter()
            found = curve(profile, kind=kind)
            times.append(time.perf_counter() - start)
            points = len(found)
        budget = (found[0].peak + found[-1].peak) // 2
        start = time.perf_counter()
        rec = recommend(profile, budget, kind=kind)
        rows.append({"model": label, "kind": kind, "points": points, "curve_s": statistics.median(times),
                     "curve_max_s": max(times), "recommend_s": time.perf_counter() - start, "method": rec.method})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--subsets", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    threads = stable_threads()
    random.seed(0)
    rounds = 2 if args.quick else args.rounds
    load_before = os.getloadavg()
    start = time.perf_counter()
    costs = replay_costs()
    rec_rows = recompute_rows(rounds, args.quick, 3 if args.quick else args.subsets)
    plan_rows = planning_rows(1 if args.quick else args.repeats, args.quick)
    load_after = os.getloadavg()
    print(f"torch {torch.__version__}, {threads} thread, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{rounds} rounds, {time.perf_counter() - start:.0f} s; load average (1, 5, 15 min) before "
          f"{', '.join(f'{v:.1f}' for v in load_before)}, after {', '.join(f'{v:.1f}' for v in load_after)}")
    print("\nReplay costs of this process (ckpt_viz.plan.calibrate), microseconds:")
    print(format_table(["kind", "per replay", "per saved tensor", "per excluded region"],
                       [[k, f"{c.fixed_ns / 1e3:.1f}", f"{c.per_tensor_ns / 1e3:.1f}", f"{c.per_region_ns / 1e3:.1f}"]
                        for k, c in costs.items()]))
    print("\n1. Recompute time: predicted / measured (median of the paired rounds)")
    print(format_table(["model", "kind", "blocks", "predicted ms", "measured ms", "ratio"],
                       [[r["model"], r["kind"], ",".join(b.rsplit(".", 1)[-1] for b in r["subset"]) + f" of {r['of']}",
                         f"{r['predicted_ms']:.3f}", f"{r['measured_ms']:.3f}", f"{r['ratio']:.2f}"]
                        for r in rec_rows]))
    ratios = [r["ratio"] for r in rec_rows if r["ratio"] == r["ratio"]]
    within = sum(abs(x - 1) <= 0.20 for x in ratios)
    median = statistics.median(ratios)
    print(f"within 20 %: {within} of {len(ratios)} runs (target: all); median ratio {median:.3f} (target 0.90-1.10)")
    by: dict[tuple[str, str], list[float]] = {}
    for r in rec_rows:
        by.setdefault((r["model"], r["kind"]), []).append(r["ratio"])
    print(format_table(["model", "kind", "runs", "within 20 %", "ratio min", "median", "max"],
                       [[m, k, str(len(v)), str(sum(abs(x - 1) <= 0.2 for x in v)), f"{min(v):.2f}",
                         f"{statistics.median(v):.2f}", f"{max(v):.2f}"] for (m, k), v in by.items()]))
    print("\n2. Planning: the whole curve from a profile")
    print(format_table(["model", "kind", "points", "curve s (median)", "curve s (max)", "recommend s", "method"],
                       [[r["model"], r["kind"], str(r["points"]), f"{r['curve_s']:.3f}", f"{r['curve_max_s']:.3f}",
                         f"{r['recommend_s']:.3f}", r["method"]] for r in plan_rows]))
    worst = max(r["curve_s"] for r in plan_rows)
    print(f"slowest curve (median): {worst:.3f} s (target <= 1 s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"recompute": rec_rows, "planning": plan_rows, "within_20": within, "runs": len(ratios),
                       "median_ratio": median, "load_before": load_before, "load_after": load_after,
                       "replay_costs": msgspec.to_builtins(costs)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
