"""Memory over the run: rows by category, the peak and its top contributors, tables, and the altair chart.

Pure functions of `Trace.memory` (see NOTE [ Memory categories ] in
ckpt_viz/probe/memory.py for what each category counts). Colours and words come from
`ckpt_viz.render.palette`; passes from `ckpt_viz.render.phases`. They import altair for
the chart and never torch or a UI runtime.

    one trace:   stacked areas of bytes by category over the event seq, parameters as the
                 base band; bands for the forward / DX / DW passes behind them
    several:     one line of total bytes per trace on an axis of passes (forward, DX, DW)
    both:        the cursor as a magenta rule, the peak as a point; hover explains a value,
                 a click selects the seq under it (selection parameter CURSOR_PICK)
"""
from __future__ import annotations

import math
from contextvars import ContextVar
from typing import Any

import altair as alt

from ckpt_viz.render import palette
from ckpt_viz.render.memory_tables import OTHER_NOTABLE, format_bytes, memory_table, other_note
from ckpt_viz.render.phases import AXIS, action_at, aligned_x, event_actions, phase_spans, phase_spans_more_than
from ckpt_viz.trace import MEMORY_CATEGORIES, MemoryColumns, Trace
from ckpt_viz.trace.cache import event_data
from ckpt_viz.trace.index import TraceIndex, derived, event_column

__all__ = ["CURSOR_PICK", "OTHER_NOTABLE", "format_bytes", "memory_cursor", "memory_peak", "memory_series",
           "memory_table", "other_note", "render_memory", "render_peaks"]

_ALTAIR_MAX_ROWS = 5000  # altair refuses to embed more rows than this by default
CURSOR_PICK = palette.CURSOR_PICK  # the click selection: {"seq": ...} (one trace) or {"x": ...} (several)
_MAX_BANDS, _MAX_LABELS = 60, 12  # more passes than this: no bands (a pipeline's), no labels
_MAX_HOVER = 400  # hover/click columns at most: a pointer cannot tell more apart on one chart
_PASS_LABELS = {"F": "forward", "DX": "DX", "DW": "DW", "B": "backward"}


def _columns(trace: Trace) -> tuple[list[int], dict[str, list[int]]]:
    """(seqs, category -> bytes per sample), read once per trace; unmeasured readings count as 0."""
    def build(t: Trace) -> tuple[list[int], dict[str, list[int]]]:
        memory = t.memory
        if isinstance(memory, MemoryColumns) and not memory.materialized:
            seqs = list(memory.columns["seq"])
            raw = memory.columns["bytes_by_category"]
            by_category = {c: values if set(map(type, values)) == {int} else [v or 0 for v in values]
                           for c, values in raw.items()}  # the column itself when it holds ints only
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
        return list(map(sum, zip(*by_category.values()))) if by_category else [0] * len(seqs)
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
    parts = ", ".join(f"{palette.category_word(c)} {format_bytes(b)}" for c, b in peak["top"])
    return f"peak {format_bytes(peak['total'])}: {parts}"


def _unit(top: float) -> tuple[str, int]:
    for unit, size in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if top >= size:
            return unit, size
    return "B", 1


def _ticks(top: float, size: int) -> list[float]:
    """About five round tick values (1, 2 or 5 times a power of ten of the unit) from 0 past `top`, in bytes."""
    span = top / size if top > 0 else 1.0
    raw = span / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [round(i * step, 10) * size for i in range(int(span / step) + 2)]


def _y(field: str, top: float, *, stack: Any = None) -> alt.Y:
    """A bytes axis labelled in the unit of the largest value (KiB, MiB, ...) at round ticks, the values in bytes."""
    unit, size = _unit(top)
    axis = alt.Axis(labelExpr=f"format(datum.value / {size}, '~g') + ' {unit}'", title=f"memory ({unit})",
                    values=_ticks(top, size))
    return alt.Y(f"{field}:Q", stack=stack, axis=axis)


