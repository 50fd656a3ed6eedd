"""Handle lifecycles as lanes: one lane per handle, one coloured bar per state, marks where replays were refused.

The states, their order and their meanings are `ckpt_viz.analysis.lifecycle`'s (see NOTE
[ Handle states ] there): a lane is that module's transitions laid end to end, so the
lanes and the tables name the same state at every seq; a lane's name is
`ckpt_viz.analysis.handles.handle_labels`', its words `ckpt_viz.analysis.words`'. They
import altair for the chart and never torch or a UI runtime.

NOTE [ Lanes ]
  1. A lane's intervals are half-open [start_seq, end_seq) between consecutive
     transitions; the last one of a handle ends one past the last seq of the trace.
     Transitions at the same seq leave no interval for the earlier state.
  2. "not_created" is never drawn: a lane starts at the handle's first transition.
  3. With `start`/`stop`, only the lanes of handles with an event in [start, stop) are
     kept, their intervals clipped to it; the states are still the whole trace's.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection
from typing import Any

import altair as alt

from ckpt_viz.analysis.handles import created_events, handle_labels
from ckpt_viz.analysis.lifecycle import Lifecycle, lifecycle
from ckpt_viz.analysis.words import STATE_WORDS, reason_word, state_word
from ckpt_viz.render import palette
from ckpt_viz.render.chartdata import collecting, rows_data
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import STATES

__all__ = ["LIFECYCLE_COLOURS", "lane_label", "lifecycle_intervals", "render_lifecycles"]

LIFECYCLE_COLOURS: dict[str, str] = palette.STATE_COLOURS  # one per `STATES`, in its order (the one palette)
_LEGEND_WORDS = "{" + ", ".join(f"'{k}': '{v}'" for k, v in STATE_WORDS.items()) + "}"
# (sort key, interval rows, refusal rows) of one handle's lane
_Lane = tuple[tuple[Any, ...], list[dict[str, Any]], list[dict[str, Any]]]


def lane_label(handle_id: int, tags: Any, name: str | None = None) -> str:
    """"h3 transformer.h.2 · stage 0 · mb 1" (the parts that are known).

    `name` is the handle's region (`analysis.handles.handle_label`): the module's qualified name
    when known (a shared module gets a call index, `layer#1`), else the checkpointed function.
    """
    tags = tags or {}
    parts = [f"h{handle_id} {name}" if name else f"h{handle_id}"]
    if tags.get("stage") is not None:
        parts.append(f"stage {tags['stage']}")
    if tags.get("microbatch") is not None:
        parts.append(f"mb {tags['microbatch']}")
    return " · ".join(parts)


def lifecycle_intervals(trace: Trace, *, start: int | None = None, stop: int | None = None,
                        handles: Collection[int] | None = None) -> list[dict[str, Any]]:
    """Rows for the lanes.

    Args:
        start, stop: keep only the handles with an event in [start, stop), clipped to it
            (see NOTE [ Lanes ], rule 3); None: unbounded.
        handles: only these handles' lanes (their states still the whole trace's).

    Returns:
        Interval rows {kind: "interval", handle_id, lane, state, what, start_seq, end_seq, reason?, because?}
        (state in `STATES`, never "not_created"; what its words; for "released" its reason, and in words)
        and point rows {kind: "refused", handle_id, lane, seq, reason, because} for each refused replay,
        ordered by lane (stage, micro-batch, first appearance) and then by seq, refusals last.
    """
    life = lifecycle(trace)
    if start is None and stop is None:
        shown = life.handle_ids
    else:
        events = trace.events
        lo = 0 if start is None else bisect_left(events, start, key=lambda e: e.seq)
        hi = len(events) if stop is None else bisect_left(events, stop, key=lambda e: e.seq)
        shown = [h for h in dict.fromkeys(e.handle_id for e in events[lo:hi]) if h is not None]
    if handles is not None:
        wanted = set(handles)
        shown = [h for h in shown if h in wanted]
    lanes = _lanes(trace, shown)
    intervals: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    for _, bars, refused in lanes:
        for row in bars:
            a = row["start_seq"] if start is None else max(row["start_seq"], start)
            b = row["end_seq"] if stop is None else min(row["end_seq"], stop)
            if a < b:
                intervals.append(row if (a, b) == (row["start_seq"], row["end_seq"])
                                 else dict(row, start_seq=a, end_seq=b))
        points.extend(p for p in refused if (start is None or p["seq"] >= start) and (stop is None or p["seq"] < stop))
    return intervals + points


def _lanes(trace: Trace, handles: list[int]) -> list[_Lane]:
    """(sort key, interval rows, refusal rows) of each handle, in lane order; each lane built once per trace."""
    life = lifecycle(trace)
    created, names = created_events(trace), handle_labels(trace)
    order = {h: i for i, h in enumerate(life.handle_ids)}  # the order of first appearance
    end = life.end_seq + 1 if life.end_seq is not None else 0
    lanes = []
    for h in handles:
        first = created.get(h)
        lanes.append(_lane(life, h, first.tags if first is not None else {}, end, order[h], names.get(h)))
    return sorted(lanes, key=lambda lane: lane[0])


def _lane(life: Lifecycle, h: int, tags: Any, end: int, order: int, name: str | None) -> _Lane:
    """One handle's lane. See NOTE [ Lanes ]."""
    stage, mb = tags.get("stage"), tags.get("microbatch")
    key = (stage is None, stage if isinstance(stage, int) else 0, mb is None, mb if isinstance(mb, int) else 0, order)
    lane = lane_label(h, tags, name)
    changes = life.transitions(h)
    bars = []
    for k, t in enumerate(changes):
        stop = changes[k + 1].seq if k + 1 < len(changes) else max(end, t.seq + 1)
        if stop > t.seq:
            row = {"kind": "interval", "handle_id": h, "lane": lane, "state": t.state, "what": state_word(t.state),
                   "start_seq": t.seq, "end_seq": stop}
            if t.state == "released" and t.reason is not None:
                row["reason"], row["because"] = t.reason, reason_word(t.reason)
            bars.append(row)
    refused = [{"kind": "refused", "handle_id": h, "lane": lane, "seq": r.seq, "reason": r.reason,
                "because": "replay refused: " + reason_word(r.reason)} for r in life.refusals(h)]
    return key, bars, refused


