"""Handle lifecycles as lanes: one lane per handle, one coloured bar per state, marks where replays were refused.

Pure functions of the trace events; they import altair for the chart and never
torch or a UI runtime.

NOTE [ Lifecycle states ]
  1. recorded: from the handle's first event; phase_dx / phase_dw once `phase_set`
     chose a phase and nothing was replayed yet.
  2. replayed: from `replay_started` while a backward uses the replay.
  3. retained: the replay is kept after its use: after DX routed its gradients,
     after a prefire, after an ordinary backward that did not release (a retaining
     session), or while a non-reentrant session keeps recomputed tensors.
  4. released: from `released` (reason = its data.reason), or for a non-reentrant
     frame once every recomputed tensor was consumed (reason "consumed") or its
     session was cleared (reason "session_cleared").
  5. Intervals are half-open [start_seq, end_seq); the last one of a handle ends one
     past the last seq of the trace.
"""
from __future__ import annotations

from typing import Any

import altair as alt

from ckpt_viz.trace.index import derived, event_column
from ckpt_viz.trace import Trace

__all__ = ["LIFECYCLE_COLOURS", "LIFECYCLE_STATES", "lane_label", "lifecycle_intervals", "render_lifecycles"]

LIFECYCLE_STATES: tuple[str, ...] = ("recorded", "phase_dx", "phase_dw", "replayed", "retained", "released")
LIFECYCLE_COLOURS: dict[str, str] = {
    "recorded": "#fee391",
    "phase_dx": "#9ecae1",
    "phase_dw": "#fdae6b",
    "replayed": "#31a354",
    "retained": "#a1d99b",
    "released": "#d9d9d9",
}
_WAITING = {"recorded", "phase_dx", "phase_dw"}


def lane_label(handle_id: int, tags: Any) -> str:
    """"h3 · stage 0 · mb 1" (the parts whose tags are present)."""
    tags = tags or {}
    parts = [f"h{handle_id}"]
    if tags.get("stage") is not None:
        parts.append(f"stage {tags['stage']}")
    if tags.get("microbatch") is not None:
        parts.append(f"mb {tags['microbatch']}")
    return " · ".join(parts)


