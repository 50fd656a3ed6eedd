"""DX/DW routing of one backward pass: which handles replayed, where their gradients went, what DW released.

Pure functions of the trace events; DOT source out, no torch, graphviz or UI import.

NOTE [ Backward passes ]
  1. A pass is a run of engine-side events: backward_entered, replays triggered by
     backward, tensor_unpacked, grads_routed, the releases and refusals they cause.
  2. It ends at any forward-side or session event (phase_set, handle_created,
     session_*, prefired, an explicit release), when the phase, the call site or
     the stage/micro-batch tags change, or when a handle enters a second time.
     memory_sampled and node_collected neither join nor end a pass.
  3. `routing_at(trace, c)` describes the pass containing c, or the last one before
     c, as of c: a cursor in the middle of DX shows the handles routed so far.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any

from ckpt_viz.render.graph import EDGE_COLOURS, NODE_COLOURS, dot_attrs, dot_quote
from ckpt_viz.trace import Trace
from ckpt_viz.trace.index import derived, event_column

__all__ = ["backward_passes", "render_routing", "routing_at"]

_JOIN = {"backward_entered", "replay_started", "replay_finished", "replay_failed", "early_stopped", "replay_refused",
         "grads_routed", "released", "tensor_unpacked", "exclude_reused", "error"}
_NEUTRAL = {"memory_sampled", "node_collected"}
_BACKWARD_RELEASES = {"ordinary_backward_complete", "dw_complete", "backward_exception"}


def backward_passes(trace: Trace) -> list[dict[str, Any]]:
    """Every backward pass (see NOTE [ Backward passes ]) as {start_seq, end_seq, phase, site, positions}."""
    return derived(trace, "routing:passes", _passes)


def _joins(kind: str, data: Any) -> bool:
    if kind not in _JOIN:
        return False
    if kind in ("replay_started", "replay_finished"):
        return data.get("trigger") != "prefire"
    if kind == "released":
        return data.get("reason") in _BACKWARD_RELEASES
    if kind == "error":
        return data.get("where") == "backward"
    return True


def _passes(trace: Trace) -> list[dict[str, Any]]:
    seqs, kinds = event_column(trace, "seq"), event_column(trace, "kind")
    handles, phases = event_column(trace, "handle_id"), event_column(trace, "phase")
    sites, tags, datas = event_column(trace, "site"), event_column(trace, "tags"), event_column(trace, "data")
    passes: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    entered: set[Any] = set()
    for i, kind in enumerate(kinds):
        if kind in _NEUTRAL:
            continue
        if not _joins(kind, datas[i]):
            current = None
            continue
        phase = phases[i] if kind != "tensor_unpacked" else None
        site = sites[i]
        group = (tags[i].get("stage"), tags[i].get("microbatch")) if tags[i] else (None, None)
        fresh = current is None or (
            (phase is not None and current["phase"] is not None and phase != current["phase"])
            or (site is not None and current["site"] is not None and site != current["site"])
            or group != current["group"]
            or (kind == "backward_entered" and handles[i] in entered))
        if fresh:
            current = {"start_seq": seqs[i], "end_seq": seqs[i], "phase": phase, "site": site, "group": group,
                       "positions": []}
            entered = set()
            passes.append(current)
        assert current is not None
        current["positions"].append(i)
        current["end_seq"] = seqs[i]
        current["phase"] = current["phase"] or phase
        current["site"] = current["site"] or site
        if kind == "backward_entered":
            entered.add(handles[i])
    return passes


def _empty() -> dict[str, Any]:
    return {"phase": None, "start_seq": None, "end_seq": None, "site": None, "stage": None, "microbatch": None,
            "complete": True, "handles": [], "handles_replayed": [], "targets": {}, "explicit_params": {},
            "discarded": {}, "captured": {}, "captured_missed": {}, "released": [], "release_reasons": {},
            "refused": []}


def routing_at(trace: Trace, cursor: int | None) -> dict[str, Any]:
    """The backward pass containing `cursor` (or the last one before it), as of `cursor`.

    Returns:
        {phase, start_seq, end_seq, site, stage, microbatch, complete (the pass ended
        by the cursor), handles (entered or replayed, in order), handles_replayed,
        targets {handle: input indices that received gradients}, explicit_params
        {handle: indices}, discarded {handle: activation grads DW dropped}, captured
        {handle: [parameter names or shapes whose .grad was accumulated]},
        captured_missed {handle: [...] not accumulated}, released [handles],
        release_reasons {handle: reason}, refused [handles]}.
        With no pass before the cursor: the same keys, empty.
    """
    passes = backward_passes(trace)
    if not passes:
        return _empty()
    cursor = cursor if cursor is not None else passes[-1]["end_seq"]
    starts = derived(trace, "routing:starts", lambda t: [p["start_seq"] for p in backward_passes(t)])
    at = bisect_right(starts, cursor) - 1
    if at < 0:
        return _empty()
    chosen = passes[at]
    out = _empty()
    out.update(phase=chosen["phase"], start_seq=chosen["start_seq"], end_seq=min(chosen["end_seq"], cursor),
               site=chosen["site"], stage=chosen["group"][0], microbatch=chosen["group"][1],
               complete=chosen["end_seq"] <= cursor)
    events = trace.events
    for i in chosen["positions"]:
        e = events[i]
        if e.seq > cursor:
            break
        h = e.handle_id
        if h is not None and h not in out["handles"] and e.kind in ("backward_entered", "replay_started",
                                                                     "grads_routed", "tensor_unpacked"):
            out["handles"].append(h)
        if e.kind == "replay_started" and h not in out["handles_replayed"]:
            out["handles_replayed"].append(h)
        elif e.kind == "grads_routed":
            out["targets"][h] = list(e.data.get("targets", []))
            out["explicit_params"][h] = list(e.data.get("explicit_params", []))
            if e.data.get("discarded_activations"):
                out["discarded"][h] = list(e.data["discarded_activations"])
            captured = e.data.get("captured") or []
            names = [(c.get("name") or f"tensor{tuple(c.get('shape') or ())}", bool(c.get("accumulated")))
                     for c in captured]
            if names:
                out["captured"][h] = [n for n, hit in names if hit]
                out["captured_missed"][h] = [n for n, hit in names if not hit]
        elif e.kind == "released":
            out["released"].append(h)
            out["release_reasons"][h] = e.data.get("reason")
        elif e.kind == "replay_refused":
            out["refused"].append(h)
    return out


_PHASE_TITLE = {"dx": "DX pass (input grads)", "dw": "DW pass (weight grads)", "ordinary": "ordinary backward"}


def render_routing(trace: Trace, cursor: int | None) -> str:
    """The pass of `routing_at` as DOT: handles on the left, the gradients they routed on the right.

    Blue edges: input gradients (DX, or the activations of an ordinary pass).
    Orange edges: parameter gradients through an input edge (explicit parameters).
    Dashed orange: captured parameters, accumulated into .grad by the inner backward.
    Dashed grey: activation gradients DW computed and the engine dropped.
    A handle box is green when it replayed in this pass, grey dashed when the pass released it,
    red when its replay was refused.
    """
    r = routing_at(trace, cursor)
    title = "no backward pass yet" if r["start_seq"] is None else (
        f"{_PHASE_TITLE.get(r['phase'] or '', 'backward pass')} · events {r['start_seq']}–{r['end_seq']}"
        + ("" if r["complete"] else " (running)") + (f" · {r['site']}" if r["site"] else ""))
    out = ["digraph routing {", f"  graph {dot_attrs(rankdir='LR', label=title, labelloc='t', fontname='Helvetica')};",
           f"  node {dot_attrs(fontname='Helvetica', fontsize=10, style='filled')};",
           f"  edge {dot_attrs(fontname='Helvetica', fontsize=9)};"]
    if not r["handles"]:
        out.append(f"  empty {dot_attrs(label='no checkpoint reached', shape='plaintext', style='')};")
    for h in r["handles"]:
        out.extend(_handle_lines(h, r))
    out.append("}")
    return "\n".join(out) + "\n"


def _handle_lines(h: int, r: dict[str, Any]) -> list[str]:
    notes = []
    if h in r["handles_replayed"]:
        notes.append("replayed here")
    if h in r["refused"]:
        notes.append("replay refused")
    if h in r["released"]:
        notes.append(f"released ({r['release_reasons'].get(h)})")
    fill = "#fcbba1" if h in r["refused"] else "#f0f0f0" if h in r["released"] else \
        "#c7e9c0" if h in r["handles_replayed"] else NODE_COLOURS["checkpoint"]
    style = "filled,dashed" if h in r["released"] else "filled"
    box = dot_attrs(label="\n".join([f"h{h}", *notes]), shape="box3d", fillcolor=fill, style=style)
    lines = [f"  h{h} {box};"]
    explicit = set(r["explicit_params"].get(h, []))
    activation_colour = EDGE_COLOURS["dx"]
    for idx in r["targets"].get(h, []):
        is_param = idx in explicit
        kind = "leaf" if is_param else "input"
        lines.append(f"  h{h}_in{idx} " + dot_attrs(label=f"{'param' if is_param else 'input'} {idx}",
                                                 shape="box" if is_param else "ellipse",
                                                 fillcolor=NODE_COLOURS[kind]) + ";")
        colour = EDGE_COLOURS["dw"] if is_param else activation_colour
        lines.append(f"  h{h} -> h{h}_in{idx} " + dot_attrs(color=colour, label="dW" if is_param else "dX",
                                                        fontcolor=colour, penwidth="1.6") + ";")
    for idx in r["discarded"].get(h, []):
        lines.append(f"  h{h}_in{idx} " + dot_attrs(label=f"input {idx}", shape="ellipse",
                                                 fillcolor=NODE_COLOURS["input"]) + ";")
        lines.append(f"  h{h} -> h{h}_in{idx} " + dot_attrs(color=EDGE_COLOURS["none"], style="dashed",
                                                        label="dropped", fontcolor="#969696") + ";")
    for k, name in enumerate(r["captured"].get(h, [])):
        lines.append(f"  h{h}_cap{k} [label={dot_quote(name)}, shape=\"box\", style=\"filled,rounded\", "
                     f"fillcolor=\"{NODE_COLOURS['leaf']}\"];")
        lines.append(f"  h{h} -> h{h}_cap{k} " + dot_attrs(color=EDGE_COLOURS["dw"], style="dashed", label=".grad",
                                                        fontcolor=EDGE_COLOURS["dw"]) + ";")
    for k, name in enumerate(r["captured_missed"].get(h, [])):
        lines.append(f"  h{h}_miss{k} [label={dot_quote(name + ' (no grad)')}, shape=\"box\", style=\"dashed\"];")
        lines.append(f"  h{h} -> h{h}_miss{k} " + dot_attrs(color=EDGE_COLOURS["none"], style="dotted") + ";")
    return lines
