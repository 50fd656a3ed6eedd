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
     c, as of c: a cursor in the middle of DX shows the handles routed so far. A handle
     is "replayed" once its replay finished (or stopped early), "replaying" before.

NOTE [ The flow of DX ]
  1. DX goes from block to block: the gradient of one region's input is the gradient
     of the output of the region that produced it. The graph snapshot taken last at
     or before the pass says who feeds whom: from each region, follow the edges
     through nodes of no region until another region, the model input, or a dead end.
  2. Without a snapshot covering the pass's handles (graphs=False, a pipeline stage's
     own graph), the handles are chained in the order the pass reached them, drawn
     dashed: the engine reaches the next region once the gradient arrived there.
"""
from __future__ import annotations

from bisect import bisect_right
from itertools import pairwise
from typing import Any

from ckpt_viz.render.graph import EDGE_COLOURS, NODE_COLOURS, dot_attrs, dot_quote
from ckpt_viz.render.palette import CATEGORY_COLOURS, MARK_COLOURS, STATE_FILLS
from ckpt_viz.trace import GraphSnapshot, Trace
from ckpt_viz.trace.cache import derived, event_column, event_data

__all__ = ["backward_passes", "handle_flow", "input_words", "pass_title", "release_words", "render_routing",
           "routing_at"]

_JOIN = {"backward_entered", "replay_started", "replay_finished", "replay_failed", "early_stopped", "replay_refused",
         "grads_routed", "released", "tensor_unpacked", "exclude_reused", "error"}
_NEUTRAL = {"memory_sampled", "node_collected"}
_CHECKED = {"replay_started", "replay_finished", "released", "error"}  # kinds that join by their data
_BACKWARD_RELEASES = {"ordinary_backward_complete", "dw_complete", "backward_exception"}


def backward_passes(trace: Trace) -> list[dict[str, Any]]:
    """Every backward pass (see NOTE [ Backward passes ]) as {start_seq, end_seq, phase, site, positions}."""
    return derived(trace, "routing:passes", _passes)


def _joins(kind: str, i: int, data: Any) -> bool:
    """Whether event i (of `kind`; `data(i, key)` reads its data) joins a backward pass."""
    if kind not in _JOIN:
        return False
    if kind in ("replay_started", "replay_finished"):
        return data(i, "trigger") != "prefire"
    if kind == "released":
        return data(i, "reason") in _BACKWARD_RELEASES
    if kind == "error":
        return data(i, "where") == "backward"
    return True


def _passes(trace: Trace) -> list[dict[str, Any]]:
    seqs, kinds = event_column(trace, "seq"), event_column(trace, "kind")
    handles, phases = event_column(trace, "handle_id"), event_column(trace, "phase")
    sites, tags = event_column(trace, "site"), event_column(trace, "tags")
    data = event_data(trace)  # a few keys of a few kinds: a loaded trace builds no data dict
    passes: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    entered: set[Any] = set()
    groups: dict[int, tuple[Any, Any]] = {}  # id(tags) -> (stage, microbatch): tags objects repeat
    alive: list[Any] = []  # the tags objects `groups` holds ids of
    join, neutral, checked = _JOIN, _NEUTRAL, _CHECKED
    for i, kind in enumerate(kinds):
        if kind not in join:
            if kind not in neutral:
                current = None
            continue
        if kind in checked and not _joins(kind, i, data):
            current = None
            continue
        phase = phases[i] if kind != "tensor_unpacked" else None
        site = sites[i]
        t = tags[i]
        group = groups.get(id(t))
        if group is None:
            group = groups[id(t)] = (t.get("stage"), t.get("microbatch")) if t else (None, None)
            alive.append(t)
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
            "complete": True, "handles": [], "handles_replaying": [], "handles_replayed": [], "targets": {},
            "explicit_params": {},
            "discarded": {}, "captured": {}, "captured_missed": {}, "released": [], "release_reasons": {},
            "refused": []}


def routing_at(trace: Trace, cursor: int | None) -> dict[str, Any]:
    """The backward pass containing `cursor` (or the last one before it), as of `cursor`.

    Returns:
        {phase, start_seq, end_seq, site, stage, microbatch, complete (the pass ended
        by the cursor), handles (entered or replayed, in order), handles_replaying
        (replay started, not finished by the cursor), handles_replayed (finished),
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
        if e.kind == "replay_started" and h not in out["handles_replaying"] + out["handles_replayed"]:
            out["handles_replaying"].append(h)
        elif e.kind in ("replay_finished", "early_stopped") and h not in out["handles_replayed"]:
            if h in out["handles_replaying"]:
                out["handles_replaying"].remove(h)
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


_PHASE_TITLE = {"dx": "DX pass (input grads)", "dw": "DW pass (weight grads)", "ordinary": "full backward"}
_RELEASE_WORDS = {"ordinary_backward_complete": "its backward is done", "dw_complete": "DW is done",
                  "backward_exception": "the backward failed", "forward_exception": "the forward failed",
                  "session_cleared": "its session was cleared", "explicit_release": "released by the code"}


def release_words(reason: str | None) -> str:
    """A release reason in words: "dw_complete" -> "DW is done"."""
    return _RELEASE_WORDS.get(reason or "", (reason or "").replace("_", " "))


def pass_title(r: dict[str, Any]) -> str:
    """What the pass of `routing_at` is, in words: phase, pipeline stage and micro-batch, events, call site."""
    if r["start_seq"] is None:
        return "no backward pass yet"
    parts = [_PHASE_TITLE.get(r["phase"] or "ordinary", "backward pass")]
    if r["stage"] is not None or r["microbatch"] is not None:
        parts.append(", ".join(p for p in (f"stage {r['stage']}" if r["stage"] is not None else "",
                                           f"micro-batch {r['microbatch']}" if r["microbatch"] is not None else "")
                               if p))
    parts.append(f"events {r['start_seq']}–{r['end_seq']}" + ("" if r["complete"] else " (running)"))
    if r["site"]:
        parts.append(r["site"])
    return " · ".join(parts)


def _created(trace: Trace) -> dict[Any, dict[str, Any]]:
    found: dict[Any, dict[str, Any]] = {}
    for kind, h, data in zip(event_column(trace, "kind"), event_column(trace, "handle_id"),
                             event_column(trace, "data")):
        if kind == "handle_created" and h not in found:
            found[h] = dict(data or {})
    return found


def input_words(trace: Trace, h: Any, index: int, *, parameter: bool = False) -> str:
    """A checkpoint input in words: "x, the block's input (512, 32)" or "input 2 of 3 (a parameter, (4, 4))"."""
    created = derived(trace, "routing:created", _created).get(h, {})
    inputs = created.get("inputs") or []
    mask = created.get("param_input_mask") or []
    shape = inputs[index].get("shape") if index < len(inputs) and isinstance(inputs[index], dict) else None
    size = f"({', '.join(str(d) for d in shape)})" if shape is not None else ""
    if parameter or (index < len(mask) and mask[index]):
        return f"parameter input {index + 1} {size}".rstrip()
    if len(inputs) <= 1:
        return f"the block's input {size}".rstrip()
    return f"input {index + 1} of {len(inputs)} {size}".rstrip()


def handle_flow(snapshot: GraphSnapshot | None, handles: list[Any]) -> list[tuple[Any, Any, bool]]:
    """Who feeds whom among `handles` (see NOTE [ The flow of DX ]): (from, to, from the graph) triples.

    `to` is a handle id or "input" (the model input). The first handle also gets
    ("loss", first, ...). Triples from the graph have True; the fallback chain False.
    """
    if not handles:
        return []
    flow: list[tuple[Any, Any, bool]] = []
    if snapshot is not None:
        flow = _graph_flow(snapshot, set(handles))
    if not flow or not {h for edge in flow for h in edge[:2]} >= set(handles):
        chain: list[Any] = ["loss", *handles]
        return [(a, b, False) for a, b in pairwise(chain)]
    return flow


def _graph_flow(snapshot: GraphSnapshot, wanted: set[Any]) -> list[tuple[Any, Any, bool]]:
    region = {n["id"]: n.get("handle_id") for n in snapshot.nodes
              if n.get("kind") != "trigger" and n.get("handle_id") is not None and not n.get("replay")}
    kind = {n["id"]: n.get("kind") for n in snapshot.nodes}
    inner = {n["id"] for n in snapshot.nodes if n.get("replay")}  # a retained replay: not the outer graph
    empty = {n["id"] for n in snapshot.nodes if n.get("shape") is not None and 0 in n["shape"]}
    children: dict[Any, list[Any]] = {}
    has_parent: set[Any] = set()
    for s, d in snapshot.edges:
        children.setdefault(s, []).append(d)
        has_parent.add(d)

    def reached(starts: list[Any], owner: Any) -> list[Any]:
        found, stack, seen = [], list(starts), set()
        while stack:
            nid = stack.pop()
            if nid in seen or nid in inner:
                continue
            seen.add(nid)
            h = region.get(nid)
            if h is not None and h != owner:
                found.append(h)
            elif h is None and kind.get(nid) == "input" and nid not in empty:
                found.append("input")
            elif h is None or h == owner:
                stack.extend(children.get(nid, ()))
        return found

    flow: list[tuple[Any, Any, bool]] = []
    roots = [n for n in children if n not in has_parent and n not in region]
    for h in reached(roots, None):
        if h in wanted and ("loss", h, True) not in flow:
            flow.append(("loss", h, True))
    for h in sorted(wanted, key=str):
        members = [nid for nid, owner in region.items() if owner == h]
        for to in reached(members, h):
            if (to in wanted or to == "input") and (h, to, True) not in flow:
                flow.append((h, to, True))
    return flow


def render_routing(trace: Trace, cursor: int | None) -> str:
    """The pass of `routing_at` as DOT: the flow of DX from block to block, and where each block's DW went.

    Loss on the left, then the checkpoint regions in the order DX reaches them, then the
    model input (see NOTE [ The flow of DX ]). Blue edges: DX (input grads) flowing on;
    grey dashed: the DW pass computed that input grad and dropped it, or nothing flowed
    yet. Orange: DW (weight grads): parameters given through an input, dashed to the
    parameters whose .grad the block's inner backward accumulated. A region is green
    once it replayed in this pass, pale green while replaying, grey dashed when the pass
    released it, dark red when its replay was refused.
    """
    r = routing_at(trace, cursor)
    graph = dot_attrs(rankdir="LR", label=pass_title(r), labelloc="t", fontname="Helvetica", fontsize=12)
    out = ["digraph routing {", f"  graph {graph};",
           f"  node {dot_attrs(fontname='Helvetica', fontsize=10, style='filled')};",
           f"  edge {dot_attrs(fontname='Helvetica', fontsize=9)};"]
    if not r["handles"]:
        out.append(f"  empty {dot_attrs(label='no checkpoint reached', shape='plaintext', style='')};")
        out.append("}")
        return "\n".join(out) + "\n"
    snapshot = _snapshot_before(trace, r["start_seq"])
    flow = handle_flow(snapshot, r["handles"])
    start = "loss" if r["stage"] is None else "grad of the stage's output"
    out.append(f"  loss {dot_attrs(label=start, shape='ellipse', fillcolor='#ffffff')};")
    if any(to == "input" for _, to, _ in flow):
        out.append(f"  input {dot_attrs(label='model input', shape='ellipse', fillcolor=NODE_COLOURS['input'])};")
    for h in r["handles"]:
        out.extend(_handle_lines(trace, h, r))
    for a, b, known in flow:
        out.append(_flow_line(a, b, known, r))
    out.append("}")
    return "\n".join(out) + "\n"


def _snapshot_before(trace: Trace, seq: int) -> GraphSnapshot | None:
    """The last snapshot at or before `seq` (the first one when none is)."""
    before = [g for g in trace.graphs if g.seq <= seq]
    return before[-1] if before else (trace.graphs[0] if trace.graphs else None)


def _flow_line(a: Any, b: Any, known: bool, r: dict[str, Any]) -> str:
    src, dst = ("loss" if a == "loss" else f"h{a}"), ("input" if b == "input" else f"h{b}")
    routed = a == "loss" or a in r["targets"] or (r["phase"] != "dx" and a in r["handles_replayed"])
    if r["phase"] == "dw":
        label = "DX dropped" if a != "loss" and r["discarded"].get(a) else ""
        attrs = dot_attrs(color=EDGE_COLOURS["none"], style="dashed", label=label or None, fontcolor="#969696")
    elif routed and (a == "loss" or r["targets"].get(a, [0])):
        attrs = dot_attrs(color=EDGE_COLOURS["dx"], label="DX", fontcolor=EDGE_COLOURS["dx"], penwidth="1.8",
                          style=None if known else "dashed")
    else:
        attrs = dot_attrs(color=EDGE_COLOURS["none"], style="dashed")
    return f"  {src} -> {dst} {attrs};"


def _handle_lines(trace: Trace, h: Any, r: dict[str, Any]) -> list[str]:
    name = derived(trace, "routing:created", _created).get(h, {}).get("function")
    notes = [f"h{h}" + (f" · {name}" if name else "")]
    if h in r["handles_replayed"]:
        notes.append("replayed here")
    elif h in r["handles_replaying"]:
        notes.append("replaying")
    if h in r["refused"]:
        notes.append("replay refused")
    if h in r["released"]:
        notes.append(f"released: {release_words(r['release_reasons'].get(h))}")
    if h in r["targets"] and not r["targets"][h] and r["phase"] != "dw":
        notes.append("no inputs got a gradient")
    fill = CATEGORY_COLOURS["checkpoint_inputs"]
    if h in r["refused"]:
        fill = "#fcbba1"
    elif h in r["released"]:
        fill = STATE_FILLS["released"]
    elif h in r["handles_replayed"]:
        fill = STATE_FILLS["replayed"]
    elif h in r["handles_replaying"]:
        fill = STATE_FILLS["replaying"]
    box = dot_attrs(label="\n".join(notes), shape="box3d", fillcolor=fill,
                    style="filled,dashed" if h in r["released"] else "filled",
                    color=MARK_COLOURS["refused"] if h in r["refused"] else None,
                    penwidth="3" if h in r["refused"] else None)
    lines = [f"  h{h} {box};"]
    for idx in r["explicit_params"].get(h, []):
        lines.append(f"  h{h}_in{idx} " + dot_attrs(label=input_words(trace, h, idx, parameter=True), shape="box",
                                                 style="filled,rounded", fillcolor=NODE_COLOURS["leaf"]) + ";")
        lines.append(f"  h{h} -> h{h}_in{idx} " + dot_attrs(color=EDGE_COLOURS["dw"], label="DW",
                                                        fontcolor=EDGE_COLOURS["dw"], penwidth="1.6") + ";")
    for k, name in enumerate(r["captured"].get(h, [])):
        lines.append(f"  h{h}_cap{k} [label={dot_quote(name)}, shape=\"box\", style=\"filled,rounded\", "
                     f"fillcolor=\"{NODE_COLOURS['leaf']}\"];")
        lines.append(f"  h{h} -> h{h}_cap{k} " + dot_attrs(color=EDGE_COLOURS["dw"], style="dashed", label="DW: .grad",
                                                        fontcolor=EDGE_COLOURS["dw"]) + ";")
    for k, name in enumerate(r["captured_missed"].get(h, [])):
        lines.append(f"  h{h}_miss{k} [label={dot_quote(name + ' (no grad)')}, shape=\"box\", style=\"dashed\"];")
        lines.append(f"  h{h} -> h{h}_miss{k} " + dot_attrs(color=EDGE_COLOURS["none"], style="dotted") + ";")
    return lines
