"""The pipeline executor: S stages by M micro-batches in one process, under a named schedule.

Owns `run_pipeline`, which executes a schedule from `ckpt_viz.run.schedules` (plain
data, no torch: see NOTE [ Schedules ] there) with split reentrant checkpoints and
records its trace. Imports torch, the runtime and the run harness; never the
scenarios module (which dispatches the "pipeline" mode here) nor the UI.

NOTE [ Loss and gradients ]
  1. The last stage's loss for micro-batch m is `spec.loss(output_m)` (or
     `spec.loss(output_m, targets_m)`, the targets split with the inputs), not
     rescaled, so the pipeline's loss is the sum over micro-batches. For a loss
     that is a sum over the batch (the zoo's default `sum_of_squares`) that is
     the full-batch loss, and the accumulated `.grad` equal the unpipelined
     model's (up to float summation order). A mean loss would give M times the
     gradients of one full-batch mean.
  2. Stage 0's input is the micro-batch itself, which needs no grad, so stage 0's
     DX has nothing to compute: its handles replay in DW. Every later stage's
     input is the previous stage's output, detached and requiring grad; its DX
     replays the handles and sends the input gradient to the previous stage.
  3. Weight gradients accumulate in each stage's DW order (micro-batch 0 first in
     all three schedules), so `.grad` is bit-identical to running the micro-batches
     one by one without checkpointing, in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ckpt_viz import bus
from ckpt_viz.errors import CkptVizError
from ckpt_viz.recording import record
from ckpt_viz.run.batch import split_batch
from ckpt_viz.run.harness import checkpointed, fresh_handle_ids, grad_digest
from ckpt_viz.run.schedules import (  # re-exported: the executor's callers name schedules here too
    SCHEDULES,
    TICKS,
    Action,
    ActionKind,
    check_counts,
    in_flight,
    make_schedule,
    schedule_name,
    simulate,
)
from ckpt_viz.run.zoo import ModelSpec
from ckpt_viz.runtime import backward_input, backward_weight, reentrant_checkpoint_scope
from ckpt_viz.trace import Trace, run_meta

__all__ = ["SCHEDULES", "TICKS", "Action", "ActionKind", "in_flight", "make_schedule", "microbatch_choices",
           "run_pipeline", "simulate"]

_API = "ckpt_viz.pipeline"


# ---------------------------------------------------------------- executor

@dataclass
class _Slot:
    """What stage s keeps for micro-batch m between its actions."""

    input: torch.Tensor | None = None
    output: torch.Tensor | None = None  # the stage output, or the loss on the last stage
    grad: torch.Tensor | None = None    # the gradient of `output` from the next stage (None for the loss)
    handles: list = field(default_factory=list)


class _Pipeline:
    def __init__(self, spec: ModelSpec, stages: list[tuple[str, nn.Module]], batches: tuple) -> None:
        self.spec = spec
        self.stages = stages
        self.batches = batches
        self.slots = [[_Slot() for _ in batches] for _ in stages]
        self.names = [tuple(n for n in spec.checkpoint if n == name or n.startswith(name + "."))
                      for name, _ in stages]
        self.losses: list[float] = []

    def params(self, s: int) -> list[torch.Tensor]:
        return [p for p in self.stages[s][1].parameters() if p.requires_grad]

    def run(self, action: Action) -> None:
        {"F": self.forward, "DX": self.dx, "DW": self.dw, "B": self.full_backward}[action.kind](
            action.stage, action.microbatch)

    def forward(self, s: int, m: int) -> None:
        slot, stage = self.slots[s][m], self.stages[s][1]
        args, kwargs, targets = self.batches[m]  # stage 0 takes the micro-batch's inputs, keywords included
        if s > 0:
            slot.input = self.slots[s - 1][m].output.detach().requires_grad_(True)
            args, kwargs = (slot.input,), {}
        with checkpointed(self.spec.model, self.names[s], use_reentrant=True), \
                reentrant_checkpoint_scope(stage.parameters) as handles:
            out = stage(*args, **kwargs)
        slot.handles = handles
        if s == len(self.stages) - 1:  # See NOTE [ Loss and gradients ], rule 1.
            out = self.spec.loss_of(out, targets)
            self.losses.append(float(out.detach()))
        slot.output = out

    def dx(self, s: int, m: int) -> None:
        slot = self.slots[s][m]
        (dinput,) = backward_input(slot.output, slot.grad, [slot.input], handles=slot.handles)
        if s > 0:
            self.slots[s - 1][m].grad = dinput

    def dw(self, s: int, m: int) -> None:
        slot = self.slots[s][m]
        backward_weight(slot.output, slot.grad, self.params(s), handles=slot.handles)
        # Free the micro-batch here, so node_collected events carry this action's tags.
        self.slots[s][m] = _Slot()

    def full_backward(self, s: int, m: int) -> None:
        self.dx(s, m)
        self.dw(s, m)


def _stage_modules(spec: ModelSpec) -> list[tuple[str, nn.Module]]:
    if not spec.stages and spec.source == "user":
        raise CkptVizError(f"{_API}: the model file {spec.name!r} names no pipeline stages.\nTip: return a dict "
                           "with 'stages': [qualified names of the stage submodules, in order] from the factory, "
                           "e.g. 'stages': ['blocks.0', 'blocks.1'] for a model that is blocks.1(blocks.0(x)).")
    if not spec.stages:
        raise CkptVizError(f"{_API}: the built-in model {spec.name!r} has no pipeline stages, so mode "
                           "'pipeline' cannot run it.\nTip: pick the built-in model 'pipeline' (2 stages) for mode "
                           f"'pipeline', or another mode (e.g. 'split-reentrant') for {spec.name!r}.")
    found = []
    for name in spec.stages:
        try:
            found.append((name, spec.model.get_submodule(name)))
        except AttributeError:
            raise CkptVizError(
                f"{_API}: the model has no stage submodule {name!r} (ModelSpec.stages = {list(spec.stages)}).\n"
                f"Tip: use names from model.named_modules(), e.g. {[n for n, _ in spec.model.named_modules()][1:4]}."
            ) from None
    return found


def microbatch_choices(spec: ModelSpec, most: int = 16) -> tuple[int, ...]:
    """The micro-batch counts up to `most` that `run_pipeline` can split `spec`'s batch into; () without stages."""
    if not spec.stages:
        return ()
    choices = []
    for m in range(1, most + 1):
        try:
            _microbatches(spec, m)
        except CkptVizError:
            continue
        choices.append(m)
    return tuple(choices)


