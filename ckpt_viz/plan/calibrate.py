"""What a replay costs beyond the forward it reruns, on this machine: the plan's recompute-time model.

Owns `replay_costs` (measured once per process, memoised) and `calibration_spec` (the tiny model it
measures). Imports torch; the costs are plain data (`ckpt_viz.plan.schema.ReplayCost`) that a
profile carries (`PlanProfile.replay_costs`) and the torch-free planner reads.

NOTE [ Replay cost ]
  1. A replay, as a trace shows it (a handle's `replay_started` to its `replay_finished`), runs the
     block's forward again (up to its last saved tensor for a non-reentrant kind, which stops early)
     and the runtime's own work for it: per replay a fixed part (the inputs detached, the RNG state
     set and put back, the events, a non-reentrant replay's early stop unwinding by an exception);
     per tensor the replay saves, a non-reentrant replay's saved-tensor hook (Python code per
     tensor: the handle, the recompute table); per excluded region it passes, the cache lookup and the
     bridge that replace the region's forward. A block's predicted recompute is
         forward part + fixed + per_tensor * saved tensors + per_region * excluded regions,
     with the forward part measured by the profile (ckpt_viz/plan/profile.py NOTE [ Plan profile ],
     rule 6) and the three costs per kind measured here.
  2. Calibration: a stack of tiny blocks (chains of k `tanh`, each saving its output, the last op
     too, so a non-reentrant replay runs the whole forward; some with an excluded region in the
     middle) on tensors so small that each block's forward is the dispatcher's and Python's work.
     Its blocks' forwards are timed by module hooks in plain steps, as `profile_spec` times any
     model's (`forward_times`), and it runs in each kind with `run_scenario` (the replays, measured
     from the trace's events as `ckpt_viz.plan.check.replay_ns` does); the cost of each replay
     beyond its forward is fitted to fixed + per_tensor * k + per_region * r by least squares with
     non-negative terms. Every figure is the fastest of several runs on both sides (preemption on a
     shared machine only ever adds time), and nothing of a model the plan is later used on enters it.
  3. Once per process: the costs are the machine's and torch's, not a model's. A profile stores the
     costs it was made with, so a saved trace predicts with its own machine's figures; a profile made
     before calibration existed (no `replay_costs`) predicts the forward part alone.
  4. Steady state: a recording checks a region's first replays for divergence
     (ckpt_viz/runtime/divergence_sampling.py NOTE [ Sampled replay checks ]) and later ones rarely;
     the calibration runs past those first checks, so the costs are those of an unchecked replay,
     as in a long training run.
  5. The calibration runs on a thread of its own: a recording open around the caller (its channels,
     saved-tensor hooks and dispatch modes are the caller's thread's) sees none of it, and it needs
     no torch profiler. It keeps the caller's RNG state (`torch.random.fork_rng`). It runs the
     calibration model through `run_scenario`, which takes the run lock of ckpt_viz/run/rng.py:
     call it outside that lock (profile_spec calibrates after its step).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ckpt_viz.plan.schema import KINDS, ReplayCost

__all__ = ["CHAINS", "RUNS", "WARMUP", "calibration_spec", "fit_costs", "forward_times", "measure_costs",
           "replay_costs", "saved_tensors"]

# (tanh ops, excluded region in the middle) per calibration block
CHAINS: tuple[tuple[int, bool], ...] = ((1, False), (4, False), (12, False), (32, False), (4, True), (12, True))
WARMUP = 5  # runs per kind before the measured ones: past the divergence checks' first runs (NOTE rule 4)
RUNS = 7  # measured runs per kind; each block's replay is the fastest of them


class _Chain(nn.Module):
    """k tanh ops, each saving its output for backward; an excluded region (one tanh) halfway when asked."""

    def __init__(self, k: int, region: bool) -> None:
        super().__init__()
        from ckpt_viz.runtime import checkpoint_exclude_wrapper

        self.k = k
        self.region = checkpoint_exclude_wrapper(nn.Tanh()) if region else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.k):
            x = torch.tanh(x)
            if i == self.k // 2 - 1 and self.region is not None:
                x = self.region(x)
        return torch.tanh(x)


def calibration_spec(chains: Sequence[tuple[int, bool]] = CHAINS) -> object:
    """The calibration model (NOTE rule 2) as a ModelSpec: a stack of `_Chain` blocks on a (4, 8) input."""
    from ckpt_viz.run.zoo import ModelSpec, Stack

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Stack([_Chain(k, region) for k, region in chains], 8)
        x = torch.randn(4, 8)
    return ModelSpec("calibration", model, (x,), checkpoint=tuple(f"blocks.{i}" for i in range(len(chains))),
                     description="the plan's replay-cost calibration")


def _replays_by_handle(trace: Any) -> list[int]:
    """Each replay's duration, in handle order (one replay per handle in these runs; handles are numbered in
    forward order): `recompute_time`'s per-handle replays."""
    from ckpt_viz.analysis.lifecycle import recompute_time

    return [ns for _, ns in sorted(recompute_time(trace).by_handle.items())]


