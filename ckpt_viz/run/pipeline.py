"""Pipeline scenarios: S stages by M micro-batches in one process, under a named schedule.

Owns the schedules (GPipe, 1F1B, ZB-H1) as plain data, the tick simulation that
orders them, and `run_pipeline`, which executes one with split reentrant
checkpoints and records its trace. Imports torch and the runtime; never the UI.

NOTE [ Schedules ]
  A schedule maps each stage to the list of `Action`s it takes, in order. Kinds:
  "F" forward, "B" full backward (DX then DW back to back on the same handles,
  recorded as one action), "DX" input gradients, "DW" weight gradients.
  1. GPipe: every F (micro-batch 0..M-1), then every B (0..M-1).
  2. 1F1B: stage s runs w = min(S - s - 1, M) warmup forwards, then M - w pairs
     "F(w + i), B(i)", then the cooldown B(M - w) .. B(M - 1).
  3. ZB-H1: F and DX keep 1F1B's order exactly (DX where 1F1B has B). Each DW is
     placed by a unit-time tick simulation (every action takes one tick, every
     stage runs at most one action per tick, an action may start only on a tick
     after the ones it depends on finished). At each tick, stage s:
       a. runs its next F/DX if it is ready, unless it is an F and the stage
          already holds S micro-batches whose F ran and whose DW has not (the
          ZB-H1 memory cap: 1F1B's peak of S micro-batches in flight);
       b. otherwise runs the DW of its oldest micro-batch whose DX ran and DW has
          not (a DW fills the idle slot, or frees a slot under the cap);
       c. otherwise idles.
     After the last DX the remaining DWs run one per tick, oldest first. So a DW
     never delays an F or DX that could run; it runs as late as that allows.
     Under the cap there is always a DW to run (before an F, stage s holds at most
     S - s - 1 micro-batches waiting for DX), so rule a never deadlocks.
     The rule is a pure function of (S, M): the schedule is deterministic.

NOTE [ Tick simulation ]
  `simulate(schedule)` orders the actions of every stage into one global list of
  (action, start tick). F, DX and DW take one tick each and B takes two (it is DX
  plus DW), so ticks compare across schedules. At each tick every idle stage
  whose next action is ready starts it; actions starting on the same tick are
  listed by stage index. Ready means the dependencies finished by that tick:
  F(s, m) needs F(s-1, m); DX or B (s, m) needs F(s, m) and DX or B (s+1, m);
  DW(s, m) needs DX(s, m). Each stage takes its actions strictly in its schedule
  order. For ZB-H1 the ticks equal those of the simulation that placed the DWs.

NOTE [ Loss and gradients ]
  1. The last stage's loss for micro-batch m is `spec.loss(output_m)`, not
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


from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Sequence

import torch
from torch import nn

from ckpt_viz.bus import tag
from ckpt_viz.errors import CkptVizError, internal_assert
from ckpt_viz.recording import record
from ckpt_viz.runtime import backward_input, backward_weight, reentrant_checkpoint_scope
from ckpt_viz.run.scenarios import checkpointed, fresh_handle_ids
from ckpt_viz.trace import Trace, run_meta
from ckpt_viz.run.zoo import ModelSpec

__all__ = ["SCHEDULES", "TICKS", "Action", "ActionKind", "in_flight", "make_schedule", "run_pipeline", "simulate"]

ActionKind = Literal["F", "B", "DX", "DW"]
SCHEDULES: tuple[str, ...] = ("GPipe", "1F1B", "ZB-H1")
TICKS: dict[str, int] = {"F": 1, "DX": 1, "DW": 1, "B": 2}  # an action's duration in the tick simulation
_API = "ckpt_viz.pipeline"


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one stage: `kind` ("F", "B", "DX" or "DW") on `microbatch`."""

    kind: ActionKind
    stage: int
    microbatch: int


# ---------------------------------------------------------------- schedules

def _schedule_name(name: str) -> str:
    for known in SCHEDULES:
        if isinstance(name, str) and name.lower() == known.lower():
            return known
    raise CkptVizError(f"{_API}: unknown schedule {name!r}; expected one of {', '.join(SCHEDULES)}.\n"
                       "Tip: the name is case-insensitive, e.g. schedule='zb-h1'.")


