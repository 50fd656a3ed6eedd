"""Memory over the run: rows by category, the peak and its top contributors, and the altair chart.

Pure functions of `Trace.memory` (see NOTE [ Memory categories ] in
ckpt_viz/probe/memory.py for what each category counts). They import altair for the
chart and never torch or a UI runtime.

    one trace:     stacked areas of bytes by category over the event seq
    several:       one line of total bytes per trace over the position in its run (0..1)
    both:          a rule at the cursor, a point and a label at the peak
"""
from __future__ import annotations

from typing import Any

import altair as alt

from ckpt_viz.trace import MEMORY_CATEGORIES, MemoryColumns, Trace
from ckpt_viz.trace.index import TraceIndex, derived

__all__ = ["format_bytes", "memory_peak", "memory_series", "render_memory"]

_ALTAIR_MAX_ROWS = 5000  # altair refuses to embed more rows than this by default


def format_bytes(nbytes: float) -> str:
    """1536 -> "1.5 KiB"."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # unreachable


def _columns(trace: Trace) -> tuple[list[int], dict[str, list[int]]]:
    """(seqs, category -> bytes per sample), read once per trace; unmeasured readings count as 0."""
    def build(t: Trace) -> tuple[list[int], dict[str, list[int]]]:
        memory = t.memory
        if isinstance(memory, MemoryColumns) and not memory.materialized:
            seqs = list(memory.columns["seq"])
            raw = memory.columns["bytes_by_category"]
            by_category = {c: [v or 0 for v in values] for c, values in raw.items()}
        else:
            seqs = [s.seq for s in memory]
            names = dict.fromkeys(c for s in memory for c in s.bytes_by_category)
            by_category = {c: [s.bytes_by_category.get(c, 0) for s in memory] for c in names}
        order = [c for c in MEMORY_CATEGORIES if c in by_category] + [c for c in by_category
                                                                      if c not in MEMORY_CATEGORIES]
        return seqs, {c: by_category[c] for c in order}
    return derived(trace, "memory:columns", build)


def _totals(trace: Trace) -> list[int]:
    def build(t: Trace) -> list[int]:
        seqs, by_category = _columns(t)
        return [sum(values) for values in zip(*by_category.values())] if by_category else [0] * len(seqs)
    return derived(trace, "memory:totals", build)


def _picked(totals: list[int], max_points: int) -> list[int]:
    """Sample positions to draw: all, or per bucket the one with the largest total (peaks survive)."""
    n = len(totals)
    if n <= max_points:
        return list(range(n))
    buckets = max(max_points - 2, 1)
    picked = {0, n - 1}
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if hi > lo:
            picked.add(max(range(lo, hi), key=totals.__getitem__))
    return sorted(picked)


def memory_series(trace: Trace, *, max_points: int = 2000, categories: list[str] | None = None) -> list[dict]:
    """Rows {seq, category, bytes} for a stacked chart, at most `max_points` samples (the peak kept).

    Args:
        categories: only these; default every category that is non-zero somewhere.
    """
    seqs, by_category = _columns(trace)
    if categories is None:
        categories = [c for c, values in by_category.items() if any(values)]
    picked = _picked(_totals(trace), max_points)
    return [{"seq": seqs[i], "category": c, "bytes": by_category[c][i]}
            for i in picked for c in categories if c in by_category]


def memory_peak(trace: Trace) -> dict[str, Any] | None:
    """{seq, total, top: [(category, bytes), ...]} of the sample with the most bytes (the first such), or None."""
    totals = _totals(trace)
    if not totals:
        return None
    i = max(range(len(totals)), key=totals.__getitem__)
    seqs, by_category = _columns(trace)
    top = sorted(((c, values[i]) for c, values in by_category.items() if values[i] > 0), key=lambda cv: -cv[1])
    return {"seq": seqs[i], "total": totals[i], "top": top[:3]}


def _peak_text(peak: dict[str, Any]) -> str:
    parts = ", ".join(f"{c} {format_bytes(b)}" for c, b in peak["top"])
    return f"peak {format_bytes(peak['total'])}: {parts}"


def render_memory(traces: dict[str, Trace], *, cursor: int | None = None, max_points: int = 2000) -> alt.Chart:
    """Bytes over the run: stacked by category for one trace, total per trace to compare several.

    Args:
        traces: name -> trace; one entry draws categories, more draw one line each.
        cursor: an event seq of the (first) trace; drawn as a rule. With several traces
            it becomes its position in the first trace's run.
        max_points: samples per trace at most (the chart also stays under altair's 5000 rows).
    """
    if len(traces) <= 1:
        trace = next(iter(traces.values())) if traces else Trace()
        return _stacked(trace, cursor, max_points)
    return _compare(traces, cursor, max_points)


def _stacked(trace: Trace, cursor: int | None, max_points: int) -> alt.Chart:
    _, by_category = _columns(trace)
    categories = [c for c, values in by_category.items() if any(values)]
    points = min(max_points, max(_ALTAIR_MAX_ROWS // max(len(categories), 1) - 2, 2))
    rows = memory_series(trace, max_points=points, categories=categories)
    data = alt.Data(values=rows)
    area = alt.Chart(data).mark_area(interpolate="step-after").encode(
        x=alt.X("seq:Q", title="event seq"),
        y=alt.Y("bytes:Q", stack="zero", title="bytes"),
        color=alt.Color("category:N", sort=categories, scale=alt.Scale(domain=categories)),
        tooltip=["seq:Q", "category:N", "bytes:Q"],
    )
    layers: list[Any] = [area]
    peak = memory_peak(trace)
    if peak is not None:
        mark = alt.Data(values=[{"seq": peak["seq"], "bytes": peak["total"], "label": _peak_text(peak)}])
        layers.append(alt.Chart(mark).mark_point(color="black", filled=True, size=60).encode(
            x="seq:Q", y="bytes:Q", tooltip=["label:N"]))
    if cursor is not None:
        layers.append(_rule([{"seq": cursor}], "seq"))
    # The peak's contributors go in the subtitle: a label next to the point would run over the legend.
    title = alt.TitleParams(trace.meta.get("model", "memory"), subtitle=[_peak_text(peak)] if peak else [])
    return alt.layer(*layers).properties(title=title)


def _rule(rows: list[dict], field: str) -> alt.Chart:
    return alt.Chart(alt.Data(values=rows)).mark_rule(color="#d62728", strokeWidth=2).encode(
        x=f"{field}:Q")


def _compare(traces: dict[str, Trace], cursor: int | None, max_points: int) -> alt.Chart:
    points = min(max_points, _ALTAIR_MAX_ROWS // len(traces) - 2)
    rows: list[dict] = []
    peaks: list[dict] = []
    for name, trace in traces.items():
        index = TraceIndex.of(trace)
        last = max(len(index.seqs) - 1, 1)
        seqs, _ = _columns(trace)
        totals = _totals(trace)
        for i in _picked(totals, points):
            rows.append({"trace": name, "position": index.position(seqs[i]) / last, "seq": seqs[i],
                         "bytes": totals[i]})
        peak = memory_peak(trace)
        if peak is not None:
            peaks.append({"trace": name, "position": index.position(peak["seq"]) / last, "bytes": peak["total"],
                          "label": f"{name}: {_peak_text(peak)}"})
    lines = alt.Chart(alt.Data(values=rows)).mark_line(interpolate="step-after").encode(
        x=alt.X("position:Q", title="position in the run", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("bytes:Q", title="total bytes"),
        color=alt.Color("trace:N", sort=list(traces)),
        tooltip=["trace:N", "seq:Q", "bytes:Q"],
    )
    layers: list[Any] = [lines]
    if peaks:
        marks = alt.Data(values=peaks)
        layers.append(alt.Chart(marks).mark_point(filled=True, size=60).encode(
            x="position:Q", y="bytes:Q", color=alt.Color("trace:N", sort=list(traces)), tooltip=["label:N"]))
    if cursor is not None:
        first = TraceIndex.of(next(iter(traces.values())))
        at = first.position(cursor) / max(len(first.seqs) - 1, 1)
        layers.append(_rule([{"position": at}], "position"))
    title = alt.TitleParams("total bytes, compared", subtitle=[p["label"] for p in peaks])
    return alt.layer(*layers).properties(title=title)
