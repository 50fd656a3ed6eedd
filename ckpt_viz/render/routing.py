"""The DX/DW routing of one backward pass as a `graphviz.Digraph`: the flow of DX from block to block, and
where each block's DW went.

Draws `ckpt_viz.analysis.routing` (the pass at the cursor, NOTE [ Routing at a cursor ], and the flow
of DX, NOTE [ The flow of DX ], there); its table is `analysis.routing.routing_rows`. Every text is
data, drawn as its characters (NOTE [ Text in a graph ] in ckpt_viz/render/graph.py). Never torch
or a UI.
"""
from __future__ import annotations

from typing import Any

import graphviz

from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.routing import Routing, handle_flow, input_words, pass_title, routing_at, snapshot_before
from ckpt_viz.analysis.words import reason_word
from ckpt_viz.render.graph import EDGE_COLOURS, NODE_COLOURS, dot_text
from ckpt_viz.render.palette import CATEGORY_COLOURS, MARK_COLOURS, STATE_FILLS
from ckpt_viz.trace import Trace

__all__ = ["render_routing"]


def render_routing(trace: Trace, cursor: int | None) -> graphviz.Digraph:
    """The pass of `routing_at(trace, cursor)`: the flow of DX from block to block, and where each block's DW went.

    Loss on the left, then the checkpoint regions in the order DX reaches them, then the
    model input. Blue edges: DX (input grads) flowing on; grey dashed: the DW pass computed
    that input grad and dropped it, or nothing flowed yet. Orange: DW (weight grads):
    parameters given through an input, dashed to the parameters whose .grad the block's
    inner backward accumulated. A region is green once it replayed in this pass, pale green
    while replaying, grey dashed when the pass released it, dark red when its replay was refused.
    """
    r = routing_at(trace, cursor)
    graph = graphviz.Digraph("routing", graph_attr={"rankdir": "LR", "label": dot_text(pass_title(r)), "labelloc": "t",
                                                    "fontname": "Helvetica", "fontsize": "12"},
                             node_attr={"fontname": "Helvetica", "fontsize": "10", "style": "filled"},
                             edge_attr={"fontname": "Helvetica", "fontsize": "9"})
    if not r.handles:
        graph.node("empty", label=dot_text("no checkpoint reached"), shape="plaintext", style="")
        return graph
    flow = handle_flow(snapshot_before(trace, r.start_seq if r.start_seq is not None else 0), r.handles)
    start = "loss" if r.stage is None else "grad of the stage's output"
    graph.node("loss", label=dot_text(start), shape="ellipse", fillcolor="#ffffff")
    if any(to == "input" for _, to, _ in flow):
        graph.node("input", label=dot_text("model input"), shape="ellipse", fillcolor=NODE_COLOURS["input"])
    names = handle_labels(trace)
    for h in r.handles:
        _handle(graph, trace, h, r, names.get(h))
    for a, b, known in flow:
        _flow(graph, a, b, known, r)
    return graph


def _flow(graph: graphviz.Digraph, a: Any, b: Any, known: bool, r: Routing) -> None:
    src, dst = ("loss" if a == "loss" else f"h{a}"), ("input" if b == "input" else f"h{b}")
    routed = a == "loss" or a in r.targets or (r.phase != "dx" and a in r.replayed)
    if r.phase == "dw":
        attrs = {"color": EDGE_COLOURS["none"], "style": "dashed", "fontcolor": "#969696"}
        if a != "loss" and r.discarded.get(a):
            attrs["label"] = dot_text("DX dropped")
    elif routed and (a == "loss" or r.targets.get(a, (0,))):
        attrs = {"color": EDGE_COLOURS["dx"], "label": dot_text("DX"), "fontcolor": EDGE_COLOURS["dx"],
                 "penwidth": "1.8"}
        if not known:
            attrs["style"] = "dashed"
    else:
        attrs = {"color": EDGE_COLOURS["none"], "style": "dashed"}
    graph.edge(src, dst, **attrs)


def _handle(graph: graphviz.Digraph, trace: Trace, h: int, r: Routing, name: str | None) -> None:
    notes = [f"h{h}" + (f" · {name}" if name else "")]
    if h in r.replayed:
        notes.append("replayed here")
    elif h in r.replaying:
        notes.append("replaying")
    if h in r.refused:
        notes.append("replay refused")
    if h in r.released:
        notes.append(f"released: {reason_word(r.release_reasons.get(h))}")
    if h in r.targets and not r.targets[h] and r.phase != "dw":
        notes.append("no inputs got a gradient")
    fill = CATEGORY_COLOURS["checkpoint_inputs"]
    if h in r.refused:
        fill = "#fcbba1"
    elif h in r.released:
        fill = STATE_FILLS["released"]
    elif h in r.replayed:
        fill = STATE_FILLS["replayed"]
    elif h in r.replaying:
        fill = STATE_FILLS["replaying"]
    box = {"label": dot_text(*notes), "shape": "box3d", "fillcolor": fill,
           "style": "filled,dashed" if h in r.released else "filled"}
    if h in r.refused:
        box.update(color=MARK_COLOURS["refused"], penwidth="3")
    graph.node(f"h{h}", **box)
    for idx in r.explicit_params.get(h, ()):
        graph.node(f"h{h}_in{idx}", label=dot_text(input_words(trace, h, idx, parameter=True)), shape="box",
                   style="filled,rounded", fillcolor=NODE_COLOURS["leaf"])
        graph.edge(f"h{h}", f"h{h}_in{idx}", color=EDGE_COLOURS["dw"], label=dot_text("DW"),
                   fontcolor=EDGE_COLOURS["dw"], penwidth="1.6")
    for k, param in enumerate(r.captured.get(h, ())):
        graph.node(f"h{h}_cap{k}", label=dot_text(param), shape="box", style="filled,rounded",
                   fillcolor=NODE_COLOURS["leaf"])
        graph.edge(f"h{h}", f"h{h}_cap{k}", color=EDGE_COLOURS["dw"], style="dashed", label=dot_text("DW: .grad"),
                   fontcolor=EDGE_COLOURS["dw"])
    for k, param in enumerate(r.captured_missed.get(h, ())):
        graph.node(f"h{h}_miss{k}", label=dot_text(f"{param} (no grad)"), shape="box", style="dashed")
        graph.edge(f"h{h}", f"h{h}_miss{k}", color=EDGE_COLOURS["none"], style="dotted")