def _check_counts(stages: int, microbatches: int) -> None:
    for what, value in (("stages", stages), ("microbatches", microbatches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CkptVizError(f"{_API}: {what} must be a positive int, got {value!r}.\n"
                               f"Tip: pass e.g. {what}=2.")


def _one_f_one_b(stage: int, stages: int, microbatches: int, back: ActionKind) -> list[Action]:
    warmup = min(stages - stage - 1, microbatches)
    order = [Action("F", stage, m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        order += [Action("F", stage, warmup + i), Action(back, stage, i)]
    return order + [Action(back, stage, m) for m in range(microbatches - warmup, microbatches)]


def _done_marks(action: Action) -> tuple[tuple[str, int, int], ...]:
    """What finishing `action` provides to others: "F", "X" (input grads sent), "W" (weights done)."""
    marks = {"F": ("F",), "DX": ("X",), "DW": ("W",), "B": ("X", "W")}[action.kind]
    return tuple((mark, action.stage, action.microbatch) for mark in marks)


def _ready(action: Action, done: dict, stages: int, tick: int) -> bool:
    """Whether `action`'s dependencies finished by `tick`; `done` maps each mark to its finishing tick."""
    s, m = action.stage, action.microbatch
    if action.kind == "F":
        needs = [("F", s - 1, m)] if s > 0 else []
    elif action.kind == "DW":
        needs = [("X", s, m)]
    else:
        needs = [("F", s, m)] + ([("X", s + 1, m)] if s < stages - 1 else [])
    return all(done.get(mark, tick + 1) <= tick for mark in needs)


def _zb_h1(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """See NOTE [ Schedules ], rule 3."""
    main = {s: deque(_one_f_one_b(s, stages, microbatches, "DX")) for s in range(stages)}
    waiting_dw: dict[int, deque[int]] = {s: deque() for s in range(stages)}
    held = [0] * stages
    done: dict = {}
    plan: dict[int, list[Action]] = {s: [] for s in range(stages)}
    tick = 0
    while any(main[s] or waiting_dw[s] for s in range(stages)):
        picks = []
        for s in range(stages):
            nxt = main[s][0] if main[s] else None
            capped = nxt is not None and nxt.kind == "F" and held[s] >= stages
            if nxt is not None and not capped and _ready(nxt, done, stages, tick):
                picks.append(main[s].popleft())
            elif waiting_dw[s]:
                picks.append(Action("DW", s, waiting_dw[s].popleft()))
        internal_assert(bool(picks), f"the ZB-H1 simulation stalled (stages={stages}, microbatches={microbatches})")
        for action in picks:
            done.update(dict.fromkeys(_done_marks(action), tick + 1))
            plan[action.stage].append(action)
            held[action.stage] += {"F": 1, "DX": 0, "DW": -1}[action.kind]
            if action.kind == "DX":
                waiting_dw[action.stage].append(action.microbatch)
        tick += 1
    return plan


def make_schedule(name: str, stages: int, microbatches: int) -> dict[int, list[Action]]:
    """The actions each stage takes, in order (see NOTE [ Schedules ]).

    Args:
        name: "GPipe", "1F1B" or "ZB-H1" (case-insensitive).
        stages: S, the number of stages.
        microbatches: M, the number of micro-batches.

    Returns:
        {stage: [Action, ...]} for stages 0..S-1.
    """
    name = _schedule_name(name)
    _check_counts(stages, microbatches)
    if name == "GPipe":
        return {s: [Action("F", s, m) for m in range(microbatches)] + [Action("B", s, m) for m in range(microbatches)]
                for s in range(stages)}
    if name == "1F1B":
        return {s: _one_f_one_b(s, stages, microbatches, "B") for s in range(stages)}
    return _zb_h1(stages, microbatches)


def simulate(schedule: dict[int, list[Action]]) -> list[tuple[Action, int]]:
    """Order every stage's actions into one global list of (action, start tick); see NOTE [ Tick simulation ].

    Raises:
        CkptVizError: the schedule deadlocks (no stage can take its next action).
    """
    stages = len(schedule)
    queues = {s: deque(schedule[s]) for s in range(stages)}
    done: dict = {}
    busy_until = [0] * stages
    order: list[tuple[Action, int]] = []
    tick = 0
    while any(queues.values()):
        picks = [queues[s][0] for s in range(stages)
                 if queues[s] and busy_until[s] <= tick and _ready(queues[s][0], done, stages, tick)]
        if not picks and all(b <= tick for b in busy_until):
            stuck = ", ".join(f"stage {s}: {q[0]}" for s, q in queues.items() if q)
            raise CkptVizError(f"{_API}: the schedule deadlocks at tick {tick}; no stage can take its next action "
                               f"({stuck}).\nTip: F(s, m) needs F(s-1, m); DX or B (s, m) needs F(s, m) and "
                               "DX or B (s+1, m); DW(s, m) needs DX(s, m).")
        for action in picks:
            queues[action.stage].popleft()
            order.append((action, tick))
            busy_until[action.stage] = tick + TICKS[action.kind]
            done.update(dict.fromkeys(_done_marks(action), busy_until[action.stage]))
        tick += 1
    return order


def in_flight(actions: Iterable[Action | Sequence[Any]], stage: int) -> list[int]:
    """Micro-batches `stage` holds after each of its actions: F ran, and B (or DW) has not.

    Args:
        actions: `Action`s, or [kind, stage, microbatch, ...] rows as in `trace.meta["actions"]`.
        stage: the stage to count.

    Returns:
        One count per action of `stage`, in order. Its max is the schedule's peak
        activation memory in micro-batches (the Zero Bubble paper's accounting).
    """
    counts, held = [], 0
    for item in actions:
        kind, where = (item.kind, item.stage) if isinstance(item, Action) else (item[0], item[1])
        if where != stage:
            continue
        held += {"F": 1, "DX": 0, "B": -1, "DW": -1}[kind]
        counts.append(held)
    return counts


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
        slot.input = self.batches[m] if s == 0 else self.slots[s - 1][m].output.detach().requires_grad_(True)
        with checkpointed(self.spec.model, self.names[s], use_reentrant=True), \
                reentrant_checkpoint_scope(stage.parameters) as handles:
            out = stage(slot.input)
        slot.handles = handles
        if s == len(self.stages) - 1:  # See NOTE [ Loss and gradients ], rule 1.
            out = self.spec.loss(out)
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
    if not spec.stages:
        raise CkptVizError(f"{_API}: this model has no pipeline stages (model {spec.name!r}, ModelSpec.stages is "
                           "empty).\nTip: set ModelSpec.stages to the qualified names of the stage modules in order, "
                           "e.g. ('stages.0', 'stages.1'), or pick the built-in 'pipeline' model.")
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


def _microbatches(spec: ModelSpec, microbatches: int) -> tuple:
    if len(spec.inputs) != 1 or not isinstance(spec.inputs[0], torch.Tensor):
        raise CkptVizError(f"{_API}: a pipeline run takes exactly one input tensor, got {len(spec.inputs)} inputs "
                           f"({', '.join(type(i).__name__ for i in spec.inputs)}).\n"
                           "Tip: make ModelSpec.inputs a 1-tuple holding the batch tensor.")
    batch = spec.inputs[0]
    size = batch.shape[0] if batch.dim() else 0
    if size % microbatches:
        raise CkptVizError(f"{_API}: cannot split a batch of {size} into {microbatches} equal micro-batches "
                           f"(input shape {tuple(batch.shape)}).\nTip: pick microbatches dividing {size}, "
                           f"e.g. {', '.join(str(d) for d in range(1, size + 1) if size % d == 0)}.")
    # Each micro-batch gets its own storage, as a data loader would give it (and memory is then per micro-batch).
    return tuple(t.detach().clone() for t in batch.split(size // microbatches, dim=0))


def run_pipeline(spec: ModelSpec, *, schedule: str = "1F1B", microbatches: int = 2, seed: int = 0,
                 memory: bool = False, graphs: bool = False) -> Trace:
    """Run `spec`'s stages as a pipeline in one process and return the recorded trace.

    Every stage forward runs in `reentrant_checkpoint_scope` with the stage's
    `spec.checkpoint` blocks checkpointed (reentrant, split); DX and DW go through
    `backward_input` / `backward_weight`. Every action runs inside
    `tag(stage=s, microbatch=m, action=kind)`. The stages must compose to the model
    (model(x) is stage S-1(... stage 0(x))). See NOTE [ Loss and gradients ].

    Args:
        spec: a model whose `stages` name its stage submodules in order.
        schedule: "GPipe", "1F1B" or "ZB-H1" (case-insensitive).
        microbatches: M; must divide the batch (dim 0 of `spec.inputs[0]`).
        seed: the RNG seed for the run (dropout).
        memory: sample memory by category (and by stage, from the tags) after every event.
        graphs: snapshot the autograd graph before every backward pass.

    Returns:
        The trace; `meta["actions"]` lists the executed order as [kind, stage, microbatch, tick].

    Raises:
        CkptVizError: no stages, an unknown stage or schedule, or a batch that does not split.
    """
    name = _schedule_name(schedule)
    stages = _stage_modules(spec)
    _check_counts(len(stages), microbatches)
    batches = _microbatches(spec, microbatches)
    order = simulate(make_schedule(name, len(stages), microbatches))
    for p in spec.model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    pipeline = _Pipeline(spec, stages, batches)
    fresh_handle_ids()
    with record(memory=memory, graphs=graphs, model=spec.model, tensors=(spec.inputs, batches)) as rec:
        for action, _ in order:
            with tag(stage=action.stage, microbatch=action.microbatch, action=action.kind):
                pipeline.run(action)
    rec.trace.meta.update(run_meta(
        model=spec.name, mode="pipeline", schedule=name, source=spec.source, description=spec.description,
        checkpoint=list(spec.checkpoint), stages=list(spec.stages), microbatches=microbatches,
        actions=[[a.kind, a.stage, a.microbatch, tick] for a, tick in order],
        loss=sum(pipeline.losses),
    ))
    return rec.trace