def fit_costs(tensors: Sequence[int], regions: Sequence[int], extra: Sequence[float]) -> ReplayCost:
    """Least squares of extra ~ fixed + per_tensor * tensors + per_region * regions, every term >= 0."""
    A = np.column_stack([np.ones(len(extra)), np.asarray(tensors, float), np.asarray(regions, float)])
    y = np.asarray(extra, float)
    active = [0, 1, 2]
    coef = np.zeros(3)
    while active:
        solution, *_ = np.linalg.lstsq(A[:, active], y, rcond=None)
        if np.all(solution >= 0):
            coef[:] = 0
            coef[active] = solution
            break
        active.pop(int(np.argmin(solution)))  # a negative term is dropped (set to 0) and the rest refitted
    return ReplayCost(fixed_ns=round(float(coef[0])), per_tensor_ns=round(float(coef[1])),
                      per_region_ns=round(float(coef[2])))


def saved_tensors(k: int, region: bool) -> tuple[int, int]:
    """(tensors a `_Chain(k, region)` block's forward saves, of them inside its excluded region): each tanh saves
    its output; tests/plan/test_calibrate.py checks this against the profile's own count."""
    return k + 1 + int(region), int(region)


def measure_costs(*, runs: int = RUNS, warmup: int = WARMUP, chains: Sequence[tuple[int, bool]] = CHAINS
                  ) -> dict[str, ReplayCost]:
    """Calibrate now (NOTE [ Replay cost ], rules 2 and 5): the costs per checkpoint kind.

    Runs on a thread of its own, so no recording, saved-tensor hook or dispatch mode of the caller's
    thread sees it; the caller waits for it.
    """
    out: dict[str, object] = {}

    def work() -> None:
        try:
            out["costs"] = _measure(runs, warmup, tuple(chains))
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=work, name="ckpt_viz.plan.calibrate", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["costs"]  # type: ignore[return-value]


def _measure(runs: int, warmup: int, chains: tuple[tuple[int, bool], ...]) -> dict[str, ReplayCost]:
    from ckpt_viz.run.scenarios import run_scenario

    spec = calibration_spec(chains)
    model, names = spec.model, spec.checkpoint
    x = spec.inputs[0].detach().requires_grad_(True)
    with torch.random.fork_rng():
        forward = [float("inf")] * len(chains)
        for step in range(warmup + runs):  # NOTE rule 2: each block's forward, as profile_spec times it
            with forward_times(model, names) as times:
                spec.loss_of(model(x)).backward()
            if step >= warmup and len(times) == len(chains):
                forward = [min(f, t) for f, t in zip(forward, times)]
            for p in model.parameters():
                p.grad = None
            x.grad = None
        counts = [saved_tensors(k, region) for k, region in chains]
        tensors = [saved - inside for saved, inside in counts]
        regions = [int(region) for _, region in chains]
        costs = {}
        for kind in KINDS:
            best = [float("inf")] * len(chains)
            for run in range(warmup + runs):
                for p in model.parameters():
                    p.grad = None
                durations = _replays_by_handle(run_scenario(spec, kind))
                if run >= warmup and len(durations) == len(chains):
                    best = [min(b, d) for b, d in zip(best, durations)]
            costs[kind] = fit_costs(tensors, regions, [b - f for b, f in zip(best, forward)])
    for p in model.parameters():
        p.grad = None
    return costs


_lock = threading.Lock()
_costs: dict[str, ReplayCost] | None = None


def replay_costs() -> dict[str, ReplayCost]:
    """This process's replay costs per kind (NOTE [ Replay cost ]): measured on the first call, then kept."""
    global _costs
    with _lock:
        if _costs is None:
            _costs = measure_costs()
        return dict(_costs)


@contextlib.contextmanager
def forward_times(model: torch.nn.Module, blocks: Sequence[str]) -> Any:
    """The forward time of each block call (in call order) of the step the block runs, from module hooks."""
    times: list[int] = []
    starts: list[int] = []
    handles = []
    for name in blocks:
        module = model.get_submodule(name)
        handles.append(module.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter_ns())))
        handles.append(module.register_forward_hook(lambda *_: times.append(time.perf_counter_ns() - starts.pop())))
    try:
        yield times
    finally:
        for handle in handles:
            handle.remove()
