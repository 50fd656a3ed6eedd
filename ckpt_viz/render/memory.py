"""Memory over the run as altair charts: bytes by category over the run, several runs compared by part of the
step, and each run's peak by category.

The charts draw `ckpt_viz.analysis.memory` (bytes by category, totals, the peak) on the parts of
the step of `ckpt_viz.analysis.passes` (bands, Compare's common axis), in the colours of
`ckpt_viz.render.palette` and the words of `ckpt_viz.analysis.words`. They import altair and never
torch or a UI runtime.

    one trace:   stacked areas of bytes by category over the event seq, parameters as the
                 base band; bands for the forward / DX / DW parts behind them
    ranks:       small multiples, one stacked chart per rank of a merged trace on one x and one
                 y scale (`render_rank_memory`)
    several:     one line of total bytes per trace on the axis of parts (forward, DX, DW)
    both:        the cursor as a magenta rule, the peak as a point; hover explains a value,
                 a click selects the seq under it (selection parameter CURSOR_PICK)

NOTE [ Samples drawn ]
  1. A chart draws at most `max_points` samples of a run: all of them, or in each of
     `max_points - 2` equal buckets the one with the largest total, plus the first and the last
     (the upper envelope: every peak the full data shows at the chart's width survives).
"""
from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any

import altair as alt

from ckpt_viz.analysis.memory import MemoryFacts, MemoryPeak, memory, rank_memory
from ckpt_viz.analysis.passes import AXIS, PARTS, passes
from ckpt_viz.analysis.words import category_word, format_bytes, part_word
from ckpt_viz.render import palette
from ckpt_viz.render.chartdata import collecting, rows_data
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import MEMORY_CATEGORIES

__all__ = ["CURSOR_PICK", "bytes_y", "drawn_samples", "memory_cursor", "memory_series", "render_memory", "render_peaks",
           "render_rank_memory"]

_ALTAIR_MAX_ROWS = 5000  # altair refuses to embed more rows than this by default
CURSOR_PICK = palette.CURSOR_PICK  # the click selection: {"seq": ...} (one trace) or {"x": ...} (several)
_MAX_BANDS, _MAX_LABELS = 60, 12  # more parts than this: no bands (a pipeline's), no labels
_MAX_HOVER = 400  # hover/click columns at most: a pointer cannot tell more apart on one chart


def drawn_samples(totals: tuple[int, ...] | list[int], max_points: int) -> list[int]:
    """Positions of the samples a chart draws (NOTE [ Samples drawn ])."""
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


def _shown(facts: MemoryFacts) -> list[str]:
    """The categories worth a band: non-zero somewhere, in `MEMORY_CATEGORIES` order."""
    return [c for c in facts.categories if any(facts.by_category[c])]


