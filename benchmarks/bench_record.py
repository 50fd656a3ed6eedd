"""Record throughput: how fast `record()` captures events, memory by category and graph snapshots.

    .venv/bin/python benchmarks/bench_record.py            # about half a minute
    .venv/bin/python benchmarks/bench_record.py --quick    # smoke run

For each built-in model, one training step (forward, loss, split DX/DW) runs in four
variants, interleaved round by round: no recorder, events only, events + memory,
events + memory + graphs. Reported: median step time, the ratio to the unrecorded step
measured in the same round, and events recorded per second of recorded step time.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin

VARIANTS = {
    "no recorder": None,
    "events": dict(memory=False, graphs=False),
    "events+memory": dict(memory=True, graphs=False),
    "events+memory+graphs": dict(memory=True, graphs=True),
}


def _step(model: str, mode: str, options: dict | None) -> tuple[float, int]:
    spec = build_builtin(model)  # not timed
    if options is None:  # the same step with no recorder attached
        start = time.perf_counter()
        _unrecorded(spec, mode)
        return time.perf_counter() - start, 0
    start = time.perf_counter()
    trace = run_scenario(spec, mode, **options)
    return time.perf_counter() - start, len(trace.events)


def _unrecorded(spec, mode: str) -> None:
    from ckpt_viz.run.scenarios import checkpointed
    from ckpt_viz.runtime import backward_input, backward_weight, reentrant_checkpoint_scope

    params = [p for p in spec.model.parameters()]
    x = spec.inputs[0].detach().requires_grad_(True)
    with checkpointed(spec.model, spec.checkpoint, use_reentrant=True), \
            reentrant_checkpoint_scope(lambda: params) as handles:
        loss = spec.loss(spec.model(x))
    backward_input(loss, None, [x], handles=handles)
    backward_weight(loss, None, params, handles=handles)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = ["mlp", "transformer"] if not args.quick else ["mlp"]
    repeats = 2 if args.quick else args.repeats
    print(f"bench_record: split-reentrant step per built-in model; {repeats} interleaved rounds; "
          f"torch {torch.__version__}, 1 thread")
    print(f"{'model':<12} {'variant':<22} {'median ms':>10} {'x no rec':>9} {'events':>7} {'events/s':>10}")
    for model in models:
        _step(model, "split-reentrant", VARIANTS["events+memory+graphs"])  # warm up
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
        events: dict[str, int] = {}
        for _ in range(repeats):
            order = list(VARIANTS)
            random.shuffle(order)
            round_times = {}
            for variant in order:
                seconds, count = _step(model, "split-reentrant", VARIANTS[variant])
                round_times[variant] = seconds
                events[variant] = count
            for variant, seconds in round_times.items():
                times[variant].append(seconds)
                ratios[variant].append(seconds / round_times["no recorder"])
        for variant in VARIANTS:
            median = statistics.median(times[variant])
            rate = f"{events[variant] / median:10.0f}" if events[variant] else f"{'-':>10}"
            print(f"{model:<12} {variant:<22} {median * 1000:10.2f} {statistics.median(ratios[variant]):9.2f} "
                  f"{events[variant] or '-':>7} {rate}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
