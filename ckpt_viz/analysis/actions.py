"""Pipeline actions, derived once: each executed F / DX / DW / B action with its micro-batch, the plan
against the executed order, and the step time and bubble per rank and per stage.

    actions(trace)            -> (Action(lane="rank 0 · stage 0", action="F", microbatch=0, start_us=..., ...), ...)
    planned_vs_executed(trace) -> (OrderCheck(lane="rank 0", planned="0F0 0F1 ...", executed=..., same=True), ...)
    bubbles(trace)            -> Bubbles(step_us=..., by_rank={0: 0.31, ...}, by_stage={...})

Read from the recorded events' tags (`action`, `stage`, `microbatch`, `step`, `rank`), so the same
answer comes from a saved trace, the in-process pipeline mode and a merged multi-rank trace. Standard
library only; the drawing is `ckpt_viz.render.timeline`.

NOTE [ Timeline boxes ]
  1. An action is the events tagged with one (rank, step, stage, microbatch, action); its box runs from its
     first event to its last. torch's I is drawn as DX and W as DW (they run `backward_input` and
     `backward_weight`); metadata inference (META) is left out.
  2. Replays (replay_started -> replay_finished of a handle) are kept with the action they ran in.
  3. Lanes: "rank r · stage s" when events carry a rank, else "stage s".
  4. The plan: a merged trace's `meta["distributed"]["planned_order"]` (torch's "0F1" per rank, compute
     actions only) or the in-process `meta["actions"]`; the executed order is each lane's actions in time
     order, of the first recorded step.

NOTE [ Bubbles ]
  1. A step's time is from the first action's start to the last action's end, over every rank (a merged
     trace's clocks are aligned to rank 0's). Per rank (a device) and per stage, the busy time is the union
     of its action boxes in that step; the bubble is the step time not busy, as a share of the step time.
  2. Boxes span a rank's recorded events only: work before an action's first event or after its last (a
     send, a receive, ops outside any checkpoint) counts as idle. The figure is an upper bound on the bubble
     of the schedule as run, exact for the order and the overlaps.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ckpt_viz.analysis._cache import derived
from ckpt_viz.trace import Trace

__all__ = ["TORCH_ACTIONS", "Action", "Bubbles", "OrderCheck", "actions", "bubbles", "planned_vs_executed"]

TORCH_ACTIONS: dict[str, str] = {"F": "F", "I": "DX", "W": "DW", "B": "B", "DX": "DX", "DW": "DW"}
_PLANNED = re.compile(r"^(\d+)(F|I|W|B)(\d+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One executed pipeline action (NOTE [ Timeline boxes ]).

    Attributes:
        lane: "rank r · stage s" or "stage s".
        rank, stage, step, microbatch: its tags (rank and step may be None).
        action: "F", "DX", "DW" or "B"; torch_action: as torch named it ("I", "W", ...).
        start_seq, end_seq, start_us, end_us: its first and last event (microseconds from the trace's first).
        tick: its start in the in-process schedule's unit ticks, or None.
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
    tick: int | None
    replays: int
    replay_spans: tuple[tuple[int, int, int, float, float], ...]


@dataclass(frozen=True, slots=True)
class OrderCheck:
    """A lane group's planned and executed action order ("0F0 0F1 ..."), and where they first differ."""

    lane: str
    planned: str
    executed: str
    same: bool
    first_difference: int | None


@dataclass(frozen=True, slots=True)
class Bubbles:
    """Step time and bubble share per rank and per stage (NOTE [ Bubbles ]), for each recorded step.

    Attributes:
        steps: the recorded steps, in order (None for a run without step tags).
        step_us: step -> its time in microseconds.
        by_rank: step -> rank -> (busy microseconds, bubble share 0..1).
        by_stage: step -> stage -> (busy microseconds, bubble share 0..1).
    """

    steps: tuple[Any, ...] = ()
    step_us: dict[Any, float] = field(default_factory=dict)
    by_rank: dict[Any, dict[Any, tuple[float, float]]] = field(default_factory=dict)
    by_stage: dict[Any, dict[Any, tuple[float, float]]] = field(default_factory=dict)


