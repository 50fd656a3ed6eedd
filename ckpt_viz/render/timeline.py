"""The schedule timeline: stage (or rank and stage) by time, one box per F / DX / DW / B action with its micro-batch.

Draws `ckpt_viz.analysis.actions` (the executed actions, NOTE [ Timeline boxes ] there) and the
bytes per stage of `ckpt_viz.analysis.memory.stage_memory`, so the same picture comes from a saved
trace, the in-process pipeline mode and a merged multi-rank trace (`ckpt-viz merge`). Imports
altair and never torch or a UI runtime. Colours: `ckpt_viz.render.palette`; words:
`ckpt_viz.analysis.words`.

    render_timeline(trace, cursor=seq, x="time" | "tick" | "events")
    render_stage_memory(trace, cursor=seq, x=...)   bytes per stage on the same x as the timeline
    render_bubbles(trace, step=...)                  busy and idle time per rank and stage in a step (the words:
                                                     `analysis.actions.bubble_lines`, `bubble_rows`)

NOTE [ Timeline x ]
  1. x = "time": microseconds from the first event (the merged trace's aligned clock);
     "tick": the in-process schedule's unit ticks (`meta["actions"]`), an action's box
     one tick long (B two); "events": event seqs.
  2. Replays are thin green boxes inside the action box they ran in, on the same lane.
  3. The timeline and the memory per stage share their x: the same domain (`x_domain`), the
     same width of y labels (`_LABELS` pixels) and their legends above the plot, so one
     point of the run is at one place in both when the page draws them one above the other.
     A memory reading is placed at its time, its seq, or its tick (`analysis.actions.tick_at`).
"""
from __future__ import annotations

import re
from bisect import bisect_right
from typing import Any

import altair as alt

from ckpt_viz.analysis.actions import Action, actions, bubbles, tick_at
from ckpt_viz.analysis.memory import stage_memory
from ckpt_viz.analysis.passes import PARTS
from ckpt_viz.analysis.words import format_bytes, part_word
from ckpt_viz.render import palette
from ckpt_viz.render.chartdata import collecting, rows_data
from ckpt_viz.render.memory import bytes_y
from ckpt_viz.trace import Trace

__all__ = ["default_x", "render_bubbles", "render_stage_memory", "render_timeline", "stage_memory_rows", "x_domain"]

_BOX, _REPLAY = 18, 6  # bar heights in pixels
_LABELS = 130  # the width of the y labels of the timeline and the memory per stage (NOTE [ Timeline x ], rule 3)
_AXIS_TITLES = {"time": "time (µs from the first event)", "tick": "schedule tick", "events": "event position"}


def _x_of(a: Action, x: str) -> tuple[float, float] | None:
    if x == "tick":
        if a.tick is None or a.tick_end is None:
            return None
        return float(a.tick), float(a.tick_end)
    if x == "events":
        return float(a.start_seq), float(a.end_seq + 1)
    return a.start_us, max(a.end_us, a.start_us + 1.0)


def _cursor_x(trace: Trace, done: tuple[Action, ...], cursor: int | None, x: str) -> float | None:
    if cursor is None:
        return None
    if x == "events":
        return float(cursor)
    if x == "tick":
        return tick_at(trace, cursor)
    events = trace.events
    if not events:
        return None
    index = min(max(bisect_right(events, cursor, key=lambda e: e.seq) - 1, 0), len(events) - 1)
    return (events[index].t_ns - events[0].t_ns) / 1000.0


def x_domain(trace: Trace, x: str) -> list[float]:
    """The x range of the timeline and the memory per stage: the whole run (time, events) or every tick."""
    events = trace.events
    if not events:
        return [0.0, 1.0]
    if x == "events":
        return [float(events[0].seq), float(events[-1].seq + 1)]
    if x == "tick":
        ends = [a.tick_end for a in actions(trace) if a.tick_end is not None]
        return [0.0, float(max(ends, default=1))]
    return [0.0, max((events[-1].t_ns - events[0].t_ns) / 1000.0, 1.0)]


def default_x(trace: Trace) -> str:
    """"tick" for an in-process pipeline run (it has a tick plan), else "time"."""
    return "tick" if trace.meta.get("actions") and not trace.meta.get("distributed") else "time"


