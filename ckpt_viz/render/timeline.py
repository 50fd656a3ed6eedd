"""The schedule timeline: stage (or rank and stage) by time, one box per F / DX / DW / B action with its micro-batch.

Draws `ckpt_viz.analysis.actions` (the executed actions, NOTE [ Timeline boxes ] there) and the
bytes per stage of `ckpt_viz.analysis.memory.stage_memory`, so the same picture comes from a saved
trace, the in-process pipeline mode and a merged multi-rank trace (`ckpt-viz merge`). Imports
altair and never torch or a UI runtime. Colours: `ckpt_viz.render.palette`; words:
`ckpt_viz.analysis.words`.

    render_timeline(trace, cursor=seq, x="time" | "tick" | "events")
    render_stage_memory(trace, cursor=seq)

NOTE [ Timeline x ]
  1. x = "time": microseconds from the first event (the merged trace's aligned clock);
     "tick": the in-process schedule's unit ticks (`meta["actions"]`), an action's box
     one tick long (B two); "events": event seqs.
  2. Replays are thin green boxes inside the action box they ran in, on the same lane.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from typing import Any

import altair as alt

from ckpt_viz.analysis.actions import Action, actions
from ckpt_viz.analysis.memory import stage_memory
from ckpt_viz.analysis.passes import PARTS
from ckpt_viz.analysis.words import part_word
from ckpt_viz.render import palette
from ckpt_viz.render.chartdata import collecting, rows_data
from ckpt_viz.trace import Trace

__all__ = ["default_x", "render_stage_memory", "render_timeline", "stage_memory_rows"]

_BOX, _REPLAY = 18, 6  # bar heights in pixels


def _x_of(a: Action, x: str) -> tuple[float, float] | None:
    if x == "tick":
        if a.tick is None:
            return None
        return float(a.tick), float(a.tick + (2 if a.action == "B" else 1))
    if x == "events":
        return float(a.start_seq), float(a.end_seq + 1)
    return a.start_us, max(a.end_us, a.start_us + 1.0)


def _cursor_x(trace: Trace, done: tuple[Action, ...], cursor: int | None, x: str) -> float | None:
    if cursor is None:
        return None
    if x == "events":
        return float(cursor)
    if x == "tick":
        inside = [a for a in done if a.start_seq <= cursor and a.tick is not None]
        return float(inside[-1].tick) + 0.5 if inside else None  # type: ignore[operator]
    events = trace.events
    if not events:
        return None
    index = min(max(bisect_right(events, cursor, key=lambda e: e.seq) - 1, 0), len(events) - 1)
    return (events[index].t_ns - events[0].t_ns) / 1000.0


def default_x(trace: Trace) -> str:
    """"tick" for an in-process pipeline run (it has a tick plan), else "time"."""
    return "tick" if trace.meta.get("actions") and not trace.meta.get("distributed") else "time"


def render_timeline(trace: Trace, *, cursor: int | None = None, x: str | None = None, title: str | None = None,
                    datasets: dict[str, list[dict]] | None = None) -> alt.LayerChart:
    """Stage (or rank and stage) by x, one box per action coloured by kind, replays nested, the cursor marked.

    Args:
        cursor: an event seq, drawn as a rule.
        x: "time", "tick" or "events" (NOTE [ Timeline x ]); default `default_x(trace)`.
        title: the chart's title (default: the schedule).
        datasets: a dict to fill with the layers' rows, by name (`ckpt_viz.render.chartdata`).
    """
    with collecting(datasets):
        return _timeline(trace, cursor, x or default_x(trace), title)


def _timeline(trace: Trace, cursor: int | None, x: str, title: str | None) -> alt.LayerChart:
    done = actions(trace)
    rows, replays = [], []
    for a in done:
        span = _x_of(a, x)
        if span is None:
            continue
        label = f"{a.action}{a.microbatch}"
        rows.append({"lane": a.lane, "x0": span[0], "x1": span[1], "action": a.action, "label": label,
                     "what": part_word(a.action) + (f" (torch {a.torch_action})" if a.torch_action in ("I", "W")
                                                    else ""),
                     "microbatch": a.microbatch, "step": a.step, "replays": a.replays,
                     "seqs": f"{a.start_seq}-{a.end_seq}"})
        for i, (handle, s0, s1, t0, t1) in enumerate(a.replay_spans):
            if x == "time":
                r0, r1 = t0, max(t1, t0 + 0.5)
            elif x == "events":
                r0, r1 = float(s0), float(s1 + 1)
            else:  # ticks: spread the replays of the action across its box
                width = (span[1] - span[0]) / max(len(a.replay_spans), 1)
                r0, r1 = span[0] + i * width + 0.05, span[0] + (i + 1) * width - 0.05
            replays.append({"lane": a.lane, "x0": r0, "x1": r1, "what": f"replay of h{handle}",
                            "seqs": f"{s0}-{s1}"})
    lanes = sorted({r["lane"] for r in rows}, key=_lane_key)
    axis_title = {"time": "time (µs)", "tick": "schedule tick", "events": "event position"}[x]
    y = alt.Y("lane:N", sort=lanes, title=None)
    scale = alt.Scale(domain=list(PARTS), range=[palette.ACTION_COLOURS[a] for a in PARTS])
    base = alt.Chart(rows_data(rows))
    boxes = base.mark_bar(height=_BOX, stroke="white", strokeWidth=0.5).encode(
        x=alt.X("x0:Q", title=axis_title), x2="x1:Q", y=y,
        color=alt.Color("action:N", scale=scale, title="action"),
        tooltip=[alt.Tooltip("lane:N", title="lane"), alt.Tooltip("label:N", title="action"),
                 alt.Tooltip("what:N", title="what"), alt.Tooltip("step:O", title="step"),
                 alt.Tooltip("replays:Q", title="replays"), alt.Tooltip("seqs:N", title="events")])
    text = base.mark_text(fontSize=9, color="white", baseline="middle").encode(
        x=alt.X("xm:Q"), y=y, text="label:N").transform_calculate(xm="(datum.x0 + datum.x1) / 2")
    layers: list[Any] = [boxes, text]
    if replays:
        layers.append(alt.Chart(rows_data(replays)).mark_bar(
            height=_REPLAY, color=palette.STATE_COLOURS["replaying"], yOffset=_BOX / 2 - _REPLAY / 2 - 1).encode(
            x="x0:Q", x2="x1:Q", y=y, tooltip=["lane:N", "what:N", "seqs:N"]))
    at = _cursor_x(trace, done, cursor, x)
    if at is not None:
        layers.append(alt.Chart(rows_data([{"x": at, "cursor": f"cursor (seq {cursor})"}])).mark_rule(
            color=palette.CURSOR_COLOUR, strokeWidth=2).encode(x="x:Q", tooltip=["cursor:N"]))
    return alt.layer(*layers).properties(height=max(60, 30 * len(lanes)),
                                         title=title or str(trace.meta.get("schedule") or "schedule"))


def _lane_key(lane: str) -> tuple:
    return tuple(int(n) for n in re.findall(r"\d+", lane))


def stage_memory_rows(trace: Trace) -> list[dict[str, Any]]:
    """The chart rows of `analysis.memory.stage_memory`: {seq, stage, bytes}; in a merged trace the stage is
    named with its rank ("rank 1 · stage 2")."""
    return [{"seq": r.seq, "stage": f"rank {r.rank} · stage {r.stage}" if r.rank is not None else f"stage {r.stage}",
             "bytes": r.nbytes} for r in stage_memory(trace)]


def render_stage_memory(trace: Trace, *, cursor: int | None = None,
                        datasets: dict[str, list[dict]] | None = None) -> alt.LayerChart:
    """Bytes held per pipeline stage over the run (a line per stage, x = event seq), the cursor marked."""
    with collecting(datasets):
        return _stage_memory(stage_memory_rows(trace), cursor)


def _stage_memory(rows: list[dict[str, Any]], cursor: int | None) -> alt.LayerChart:
    line = alt.Chart(rows_data(rows)).mark_line(interpolate="step-after").encode(
        x=alt.X("seq:Q", title="event seq"), y=alt.Y("bytes:Q", title="bytes held"),
        color=alt.Color("stage:N", title="stage"),
        tooltip=[alt.Tooltip("stage:N", title="stage"), alt.Tooltip("seq:Q", title="event seq"),
                 alt.Tooltip("bytes:Q", title="bytes held")])
    layers: list[Any] = [line]
    if cursor is not None:
        layers.append(alt.Chart(rows_data([{"seq": cursor}])).mark_rule(
            color=palette.CURSOR_COLOUR, strokeWidth=2).encode(x="seq:Q"))
    return alt.layer(*layers).properties(height=220)
