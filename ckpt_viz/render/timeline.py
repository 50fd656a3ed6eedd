"""The schedule timeline: stage (or rank and stage) by time, one box per F / DX / DW / B action with its micro-batch.

Pure functions of the trace, read from the recorded events (their `action`, `stage`,
`microbatch`, `step` and `rank` tags), so the same picture comes from a saved trace, the
in-process pipeline mode and a merged multi-rank trace (`ckpt-viz merge`). They import
altair for the charts and never torch or a UI runtime. Colours: `ckpt_viz.render.palette`.

    timeline_actions(trace)  -> [{lane, rank, stage, step, microbatch, action, start_seq, end_seq,
                                  start_us, end_us, tick, replays}, ...]
    planned_vs_executed(trace) -> [{lane, planned, executed, same, first_difference}, ...] or []
    render_timeline(trace, cursor=seq, x="time" | "tick" | "events")
    render_stage_memory(trace, cursor=seq)

NOTE [ Timeline boxes ]
  1. An action is the events tagged with one (rank, step, stage, microbatch, action); its
     box runs from its first event to its last. torch's I is drawn as DX and W as DW (they
     run `backward_input` and `backward_weight`); metadata inference (META) is left out.
  2. x = "time": microseconds from the first event (the merged trace's aligned clock);
     "tick": the in-process schedule's unit ticks (`meta["actions"]`), an action's box
     one tick long (B two); "events": event positions.
  3. Replays (replay_started -> replay_finished of a handle) are thin green boxes inside
     the action box they ran in, on the same lane.
  4. Lanes: "rank r · stage s" when events carry a rank, else "stage s".
  5. The plan: a merged trace's `meta["distributed"]["planned_order"]` (torch's "0F1" per
     rank, compute actions only) or the in-process `meta["actions"]`; the executed order is
     each lane's actions in time order, of the first recorded step.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from typing import Any

import altair as alt

from ckpt_viz.render import palette
from ckpt_viz.trace import Trace
from ckpt_viz.trace.cache import derived, event_column

__all__ = ["TORCH_ACTIONS", "default_x", "planned_vs_executed", "render_stage_memory", "render_timeline",
           "stage_memory_rows", "timeline_actions"]

TORCH_ACTIONS: dict[str, str] = {"F": "F", "I": "DX", "W": "DW", "B": "B", "DX": "DX", "DW": "DW"}
_PLANNED = re.compile(r"^(\d+)(F|I|W|B)(\d+)$")
_BOX, _REPLAY = 18, 6  # bar heights in pixels


def _lane(rank: Any, stage: Any) -> str:
    return f"rank {rank} · stage {stage}" if rank is not None else f"stage {stage}"


def timeline_actions(trace: Trace) -> list[dict[str, Any]]:
    """One row per executed action, in order of its first event (NOTE [ Timeline boxes ]); once per trace."""
    return [dict(r) for r in derived(trace, "timeline:actions", _actions)]


def _actions(trace: Trace) -> list[dict[str, Any]]:
    # Only events tagged with an action and a stage make boxes: they are found from the tags column alone (a loaded
    # trace's tags are shared objects, read without building an Event), and only their other fields are read.
    tags_column = event_column(trace, "tags")
    if not len(tags_column):
        return []
    acting = [i for i, tags in enumerate(tags_column)
              if tags and tags.get("action") in TORCH_ACTIONS and tags.get("stage") is not None]
    if not acting:
        return []
    t_ns, seqs = event_column(trace, "t_ns"), event_column(trace, "seq")
    kinds, handles = event_column(trace, "kind"), event_column(trace, "handle_id")
    origin = t_ns[0]
    rows: dict[tuple, dict[str, Any]] = {}
    open_replays: dict[Any, tuple] = {}
    for i in acting:
        tags, seq, kind, handle = tags_column[i], seqs[i], kinds[i], handles[i]
        action = TORCH_ACTIONS[tags["action"]]
        rank = tags.get("rank")
        key = (rank, tags.get("step"), tags.get("stage"), tags.get("microbatch"), action)
        row = rows.get(key)
        us = (t_ns[i] - origin) / 1000.0
        if row is None:
            row = rows[key] = {"lane": _lane(rank, tags["stage"]), "rank": rank, "stage": tags["stage"],
                               "step": tags.get("step"), "microbatch": tags.get("microbatch"), "action": action,
                               "torch_action": tags.get("action"), "start_seq": seq, "end_seq": seq,
                               "start_us": us, "end_us": us, "replays": 0, "replay_spans": []}
        row["end_seq"], row["end_us"] = max(row["end_seq"], seq), max(row["end_us"], us)
        if kind == "replay_started":
            row["replays"] += 1
            open_replays[rank, handle] = (key, seq, us)
        elif kind in ("replay_finished", "replay_failed") and (rank, handle) in open_replays:
            where, start_seq, start = open_replays.pop((rank, handle))
            rows[where]["replay_spans"].append((handle, start_seq, seq, start, us))
    out = sorted(rows.values(), key=lambda r: r["start_seq"])
    ticks = _ticks(trace)
    for row in out:
        tick = ticks.get((row["stage"], row["microbatch"], row["action"])) if row["step"] in (None, 0) else None
        row["tick"] = tick
    return out


def _ticks(trace: Trace) -> dict[tuple, int]:
    """(stage, microbatch, action) -> start tick of the in-process schedule (`meta["actions"]`)."""
    ticks = {}
    for item in trace.meta.get("actions") or ():
        if isinstance(item, (list, tuple)) and len(item) >= 4:
            ticks[item[1], item[2], item[0]] = item[3]
    return ticks


def planned_vs_executed(trace: Trace) -> list[dict[str, Any]]:
    """Per lane group (rank, or stage in-process): the planned and the executed action order (NOTE rule 5)."""
    actions = timeline_actions(trace)
    steps = sorted({a["step"] for a in actions if a["step"] is not None})
    first = [a for a in actions if a["step"] == (steps[0] if steps else None)]
    dist = trace.meta.get("distributed") or {}
    planned_order = dist.get("planned_order")
    rows = []
    if isinstance(planned_order, dict):
        for rank, plan in sorted(planned_order.items(), key=lambda kv: int(kv[0])):
            planned = []
            for text in plan or ():
                match = _PLANNED.match(str(text)) if text is not None else None
                if match:
                    planned.append(f"{match.group(1)}{TORCH_ACTIONS[match.group(2)]}{match.group(3)}")
            executed = [f"{a['stage']}{a['action']}{a['microbatch']}" for a in first if str(a["rank"]) == str(rank)]
            rows.append(_compare(f"rank {rank}", planned, executed))
    elif trace.meta.get("actions"):
        stages = sorted({int(item[1]) for item in trace.meta["actions"]})
        for stage in stages:
            planned = [f"{s}{k}{m}" for k, s, m, *_ in trace.meta["actions"] if s == stage]
            executed = [f"{a['stage']}{a['action']}{a['microbatch']}" for a in first if a["stage"] == stage]
            rows.append(_compare(f"stage {stage}", planned, executed))
    return rows


def _compare(lane: str, planned: list[str], executed: list[str]) -> dict[str, Any]:
    diff = next((i for i, (p, e) in enumerate(zip(planned, executed)) if p != e), None)
    if diff is None and len(planned) != len(executed):
        diff = min(len(planned), len(executed))
    return {"lane": lane, "planned": " ".join(planned), "executed": " ".join(executed), "same": diff is None,
            "first_difference": diff}


def _x_of(row: dict[str, Any], x: str) -> tuple[float, float] | None:
    if x == "tick":
        if row["tick"] is None:
            return None
        return float(row["tick"]), float(row["tick"] + (2 if row["action"] == "B" else 1))
    if x == "events":
        return float(row["start_seq"]), float(row["end_seq"] + 1)
    return row["start_us"], max(row["end_us"], row["start_us"] + 1.0)


def _cursor_x(trace: Trace, actions: list[dict[str, Any]], cursor: int | None, x: str) -> float | None:
    if cursor is None:
        return None
    if x == "events":
        return float(cursor)
    started = [a for a in actions if a["start_seq"] <= cursor]
    if x == "tick":
        inside = [a for a in started if a["tick"] is not None]
        return float(inside[-1]["tick"]) + 0.5 if inside else None
    seqs, times = event_column(trace, "seq"), event_column(trace, "t_ns")
    if not len(seqs):
        return None
    index = min(max(bisect_right(seqs, cursor) - 1, 0), len(seqs) - 1)
    return (times[index] - times[0]) / 1000.0


def default_x(trace: Trace) -> str:
    """"tick" for an in-process pipeline run (it has a tick plan), else "time"."""
    return "tick" if trace.meta.get("actions") and not trace.meta.get("distributed") else "time"


def render_timeline(trace: Trace, *, cursor: int | None = None, x: str | None = None,
                    title: str | None = None) -> alt.LayerChart:
    """Stage (or rank and stage) by x, one box per action coloured by kind, replays nested, the cursor marked."""
    x = x or default_x(trace)
    actions = timeline_actions(trace)
    rows, replays = [], []
    for a in actions:
        span = _x_of(a, x)
        if span is None:
            continue
        label = f"{a['action']}{a['microbatch']}"
        rows.append({"lane": a["lane"], "x0": span[0], "x1": span[1], "action": a["action"], "label": label,
                     "what": palette.action_word(a["action"]) + (f" (torch {a['torch_action']})"
                                                                  if a["torch_action"] in ("I", "W") else ""),
                     "microbatch": a["microbatch"], "step": a["step"], "replays": a["replays"],
                     "seqs": f"{a['start_seq']}-{a['end_seq']}"})
        for handle, s0, s1, t0, t1 in a["replay_spans"]:
            if x == "time":
                r0, r1 = t0, max(t1, t0 + 0.5)
            elif x == "events":
                r0, r1 = float(s0), float(s1 + 1)
            else:  # ticks: spread the replays of the action across its box
                n, i = len(a["replay_spans"]), a["replay_spans"].index((handle, s0, s1, t0, t1))
                width = (span[1] - span[0]) / max(n, 1)
                r0, r1 = span[0] + i * width + 0.05, span[0] + (i + 1) * width - 0.05
            replays.append({"lane": a["lane"], "x0": r0, "x1": r1, "what": f"replay of h{handle}",
                            "seqs": f"{s0}-{s1}"})
    lanes = sorted({r["lane"] for r in rows}, key=_lane_key)
    axis_title = {"time": "time (µs)", "tick": "schedule tick", "events": "event position"}[x]
    y = alt.Y("lane:N", sort=lanes, title=None)
    scale = alt.Scale(domain=list(palette.ACTIONS), range=[palette.ACTION_COLOURS[a] for a in palette.ACTIONS])
    base = alt.Chart(alt.Data(values=rows))
    boxes = base.mark_bar(height=_BOX, stroke="white", strokeWidth=0.5).encode(
        x=alt.X("x0:Q", title=axis_title), x2="x1:Q", y=y,
        color=alt.Color("action:N", scale=scale, title="action"),
        tooltip=["lane:N", "label:N", "what:N", "step:O", "replays:Q", "seqs:N"])
    text = base.mark_text(fontSize=9, color="white", baseline="middle").encode(
        x=alt.X("xm:Q"), y=y, text="label:N").transform_calculate(xm="(datum.x0 + datum.x1) / 2")
    layers: list[Any] = [boxes, text]
    if replays:
        layers.append(alt.Chart(alt.Data(values=replays)).mark_bar(
            height=_REPLAY, color=palette.STATE_COLOURS["replaying"], yOffset=_BOX / 2 - _REPLAY / 2 - 1).encode(
            x="x0:Q", x2="x1:Q", y=y, tooltip=["lane:N", "what:N", "seqs:N"]))
    at = _cursor_x(trace, actions, cursor, x)
    if at is not None:
        layers.append(alt.Chart(alt.Data(values=[{"x": at, "cursor": f"cursor (seq {cursor})"}])).mark_rule(
            color=palette.CURSOR_COLOUR, strokeWidth=2).encode(x="x:Q", tooltip=["cursor:N"]))
    return alt.layer(*layers).properties(height=max(60, 30 * len(lanes)),
                                         title=title or trace.meta.get("schedule") or "schedule")


def _lane_key(lane: str) -> tuple:
    return tuple(int(n) for n in re.findall(r"\d+", lane))


def stage_memory_rows(trace: Trace) -> list[dict[str, Any]]:
    """Bytes held per stage after each memory sample with a by-stage reading: {seq, stage, bytes}; in a merged
    trace the stage is named with its rank ("rank 1 · stage 2")."""
    by_rank = (trace.meta.get("distributed") or {}).get("stages_by_rank") or {}
    rank_of = {str(stage): rank for rank, stages in by_rank.items() for stage in stages or ()}
    rows = []
    for sample in trace.memory:
        for stage, cats in (sample.by_stage or {}).items():
            lane = _lane(rank_of.get(str(stage)), stage)
            rows.append({"seq": sample.seq, "stage": lane, "bytes": sum(cats.values())})
    return rows


def render_stage_memory(trace: Trace, *, cursor: int | None = None) -> alt.LayerChart:
    """Bytes held per pipeline stage over the run (a line per stage, x = event seq), the cursor marked."""
    rows = stage_memory_rows(trace)
    line = alt.Chart(alt.Data(values=rows)).mark_line(interpolate="step-after").encode(
        x=alt.X("seq:Q", title="event seq"), y=alt.Y("bytes:Q", title="bytes held"),
        color=alt.Color("stage:N", title="stage"), tooltip=["stage:N", "seq:Q", "bytes:Q"])
    layers: list[Any] = [line]
    if cursor is not None:
        layers.append(alt.Chart(alt.Data(values=[{"seq": cursor}])).mark_rule(
            color=palette.CURSOR_COLOUR, strokeWidth=2).encode(x="seq:Q"))
    return alt.layer(*layers).properties(height=220)
