"""Record throughput: how fast `record()` captures events, memory by category and graph snapshots.

    .venv/bin/python benchmarks/bench_record.py            # about half a minute
    .venv/bin/python benchmarks/bench_record.py --quick    # smoke run

For each built-in model, one training step (forward, loss, split DX/DW) runs in five
variants, interleaved round by round: no recorder, events only, events + memory as
`record(memory=True)` comes (the allocation probe on torch's memory-only profiler,
`ckpt_viz.probe.stream`), the same with the dispatch tracker (its fallback, forced), and
events + memory + graphs. Reported: median step time, the median of per-round ratios to
the unrecorded step, and events recorded per second of recorded step time. `--clock cpu`
times CPU time (steadier on a loaded machine). The two probes must read the same memory
right after every event, or the script fails.
"""
from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from collections.abc import Iterator

import torch

from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin

VARIANTS = {
    "no recorder": None,
    "events": dict(memory=False, graphs=False),
    "events+memory": dict(memory=True, graphs=False),
    "events+memory(tracker)": dict(memory=True, graphs=False, probe="tracker"),
    "events+memory+graphs": dict(memory=True, graphs=True),
}
_clock = time.perf_counter


@contextlib.contextmanager
def _probe(kind: str | None) -> Iterator[None]:
    """`record(memory=True)` with the probe `kind` ("tracker": torch's profiler refused; None: as it comes)."""
    from ckpt_viz.probe.stream import AllocationStream

    if kind is None:
        yield
        return
    original = AllocationStream.acquire
    AllocationStream.acquire = staticmethod(lambda on_batch: None)  # the fallback open_probe then takes
    try:
        yield
    finally:
        AllocationStream.acquire = original


def _at_events(trace) -> list[tuple]:
    """The reading right after each event: the first sample of its seq, else the last one before."""
    samples, out, i = list(trace.memory), [], 0
    for event in trace.events:
        while i < len(samples) and samples[i].seq < event.seq:
            i += 1
        sample = samples[i] if i < len(samples) and samples[i].seq == event.seq else samples[i - 1] if i else None
        out.append(None if sample is None else (sample.bytes_by_category, sample.by_stage))
    return out


def _step(model: str, mode: str, options: dict | None) -> tuple[float, int]:
    spec = build_builtin(model)  # not timed
    if options is None:  # the same step with no recorder attached
        start = _clock()
        _unrecorded(spec, mode)
        return _clock() - start, 0
    options = dict(options)
    with _probe(options.pop("probe", None)):
        start = _clock()
        trace = run_scenario(spec, mode, **options)
        seconds = _clock() - start
    return seconds, len(trace.events)


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
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    global _clock
    _clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    models = ["mlp", "transformer"] if not args.quick else ["mlp"]
    repeats = 2 if args.quick else args.repeats
    print(f"bench_record: split-reentrant step per built-in model; {repeats} interleaved rounds; "
          f"torch {torch.__version__}, 1 thread, {args.clock} clock")
    print(f"{'model':<12} {'variant':<24} {'median ms':>10} {'x no rec':>9} {'events':>7} {'events/s':>10}")
    for model in models:
        _step(model, "split-reentrant", VARIANTS["events+memory+graphs"])  # warm up
        readings = []
        for kind in ("tracker", None):  # the same memory at every event, or the figure means nothing
            with _probe(kind):
                trace = run_scenario(build_builtin(model), "split-reentrant", memory=True)
            readings.append(_at_events(trace))
        if readings[1] != readings[0]:
            print(f"{model}: the allocation probe read other memory than the dispatch tracker")
            return 1
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
            print(f"{model:<12} {variant:<24} {median * 1000:10.2f} {statistics.median(ratios[variant]):9.2f} "
                  f"{events[variant] or '-':>7} {rate}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
