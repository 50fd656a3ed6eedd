"""Pipeline schedules as plain data: which actions each stage takes, and the tick simulation that orders them.

Owns `Action`, the schedules (GPipe, 1F1B, ZB-H1), `simulate` and `in_flight`. Pure
Python: no torch, so the CLI sizes a progress bar and the app lists schedules without it.
The executor that runs a schedule on a model is `ckpt_viz.run.pipeline`.

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
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ckpt_viz.errors import CkptVizError, internal_assert

__all__ = ["SCHEDULES", "TICKS", "Action", "ActionKind", "in_flight", "make_schedule", "schedule_name", "simulate"]

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

def schedule_name(name: str) -> str:
    for known in SCHEDULES:
        if isinstance(name, str) and name.lower() == known.lower():
            return known
    raise CkptVizError(f"{_API}: unknown schedule {name!r}; expected one of {', '.join(SCHEDULES)}.\n"
                       "Tip: the name is case-insensitive, e.g. schedule='zb-h1'.")


def check_counts(stages: int, microbatches: int) -> None:
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


def _ready(action: Action, done: dict[tuple[str, int, int], int], stages: int, tick: int) -> bool:
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
    done: dict[tuple[str, int, int], int] = {}
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
    name = schedule_name(name)
    check_counts(stages, microbatches)
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
    done: dict[tuple[str, int, int], int] = {}
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