def render_lifecycles(trace: Trace, *, cursor: int | None = None, start: int | None = None,
                      stop: int | None = None, handles: Collection[int] | None = None,
                      datasets: dict[str, list[dict[str, Any]]] | None = None) -> alt.LayerChart:
    """One lane per handle (grouped by stage and micro-batch), bars by state, dark red crosses at refused replays.

    Args:
        cursor: an event seq, drawn as a rule.
        start, stop: draw only the seqs in [start, stop) (see `lifecycle_intervals`).
        handles: draw only these handles' lanes.
        datasets: a dict to fill with the layers' rows, by name (`ckpt_viz.render.chartdata`).
    """
    with collecting(datasets):
        return _lanes_chart(lifecycle_intervals(trace, start=start, stop=stop, handles=handles), cursor)


def _lanes_chart(rows: list[dict[str, Any]], cursor: int | None) -> alt.LayerChart:
    intervals = [r for r in rows if r["kind"] == "interval"]
    refused = [r for r in rows if r["kind"] == "refused"]
    lanes = list(dict.fromkeys(r["lane"] for r in intervals))
    y = alt.Y("lane:N", sort=lanes, title=None)
    bars = alt.Chart(rows_data(intervals)).mark_bar(height={"band": 0.7}).encode(
        x=alt.X("start_seq:Q", title="event seq", scale=alt.Scale(zero=False)),  # a window need not start at 0
        x2="end_seq:Q",
        y=y,
        color=alt.Color("state:N", scale=alt.Scale(domain=list(STATES),
                                                   range=[LIFECYCLE_COLOURS[s] for s in STATES]),
                        legend=alt.Legend(title="handle state", labelExpr=f"{_LEGEND_WORDS}[datum.label]")),
        tooltip=[alt.Tooltip("lane:N", title="handle"), alt.Tooltip("what:N", title="state"),
                 alt.Tooltip("start_seq:Q", title="from seq"), alt.Tooltip("end_seq:Q", title="to seq"),
                 alt.Tooltip("because:N", title="because")],
    )
    layers: list[Any] = [bars]
    if refused:
        cross = alt.Chart(rows_data(refused)).mark_point(shape="cross", color=palette.MARK_COLOURS["refused"],
                                                               size=120, filled=True)
        layers.append(cross.encode(x="seq:Q", y=y, tooltip=[alt.Tooltip("lane:N", title="handle"),
                                                            alt.Tooltip("seq:Q", title="seq"),
                                                            alt.Tooltip("because:N", title="what")]))
    if cursor is not None:
        rule = alt.Chart(rows_data([{"seq": cursor}])).mark_rule(color=palette.CURSOR_COLOUR, strokeWidth=2)
        layers.append(rule.encode(x="seq:Q"))
    return alt.layer(*layers).properties(height=max(24 * len(lanes), 48), title="handle lifecycles")
