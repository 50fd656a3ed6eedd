"""Pipeline actions, derived once: each executed F / DX / DW / B action with its micro-batch, the plan
against the executed order, and the step time and bubble per rank and per stage.

    actions(trace)            -> (Action(lane="rank 0 · stage 0", action="F", microbatch=0, start_us=..., ...), ...)
    planned_vs_executed(trace) -> (OrderCheck(lane="rank 0", planned="0F0 0F1 ...", executed=..., same=True), ...)
    bubbles(trace)            -> Bubbles(unit="µs", exact=True, steps=(StepBubbles(step=0, length=..., bubble=0.38,
                                 by_rank={0: Busy(busy=..., idle=..., bubble=0.47, actions=24), ...}, by_stage=...),))
    bubble_lines(trace)       -> ["step 0: 208.05 ms; bubble 38% (rank 0 47%, rank 1 29%)"]   (`ckpt-viz info`)
    bubble_rows(trace, step)  -> [{"": "rank 0", "busy": "110.21 ms", "idle": ..., "bubble": "47%", ...}, ...]

Read from the recorded events' tags (`action`, `stage`, `microbatch`, `step`, `rank`), so the same
answer comes from a saved trace, the in-process pipeline mode and a merged multi-rank trace. Standard
library only; the drawing is `ckpt_viz.render.timeline`.

NOTE [ Timeline boxes ]
  1. An action is the events tagged with one (rank, step, stage, microbatch, action). Our executors (the
     in-process pipeline, `ckpt_viz.run.pipeline`, and `ckpt_viz.pipelining.PipelineStage`) run each action
     inside `bus.action(...)`, which emits `action_started` and `action_finished` around it: its box runs
     from the one to the other (`bounded`). A trace recorded before those events existed, or a user's own
     tags, has none: its box runs from its first tagged event to its last. torch's I is drawn as DX and W
     as DW (they run `backward_input` and `backward_weight`); metadata inference (META) is left out.
  2. An `action_started` of a key whose action already finished starts a new action (a step run twice
     without a step tag); an event after the finish, outside any new start, is counted in that action
     (its replays) but does not stretch a bounded box.
  3. Replays (replay_started -> replay_finished of a handle) are kept with the action they ran in.
  4. Lanes: "rank r · stage s" when events carry a rank, else "stage s".
  5. The plan: a merged trace's `meta["distributed"]["planned_order"]` (torch's "0F1" per rank, compute
     actions only) or the in-process `meta["actions"]`; the executed order is each lane's actions in time
     order, of the first recorded step.
  6. Ticks (in-process runs): an action's tick is its start in the schedule's unit-tick simulation
     (`meta["actions"]`), `tick_end` its end: B takes `TICK_LENGTH["B"]` = 2 ticks, every other action 1
     (the same lengths as `ckpt_viz.run.schedules.TICKS`).

NOTE [ Bubbles ]
  1. Where ranks ran the stages (a merged distributed trace), figures are in recorded time: a step runs
     from its first action's start to its last action's end, over every rank (a merged trace's clocks are
     aligned to rank 0's). Per rank (a device) and per stage, the busy time is the union of its action
     boxes in that step; the idle time is the rest of the step, and the bubble is the idle share.
  2. An in-process pipeline runs every stage in turn in one process, so its clock has no overlap to
     measure: its figures are in the schedule's unit ticks, each stage one device of the schedule (the
     tick simulation runs at most one action per stage per tick), e.g. GPipe's bubble (S-1)/(M+S-1) for
     one-tick F and B. `wall_us` keeps the recorded time of the step all the same.
  3. Work outside an action (sends, receives, the optimizer) is idle time: that is the bubble. Boxes
     without start and end events (NOTE [ Timeline boxes ], rule 1) also miss work before an action's
     first event and after its last, so there the bubble is an upper bound (`Bubbles.exact` is False).
"""
from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Literal

from ckpt_viz.analysis._cache import derived
from ckpt_viz.trace import Trace

__all__ = ["TICK_LENGTH", "TORCH_ACTIONS", "Action", "Bubbles", "Busy", "OrderCheck", "StepBubbles", "actions",
           "bubble_lines", "bubble_rows", "bubbles", "planned_vs_executed", "tick_at"]

