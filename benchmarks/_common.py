"""Interleaved timing helpers shared by the benchmark scripts.

Noisy machines (shared CI runners, a 2-core box with other jobs) make absolute
times meaningless and drift over a run. So every case runs once per *round*, in a
shuffled order, and a comparison is the median of the per-round ratios B_i / A_i:
A and B always ran seconds apart, under the same load. Standard library and torch
only; never imports the UI.
"""
from __future__ import annotations

import gc
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import torch

__all__ = ["CLOCKS", "format_table", "gen0_collections", "interleaved", "opcodes_per_step", "paired_ratio",
           "stable_threads"]


def stable_threads() -> int:
    """Pin torch to one intra-op (and, if still possible, one inter-op) thread; return the count."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work already started: harmless for timing
        pass
    return torch.get_num_threads()


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def interleaved(cases: Mapping[str, Callable[[], None]], *, repeats: int, warmup: int = 2,
                seed: int = 0, clock: str = "wall") -> dict[str, list[float]]:
    """Run every case once per round for `repeats` rounds; return per-round milliseconds.

    The order inside a round is shuffled (seeded), so no case always runs first or
    after the same neighbour. After the warmup, `gc.freeze()` moves every object
    alive so far (torch's modules, the model) out of the collector's sight, so
    the `gc.collect()` that runs between samples, outside the timed region, is
    cheap; the garbage a case makes while running is still its own cost.
    Lists are aligned by round: `times[a][i]` and `times[b][i]` come from round i.
    `clock="cpu"` times with `time.process_time` (this process's CPU time, all its
    threads): steadier on a loaded machine, where wall time also counts the waits
    for a core; it needs steps long against its resolution (about 1 ms or better).
    """
    now = CLOCKS[clock]
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
    rng = random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.freeze()
    try:
        for _ in range(repeats):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                gc.collect()
                start = now()
                cases[name]()
                times[name].append((now() - start) * 1e3)
    finally:
        gc.unfreeze()
    return times


def gen0_collections(run: Callable[[], None], *, runs: int = 10) -> float:
    """Generation-0 collections per call of `run`, each call started right after a `gc.collect()` (as timed)."""
    seen = [0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 0:
            seen[0] += 1

    gc.callbacks.append(count)
    try:
        for _ in range(runs):
            gc.collect()
            run()
    finally:
        gc.callbacks.remove(count)
    return seen[0] / runs


def opcodes_per_step(run: Callable[[], None], *, steps: int = 4) -> float:
    """Python bytecode instructions executed per call of `run` (opcode tracing; untimed, load-independent).

    Counts every thread's Python code (`threading.settrace` for threads started meanwhile);
    C code (torch's kernels, the interpreter's builtins) counts nothing, so this measures
    the Python work a change adds or removes, not the time it takes.
    """
    count = [0]

    def tracer(frame: object, event: str, arg: object) -> object:
        frame.f_trace_opcodes = True  # type: ignore[attr-defined]
        if event == "opcode":
            count[0] += 1
        return tracer

    run()  # warm: first-call caches are not per-step work
    previous = sys.gettrace()
    sys.settrace(tracer)
    threading.settrace(tracer)
    try:
        for _ in range(steps):
            run()
    finally:
        sys.settrace(previous)
        threading.settrace(None)  # type: ignore[arg-type]
    return count[0] / steps


def paired_ratio(candidate: Sequence[float], baseline: Sequence[float]) -> float:
    """Median over rounds of candidate_i / baseline_i (both lists from the same `interleaved` call)."""
    return statistics.median(c / b for c, b in zip(candidate, baseline, strict=True))


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain fixed-width table: first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])
