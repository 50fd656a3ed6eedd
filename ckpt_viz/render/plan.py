"""The plan's trade-off curve as a chart: peak memory against recompute time, the chosen point marked.

Pure: `curve_chart` takes the planner's results (`ckpt_viz.plan.search.recommend` /
`curve`) and returns an altair chart; it computes nothing about the run. Imports altair
and the palette; never torch or a UI runtime.

    points   every Pareto-optimal policy: x = recompute (ms), y = predicted peak (MiB);
             the step line joins them (less memory costs more recompute)
    chosen   the recommended policy: a larger point in the peak colour
    budget   a dashed horizontal rule at the budget
    hover    the policy's blocks (as plain text), its peak and its recompute
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt

from ckpt_viz.render import palette

__all__ = ["curve_chart", "curve_rows"]

_MIB = float(1 << 20)
_LINE = "#4e79a7"
_BUDGET = "#b07aa1"


def curve_rows(points: Sequence[Any], chosen: Any = None, names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per curve point: peak_mib, recompute_ms, blocks (text), count, chosen (bool)."""
    from ckpt_viz.plan.search import block_ranges

    rows = []
    for p in points:
        blocks = block_ranges(p.blocks, list(names) or sorted(p.blocks)) or "(none)"
        if p.save_ops:
            blocks += f"; keep {', '.join(sorted(p.save_ops))}"
        is_chosen = (chosen is not None and p.blocks == chosen.policy.blocks
                     and p.save_ops == chosen.policy.save_ops)
        rows.append({"peak_mib": p.peak / _MIB, "recompute_ms": p.recompute_ns / 1e6, "blocks": blocks,
                     "count": len(p.blocks), "chosen": is_chosen})
    return rows


def curve_chart(points: Sequence[Any], *, chosen: Any = None, budget: int | None = None,
                names: Sequence[str] = (), title: str = "Peak memory against recompute") -> alt.LayerChart:
    """The trade-off curve (see the module docstring).

    Args:
        points: `CurvePoint`s (a Recommendation's `curve`, or `curve(...)`).
        chosen: the chosen `Prediction` (a Recommendation's `prediction`), marked; or None.
        budget: the budget in bytes, drawn as a rule; or None.
        names: the profile's block names in forward order (to write ranges like "layers.2-7").
        title: the chart's title.
    """
    rows = curve_rows(points, chosen, names)
    data = alt.Data(values=rows)
    x = alt.X("recompute_ms:Q", title="recompute per step (ms)")
    y = alt.Y("peak_mib:Q", title="predicted peak (MiB)", scale=alt.Scale(zero=False))
    tooltip = [alt.Tooltip("blocks:N", title="checkpointed"), alt.Tooltip("peak_mib:Q", title="peak (MiB)",
                                                                           format=".2f"),
               alt.Tooltip("recompute_ms:Q", title="recompute (ms)", format=".2f")]
    base = alt.Chart(data)
    line = base.mark_line(interpolate="step-after", color=_LINE, opacity=0.6).encode(x=x, y=y)
    dots = base.mark_circle(size=60, color=_LINE).encode(x=x, y=y, tooltip=tooltip)
    layers: list[Any] = [line, dots]
    if any(r["chosen"] for r in rows):
        mark = base.transform_filter("datum.chosen").mark_point(size=220, filled=True,
                                                                 color=palette.PEAK_COLOUR)
        layers.append(mark.encode(x=x, y=y, tooltip=tooltip))
    if budget is not None:
        rule = alt.Chart(alt.Data(values=[{"budget_mib": budget / _MIB}])).mark_rule(
            color=_BUDGET, strokeDash=[6, 4]).encode(y="budget_mib:Q", tooltip=[alt.Tooltip(
                "budget_mib:Q", title="budget (MiB)", format=".2f")])
        layers.append(rule)
    return alt.layer(*layers).properties(title=title, width="container", height=320)