TORCH_ACTIONS: dict[str, str] = {"F": "F", "I": "DX", "W": "DW", "B": "B", "DX": "DX", "DW": "DW"}
TICK_LENGTH: dict[str, int] = {"F": 1, "DX": 1, "DW": 1, "B": 2}  # NOTE [ Timeline boxes ], rule 6
_PLANNED = re.compile(r"^(\d+)(F|I|W|B)(\d+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One executed pipeline action (NOTE [ Timeline boxes ]).

    Attributes:
        lane: "rank r · stage s" or "stage s".
        rank, stage, step, microbatch: its tags (rank and step may be None).
        action: "F", "DX", "DW" or "B"; torch_action: as torch named it ("I", "W", ...).
        start_seq, end_seq, start_us, end_us: where its box starts and ends (microseconds from the trace's
            first event): its start and end events, or its first and last event.
        bounded: its box is from its own `action_started` to its `action_finished` event.
        tick, tick_end: its box in the in-process schedule's unit ticks, or None.
        replays: how many replays ran in it; replay_spans: (handle, start_seq, end_seq, start_us, end_us).
    """

    lane: str
    rank: Any
    stage: Any
    step: Any
    microbatch: Any
    action: str
    torch_action: str
    start_seq: int
    end_seq: int
    start_us: float
    end_us: float
    bounded: bool = False
    tick: int | None = None
    tick_end: int | None = None
    replays: int = 0
    replay_spans: tuple[tuple[int, int, int, float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class OrderCheck:
    """A lane group's planned and executed action order ("0F0 0F1 ..."), and where they first differ."""

    lane: str
    planned: str
    executed: str
    same: bool
    first_difference: int | None


@dataclass(frozen=True, slots=True)
class Busy:
    """One device's (rank's) or stage's share of a step (NOTE [ Bubbles ]), in the step's unit.

    Attributes:
        busy: time inside its actions (their union); idle: the rest of the step.
        bubble: idle over the step time, 0..1.
        actions: how many actions it ran in the step.
    """

    busy: float
    idle: float
    bubble: float
    actions: int


@dataclass(frozen=True, slots=True)
class StepBubbles:
    """One step's time and bubbles.

    Attributes:
        step: the step tag (None for a run without step tags).
        start, end, length: the step in `Bubbles.unit` (length = end - start).
        wall_us: its recorded time in microseconds (the same as `length` in a distributed trace).
        by_rank: rank -> `Busy` (empty in-process: NOTE [ Bubbles ], rule 2).
        by_stage: stage -> `Busy`.
        bubble: the idle share of the whole step over its devices (the ranks, or the stages in-process):
            their idle time summed over (devices x step time).
    """

    step: Any
    start: float
    end: float
    length: float
    wall_us: float
    by_rank: dict[Any, Busy]
    by_stage: dict[Any, Busy]
    bubble: float


@dataclass(frozen=True, slots=True)
class Bubbles:
    """Step time and bubbles of every recorded step (NOTE [ Bubbles ]).

    Attributes:
        unit: "µs" (recorded time, a distributed trace) or "tick" (an in-process schedule's unit ticks).
        exact: every action has its own start and end events (else the bubbles are upper bounds).
        steps: one `StepBubbles` per step, in order; () for a run without pipeline actions.
    """

    unit: Literal["µs", "tick"] = "µs"
    exact: bool = True
    steps: tuple[StepBubbles, ...] = ()

    def step(self, step: Any) -> StepBubbles | None:
        """The figures of the step tagged `step`, or None."""
        return next((s for s in self.steps if s.step == step), None)


def _lane(rank: Any, stage: Any) -> str:
    return f"rank {rank} · stage {stage}" if rank is not None else f"stage {stage}"


def _ticks(trace: Trace) -> dict[tuple[Any, Any, Any], int]:
    """(stage, microbatch, action) -> start tick of the in-process schedule (`meta["actions"]`)."""
    ticks = {}
    for item in trace.meta.get("actions") or ():
        if isinstance(item, (list, tuple)) and len(item) >= 4 and isinstance(item[3], int):
            ticks[item[1], item[2], item[0]] = item[3]
    return ticks


def _build(trace: Trace) -> tuple[Action, ...]:
    events = trace.events
    if not events:
        return ()
    origin = events[0].t_ns
    done: list[dict[str, Any]] = []
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}  # key -> its current (last started) action
    open_replays: dict[tuple[Any, int | None], tuple[dict[str, Any], int, float]] = {}
    for e in events:
        tags = e.tags
        if not tags:
            continue
        torch_action = tags.get("action")
        if torch_action not in TORCH_ACTIONS or tags.get("stage") is None:
            continue
        action = TORCH_ACTIONS[torch_action]
        rank = tags.get("rank")
        key = (rank, tags.get("step"), tags.get("stage"), tags.get("microbatch"), action)
        us = (e.t_ns - origin) / 1000.0
        row = rows.get(key)
        if row is None or (e.kind == "action_started" and row["finished"]):  # rule 2
            row = rows[key] = {"lane": _lane(rank, tags["stage"]), "rank": rank, "stage": tags["stage"],
                               "step": tags.get("step"), "microbatch": tags.get("microbatch"), "action": action,
                               "torch_action": torch_action, "start_seq": e.seq, "end_seq": e.seq,
                               "start_us": us, "end_us": us, "replays": 0, "replay_spans": [],
                               "started": e.kind == "action_started", "finished": False}
            done.append(row)
        if not (row["started"] and row["finished"]):  # a finished bounded box does not stretch
            row["end_seq"], row["end_us"] = max(row["end_seq"], e.seq), max(row["end_us"], us)
        if e.kind == "action_finished":
            row["finished"] = True
        elif e.kind == "replay_started":
            row["replays"] += 1
            open_replays[rank, e.handle_id] = (row, e.seq, us)
        elif e.kind in ("replay_finished", "replay_failed") and (rank, e.handle_id) in open_replays:
            where, start_seq, start = open_replays.pop((rank, e.handle_id))
            where["replay_spans"].append((e.handle_id, start_seq, e.seq, start, us))
    ticks = _ticks(trace)
    out = []
    for row in sorted(done, key=lambda r: r["start_seq"]):
        tick = ticks.get((row["stage"], row["microbatch"], row["action"])) if row["step"] in (None, 0) else None
        started, finished = row.pop("started"), row.pop("finished")
        out.append(Action(bounded=started and finished, tick=tick,
                          tick_end=None if tick is None else tick + TICK_LENGTH.get(row["action"], 1),
                          **{**row, "replay_spans": tuple(row["replay_spans"])}))
    return tuple(out)


