"""Measure a step's peak as the allocator sees it: the reference `verify` compares a prediction with.

Owns `measure_step` (any step function) and `measure_spec` (a `ModelSpec` in a run mode with a
chosen set of checkpointed blocks, through `ckpt_viz.run.scenarios.run_scenario`). Imports torch.

NOTE [ Measured peak ]
  The plan's reference is the allocator's own record of the step (ckpt_viz/plan/_alloc.py):
  the bytes that existed before the step (parameters, buffers, gradients, the inputs) plus the
  highest running sum of every allocation and free during it. That is the CPU allocator's
  "allocated" figure at its highest point, to the byte; it needs no recording open (a
  `record(memory=True)` reads the allocator through torch's profiler too, and one profiler runs at
  a time). `verify` reports it beside the recording's own peak by category.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ckpt_viz.plan._alloc import Allocations

__all__ = ["Measured", "measure_spec", "measure_step"]


@dataclass(frozen=True)
class Measured:
    """A step's measured peak.

    Attributes:
        peak: bytes at the allocator's highest point, the existing bytes included.
        base: bytes that existed before the step.
        events: allocator events in the step.
        trace: the run's trace, when the step was a recorded scenario run.
    """

    peak: int
    base: int
    events: int
    trace: Any = None


def existing_bytes(model: torch.nn.Module | None, tensors: Any = ()) -> int:
    """Bytes of the distinct storages of the model's parameters, buffers and gradients and of `tensors`."""
    seen: dict[int, int] = {}
    values: list[Any] = []
    if model is not None:
        values += [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters() if p.grad is not None)]
    values += [t for t in tree_flatten(tensors)[0] if isinstance(t, torch.Tensor)]
    for t in values:
        if t.device.type == "cpu":
            storage = t.untyped_storage()
            seen.setdefault(storage.data_ptr(), storage.nbytes())
    return sum(seen.values())


def measure_step(step: Callable[[], Any], *, model: torch.nn.Module | None = None, tensors: Iterable[Any] = (),
                 api: str = "ckpt_viz.plan.measure_step") -> Measured:
    """Run `step()` once under the allocator's record; see NOTE [ Measured peak ]."""
    base = existing_bytes(model, tensors)
    with Allocations(api) as alloc:
        result = step()
        del result
        record = alloc.stop()
    live = top = 0
    for size in record.sizes:
        live += size
        if live > top:
            top = live
    return Measured(peak=base + top, base=base, events=len(record.sizes))


def measure_spec(spec: Any, mode: str, blocks: Iterable[str] | None = None, *, seed: int = 0, microbatches: int = 4,
                 schedule: str = "1F1B") -> Measured:
    """Run `spec` in `mode` with `blocks` checkpointed (default: the spec's own) and measure its peak.

    The run is `ckpt_viz.run.scenarios.run_scenario(spec, mode)` without memory recording (its probe
    would add a Python call per op, not bytes); the measured figure is the allocator's.
    """
    from ckpt_viz.run.scenarios import run_scenario

    if blocks is not None:
        spec = dataclasses.replace(spec, checkpoint=tuple(blocks))
    for p in spec.model.parameters():
        p.grad = None
    out: dict[str, Any] = {}

    def step() -> None:
        out["trace"] = run_scenario(spec, mode, seed=seed, microbatches=microbatches, schedule=schedule)

    measured = measure_step(step, model=spec.model, tensors=(spec.inputs, spec.kwargs, spec.targets),
                            api="ckpt_viz.plan.measure_spec")
    for p in spec.model.parameters():
        p.grad = None
    return dataclasses.replace(measured, trace=out.get("trace"))
