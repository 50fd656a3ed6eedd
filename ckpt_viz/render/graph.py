"""Graph snapshots as Graphviz DOT: the annotated checkpoint view and the plain torchviz-style view.

Pure functions of a `GraphSnapshot` (see `ckpt_viz.probe.graph` for what a snapshot
holds); they return DOT source text and never import torch, graphviz or a UI.

NOTE [ Collapsing repeated blocks ]
  1. A region is one handle's nodes: nodes whose handle_id is set (non-reentrant
     frames, retained reentrant replays) and the checkpoint node. Its satellites
     are the sinks outside it whose every parent lies inside it: its parameters,
     its backward trigger and its zero-size dummy input.
  2. Two regions are identical when their nodes and satellites have the same
     kinds, names (digits ignored: blocks.3.fc1 == blocks.7.fc1) and shapes, they
     have as many internal edges, and they are in the same state.
  3. When the graph has more than `collapse_above` nodes, each run of at least
     `min_repeat` identical regions with consecutive handle ids becomes one node
     "Block xN"; edges into or out of the run are redirected to it.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ckpt_viz.trace import GraphSnapshot

__all__ = [
    "EDGE_COLOURS",
    "GRAPH_LEGEND",
    "NODE_COLOURS",
    "STATE_COLOURS",
    "dot_attrs",
    "dot_quote",
    "render_graph",
    "render_torchviz_view",
]

NODE_COLOURS: dict[str, str] = {
    "backward": "#d9d9d9",    # grey box
    "leaf": "#a6cee3",        # blue box: parameter
    "input": "#b2df8a",       # green oval: input tensor
    "trigger": "#fdbf6f",     # orange diamond: backward trigger
    "checkpoint": "#ffd92f",  # yellow 3-D box: checkpoint node
    "block": "#ffffff",       # collapsed run; filled with its state colour
}
_NODE_SHAPES: dict[str, str] = {"backward": "box", "leaf": "box", "input": "ellipse", "trigger": "diamond",
                                "checkpoint": "box3d", "block": "folder"}
STATE_COLOURS: dict[str, str] = {  # one per `ckpt_viz.trace.lifecycle.STATES`, in its order
    "not_created": "#ffffff",
    "recorded": "#fff7bc",
    "phase_dx": "#deebf7",
    "phase_dw": "#fee6ce",
    "replaying": "#fdd0a2",
    "replayed": "#c7e9c0",
    "retained": "#e5f5e0",
    "released": "#f0f0f0",
    "collected": "#fcbba1",
}
_DASHED_STATES = {"not_created", "released", "collected"}
EDGE_COLOURS: dict[str, str] = {"dx": "#2171b5", "dw": "#e6550d", "both": "#756bb1", "none": "#bdbdbd"}

GRAPH_LEGEND = "\n".join([
    "Grey box: backward node. Blue box: parameter (with its shape). Green oval: input tensor.",
    "Orange diamond: backward trigger of a split handle. Yellow 3-D box: checkpoint node.",
    "Cluster h<id> · <state>: one checkpoint region, in the states of the Handles page; yellow recorded,",
    "light blue phase_dx, light orange phase_dw, orange replaying, green replayed, pale green retained,",
    "grey dashed released, red dashed collected.",
    "Edges: blue reached by DX (input grads), orange reached by DW (weight grads), purple both, grey neither.",
    "Folder \"Block xN\": N identical regions drawn as one node.",
])


def dot_quote(text: Any) -> str:
    """A DOT double-quoted string."""
    s = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{s}"'


def dot_attrs(**attrs: Any) -> str:
    return "[" + ", ".join(f"{k}={dot_quote(v)}" for k, v in attrs.items() if v is not None) + "]"


def _shape_text(shape: Any) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")" if shape is not None else ""


def _numel(shape: Any) -> int:
    if shape is None:
        return -1
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _label(node: Mapping[str, Any]) -> str:
    kind, name = node.get("kind"), str(node.get("name", "?"))
    h = node.get("handle_id")
    if kind == "checkpoint":
        phase = node.get("phase")
        return f"{name}\nh{h}" + (f" · {phase}" if phase in ("dx", "dw") else "")
    if kind == "trigger":
        return f"trigger h{h}"
    if kind == "input" and _numel(node.get("shape")) == 0:
        return "dummy\n(0)"  # the checkpoint's zero-size input that makes every output require grad
    if kind in ("leaf", "input"):
        return f"{name}\n{_shape_text(node.get('shape'))}".rstrip()
    return name + ("\n(excluded)" if node.get("exclude") is not None else "")


def _edge_kind(dx: bool, dw: bool) -> str:
    return "both" if dx and dw else "dx" if dx else "dw" if dw else "none"


def _region_of(node: Mapping[str, Any]) -> int | None:
    return node.get("handle_id") if node.get("kind") != "trigger" else None


def _default_state(members: Iterable[Mapping[str, Any]]) -> str:
    members = list(members)
    for n in members:
        if n.get("kind") == "checkpoint":
            if n.get("released"):
                return "released"
            if n.get("replayed"):
                return "replayed"
            return "recorded"
    return "replayed" if any(n.get("replay") for n in members) else "recorded"


_DIGITS = re.compile(r"\d+")


def render_graph(snapshot: GraphSnapshot, *, states: Mapping[int, str] | None = None, collapse: bool = True,
                 rankdir: str = "TB", collapse_above: int = 100, min_repeat: int = 3) -> str:
    """Draw one autograd graph snapshot with its checkpoint regions as DOT source.

    Args:
        snapshot: the graph (see `ckpt_viz.probe.graph.capture_graph`).
        states: handle id -> state at the cursor (`Lifecycle.states_at`, one of
            `ckpt_viz.trace.lifecycle.STATES`); without it the state comes from the
            checkpoint node's own flags.
        collapse: collapse runs of identical regions (see NOTE [ Collapsing repeated blocks ]).
        rankdir: "TB" (loss at the top) or "LR".
        collapse_above: collapse only graphs with more nodes than this.
        min_repeat: the shortest run of identical regions that is collapsed.

    Returns:
        DOT source: clusters "cluster_h<id>" labelled "h<id> · <state>", nodes "n<index>",
        collapsed runs "block<k>".

    Legend:
    """
    nodes = list(snapshot.nodes)
    index = {n["id"]: i for i, n in enumerate(nodes)}
    edges = [(index[s], index[d]) for s, d in snapshot.edges if s in index and d in index]

    regions: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        h = _region_of(n)
        if h is not None:
            regions.setdefault(h, []).append(i)
    region_state = {h: (states.get(h) if states is not None and h in states else None)
                    or _default_state(nodes[i] for i in members) for h, members in regions.items()}

    block_of: dict[int, int] = {}  # node index -> block number
    blocks: list[tuple[list[int], int]] = []  # (handle ids, nodes per region)
    if collapse and len(nodes) > collapse_above and len(regions) >= min_repeat:
        block_of, blocks = _collapse(nodes, edges, regions, region_state, min_repeat)
    collapsed = {h for handles, _ in blocks for h in handles}

    graph = dot_attrs(rankdir=rankdir, label=snapshot.label, labelloc="t", fontname="Helvetica", fontsize=12)
    out = ["digraph autograd {", f"  graph {graph};",
           f"  node {dot_attrs(fontname='Helvetica', fontsize=10, style='filled')};",
           f"  edge {dot_attrs(arrowsize='0.6')};"]
    for h in sorted(regions, key=_sort_key):
        if h in collapsed:
            continue
        state = region_state[h]
        style = "filled,dashed" if state in _DASHED_STATES else "filled,rounded"
        out.append(f"  subgraph cluster_h{h} {{")
        cluster = dot_attrs(label=f"h{h} · {state}", style=style, fillcolor=STATE_COLOURS.get(state, "#ffffff"),
                            color="#636363")
        out.append(f"    graph {cluster};")
        out.extend("    " + _node_line(i, nodes[i]) for i in regions[h])
        out.append("  }")
    for i, n in enumerate(nodes):
        if _region_of(n) is None and i not in block_of:
            out.append("  " + _node_line(i, n))
    for k, (handles, size) in enumerate(blocks):
        state = region_state[handles[0]]
        label = f"Block x{len(handles)}\nh{handles[0]} – h{handles[-1]} · {state}\n{size} nodes each"
        out.append(f"  block{k} " + dot_attrs(label=label, shape=_NODE_SHAPES["block"],
                                           fillcolor=STATE_COLOURS.get(state, NODE_COLOURS["block"]),
                                           tooltip=", ".join(f"h{h}" for h in handles)) + ";")
    out.extend(_edge_lines(nodes, edges, block_of))
    out.append("}")
    return "\n".join(out) + "\n"


# The legend lives in the docstring (pytorchviz style) and in GRAPH_LEGEND, the app's caption.
render_graph.__doc__ = (render_graph.__doc__ or "").rstrip() + "\n" + "".join(
    f"        {line}\n" for line in GRAPH_LEGEND.splitlines()) + "    "


def _sort_key(h: Any) -> tuple[int, Any]:
    return (0, h) if isinstance(h, int) else (1, str(h))


def _node_line(i: int, node: Mapping[str, Any]) -> str:
    kind = node.get("kind", "backward")
    style = "filled,rounded" if kind == "leaf" else "filled,dashed" if node.get("exclude") is not None else "filled"
    owner = f" · h{node['handle_id']}" if node.get("handle_id") is not None else ""
    reached = f" · dx {'yes' if node.get('dx_reached') else 'no'} · dw {'yes' if node.get('dw_reached') else 'no'}"
    tooltip = f"{node.get('name')} · {kind}{owner}{reached}"
    return f"n{i} " + dot_attrs(label=_label(node), shape=_NODE_SHAPES.get(kind, "box"),
                             fillcolor=NODE_COLOURS.get(kind, NODE_COLOURS["backward"]), style=style,
                             tooltip=tooltip) + ";"


def _edge_lines(nodes: list[dict[str, Any]], edges: list[tuple[int, int]], block_of: dict[int, int]) -> list[str]:
    merged: dict[tuple[str, str], list[bool]] = {}
    for s, d in edges:
        src = f"block{block_of[s]}" if s in block_of else f"n{s}"
        dst = f"block{block_of[d]}" if d in block_of else f"n{d}"
        if src == dst:
            continue
        flags = merged.setdefault((src, dst), [False, False])
        flags[0] |= bool(nodes[s].get("dx_reached") and nodes[d].get("dx_reached"))
        flags[1] |= bool(nodes[s].get("dw_reached") and nodes[d].get("dw_reached"))
    lines = []
    for (src, dst), (dx, dw) in merged.items():
        kind = _edge_kind(dx, dw)
        lines.append(f"  {src} -> {dst} " + dot_attrs(color=EDGE_COLOURS[kind],
                                                   penwidth="1.6" if kind != "none" else "1.0") + ";")
    return lines


def _collapse(nodes: list[dict[str, Any]], edges: list[tuple[int, int]], regions: dict[int, list[int]],
              region_state: dict[int, str], min_repeat: int) -> tuple[dict[int, int], list[tuple[list[int], int]]]:
    """See NOTE [ Collapsing repeated blocks ]."""
    member_of = {i: h for h, members in regions.items() for i in members}
    parents: dict[int, set[Any]] = {}
    has_children: set[int] = set()
    internal: dict[int, int] = dict.fromkeys(regions, 0)
    for s, d in edges:
        has_children.add(s)
        parents.setdefault(d, set()).add(member_of.get(s, ("outer", s)))
        if s in member_of and member_of.get(d) == member_of[s]:
            internal[member_of[s]] += 1
    satellites: dict[int, list[int]] = {h: [] for h in regions}
    for i, n in enumerate(nodes):
        if i in member_of or i in has_children:
            continue
        owners = parents.get(i, set())
        if len(owners) != 1:
            continue
        (owner,) = owners
        if owner in regions and (n.get("kind") in ("leaf", "trigger") or _numel(n.get("shape")) == 0):
            satellites[owner].append(i)

    def signature(h: int) -> tuple:
        items = sorted((str(nodes[i].get("kind")), _DIGITS.sub("#", str(nodes[i].get("name"))),
                        tuple(nodes[i].get("shape") or ())) for i in [*regions[h], *satellites[h]])
        return (region_state[h], internal[h], tuple(items))

    ordered = sorted(h for h in regions if isinstance(h, int))
    block_of: dict[int, int] = {}
    blocks: list[tuple[list[int], int]] = []
    run: list[int] = []

    def close_run() -> None:
        if len(run) >= min_repeat:
            k = len(blocks)
            blocks.append((list(run), len(regions[run[0]]) + len(satellites[run[0]])))
            for h in run:
                for i in [*regions[h], *satellites[h]]:
                    block_of[i] = k

    previous = None
    for h in ordered:
        sig = signature(h)
        if run and sig == previous and h == run[-1] + 1:
            run.append(h)
        else:
            close_run()
            run = [h]
        previous = sig
    close_run()
    return block_of, blocks


def render_torchviz_view(snapshot: GraphSnapshot) -> str:
    """The plain autograd graph, torchviz style: grey boxes for backward nodes, blue boxes for leaves.

    No checkpoint annotations: no regions, no DX/DW colours, and no retained replay
    nodes (they hang off a handle, not off the autograd graph).
    """
    nodes = list(snapshot.nodes)
    index = {n["id"]: i for i, n in enumerate(nodes) if not n.get("replay")}
    out = ["digraph autograd {", f"  graph {dot_attrs(label=snapshot.label, labelloc='t', fontname='Helvetica')};",
           f"  node {dot_attrs(style='filled', shape='box', fontsize=10, height='0.2')};"]
    for n in nodes:
        if n.get("replay"):
            continue
        i = index[n["id"]]
        if n.get("kind") in ("leaf", "input", "trigger"):
            name = "backward_trigger" if n.get("kind") == "trigger" else n.get("name", "?")
            out.append(f"  n{i} " + dot_attrs(label=f"{name}\n {_shape_text(n.get('shape'))}".rstrip(),
                                           fillcolor="lightblue") + ";")
        else:
            out.append(f"  n{i} " + dot_attrs(label=n.get("name", "?"), fillcolor="lightgrey") + ";")
    for s, d in snapshot.edges:  # torchviz draws from an input's node to its user: leaves on top
        if s in index and d in index:
            out.append(f"  n{index[d]} -> n{index[s]};")
    out.append("}")
    return "\n".join(out) + "\n"