def actions(trace: Trace) -> tuple[Action, ...]:
    """Every executed action, in order of its start (NOTE [ Timeline boxes ]); once per trace."""
    return derived(trace, "actions", _build)


def planned_vs_executed(trace: Trace) -> tuple[OrderCheck, ...]:
    """Per lane group (rank, or stage in-process): the planned and the executed action order."""
    done = actions(trace)
    steps = sorted({a.step for a in done if a.step is not None}, key=_order)
    first = [a for a in done if a.step == (steps[0] if steps else None)]
    dist = trace.meta.get("distributed") or {}
    planned_order = dist.get("planned_order") if isinstance(dist, dict) else None
    rows = []
    if isinstance(planned_order, dict):
        for rank, plan in sorted(planned_order.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            planned = []
            for text in plan if isinstance(plan, list) else ():  # a hand-edited file may hold anything here
                match = _PLANNED.match(str(text)) if text is not None else None
                if match:
                    planned.append(f"{match.group(1)}{TORCH_ACTIONS[match.group(2)]}{match.group(3)}")
            executed = [f"{a.stage}{a.action}{a.microbatch}" for a in first if str(a.rank) == str(rank)]
            rows.append(_compare(f"rank {rank}", planned, executed))
    elif trace.meta.get("actions"):
        stages = sorted({int(item[1]) for item in trace.meta["actions"]})
        for stage in stages:
            planned = [f"{s}{k}{m}" for k, s, m, *_ in trace.meta["actions"] if s == stage]
            executed = [f"{a.stage}{a.action}{a.microbatch}" for a in first if a.stage == stage]
            rows.append(_compare(f"stage {stage}", planned, executed))
    return tuple(rows)


def _compare(lane: str, planned: list[str], executed: list[str]) -> OrderCheck:
    diff = next((i for i, (p, e) in enumerate(zip(planned, executed)) if p != e), None)
    if diff is None and len(planned) != len(executed):
        diff = min(len(planned), len(executed))
    return OrderCheck(lane, " ".join(planned), " ".join(executed), diff is None, diff)


def _busy(spans: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end] spans."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _in_process(trace: Trace, done: tuple[Action, ...]) -> bool:
    """An in-process schedule: every action has a tick and no rank ran it (NOTE [ Bubbles ], rule 2)."""
    return bool(done) and all(a.tick is not None and a.rank is None for a in done) and \
        not trace.meta.get("distributed")


def _busy_of(done: list[Action], span: Any, length: float) -> Busy:
    busy = _busy([span(a) for a in done])
    idle = max(length - busy, 0.0)
    return Busy(busy=busy, idle=idle, bubble=idle / length if length > 0 else 0.0, actions=len(done))


def _order(value: Any) -> tuple[int, Any]:
    """A sort key for tag values of any type (a loaded trace's `step` may be 0 in one event and "0" in another):
    numbers in their order, then anything else by its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def _grouped(done: list[Action], key: Any) -> dict[Any, list[Action]]:
    groups: dict[Any, list[Action]] = {}
    for a in done:
        groups.setdefault(key(a), []).append(a)
    return dict(sorted(groups.items(), key=lambda kv: (str(type(kv[0])), kv[0])))


def bubbles(trace: Trace) -> Bubbles:
    """Step time and bubble per rank and stage, for each recorded step (NOTE [ Bubbles ]); once per trace."""
    def build(t: Trace) -> Bubbles:
        done = actions(t)
        if not done:
            return Bubbles()
        ticked = _in_process(t, done)
        span = (lambda a: (float(a.tick), float(a.tick_end))) if ticked else (lambda a: (a.start_us, a.end_us))
        by_step: dict[Any, list[Action]] = {}
        for a in done:
            by_step.setdefault(a.step, []).append(a)
        figures = []
        for step in sorted(by_step, key=lambda s: (s is not None, _order(s))):
            these = by_step[step]
            start, end = min(span(a)[0] for a in these), max(span(a)[1] for a in these)
            length = end - start
            wall = max(a.end_us for a in these) - min(a.start_us for a in these)
            by_rank = {} if ticked else {r: _busy_of(g, span, length) for r, g in
                                         _grouped(these, lambda a: a.rank).items() if r is not None}
            by_stage = {s: _busy_of(g, span, length) for s, g in _grouped(these, lambda a: a.stage).items()}
            devices = by_rank or by_stage
            idle = sum(b.idle for b in devices.values())
            share = idle / (len(devices) * length) if devices and length > 0 else 0.0
            figures.append(StepBubbles(step=step, start=start, end=end, length=length, wall_us=wall,
                                       by_rank=by_rank, by_stage=by_stage, bubble=share))
        return Bubbles(unit="tick" if ticked else "µs", exact=all(a.bounded for a in done), steps=tuple(figures))
    return derived(trace, "bubbles", build)


def tick_at(trace: Trace, seq: int) -> float | None:
    """Where event `seq` falls on an in-process run's tick axis (NOTE [ Timeline boxes ], rule 6): inside an
    action, its tick plus the share of the action's events before it; between actions, the end of the last
    one before it; None for a run without ticks or before its first action."""
    done = [(a, a.tick, a.tick_end) for a in actions(trace) if a.tick is not None and a.tick_end is not None]
    if not done:
        return None
    starts = [a.start_seq for a, _, _ in done]
    i = bisect_right(starts, seq) - 1
    if i < 0:
        return None
    a, tick, tick_end = done[i]
    if seq > a.end_seq:
        return float(tick_end)
    width = a.end_seq - a.start_seq + 1
    return tick + (tick_end - tick) * (seq - a.start_seq) / width


def _amount(value: float, unit: str) -> str:
    if unit == "tick":
        return f"{value:g} tick" + ("" if value == 1 else "s")
    if value >= 1000:
        return f"{value / 1000:.2f} ms"
    return f"{value:.0f} µs"


def bubble_lines(trace: Trace) -> list[str]:
    """The step time and bubbles in words, one line per step ("step 0: 3.21 ms; bubble 27% (rank 0 31%,
    rank 1 23%)"), for `ckpt-viz info` and the pages; [] for a run without pipeline actions."""
    found = bubbles(trace)
    lines = []
    for s in found.steps:
        devices = s.by_rank or s.by_stage
        word = "rank" if s.by_rank else "stage"
        each = ", ".join(f"{word} {k} {100 * b.bubble:.0f}%" for k, b in devices.items())
        name = "the step" if s.step is None else f"step {s.step}"
        wall = f" ({_amount(s.wall_us, 'µs')} recorded)" if found.unit == "tick" else ""
        lines.append(f"{name}: {_amount(s.length, found.unit)}{wall}; bubble {100 * s.bubble:.0f}% ({each})"
                     + ("" if found.exact else "; an upper bound: actions without start and end events"))
    return lines


def bubble_rows(trace: Trace, step: Any = None) -> list[dict[str, Any]]:
    """A step's figures per rank, then per stage, in words: {"": "rank 0", "busy": "110.21 ms", "idle": ...,
    "bubble": "47%", "actions": 24}; `step`: the step tag (default: the first recorded step)."""
    found = bubbles(trace)
    figures = found.step(step) or (found.steps[0] if found.steps else None)
    if figures is None:
        return []
    return [{"": f"{word} {key}", "busy": _amount(b.busy, found.unit), "idle": _amount(b.idle, found.unit),
             "bubble": f"{100 * b.bubble:.0f}%", "actions": b.actions}
            for word, group in (("rank", figures.by_rank), ("stage", figures.by_stage)) for key, b in group.items()]