def render_timeline(trace: Trace, *, cursor: int | None = None, x: str | None = None, title: str | None = None,
                    datasets: dict[str, list[dict[str, Any]]] | None = None) -> alt.LayerChart:
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
                     "seqs": f"{a.start_seq}-{a.end_seq}", "took": _took(a, x)})
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
    y = alt.Y("lane:N", sort=lanes, title=None, axis=alt.Axis(minExtent=_LABELS, maxExtent=_LABELS))
    scale = alt.Scale(domain=list(PARTS), range=[palette.ACTION_COLOURS[a] for a in PARTS])
    base = alt.Chart(rows_data(rows))
    boxes = base.mark_bar(height=_BOX, stroke="white", strokeWidth=0.5).encode(
        x=alt.X("x0:Q", title=_AXIS_TITLES[x], scale=alt.Scale(domain=x_domain(trace, x), nice=False, zero=False)),
        x2="x1:Q", y=y,
        color=alt.Color("action:N", scale=scale, title="action", legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("lane:N", title="lane"), alt.Tooltip("label:N", title="action"),
                 alt.Tooltip("what:N", title="what"), alt.Tooltip("took:N", title="took"),
                 alt.Tooltip("step:O", title="step"),
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


def _lane_key(lane: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", lane))


def _took(a: Action, x: str) -> str:
    """An action's length in words: its ticks on the tick axis, else its recorded time."""
    if x == "tick" and a.tick is not None and a.tick_end is not None:
        n = a.tick_end - a.tick
        return f"{n} tick" + ("" if n == 1 else "s")
    us = a.end_us - a.start_us
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def stage_memory_rows(trace: Trace, x: str = "time") -> list[dict[str, Any]]:
    """The chart rows of `analysis.memory.stage_memory`: {x, seq, stage, bytes, size}, x on the timeline's axis
    (NOTE [ Timeline x ], rule 3; a reading without a tick is left out on the tick axis); in a merged trace the
    stage is named with its rank ("rank 1 · stage 2")."""
    rows = []
    for r in stage_memory(trace):
        at = r.us if x == "time" else float(r.seq) if x == "events" else tick_at(trace, r.seq)
        if at is None:
            continue
        rows.append({"x": at, "seq": r.seq, "bytes": r.nbytes, "size": format_bytes(r.nbytes),
                     "stage": f"rank {r.rank} · stage {r.stage}" if r.rank is not None else f"stage {r.stage}"})
    return rows


def render_stage_memory(trace: Trace, *, cursor: int | None = None, x: str | None = None,
                        datasets: dict[str, list[dict[str, Any]]] | None = None) -> alt.LayerChart:
    """Bytes held per pipeline stage over the run (a line per stage) on the timeline's x (NOTE [ Timeline x ]),
    in KiB/MiB, the cursor marked."""
    x = x or default_x(trace)
    with collecting(datasets):
        return _stage_memory(trace, stage_memory_rows(trace, x), cursor, x)


def _stage_memory(trace: Trace, rows: list[dict[str, Any]], cursor: int | None, x: str) -> alt.LayerChart:
    stages = sorted({r["stage"] for r in rows}, key=_lane_key)
    top = max((r["bytes"] for r in rows), default=0)
    y = bytes_y("bytes", top, title=None, extent=_LABELS)
    line = alt.Chart(rows_data(rows)).mark_line(interpolate="step-after").encode(
        x=alt.X("x:Q", title=_AXIS_TITLES[x], scale=alt.Scale(domain=x_domain(trace, x), nice=False, zero=False)),
        y=y, color=alt.Color("stage:N", sort=stages, title="stage", legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("stage:N", title="stage"), alt.Tooltip("seq:Q", title="event seq"),
                 alt.Tooltip("size:N", title="held")])
    layers: list[Any] = [line]
    at = _cursor_x(trace, actions(trace), cursor, x)
    if at is not None:
        layers.append(alt.Chart(rows_data([{"x": at}])).mark_rule(
            color=palette.CURSOR_COLOUR, strokeWidth=2).encode(x="x:Q"))
    return alt.layer(*layers).properties(height=220, title="memory held per stage")


def render_bubbles(trace: Trace, *, step: Any = None,
                   datasets: dict[str, list[dict[str, Any]]] | None = None) -> alt.Chart:
    """One bar per rank and per stage over a step (`analysis.actions.bubbles`): its busy time, then its idle time
    (the bubble), labelled with the bubble's share. `step`: the step tag (default: the first recorded step)."""
    with collecting(datasets):
        return _bubbles(trace, step)


def _bubbles(trace: Trace, step: Any) -> alt.Chart:
    found = bubbles(trace)
    index = next((i for i, s in enumerate(found.steps) if s.step == step), 0)
    figures = found.steps[index] if found.steps else None
    rows: list[dict[str, Any]] = []
    lanes: list[str] = []
    length = figures.length if figures else 1.0
    scale_by, unit = (1.0, "schedule ticks") if found.unit == "tick" else (1000.0, "ms") if length >= 1000 else (
        1.0, "µs")
    for word, group in (("rank", figures.by_rank if figures else {}), ("stage", figures.by_stage if figures else {})):
        for key, b in group.items():
            lane = f"{word} {key}"
            lanes.append(lane)
            share = f"bubble {100 * b.bubble:.0f}%"
            rows.append({"lane": lane, "part": "busy", "order": 0, "amount": b.busy / scale_by, "share": share,
                         "actions": b.actions})
            rows.append({"lane": lane, "part": "idle", "order": 1, "amount": b.idle / scale_by, "share": share,
                         "actions": b.actions})
    scale = alt.Scale(domain=list(palette.BUBBLE_COLOURS), range=list(palette.BUBBLE_COLOURS.values()))
    base = alt.Chart(rows_data(rows))
    bars = base.mark_bar(height=16).encode(
        y=alt.Y("lane:N", sort=lanes, title=None, axis=alt.Axis(minExtent=_LABELS, maxExtent=_LABELS)),
        x=alt.X("amount:Q", stack="zero", title=f"time in the step ({unit})",
                scale=alt.Scale(domain=[0, max(length / scale_by, 1e-9)], nice=False)),
        color=alt.Color("part:N", scale=scale, title=None, legend=alt.Legend(
            orient="top", labelExpr="datum.value == 'busy' ? 'in an action' : 'idle (the bubble)'")),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("lane:N", title="device" if found.unit != "tick" else "stage"),
                 alt.Tooltip("part:N", title="time"), alt.Tooltip("amount:Q", title=unit, format=",.2f"),
                 alt.Tooltip("share:N", title="bubble"), alt.Tooltip("actions:Q", title="actions")])
    labels = base.transform_filter("datum.part == 'idle'").mark_text(
        align="right", dx=-4, fontSize=11, color=palette.PEAK_COLOUR).encode(
        y=alt.Y("lane:N", sort=lanes), x=alt.value("width"), text="share:N")
    title = "no pipeline actions" if figures is None else \
        f"{'the step' if figures.step is None else f'step {figures.step}'}: busy and idle time per rank and stage"
    return alt.layer(bars, labels).properties(height=max(60, 26 * len(lanes)), title=title)
