"""The Routing page's table: one row per handle of the pass at the cursor, in words.

A pure function of the trace (`routing_at`, `handle_flow`); no raw index lists, no "input 0".
"""
from __future__ import annotations

from typing import Any

from ckpt_viz.render.routing import _snapshot_before, handle_flow, input_words, release_words, routing_at
from ckpt_viz.trace import Trace

__all__ = ["routing_rows"]


def _state(h: Any, r: dict[str, Any]) -> str:
    if h in r["refused"]:
        return "replay refused"
    if h in r["released"]:
        return "released: " + release_words(r["release_reasons"].get(h))
    if h in r["handles_replayed"]:
        return "replayed here"
    return "replaying" if h in r["handles_replaying"] else "reached (no replay in this pass)"


def _receiver(to: Any) -> str:
    return "the model input" if to == "input" else f"h{to}"


def routing_rows(trace: Trace, cursor: int | None) -> list[dict[str, str]]:
    """Per handle of the pass at `cursor`: its state in the pass, where its DX went (and on to whom), its DW."""
    r = routing_at(trace, cursor)
    if r["start_seq"] is None:
        return []
    flow = handle_flow(_snapshot_before(trace, r["start_seq"]), r["handles"])
    onward = {a: b for a, b, _ in flow if a != "loss"}
    rows = []
    for h in r["handles"]:
        explicit = set(r["explicit_params"].get(h, []))
        if r["phase"] == "dw":
            dx = "none (DW pass)"
        elif h not in r["targets"]:
            dx = "not routed yet"
        else:
            words = [input_words(trace, h, i) for i in r["targets"][h] if i not in explicit]
            dx = ", ".join(words) if words else "no inputs got a gradient"
            if words and h in onward:
                dx += f", on to {_receiver(onward[h])}"
        rows.append({
            "handle": f"h{h}",
            "in this pass": _state(h, r),
            "DX went to": dx,
            "DW to parameter inputs": ", ".join(input_words(trace, h, i, parameter=True) for i in sorted(explicit))
            or "none",
            "parameters given .grad": ", ".join(r["captured"].get(h, [])) or "none",
            "DX dropped (DW pass)": ", ".join(input_words(trace, h, i) for i in r["discarded"].get(h, [])) or "none",
        })
    return rows