def _event_word(trace: Trace, seq: int) -> str:
    """What happened at event `seq`, for a memory sample's tooltip ("blocks.3 backward", "replay started (h3)");
    "" when no event has that seq. Read for the drawn samples only, never for every event."""
    seqs = event_column(trace, "seq")
    position = TraceIndex.of(trace).position(seq)
    if position < 0 or seqs[position] != seq:
        return ""
    kind, handle = event_column(trace, "kind")[position], event_column(trace, "handle_id")[position]
    if kind == "memory_sampled":
        return str(event_data(trace)(position, "at") or kind.replace("_", " "))
    return kind.replace("_", " ") + ("" if handle is None else f" (h{handle})")


def memory_cursor(traces: dict[str, Trace], cursor: int | None, cursor_in: str | Trace | None = None) -> list[dict]:
    """The cursor rule's rows in `render_memory(traces, ...)`: [{"seq": cursor}] for one trace, [{"x": ...}] (its
    point on the axis of passes) for several; [] when there is no cursor (or no event to place it at)."""
    if cursor is None:
        return []
    if len(traces) <= 1:
        return [{"seq": cursor}]
    source = traces.get(cursor_in) if isinstance(cursor_in, str) else cursor_in
    source = source if source is not None else next(iter(traces.values()))
    seqs, xs = aligned_x(source)
    return [{"x": xs[TraceIndex.of(source).position(cursor)]}] if seqs else []


def render_memory(traces: dict[str, Trace], *, cursor: int | None = None, max_points: int = 2000,
                  cursor_in: str | Trace | None = None, cursor_data: str | None = None,
                  datasets: dict[str, list[dict]] | None = None) -> alt.Chart:
    """Bytes over the run: stacked by category for one trace, total per trace to compare several.

    Args:
        traces: name -> trace; one entry draws categories, more draw one line each.
        cursor: an event seq, drawn as a rule. With several traces it is a seq of
            `cursor_in` (a name in `traces` or another trace of the same model; default
            the first), drawn where that point falls on the axis of passes.
        max_points: samples per trace at most (the chart also stays under altair's 5000 rows).
        cursor_data: draw the cursor rule from the named dataset of this name instead (its rows:
            `memory_cursor(traces, cursor, cursor_in)`; `cursor` is then not drawn): a page can keep
            the rest of the chart's spec and data for every cursor position and send only the cursor.
        datasets: a dict to fill: each layer's rows go in it by name ("d0", ...) and the layer reads
            that named dataset (the rule's rows aside), so altair never copies or walks the rows.
    """
    token = _DATASETS.set(datasets)
    try:
        rule = None
        if cursor_data is not None:
            rule = _cursor_rule(alt.NamedData(name=cursor_data), "x" if len(traces) > 1 else "seq")
        elif rows := memory_cursor(traces, cursor, cursor_in):
            rule = _cursor_rule(alt.Data(values=rows), "x" if len(traces) > 1 else "seq")
        if len(traces) <= 1:
            return _stacked(next(iter(traces.values())) if traces else Trace(), rule, max_points)
        return _compare(traces, rule, max_points)
    finally:
        _DATASETS.reset(token)


def _bands(spans: list[dict[str, Any]], x: str, x2: str) -> list[alt.Chart]:
    """The passes as light bands behind the data, labelled at the top (when they are few)."""
    rows = [dict(s, label=_PASS_LABELS[s["action"]], what=palette.action_word(s["action"])) for s in spans]
    colour = alt.Color("action:N", scale=alt.Scale(domain=list(palette.ACTIONS),
                                                   range=[palette.ACTION_COLOURS[a] for a in palette.ACTIONS]),
                       legend=None)
    rects = alt.Chart(_data(rows)).mark_rect(opacity=0.10, clip=True).encode(
        x=alt.X(f"{x}:Q"), x2=alt.X2(x2), color=colour, tooltip=[alt.Tooltip("what:N", title="pass")])
    if len(rows) > _MAX_LABELS:
        return [rects]
    labels = alt.Chart(_data(rows)).mark_text(align="left", baseline="top", dx=3, dy=3, fontSize=11,
                                                        opacity=0.8).encode(
        x=alt.X(f"{x}:Q"), y=alt.YValue(0), text=alt.Text("label:N"), color=colour)
    return [rects, labels]