class _Lanes:
    """The open interval of every handle while the events are scanned."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.open: dict[int, tuple[str, int, str | None]] = {}  # handle -> (state, start, reason)
        self.lane: dict[int, str] = {}
        self.sort: dict[int, tuple] = {}
        self.phase: dict[int, str] = {}
        self.pending: dict[int, int] = {}  # handle -> seq of a grads_routed that may turn into "retained"
        self.unconsumed: dict[int, int] = {}

    def start(self, h: int, seq: int, tags: Any, order: int) -> None:
        self.lane[h] = lane_label(h, tags)
        tags = tags or {}
        stage, mb = tags.get("stage"), tags.get("microbatch")
        self.sort[h] = (stage is None, stage if isinstance(stage, int) else 0, mb is None,
                        mb if isinstance(mb, int) else 0, order)
        self.open[h] = ("recorded", seq, None)

    def move(self, h: int, seq: int, state: str, reason: str | None = None) -> None:
        current, start, old_reason = self.open[h]
        if current == state:
            return
        if seq > start:
            self.rows.append(self._row(h, current, start, seq, old_reason))
        self.open[h] = (state, seq, reason)

    def waiting(self, h: int) -> str:
        return {"dx": "phase_dx", "dw": "phase_dw"}.get(self.phase.get(h, ""), "recorded")

    def _row(self, h: int, state: str, start: int, end: int, reason: str | None) -> dict[str, Any]:
        row = {"kind": "interval", "handle_id": h, "lane": self.lane[h], "state": state, "start_seq": start,
               "end_seq": end}
        if reason is not None:
            row["reason"] = reason
        return row

    def finish(self, end: int) -> list[dict[str, Any]]:
        for h, seq in self.pending.items():
            self.move(h, seq, "retained")
        for h, (state, start, reason) in self.open.items():
            self.rows.append(self._row(h, state, start, max(end, start + 1), reason))
        order = {h: i for i, h in enumerate(sorted(self.sort, key=self.sort.__getitem__))}
        self.rows.sort(key=lambda r: (order[r["handle_id"]], r.get("start_seq", r.get("seq", 0))))
        return self.rows


def lifecycle_intervals(trace: Trace) -> list[dict[str, Any]]:
    """Rows for the lanes, computed once per trace.

    Returns:
        Interval rows {kind: "interval", handle_id, lane, state, start_seq, end_seq, reason?}
        (state in `LIFECYCLE_STATES`, see NOTE [ Lifecycle states ]) and point rows
        {kind: "refused", handle_id, lane, seq, reason} for each refused replay, ordered
        by lane (stage, micro-batch, first appearance) and then by seq.
    """
    return derived(trace, "swimlane:intervals", _intervals)


def _intervals(trace: Trace) -> list[dict[str, Any]]:
    seqs = event_column(trace, "seq")
    kinds = event_column(trace, "kind")
    handles = event_column(trace, "handle_id")
    datas = event_column(trace, "data")
    tags = event_column(trace, "tags")
    phases = event_column(trace, "phase")
    lanes = _Lanes()
    points: list[dict[str, Any]] = []
    for i, (seq, kind, h) in enumerate(zip(seqs, kinds, handles)):
        if h is None:
            if kind == "session_cleared":
                for frame in datas[i].get("frames", ()):
                    if frame in lanes.open and lanes.open[frame][0] in ("replayed", "retained"):
                        lanes.move(frame, seq, "released", "session_cleared")
            continue
        if h not in lanes.open:
            lanes.start(h, seq, tags[i], len(lanes.open))
        if h in lanes.pending and kind != "released":
            lanes.move(h, lanes.pending.pop(h), "retained")
        data = datas[i]
        state = lanes.open[h][0]
        if kind == "phase_set":
            lanes.phase[h] = data.get("new", "")
            if state in _WAITING:
                lanes.move(h, seq, lanes.waiting(h))
        elif kind == "replay_started":
            lanes.move(h, seq, "replayed")
        elif kind == "replay_finished":
            lanes.unconsumed[h] = lanes.unconsumed.get(h, 0) + int(data.get("saved_count") or 0)
            if data.get("trigger") == "prefire":
                lanes.move(h, seq, "retained")
        elif kind == "replay_failed":
            lanes.move(h, seq, lanes.waiting(h))
        elif kind == "grads_routed":
            if phases[i] == "dx":
                lanes.move(h, seq, "retained")
            else:
                lanes.pending[h] = seq
        elif kind == "released":
            lanes.pending.pop(h, None)
            lanes.move(h, seq, "released", data.get("reason"))
        elif kind == "tensor_unpacked" and state in ("replayed", "retained"):
            if data.get("consumed"):
                lanes.unconsumed[h] = lanes.unconsumed.get(h, 0) - 1
                if lanes.unconsumed[h] <= 0:
                    lanes.unconsumed[h] = 0
                    lanes.move(h, seq, "released", "consumed")
            else:
                lanes.move(h, seq, "retained")
        elif kind == "replay_refused":
            points.append({"kind": "refused", "handle_id": h, "lane": lanes.lane[h], "seq": seq,
                           "reason": data.get("reason")})
    end = (seqs[-1] + 1) if seqs else 0
    rows = lanes.finish(end)
    order = {r["handle_id"]: k for k, r in enumerate(rows)}
    return rows + sorted(points, key=lambda p: (order.get(p["handle_id"], 0), p["seq"]))


def render_lifecycles(trace: Trace, *, cursor: int | None = None) -> alt.Chart:
    """One lane per handle (grouped by stage and micro-batch), bars by state, red crosses at refused replays.

    Args:
        cursor: an event seq, drawn as a rule.
    """
    rows = lifecycle_intervals(trace)
    intervals = [r for r in rows if r["kind"] == "interval"]
    refused = [r for r in rows if r["kind"] == "refused"]
    lanes = list(dict.fromkeys(r["lane"] for r in intervals))
    y = alt.Y("lane:N", sort=lanes, title=None)
    bars = alt.Chart(alt.Data(values=intervals)).mark_bar(height={"band": 0.7}).encode(
        x=alt.X("start_seq:Q", title="event seq", scale=alt.Scale(zero=False)),  # a window need not start at 0
        x2="end_seq:Q",
        y=y,
        color=alt.Color("state:N", scale=alt.Scale(domain=list(LIFECYCLE_STATES),
                                                   range=[LIFECYCLE_COLOURS[s] for s in LIFECYCLE_STATES])),
        tooltip=["lane:N", "state:N", "start_seq:Q", "end_seq:Q", "reason:N"],
    )
    layers: list[Any] = [bars]
    if refused:
        layers.append(alt.Chart(alt.Data(values=refused)).mark_point(shape="cross", color="#d62728", size=120,
                                                                     filled=True).encode(
            x="seq:Q", y=y, tooltip=["lane:N", "seq:Q", "reason:N"]))
    if cursor is not None:
        layers.append(alt.Chart(alt.Data(values=[{"seq": cursor}])).mark_rule(color="#d62728", strokeWidth=2)
                      .encode(x="seq:Q"))
    return alt.layer(*layers).properties(height=max(24 * len(lanes), 48), title="handle lifecycles")