def _order(value: Any) -> tuple[int, Any]:
    """A sort key for tag values of any type (a loaded trace's `step` may be 0 in one event and "0" in another):
    numbers in their order, then anything else by its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def _lane(rank: Any, stage: Any) -> str:
    return f"rank {rank} · stage {stage}" if rank is not None else f"stage {stage}"


def _ticks(trace: Trace) -> dict[tuple[Any, Any, Any], int]:
    """(stage, microbatch, action) -> start tick of the in-process schedule (`meta["actions"]`)."""
    ticks = {}
    for item in trace.meta.get("actions") or ():
        if isinstance(item, (list, tuple)) and len(item) >= 4:
            ticks[item[1], item[2], item[0]] = item[3]
    return ticks


def _build(trace: Trace) -> tuple[Action, ...]:
    events = trace.events
    if not events:
        return ()
    origin = events[0].t_ns
    rows: dict[tuple, dict[str, Any]] = {}
    open_replays: dict[Any, tuple] = {}
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
        if row is None:
            row = rows[key] = {"lane": _lane(rank, tags["stage"]), "rank": rank, "stage": tags["stage"],
                               "step": tags.get("step"), "microbatch": tags.get("microbatch"), "action": action,
                               "torch_action": torch_action, "start_seq": e.seq, "end_seq": e.seq,
                               "start_us": us, "end_us": us, "replays": 0, "replay_spans": []}
        row["end_seq"], row["end_us"] = max(row["end_seq"], e.seq), max(row["end_us"], us)
        if e.kind == "replay_started":
            row["replays"] += 1
            open_replays[rank, e.handle_id] = (key, e.seq, us)
        elif e.kind in ("replay_finished", "replay_failed") and (rank, e.handle_id) in open_replays:
            where, start_seq, start = open_replays.pop((rank, e.handle_id))
            rows[where]["replay_spans"].append((e.handle_id, start_seq, e.seq, start, us))
    ticks = _ticks(trace)
    out = []
    for row in sorted(rows.values(), key=lambda r: r["start_seq"]):
        tick = ticks.get((row["stage"], row["microbatch"], row["action"])) if row["step"] in (None, 0) else None
        out.append(Action(tick=tick, **{**row, "replay_spans": tuple(row["replay_spans"])}))
    return tuple(out)


def actions(trace: Trace) -> tuple[Action, ...]:
    """Every executed action, in order of its first event (NOTE [ Timeline boxes ]); once per trace."""
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


def bubbles(trace: Trace) -> Bubbles:
    """Step time and bubble per rank and stage, for each recorded step (NOTE [ Bubbles ]); once per trace."""
    def build(t: Trace) -> Bubbles:
        by_step: dict[Any, list[Action]] = {}
        for a in actions(t):
            by_step.setdefault(a.step, []).append(a)
        steps = tuple(sorted(by_step, key=lambda s: (s is not None, _order(s))))
        step_us, by_rank, by_stage = {}, {}, {}
        for step in steps:
            done = by_step[step]
            length = max(a.end_us for a in done) - min(a.start_us for a in done)
            step_us[step] = length
            for key, into in ((lambda a: a.rank, by_rank), (lambda a: a.stage, by_stage)):
                groups: dict[Any, list[tuple[float, float]]] = {}
                for a in done:
                    groups.setdefault(key(a), []).append((a.start_us, a.end_us))
                into[step] = {g: (busy := _busy(spans), 1.0 - busy / length if length > 0 else 0.0)
                              for g, spans in sorted(groups.items(), key=lambda kv: str(kv[0]))}
        return Bubbles(steps=steps, step_us=step_us, by_rank=by_rank, by_stage=by_stage)
    return derived(trace, "bubbles", build)