_DATASETS: ContextVar[dict[str, list[dict]] | None] = ContextVar("memory_chart_datasets", default=None)


def _data(rows: list[dict]) -> alt.Data | alt.NamedData:
    """A layer's data: its rows inline, or by name in the `datasets` of the `render_memory` call being built."""
    sink = _DATASETS.get()
    if sink is None:
        return alt.Data(values=rows)
    name = f"d{len(sink)}"
    sink[name] = rows
    return alt.NamedData(name=name)


def _cursor_rule(data: Any, field: str) -> alt.Chart:
    return alt.Chart(data).mark_rule(
        color=palette.CURSOR_COLOUR, strokeWidth=2).encode(x=alt.X(f"{field}:Q"), tooltip=alt.TooltipValue("cursor"))


def _stacked(trace: Trace, rule: alt.Chart | None, max_points: int) -> alt.Chart:
    seqs_all, by_category = _columns(trace)
    categories = [c for c, values in by_category.items() if any(values)]
    points = min(max_points, max(_ALTAIR_MAX_ROWS // max(len(categories) + 1, 1) - 2, 2))
    order = {c: i for i, c in enumerate(categories)}  # parameters first: the base band (palette NOTE rule 2)
    rows = [dict(r, what=palette.category_word(r["category"]), order=order[r["category"]])
            for r in memory_series(trace, max_points=points, categories=categories)]
    event_seqs = event_column(trace, "seq")
    lo = event_seqs[0] if event_seqs else (seqs_all[0] if seqs_all else 0)
    hi = event_seqs[-1] if event_seqs else (seqs_all[-1] if seqs_all else 1)
    x_scale = alt.Scale(domain=[lo, max(hi, lo + 1)], nice=False, zero=False)  # the axis ends where the run ends
    peak = memory_peak(trace)
    top = peak["total"] if peak else 0
    words = [palette.category_word(c) for c in categories]
    area = alt.Chart(_data(rows)).mark_area(interpolate="step-after").encode(
        x=alt.X("seq:Q", title="event seq", scale=x_scale),
        y=_y("bytes", top, stack="zero"),
        color=alt.Color("what:N", sort=words, title="memory category", scale=alt.Scale(
            domain=words, range=[palette.CATEGORY_COLOURS.get(c, "#888888") for c in categories])),
        order=alt.Order("order:Q"),
    )
    layers: list[Any] = []
    if len(trace.events) and not phase_spans_more_than(trace, _MAX_BANDS):  # many passes read better on the timeline
        layers += _bands(phase_spans(trace), "start_seq", "end_seq")
    layers.append(area)
    layers.append(_hover_columns(trace, _picked(_totals(trace), _MAX_HOVER), categories, x_scale, top))
    if peak is not None:
        mark = _data([{"seq": peak["seq"], "bytes": peak["total"], "label": _peak_text(peak)}])
        layers.append(alt.Chart(mark).mark_point(color=palette.PEAK_COLOUR, filled=True, size=60).encode(
            x=alt.X("seq:Q"), y=alt.Y("bytes:Q"), tooltip=[alt.Tooltip("label:N")]))
    if rule is not None:
        layers.append(rule)
    # The peak's contributors go in the subtitle: a label next to the point would run over the legend.
    title = alt.TitleParams(trace.meta.get("model", "memory"), subtitle=[_peak_text(peak)] if peak else [])
    return _layered(layers, title)


def _hover_columns(trace: Trace, picked: list[int], categories: list[str], x_scale: alt.Scale,
                   top: float) -> alt.Chart:
    """One transparent column per drawn sample, up to the next one: its tooltip explains the sample, a click
    selects its seq (CURSOR_PICK), the pointer lights it."""
    seqs, by_category = _columns(trace)
    totals = _totals(trace)
    index = TraceIndex.of(trace)
    n_events = len(trace.events)
    end = event_column(trace, "seq")[-1] + 1 if len(trace.events) else (seqs[-1] + 1 if seqs else 1)
    rows = []
    for k, i in enumerate(picked):
        position = index.position(seqs[i])
        row = {"seq": seqs[i], "next": seqs[picked[k + 1]] if k + 1 < len(picked) else max(end, seqs[i] + 1),
               "zero": 0, "top": top or 1, "total": format_bytes(totals[i]), "at": _event_word(trace, seqs[i]),
               "pass": palette.action_word(action_at(trace, position)) if 0 <= position < n_events else ""}
        row.update({f"c{j}": format_bytes(by_category[c][i]) for j, c in enumerate(categories)})
        rows.append(row)
    hover = alt.selection_point(name="memory_hover", on="pointerover", fields=["seq"], clear="pointerout")
    pick = alt.selection_point(name=CURSOR_PICK, on="click", fields=["seq"], clear=False)
    tooltip = [alt.Tooltip("seq:Q", title="event seq"), alt.Tooltip("at:N", title="event"),
               alt.Tooltip("pass:N", title="pass"), alt.Tooltip("total:N", title="total")]
    tooltip += [alt.Tooltip(f"c{j}:N", title=palette.category_word(c)) for j, c in enumerate(categories)]
    return alt.Chart(_data(rows)).mark_rect(color=palette.PEAK_COLOUR, clip=True).encode(
        x=alt.X("seq:Q", scale=x_scale), x2=alt.X2("next"), y=alt.Y("zero:Q"), y2=alt.Y2("top"), tooltip=tooltip,
        opacity=alt.OpacityValue(0.001, condition={"param": hover.name, "value": 0.08}),
    ).add_params(hover, pick)


def _compare(traces: dict[str, Trace], rule: alt.Chart | None, max_points: int) -> alt.Chart:
    points = min(max_points, _ALTAIR_MAX_ROWS // len(traces) - 2)
    rows: list[dict] = []
    peaks: list[dict] = []
    for name, trace in traces.items():
        index = TraceIndex.of(trace)
        _, xs = aligned_x(trace)
        actions = event_actions(trace)
        seqs, _ = _columns(trace)
        totals = _totals(trace)
        for i in _picked(totals, points):
            p = index.position(seqs[i])
            rows.append({"trace": name, "x": xs[p] if p >= 0 else 0.0, "seq": seqs[i], "bytes": totals[i],
                         "size": format_bytes(totals[i]), "at": _event_word(trace, seqs[i]),
                         "pass": palette.action_word(actions[p]) if p >= 0 else ""})
        peak = memory_peak(trace)
        if peak is not None:
            p = index.position(peak["seq"])
            peaks.append({"trace": name, "x": xs[p] if p >= 0 else 0.0, "bytes": peak["total"],
                          "label": f"{name}: {_peak_text(peak)}"})
    names = list(traces)
    spare = [c for m, c in palette.MODE_COLOURS.items() if m not in names]  # for names that are no mode
    colours = [palette.MODE_COLOURS.get(n) or (spare.pop(0) if spare else palette.PEAK_COLOUR) for n in names]
    scale = alt.Scale(domain=names, range=colours)
    colour = alt.Color("trace:N", sort=names, title="mode", scale=scale)
    same_colour = alt.Color("trace:N", sort=names, scale=scale, legend=None)  # one legend, the lines'
    top = max((r["bytes"] for r in rows), default=0)
    x = alt.X("x:Q", title="pass (each run's forward, DX and DW line up; a full backward spans DX and DW)",
              scale=alt.Scale(domain=[0, 3], nice=False),
              axis=alt.Axis(values=[0, 1, 2, 3], labelExpr="['start', 'forward ends', 'DX ends', 'end'][datum.value]"))
    lines = alt.Chart(_data(rows)).mark_line(interpolate="step-after").encode(
        x=x, y=_y("bytes", top), color=colour)
    pick = alt.selection_point(name=CURSOR_PICK, on="click", fields=["x"], nearest=True, clear=False)
    dots = alt.Chart(_data(rows)).mark_point(filled=True, size=24, opacity=0.6).encode(
        x="x:Q", y="bytes:Q", color=same_colour,
        tooltip=[alt.Tooltip("trace:N", title="mode"), alt.Tooltip("size:N", title="total"),
                 alt.Tooltip("seq:Q", title="event seq"), alt.Tooltip("at:N", title="event"),
                 alt.Tooltip("pass:N", title="pass")]).add_params(pick)
    split_bands = [{"action": a, "start": AXIS[a][0], "end": AXIS[a][1]} for a in ("F", "DX", "DW")]
    layers: list[Any] = [*_bands(split_bands, "start", "end"), lines, dots]
    if peaks:
        layers.append(alt.Chart(_data(peaks)).mark_point(filled=True, size=90, shape="diamond").encode(
            x="x:Q", y="bytes:Q", color=same_colour, tooltip=["label:N"]))
    if rule is not None:
        layers.append(rule)
    title = alt.TitleParams("total memory, compared by pass", subtitle=[p["label"] for p in peaks])
    return _layered(layers, title)


def _layered(layers: list[Any], title: alt.TitleParams) -> alt.LayerChart:
    """One layer chart built in one step (each altair method call copies every row of every layer), with
    independent colour scales: the bands' passes, the categories and the modes each keep their palette."""
    return alt.LayerChart(layer=layers, resolve=alt.Resolve(scale=alt.ScaleResolveMap(color="independent")),
                          title=title)


def render_peaks(traces: dict[str, Trace]) -> alt.Chart:
    """One horizontal bar per trace: its bytes by category at its peak, stacked in the palette's colours
    (parameters first), each segment's tooltip in KiB/MiB."""
    rows, categories = [], []
    for name, trace in traces.items():
        peak = memory_peak(trace)
        if peak is None:
            continue
        seqs, by_category = _columns(trace)
        i = seqs.index(peak["seq"])
        for c, values in by_category.items():
            if values[i]:
                categories.append(c)
                rows.append({"trace": name, "category": c, "what": palette.category_word(c), "bytes": values[i],
                             "size": format_bytes(values[i]), "total": format_bytes(peak["total"]),
                             "order": MEMORY_CATEGORIES.index(c) if c in MEMORY_CATEGORIES else 99})
    present = [c for c in (*MEMORY_CATEGORIES, *dict.fromkeys(categories)) if c in categories]
    present = list(dict.fromkeys(present))
    words = [palette.category_word(c) for c in present]
    top = max((sum(r["bytes"] for r in rows if r["trace"] == n) for n in traces), default=0)
    return alt.Chart(alt.Data(values=rows)).mark_bar().encode(
        y=alt.Y("trace:N", sort=list(traces), title=None),
        x=_x_bytes(top),
        color=alt.Color("what:N", sort=words, title="memory category", scale=alt.Scale(
            domain=words, range=[palette.CATEGORY_COLOURS.get(c, "#888888") for c in present])),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("trace:N", title="mode"), alt.Tooltip("what:N", title="category"),
                 alt.Tooltip("size:N", title="bytes"), alt.Tooltip("total:N", title="peak total")],
    ).properties(title="memory at each mode's peak, by category", height=max(28 * len(traces), 60))


def _x_bytes(top: float) -> alt.X:
    unit, size = _unit(top)
    axis = alt.Axis(labelExpr=f"format(datum.value / {size}, '~g') + ' {unit}'", title=f"memory at the peak ({unit})",
                    values=_ticks(top, size))
    return alt.X("bytes:Q", stack="zero", axis=axis)
