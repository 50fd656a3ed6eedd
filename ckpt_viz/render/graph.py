"""Graph snapshots as Graphviz DOT: the annotated checkpoint view and torchviz's own view.

Pure functions of a `GraphSnapshot` (see `ckpt_viz.probe.graph` for what a snapshot
holds); they return DOT source text and never import torch, graphviz or a UI. Colours
and words come from `ckpt_viz.render.palette`; `ckpt_viz.render.svg` draws the SVG.

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
     "Block xN"; edges into or out of the run are redirected to it. A highlighted or
     refused handle is never collapsed: it must stay visible.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ckpt_viz.render.palette import (
    ACTION_COLOURS,
    CATEGORY_COLOURS,
    CURSOR_COLOUR,
    MARK_COLOURS,
    STATE_FILLS,
    state_word,
)
from ckpt_viz.trace import GraphSnapshot, Trace
from ckpt_viz.trace.cache import event_column

__all__ = [
    "EDGE_COLOURS",
    "EXCLUDED_FILL",
    "GRAPH_LEGEND",
    "NODE_COLOURS",
    "REGION_FILLS",
    "TORCHVIZ_LEGEND",
    "collapse_runs",
    "dot_attrs",
    "dot_quote",
    "refused_handles",
    "render_graph",
    "render_torchviz_view",
]

NODE_COLOURS: dict[str, str] = {
    "backward": "#ffffff",                        # white box: backward node
    "leaf": CATEGORY_COLOURS["parameters"],        # grey box: parameter
    "input": CATEGORY_COLOURS["other"],            # teal oval: input tensor
    "trigger": "#fdae6b",                          # orange diamond: backward trigger (DW's hue)
    "checkpoint": CATEGORY_COLOURS["checkpoint_inputs"],  # yellow 3-D box: checkpoint node
    "block": "#ffffff",                            # collapsed run; filled with its state colour
}
_NODE_SHAPES: dict[str, str] = {"backward": "box", "leaf": "box", "input": "ellipse", "trigger": "diamond",
                                "checkpoint": "box3d", "block": "folder"}
REGION_FILLS: dict[str, str] = STATE_FILLS  # one per `ckpt_viz.trace.lifecycle.STATES`: the light state colours
EXCLUDED_FILL = "#eadccf"  # a light version of the excluded_outputs brown
_DASHED_STATES = {"not_created", "released", "collected"}
EDGE_COLOURS: dict[str, str] = {"dx": ACTION_COLOURS["DX"], "dw": ACTION_COLOURS["DW"], "both": ACTION_COLOURS["B"],
                                "none": "#bdbdbd"}
_FONT = {"fontname": "Helvetica", "fontsize": 10}

GRAPH_LEGEND = "\n".join([
    "White box: backward node. Grey box: parameter (with its shape). Teal oval: input tensor.",
    "Orange diamond: backward trigger of a split handle. Yellow 3-D box: checkpoint node.",
    "Region h<id> · <state>: one checkpoint region, in the states of the Handles page; yellow recorded,",
    "light blue waiting for DX, light orange waiting for DW, green replaying / replayed / retained,",
    "grey dashed released, red dashed collected. A dark red border: its replay was refused;",
    "a magenta border: the handle picked elsewhere (Debugger).",
    "Brown dashed box inside a region: an excluded region, kept from the forward and not recomputed.",
    "Edges: blue reached by DX (input grads), orange reached by DW (weight grads), purple both, grey neither.",
    "Folder \"Block xN\": N identical regions drawn as one node.",
])
TORCHVIZ_LEGEND = "\n".join([
    "Drawn by torchviz.make_dot itself, at snapshot time (no replay): grey box: backward node;",
    "blue box: a leaf tensor that requires grad (a parameter with its name, or an input), with its shape;",
    "green box: the output (the loss); dark green: the base of an output that is a view.",
    "No checkpoint regions and no DX/DW colours: this is the autograd graph as torch holds it.",
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
    return name


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
                 rankdir: str = "TB", collapse_above: int = 100, min_repeat: int = 3, highlight: int | None = None,
                 refused: Iterable[int] = ()) -> str:
    """Draw one autograd graph snapshot with its checkpoint regions as DOT source.

    Args:
        snapshot: the graph (see `ckpt_viz.probe.graph.capture_graph`).
        states: handle id -> state at the cursor (`Lifecycle.states_at`, one of
            `ckpt_viz.trace.lifecycle.STATES`); without it the state comes from the
            checkpoint node's own flags.
        collapse: collapse runs of identical regions (see NOTE [ Collapsing repeated blocks ]).
        rankdir: "TB" (loss at the top) or "LR".
        collapse_above: collapse only graphs with more nodes than this (0: any graph).
        min_repeat: the shortest run of identical regions that is collapsed.
        highlight: a handle id to point out (a magenta border), e.g. the Debugger's handle.
        refused: handle ids whose replay was refused (`refused_handles`): a dark red border.

    Returns:
        DOT source: clusters "cluster_h<id>" labelled "h<id> · <state word>", excluded
        regions "cluster_x<id>_h<handle>" inside them, nodes "n<index>", collapsed runs
        "block<k>".

    Legend:
    """
    nodes = list(snapshot.nodes)
    edges = _edges(snapshot, nodes)
    regions, region_state = _regions(nodes, states)
    refused = {h for h in refused if h in regions}
    keep = refused | ({highlight} if highlight in regions else set())
    block_of: dict[int, int] = {}  # node index -> block number
    blocks: list[tuple[list[int], int]] = []  # (handle ids, nodes per region)
    if collapse and len(nodes) > collapse_above and len(regions) >= min_repeat:
        block_of, blocks = _collapse(nodes, edges, regions, region_state, min_repeat, keep)
    collapsed = {h for handles, _ in blocks for h in handles}

    graph = dot_attrs(rankdir=rankdir, label=snapshot.label, labelloc="t", fontname="Helvetica", fontsize=12)
    out = ["digraph autograd {", f"  graph {graph};", f"  node {dot_attrs(**_FONT, style='filled')};",
           f"  edge {dot_attrs(arrowsize='0.6')};"]
    for h in sorted(regions, key=_sort_key):
        if h not in collapsed:
            out.extend(_region_lines(h, nodes, regions[h], region_state[h], h in refused, h == highlight))
    for i, n in enumerate(nodes):
        if _region_of(n) is None and i not in block_of:
            out.append("  " + _node_line(i, n))
    for k, (handles, size) in enumerate(blocks):
        state = region_state[handles[0]]
        label = f"Block x{len(handles)}\nh{handles[0]} – h{handles[-1]} · {state_word(state)}\n{size} nodes each"
        out.append(f"  block{k} " + dot_attrs(label=label, shape=_NODE_SHAPES["block"],
                                           fillcolor=REGION_FILLS.get(state, NODE_COLOURS["block"]),
                                           tooltip=", ".join(f"h{h}" for h in handles)) + ";")
    out.extend(_edge_lines(nodes, edges, block_of))
    out.append("}")
    return "\n".join(out) + "\n"


def collapse_runs(snapshot: GraphSnapshot, *, states: Mapping[int, str] | None = None, min_repeat: int = 3,
                  keep: Iterable[int] = ()) -> list[list[int]]:
    """The runs of identical regions `render_graph(collapse=True)` would draw as one block, as handle-id lists."""
    nodes = list(snapshot.nodes)
    regions, region_state = _regions(nodes, states)
    if len(regions) < min_repeat:
        return []
    _, blocks = _collapse(nodes, _edges(snapshot, nodes), regions, region_state, min_repeat, set(keep))
    return [handles for handles, _ in blocks]


def refused_handles(trace: Trace, seq: int | None) -> list[int]:
    """The handles whose replay was refused at or before `seq` (all of them when seq is None), in order."""
    found: list[int] = []
    for s, kind, h in zip(event_column(trace, "seq"), event_column(trace, "kind"), event_column(trace, "handle_id")):
        if seq is not None and s > seq:
            break
        if kind == "replay_refused" and h is not None and h not in found:
            found.append(h)
    return found


def _edges(snapshot: GraphSnapshot, nodes: list[dict[str, Any]]) -> list[tuple[int, int]]:
    index = {n["id"]: i for i, n in enumerate(nodes)}
    return [(index[s], index[d]) for s, d in snapshot.edges if s in index and d in index]


def _regions(nodes: list[dict[str, Any]], states: Mapping[int, str] | None) -> tuple[dict, dict]:
    regions: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        h = _region_of(n)
        if h is not None:
            regions.setdefault(h, []).append(i)
    region_state = {h: (states.get(h) if states is not None and h in states else None)
                    or _default_state(nodes[i] for i in members) for h, members in regions.items()}
    return regions, region_state


def _region_lines(h: int, nodes: list[dict[str, Any]], members: list[int], state: str, refused: bool,
                  highlight: bool) -> list[str]:
    style = "filled,dashed" if state in _DASHED_STATES else "filled,rounded"
    label = ("▶ " if highlight else "") + f"h{h} · {state_word(state)}" + (" · replay refused" if refused else "")
    colour = CURSOR_COLOUR if highlight else MARK_COLOURS["refused"] if refused else "#636363"
    cluster = dot_attrs(label=label, style=style, fillcolor=REGION_FILLS.get(state, "#ffffff"), color=colour,
                        penwidth="3" if highlight or refused else "1", fontcolor=colour if refused else None,
                        tooltip=f"h{h}: {state}")
    out = [f"  subgraph cluster_h{h} {{", f"    graph {cluster};"]
    excluded: dict[Any, list[int]] = {}
    for i in members:
        if nodes[i].get("exclude") is not None:
            excluded.setdefault(nodes[i]["exclude"], []).append(i)
        else:
            out.append("    " + _node_line(i, nodes[i]))
    for x, inner in excluded.items():  # an excluded region inside the checkpoint: kept, not recomputed
        box = dot_attrs(label=f"excluded region {x} · kept, not recomputed", style="filled,dashed",
                        fillcolor=EXCLUDED_FILL, color=CATEGORY_COLOURS["excluded_outputs"], penwidth="2",
                        fontcolor=CATEGORY_COLOURS["excluded_outputs"])
        out.append(f"    subgraph cluster_x{_ident(x)}_h{h} {{")
        out.append(f"      graph {box};")
        out.extend("      " + _node_line(i, nodes[i]) for i in inner)
        out.append("    }")
    out.append("  }")
    return out


def _ident(value: Any) -> str:
    return re.sub(r"\W", "_", str(value))


# The legend lives in the docstring (pytorchviz style) and in GRAPH_LEGEND, the app's caption.
render_graph.__doc__ = (render_graph.__doc__ or "").rstrip() + "\n" + "".join(
    f"        {line}\n" for line in GRAPH_LEGEND.splitlines()) + "    "


def _sort_key(h: Any) -> tuple[int, Any]:
    return (0, h) if isinstance(h, int) else (1, str(h))


def _node_line(i: int, node: Mapping[str, Any]) -> str:
    kind = node.get("kind", "backward")
    style = "filled,rounded" if kind == "leaf" else "filled"
    owner = f" · h{node['handle_id']}" if node.get("handle_id") is not None else ""
    owner += f" · excluded region {node['exclude']}" if node.get("exclude") is not None else ""
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
              region_state: dict[int, str], min_repeat: int,
              keep: set[int]) -> tuple[dict[int, int], list[tuple[list[int], int]]]:
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
        sig = signature(h) if h not in keep else ("kept", h)  # NOTE rule 3: kept handles break a run
        if run and sig == previous and h == run[-1] + 1:
            run.append(h)
        else:
            close_run()
            run = [h]
        previous = sig
    close_run()
    return block_of, blocks


def render_torchviz_view(snapshot: GraphSnapshot, *, rankdir: str = "TB") -> str | None:
    """torchviz's own drawing of the snapshot (`GraphSnapshot.torchviz`), labelled and laid out in `rankdir`.

    Returns None when the snapshot holds no make_dot DOT (a trace recorded before it
    was kept, or without torchviz installed). See TORCHVIZ_LEGEND for its colours.
    """
    source = snapshot.torchviz
    if not source:
        return None
    head, sep, body = source.partition("{")
    if not sep:
        return None
    graph = dot_attrs(rankdir=rankdir, label=snapshot.label, labelloc="t", fontname="Helvetica", fontsize=12)
    return f"{head}{{\n\tgraph {graph};{body}"