def _microbatches(spec: ModelSpec, microbatches: int) -> tuple:
    """(args, kwargs, targets) per micro-batch, each its own copy; see NOTE [ Splitting a batch ] in batch.py."""
    return tuple(split_batch(spec.inputs, spec.kwargs, spec.targets, microbatches, api=_API,
                             roots=spec.extra.get("input_keys"), single=bool(spec.extra.get("single_input"))))


def run_pipeline(spec: ModelSpec, *, schedule: str = "1F1B", microbatches: int = 4, seed: int = 0,
                 memory: bool = False, graphs: bool = False) -> Trace:
    """Run `spec`'s stages as a pipeline in one process and return the recorded trace.

    Every stage forward runs in `reentrant_checkpoint_scope` with the stage's
    `spec.checkpoint` blocks checkpointed (reentrant, split); DX and DW go through
    `backward_input` / `backward_weight`. Every action runs inside
    `bus.action(stage=s, microbatch=m, action=kind)`: tagged, between an
    `action_started` and an `action_finished` event. The stages must compose to the model
    (model(x) is stage S-1(... stage 0(x))). See NOTE [ Loss and gradients ].

    Args:
        spec: a model whose `stages` name its stage submodules in order.
        schedule: "GPipe", "1F1B" or "ZB-H1" (case-insensitive).
        microbatches: M; must divide the batch (dim 0 of every batched tensor in the inputs and targets).
        seed: the RNG seed for the run (dropout).
        memory: sample memory by category (and by stage, from the tags) after every event.
        graphs: snapshot the autograd graph before every backward pass.

    Returns:
        The trace; `meta["actions"]` lists the executed order as [kind, stage, microbatch, tick].

    Raises:
        CkptVizError: no stages, an unknown stage or schedule, or a batch that does not split.
    """
    name = schedule_name(schedule)
    stages = _stage_modules(spec)
    check_counts(len(stages), microbatches)
    batches = _microbatches(spec, microbatches)
    order = simulate(make_schedule(name, len(stages), microbatches))
    for p in spec.model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    pipeline = _Pipeline(spec, stages, batches)
    fresh_handle_ids()
    with record(memory=memory, graphs=graphs, model=spec.model,
                tensors=(spec.inputs, spec.kwargs, spec.targets, batches)) as rec:
        for s, (_, module) in enumerate(stages):  # each stage's parameters in its row of by_stage
            rec.assign_stage(list(module.parameters()), s)
        for action, _ in order:
            with bus.action(stage=action.stage, microbatch=action.microbatch, action=action.kind):
                pipeline.run(action)
    rec.trace.meta.update(run_meta(
        model=spec.name, mode="pipeline", schedule=name, source=spec.source, description=spec.description,
        look_at=spec.look_at, checkpoint=list(spec.checkpoint), seed=seed, stages=list(spec.stages),
        microbatches=microbatches,
        grad_sha256=grad_digest(spec.model),
        actions=[[a.kind, a.stage, a.microbatch, tick] for a, tick in order],
        loss=sum(pipeline.losses),
    ))
    return rec.trace