def memory_series(trace: Trace, *, max_points: int = 2000, categories: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows {seq, category, bytes} for a stacked chart, at most `max_points` samples (NOTE [ Samples drawn ]).

    Args:
        categories: only these; default every category that is non-zero somewhere.
    """
    facts = memory(trace)
    if categories is None:
        categories = _shown(facts)
    picked = drawn_samples(facts.totals, max_points)
    return [{"seq": facts.seqs[i], "category": c, "bytes": facts.by_category[c][i]}
            for i in picked for c in categories if c in facts.by_category]


def _peak_text(peak: MemoryPeak) -> str:
    parts = ", ".join(f"{category_word(c)} {format_bytes(b)}" for c, b in peak.top)
    return f"peak {format_bytes(peak.total)}: {parts}"


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


def bytes_y(field: str, top: float, *, stack: Any = None, title: str | None = "memory",
            extent: int | None = None) -> alt.Y:
    """A bytes axis labelled in the unit of the largest value (KiB, MiB, ...) at round ticks, the values in bytes;
    its title names the unit ("memory (KiB)"), or is left out with `title=None`; `extent`: the labels' width in
    pixels (to line its plot up with another chart's)."""
    unit, size = _unit(top)
    extents: dict[str, Any] = {"minExtent": extent, "maxExtent": extent} if extent is not None else {}
    axis = alt.Axis(labelExpr=f"format(datum.value / {size}, '~g') + ' {unit}'",
                    title=f"{title} ({unit})" if title else None, values=_ticks(top, size), **extents)
    return alt.Y(f"{field}:Q", stack=stack, axis=axis)


def _position(trace: Trace, seq: int) -> int:
    """The position of the event with seq `seq`, or of the last one before it; -1 before the first."""
    return bisect_right(passes(trace).seqs, seq) - 1


def _event_word(trace: Trace, seq: int) -> str:
    """What happened at event `seq`, for a memory sample's tooltip ("blocks.3 backward", "grads routed (h3)");
    "" when no event has that seq."""
    p = _position(trace, seq)
    if p < 0 or trace.events[p].seq != seq:
        return ""
    event = trace.events[p]
    at = getattr(event, "at", None)
    if event.kind == "memory_sampled" and at:
        return str(at)
    return event.kind.replace("_", " ") + ("" if event.handle_id is None else f" (h{event.handle_id})")


def _part_at(trace: Trace, seq: int) -> str:
    part = passes(trace).part_at(seq)
    return part_word(part) if part is not None else ""


def memory_cursor(traces: dict[str, Trace], cursor: int | None,
                  cursor_in: str | Trace | None = None) -> list[dict[str, Any]]:
    """The cursor rule's rows in `render_memory(traces, ...)`: [{"seq": cursor}] for one trace, [{"x": ...}] (its
    point on the axis of parts) for several; [] when there is no cursor (or no event to place it at)."""
    if cursor is None:
        return []
    if len(traces) <= 1:
        return [{"seq": cursor}]
    source = traces.get(cursor_in) if isinstance(cursor_in, str) else cursor_in
    source = source if source is not None else next(iter(traces.values()))
    step = passes(source)
    p = bisect_right(step.seqs, cursor) - 1
    return [{"x": step.aligned_x[max(p, 0)]}] if step.seqs else []


def render_memory(traces: dict[str, Trace], *, cursor: int | None = None, max_points: int = 2000,
                  cursor_in: str | Trace | None = None, cursor_data: str | None = None,
                  datasets: dict[str, list[dict[str, Any]]] | None = None) -> alt.LayerChart:
    """Bytes over the run: stacked by category for one trace, total per trace to compare several.

    Args:
        traces: name -> trace; one entry draws categories, more draw one line each.
        cursor: an event seq, drawn as a rule. With several traces it is a seq of
            `cursor_in` (a name in `traces` or another trace of the same model; default
            the first), drawn where that point falls on the axis of parts.
        max_points: samples per trace at most (the chart also stays under altair's 5000 rows).
        cursor_data: draw the cursor rule from the named dataset of this name instead (its rows:
            `memory_cursor(traces, cursor, cursor_in)`; `cursor` is then not drawn): a page can keep
            the rest of the chart's spec and data for every cursor position and send only the cursor.
        datasets: a dict to fill with each layer's rows, by name (`ckpt_viz.render.chartdata`; the rule's rows
            aside), so altair never copies or walks the rows.
    """
    with collecting(datasets):
        rule = None
        if cursor_data is not None:
            rule = _cursor_rule(alt.NamedData(name=cursor_data), "x" if len(traces) > 1 else "seq")
        elif rows := memory_cursor(traces, cursor, cursor_in):
            rule = _cursor_rule(alt.Data(values=rows), "x" if len(traces) > 1 else "seq")
        if len(traces) <= 1:
            return _stacked(next(iter(traces.values())) if traces else Trace(), rule, max_points)
        return _compare(traces, rule, max_points)


def _part_scale() -> alt.Scale:
    return alt.Scale(domain=list(PARTS), range=[palette.ACTION_COLOURS[a] for a in PARTS])


def _bands(spans: list[dict[str, Any]], x: str, x2: str) -> list[alt.Chart]:
    """The parts of the step as light bands behind the data, labelled at the top (when they are few)."""
    rows = [dict(s, what=part_word(s["action"])) for s in spans]
    colour = alt.Color("action:N", scale=_part_scale(), legend=None)
    rects = alt.Chart(rows_data(rows)).mark_rect(opacity=0.10, clip=True).encode(
        x=alt.X(f"{x}:Q"), x2=alt.X2(x2), color=colour, tooltip=[alt.Tooltip("what:N", title="part of the step")])
    if len(rows) > _MAX_LABELS:
        return [rects]
    labels = alt.Chart(rows_data(rows)).mark_text(align="left", baseline="top", dx=3, dy=3, fontSize=11,
                                              opacity=0.8).encode(
        x=alt.X(f"{x}:Q"), y=alt.YValue(0), text=alt.Text("what:N"), color=colour)
    return [rects, labels]


def _cursor_rule(data: Any, field: str) -> alt.Chart:
    return alt.Chart(data).mark_rule(
        color=palette.CURSOR_COLOUR, strokeWidth=2).encode(x=alt.X(f"{field}:Q"), tooltip=alt.TooltipValue("cursor"))


def _stacked(trace: Trace, rule: alt.Chart | None, max_points: int) -> alt.LayerChart:
    facts = memory(trace)
    categories = _shown(facts)
    points = min(max_points, max(_ALTAIR_MAX_ROWS // max(len(categories) + 1, 1) - 2, 2))
    order = {c: i for i, c in enumerate(categories)}  # parameters first: the base band (palette NOTE rule 2)
    rows = [dict(r, what=category_word(r["category"]), order=order[r["category"]])
            for r in memory_series(trace, max_points=points, categories=categories)]
    events = trace.events
    lo = events[0].seq if events else (facts.seqs[0] if facts.seqs else 0)
    hi = events[-1].seq if events else (facts.seqs[-1] if facts.seqs else 1)
    x_scale = alt.Scale(domain=[lo, max(hi, lo + 1)], nice=False, zero=False)  # the axis ends where the run ends
    peak = facts.peak
    top = peak.total if peak else 0
    words = [category_word(c) for c in categories]
    area = alt.Chart(rows_data(rows)).mark_area(interpolate="step-after").encode(
        x=alt.X("seq:Q", title="event seq", scale=x_scale),
        y=bytes_y("bytes", top, stack="zero"),
        color=alt.Color("what:N", sort=words, title="memory category", scale=alt.Scale(
            domain=words, range=[palette.CATEGORY_COLOURS.get(c, "#888888") for c in categories])),
        order=alt.Order("order:Q"),
    )
    layers: list[Any] = []
    spans = passes(trace).spans if events else ()
    if spans and len(spans) <= _MAX_BANDS:  # many parts (a pipeline's) read better on the timeline
        layers += _bands([{"action": s.part, "start_seq": s.start_seq, "end_seq": s.end_seq} for s in spans],
                         "start_seq", "end_seq")
    layers.append(area)
    layers.append(_hover_columns(trace, drawn_samples(facts.totals, _MAX_HOVER), categories, x_scale, top))
    if peak is not None:
        mark = rows_data([{"seq": peak.seq, "bytes": peak.total, "label": _peak_text(peak)}])
        layers.append(alt.Chart(mark).mark_point(color=palette.PEAK_COLOUR, filled=True, size=60).encode(
            x=alt.X("seq:Q"), y=alt.Y("bytes:Q"), tooltip=[alt.Tooltip("label:N")]))
    if rule is not None:
        layers.append(rule)
    # The peak's contributors go in the subtitle: a label next to the point would run over the legend.
    title = alt.TitleParams(str(trace.meta.get("model") or "memory"), subtitle=[_peak_text(peak)] if peak else [])
    return _layered(layers, title)


def _hover_columns(trace: Trace, picked: list[int], categories: list[str], x_scale: alt.Scale,
                   top: float) -> alt.Chart:
    """One transparent column per drawn sample, up to the next one: its tooltip explains the sample, a click
    selects its seq (CURSOR_PICK), the pointer lights it."""
    facts = memory(trace)
    seqs = facts.seqs
    end = trace.events[-1].seq + 1 if trace.events else (seqs[-1] + 1 if seqs else 1)
    rows = []
    for k, i in enumerate(picked):
        row = {"seq": seqs[i], "next": seqs[picked[k + 1]] if k + 1 < len(picked) else max(end, seqs[i] + 1),
               "zero": 0, "top": top or 1, "total": format_bytes(facts.totals[i]), "at": _event_word(trace, seqs[i]),
               "pass": _part_at(trace, seqs[i]) if trace.events else ""}
        row.update({f"c{j}": format_bytes(facts.by_category[c][i]) for j, c in enumerate(categories)})
        rows.append(row)
    hover = alt.selection_point(name="memory_hover", on="pointerover", fields=["seq"], clear="pointerout")
    pick = alt.selection_point(name=CURSOR_PICK, on="click", fields=["seq"], clear=False)
    tooltip = [alt.Tooltip("seq:Q", title="event seq"), alt.Tooltip("at:N", title="event"),
               alt.Tooltip("pass:N", title="part of the step"), alt.Tooltip("total:N", title="total")]
    tooltip += [alt.Tooltip(f"c{j}:N", title=category_word(c)) for j, c in enumerate(categories)]
    return alt.Chart(rows_data(rows)).mark_rect(color=palette.PEAK_COLOUR, clip=True).encode(
        x=alt.X("seq:Q", scale=x_scale), x2=alt.X2("next"), y=alt.Y("zero:Q"), y2=alt.Y2("top"), tooltip=tooltip,
        opacity=alt.OpacityValue(0.001, condition={"param": hover.name, "value": 0.08}),
    ).add_params(hover, pick)


def _compare(traces: dict[str, Trace], rule: alt.Chart | None, max_points: int) -> alt.LayerChart:
    points = min(max_points, _ALTAIR_MAX_ROWS // len(traces) - 2)
    rows: list[dict[str, Any]] = []
    peaks: list[dict[str, Any]] = []
    for name, trace in traces.items():
        facts, step = memory(trace), passes(trace)
        for i in drawn_samples(facts.totals, points):
            p = bisect_right(step.seqs, facts.seqs[i]) - 1
            rows.append({"trace": name, "x": step.aligned_x[p] if p >= 0 else 0.0, "seq": facts.seqs[i],
                         "bytes": facts.totals[i], "size": format_bytes(facts.totals[i]),
                         "at": _event_word(trace, facts.seqs[i]),
                         "pass": part_word(step.of_event[p]) if p >= 0 else ""})
        if facts.peak is not None:
            p = bisect_right(step.seqs, facts.peak.seq) - 1
            peaks.append({"trace": name, "x": step.aligned_x[p] if p >= 0 else 0.0, "bytes": facts.peak.total,
                          "label": f"{name}: {_peak_text(facts.peak)}"})
    names = list(traces)
    spare = [c for m, c in palette.MODE_COLOURS.items() if m not in names]  # for names that are no mode
    colours = [palette.MODE_COLOURS.get(n) or (spare.pop(0) if spare else palette.PEAK_COLOUR) for n in names]
    scale = alt.Scale(domain=names, range=colours)
    colour = alt.Color("trace:N", sort=names, title="run", scale=scale)
    same_colour = alt.Color("trace:N", sort=names, scale=scale, legend=None)  # one legend, the lines'
    top = max((r["bytes"] for r in rows), default=0)
    x = alt.X("x:Q", title="part of the step (each run's forward, DX and DW line up; a full backward spans DX and DW)",
              scale=alt.Scale(domain=[0, 3], nice=False),
              axis=alt.Axis(values=[0, 1, 2, 3], labelExpr="['start', 'forward ends', 'DX ends', 'end'][datum.value]"))
    lines = alt.Chart(rows_data(rows)).mark_line(interpolate="step-after").encode(
        x=x, y=bytes_y("bytes", top), color=colour)
    pick = alt.selection_point(name=CURSOR_PICK, on="click", fields=["x"], nearest=True, clear=False)
    dots = alt.Chart(rows_data(rows)).mark_point(filled=True, size=24, opacity=0.6).encode(
        x="x:Q", y="bytes:Q", color=same_colour,
        tooltip=[alt.Tooltip("trace:N", title="run"), alt.Tooltip("size:N", title="total"),
                 alt.Tooltip("seq:Q", title="event seq"), alt.Tooltip("at:N", title="event"),
                 alt.Tooltip("pass:N", title="part of the step")]).add_params(pick)
    split_bands = [{"action": a, "start": AXIS[a][0], "end": AXIS[a][1]} for a in ("F", "DX", "DW")]
    layers: list[Any] = [*_bands(split_bands, "start", "end"), lines, dots]
    if peaks:
        layers.append(alt.Chart(rows_data(peaks)).mark_point(filled=True, size=90, shape="diamond").encode(
            x="x:Q", y="bytes:Q", color=same_colour, tooltip=["label:N"]))
    if rule is not None:
        layers.append(rule)
    title = alt.TitleParams("total memory, compared by part of the step", subtitle=[p["label"] for p in peaks])
    return _layered(layers, title)


def _layered(layers: list[Any], title: alt.TitleParams) -> alt.LayerChart:
    """One layer chart built in one step (each altair method call copies every row of every layer), with
    independent colour scales: the bands' parts, the categories and the modes each keep their palette."""
    return alt.LayerChart(layer=layers, resolve=alt.Resolve(scale=alt.ScaleResolveMap(color="independent")),
                          title=title)


def render_peaks(traces: dict[str, Trace]) -> alt.Chart:
    """One horizontal bar per trace: its bytes by category at its peak, stacked in the palette's colours
    (parameters first), each segment's tooltip in KiB/MiB."""
    rows: list[dict[str, Any]] = []
    present: list[str] = []
    for name, trace in traces.items():
        peak = memory(trace).peak
        if peak is None:
            continue
        for order, (c, b) in enumerate(peak.by_category.items()):  # in MEMORY_CATEGORIES order
            if b:
                present.append(c)
                rows.append({"trace": name, "category": c, "what": category_word(c), "bytes": b,
                             "size": format_bytes(b), "total": format_bytes(peak.total), "order": order})
    categories = _in_order(present)
    words = [category_word(c) for c in categories]
    top = max((sum(r["bytes"] for r in rows if r["trace"] == n) for n in traces), default=0)
    unit, size = _unit(top)
    axis = alt.Axis(labelExpr=f"format(datum.value / {size}, '~g') + ' {unit}'", title=f"memory at the peak ({unit})",
                    values=_ticks(top, size))
    return alt.Chart(alt.Data(values=rows)).mark_bar().encode(
        y=alt.Y("trace:N", sort=list(traces), title=None),
        x=alt.X("bytes:Q", stack="zero", axis=axis),
        color=alt.Color("what:N", sort=words, title="memory category", scale=alt.Scale(
            domain=words, range=[palette.CATEGORY_COLOURS.get(c, "#888888") for c in categories])),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("trace:N", title="run"), alt.Tooltip("what:N", title="category"),
                 alt.Tooltip("size:N", title="bytes"), alt.Tooltip("total:N", title="peak total")],
    ).properties(title="memory at each run's peak, by category", height=max(28 * len(traces), 60))


def _in_order(categories: list[str]) -> list[str]:
    """The distinct `categories` in `MEMORY_CATEGORIES` order (others after, in their order)."""
    seen = set(categories)
    return [c for c in MEMORY_CATEGORIES if c in seen] + [c for c in dict.fromkeys(categories)
                                                          if c not in MEMORY_CATEGORIES]


def render_rank_memory(trace: Trace, *, cursor: int | None = None, max_points: int = 400,
                       datasets: dict[str, list[dict[str, Any]]] | None = None) -> alt.ConcatChart:
    """Small multiples: each rank's bytes by category over the event seq (`analysis.memory.rank_memory`), stacked as
    in `render_memory`, one panel per rank on one x and one y scale (so the panels compare), each titled with the
    rank's peak; the cursor marked in every panel."""
    with collecting(datasets):
        facts = rank_memory(trace)
        categories = _in_order([c for f in facts.values() for c in _shown(f)])
        words = [category_word(c) for c in categories]
        colour = alt.Color("what:N", sort=words, title="memory category", scale=alt.Scale(
            domain=words, range=[palette.CATEGORY_COLOURS.get(c, "#888888") for c in categories]))
        top = max((f.peak.total for f in facts.values() if f.peak), default=0)
        events = trace.events
        lo, hi = (events[0].seq, events[-1].seq) if events else (0, 1)
        x = alt.X("seq:Q", title="event seq", scale=alt.Scale(domain=[lo, max(hi, lo + 1)], nice=False, zero=False))
        y = bytes_y("bytes", top, stack="zero").scale(domain=[0, max(top, 1)])
        panels = []
        for rank, f in facts.items():
            order = {c: i for i, c in enumerate(categories)}
            rows = [{"seq": f.seqs[i], "what": category_word(c), "order": order[c], "bytes": f.by_category[c][i],
                     "size": format_bytes(f.by_category[c][i])}
                    for i in drawn_samples(f.totals, max_points) for c in categories if c in f.by_category]
            area = alt.Chart(rows_data(rows)).mark_area(interpolate="step-after").encode(
                x=x, y=y, color=colour, order=alt.Order("order:Q"),
                tooltip=[alt.Tooltip("seq:Q", title="event seq"), alt.Tooltip("what:N", title="category"),
                         alt.Tooltip("size:N", title="bytes")])
            layers: list[Any] = [area]
            if cursor is not None:
                layers.append(_cursor_rule(rows_data([{"seq": cursor}]), "seq"))
            peak = f"peak {format_bytes(f.peak.total)}" if f.peak else "no samples"
            panels.append(alt.layer(*layers).properties(title=f"rank {rank} · {peak}", width=340, height=150))
        return alt.concat(*panels, columns=2)
