"""Graph snapshots as `graphviz.Digraph`: the annotated checkpoint view and torchviz's own view.

Each renderer takes the trace and the cursor and draws what `ckpt_viz.analysis` says about them:
the snapshot shown at the cursor (`analysis.routing.snapshot_before`), what DX and DW did reach of it
(`analysis.routing.reach_after`), each region's handle state (`analysis.lifecycle.region_states`) and
the refused replays (`analysis.lifecycle.refused_handles`).
Colours come from `ckpt_viz.render.palette`, words from `ckpt_viz.analysis.words`;
`ckpt_viz.render.svg` draws the SVG. Never torch or a UI.

NOTE [ Text in a graph ]
  1. Every text drawn (a node's name, a label, a tooltip) is data from a trace or a model file. It
     is passed to graphviz through `dot_text`, which escapes backslashes and marks it as no HTML
     (`graphviz.escape`), so `graphviz.Digraph` quotes it: it is drawn as its characters, never read
     as an HTML-like label, an escape sequence or DOT. The torchviz view is rebuilt from the
     snapshot's `TorchvizGraph` data the same way, never from DOT text.

NOTE [ Collapsing repeated blocks ]
  1. A region is one handle's nodes: nodes whose handle_id is set (non-reentrant
     frames, retained reentrant replays) and the checkpoint node. Its satellites
     are the sinks outside it whose every parent lies inside it: its parameters,
     its backward trigger and its zero-size dummy input.
  2. Two regions are identical when their nodes and satellites have the same
     kinds, names (digits ignored: blocks.3.fc1 == blocks.7.fc1) and shapes, they
     have as many internal edges, they are in the same state, and the run missed
     the same parts of their reach (`analysis.routing.reach_after`).
  3. When the graph is big (more than `collapse_above` nodes, or more than
     `collapse_regions_above` regions), each run of at least `min_repeat` identical regions
     with consecutive handle ids keeps its first region drawn in full (what the run
     repeats) and the rest become one node "Block xN"; edges into or out of them are
     redirected to it. A highlighted or refused handle is never collapsed: it must stay
     visible.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import graphviz

from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.lifecycle import refused_handles, region_states
from ckpt_viz.analysis.routing import Reach, reach_after, snapshot_before, snapshot_relation
from ckpt_viz.analysis.words import phase_word, state_word
from ckpt_viz.render.palette import ACTION_COLOURS, CATEGORY_COLOURS, CURSOR_COLOUR, MARK_COLOURS, STATE_FILLS
from ckpt_viz.trace import GraphNode, GraphSnapshot, Trace

__all__ = [
    "COLLAPSE_ABOVE",
    "COLLAPSE_REGIONS_ABOVE",
    "EDGE_COLOURS",
    "EXCLUDED_FILL",
    "GRAPH_LEGEND",
    "NODE_COLOURS",
    "REGION_FILLS",
    "TORCHVIZ_FILLS",
    "TORCHVIZ_LEGEND",
    "collapse_runs",
    "dot_text",
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
REGION_FILLS: dict[str, str] = STATE_FILLS  # one per `ckpt_viz.vocabulary.STATES`: the light state colours
EXCLUDED_FILL = "#eadccf"  # a light version of the excluded_outputs brown
_DASHED_STATES = {"not_created", "released", "collected"}
EDGE_COLOURS: dict[str, str] = {"dx": ACTION_COLOURS["DX"], "dw": ACTION_COLOURS["DW"], "both": ACTION_COLOURS["B"],
                                "none": "#bdbdbd"}
# torchviz.make_dot's own fill colours (a `TorchvizNode.fill`), drawn as make_dot draws them.
TORCHVIZ_FILLS: tuple[str, ...] = ("lightblue", "orange", "darkolivegreen1", "darkolivegreen3")
_FONT = {"fontname": "Helvetica", "fontsize": "10"}
COLLAPSE_ABOVE = 100  # a graph with more nodes than this is big (NOTE [ Collapsing repeated blocks ], rule 3) ...
COLLAPSE_REGIONS_ABOVE = 8  # ... and so is one with more checkpoint regions than this

GRAPH_LEGEND = "\n".join([
    "White box: backward node. Grey box: parameter (with its shape). Teal oval: input tensor.",
    "Orange diamond: backward trigger of a split handle. Yellow 3-D box: checkpoint node.",
    "Region \"h<id> · <module>\" over its state: one checkpoint region, in the states of the Handles page at the",
    "cursor; yellow recorded,",
    "light blue waiting for DX, light orange waiting for DW, green replaying / replayed / retained,",
    "grey dashed released, red dashed collected. A dark red border: its replay was refused;",
    "a magenta border: the handle picked elsewhere (Debugger).",
    "Brown dashed box inside a region: an excluded region, kept from the forward and not recomputed.",
    "Edges: blue reached by DX (input grads), orange reached by DW (weight grads), purple both, grey neither;",
    "a handle whose DX or DW the backward after the snapshot skipped is not coloured for it.",
    "Folder \"Block xN\": N more regions identical to the one drawn in full before them, as one node.",
])
TORCHVIZ_LEGEND = "\n".join([
    "Drawn in torchviz.make_dot's style, from its drawing kept at snapshot time (no replay): grey box:",
    "backward node; blue box: a leaf tensor that requires grad (a parameter with its name, or an input), with its",
    "shape; orange: a tensor saved for backward; green box: the output (the loss); dark green: the base of an",
    "output that is a view. No checkpoint regions and no DX/DW colours: this is the autograd graph as torch holds it.",
])


def dot_text(*lines: Any) -> str:
    """Lines of data as one graphviz label or tooltip: each drawn as its characters (NOTE [ Text in a graph ])."""
    text: str = graphviz.nohtml("\\n".join(graphviz.escape(str(line)) for line in lines))  # (untyped) a str subclass
    return text


def _shape_text(shape: Any) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")" if shape is not None else ""


def _numel(shape: Any) -> int:
    if shape is None:
        return -1
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _label(node: GraphNode) -> str:
    kind, name, h = node.kind, node.name, node.handle_id
    if kind == "checkpoint":
        return dot_text(name, f"h{h}" + (f" · {phase_word(node.phase)}" if node.phase in ("dx", "dw") else ""))
    if kind == "trigger":
        return dot_text(f"trigger h{h}")
    if kind == "input" and _numel(node.shape) == 0:
        return dot_text("dummy", "(0)")  # the checkpoint's zero-size input that makes every output require grad
    if kind in ("leaf", "input") and node.shape is not None:
        return dot_text(name, _shape_text(node.shape))
    return dot_text(name)


def _edge_kind(dx: bool, dw: bool) -> str:
    return "both" if dx and dw else "dx" if dx else "dw" if dw else "none"


def _region_of(node: GraphNode) -> int | None:
    return node.handle_id if node.kind != "trigger" else None


_DIGITS = re.compile(r"\d+")


def render_graph(trace: Trace, seq: int | None = None, *, snapshot: GraphSnapshot | None = None,
                 collapse: bool = True, rankdir: str = "TB", collapse_above: int = COLLAPSE_ABOVE,
                 collapse_regions_above: int = COLLAPSE_REGIONS_ABOVE, min_repeat: int = 3,
                 highlight: int | None = None) -> graphviz.Digraph | None:
    """Draw the autograd graph shown at the cursor with its checkpoint regions in their states.

    Args:
        trace: the run.
        seq: the cursor (None: the end of the run): which snapshot, which states, which refusals.
        snapshot: draw this snapshot instead of the one shown at `seq` (states still as of `seq`).
        collapse: collapse runs of identical regions (see NOTE [ Collapsing repeated blocks ]).
        rankdir: "TB" (loss at the top) or "LR".
        collapse_above: collapse graphs with more nodes than this (0: any graph) ...
        collapse_regions_above: ... or with more checkpoint regions than this.
        min_repeat: the shortest run of identical regions that is collapsed (its first region stays drawn).
        highlight: a handle id to point out (a magenta border), e.g. the Debugger's handle.

    Returns:
        The graph (None when the trace has no snapshot), titled with the snapshot and where it was
        taken relative to the cursor (`analysis.routing.snapshot_relation`): clusters "cluster_h<id>"
        labelled "h<id> · <module name>" over "<state word>" (`analysis.handles.handle_labels`),
        excluded regions "cluster_x<id>_h<handle>" inside them, nodes "n<index>", collapsed runs
        "block<k>".

    Legend:
    """
    end = seq if seq is not None else _end(trace)
    snapshot = snapshot if snapshot is not None else snapshot_before(trace, end)
    if snapshot is None:
        return None
    states = region_states(trace, snapshot, seq)
    reach = reach_after(trace, snapshot, seq)
    names = handle_labels(trace)
    nodes = list(snapshot.nodes)
    edges = _edges(snapshot, nodes)
    regions = _regions(nodes)
    refused = {h for h in refused_handles(trace, seq) if h in regions}
    keep = refused | ({highlight} if highlight in regions else set())
    block_of: dict[int, int] = {}  # node index -> block number
    blocks: list[tuple[list[int], int]] = []  # (handle ids, nodes per region)
    big = len(nodes) > collapse_above or len(regions) > collapse_regions_above
    if collapse and big and len(regions) >= min_repeat:
        block_of, blocks = _collapse(nodes, edges, regions, states, min_repeat, keep, reach)
    collapsed = {h for handles, _ in blocks for h in handles}

    where = snapshot_relation(trace, end) if snapshot is snapshot_before(trace, end) else f"taken at seq {snapshot.seq}"
    title = dot_text(snapshot.label, f"snapshot {where}; handle states at seq {end}")
    graph = graphviz.Digraph("autograd", graph_attr={"rankdir": rankdir, "label": title,
                                                     "labelloc": "t", "fontname": "Helvetica", "fontsize": "12"},
                             node_attr={**_FONT, "style": "filled"}, edge_attr={"arrowsize": "0.6"})
    for h in sorted(regions):
        if h not in collapsed:
            _region(graph, h, names.get(h), nodes, regions[h], states.get(h, "recorded"), h in refused,
                    h == highlight, reach)
    for i, n in enumerate(nodes):
        if _region_of(n) is None and i not in block_of:
            _node(graph, i, n, reach)
    for k, (handles, size) in enumerate(blocks):
        state = states.get(handles[0], "recorded")
        first, last = names.get(handles[0]), names.get(handles[-1])
        graph.node(f"block{k}", label=dot_text(f"Block x{len(handles)}",
                                            f"h{handles[0]} – h{handles[-1]} · {state_word(state)}",
                                            *([f"{first} – {last}"] if first and last else []),
                                            f"{size} nodes each, like h{handles[0] - 1}"),
                   shape=_NODE_SHAPES["block"], fillcolor=REGION_FILLS.get(state, NODE_COLOURS["block"]),
                   tooltip=dot_text(", ".join(f"h{h}" for h in handles)))
    _edge_lines(graph, nodes, edges, block_of, reach)
    return graph


def collapse_runs(trace: Trace, seq: int | None = None, *, snapshot: GraphSnapshot | None = None,
                  min_repeat: int = 3, keep: Iterable[int] = (), collapse_above: int = 0,
                  collapse_regions_above: int = 0) -> list[list[int]]:
    """The regions `render_graph(collapse=True, collapse_above=..., collapse_regions_above=...)` draws as one block
    each, as handle-id lists: each run of identical regions but its first, which stays drawn (refused handles and
    `keep` stay out of every run). With the thresholds at 0 (the default), at any size."""
    snapshot = snapshot if snapshot is not None else snapshot_before(trace, seq if seq is not None else _end(trace))
    if snapshot is None:
        return []
    nodes = list(snapshot.nodes)
    regions = _regions(nodes)
    if len(regions) < min_repeat or not (len(nodes) > collapse_above or len(regions) > collapse_regions_above):
        return []
    kept = set(keep) | set(refused_handles(trace, seq))
    _, blocks = _collapse(nodes, _edges(snapshot, nodes), regions, region_states(trace, snapshot, seq), min_repeat,
                          kept, reach_after(trace, snapshot, seq))
    return [handles for handles, _ in blocks]


def _end(trace: Trace) -> int:
    return trace.events[-1].seq if trace.events else (trace.graphs[-1].seq if trace.graphs else 0)


def _edges(snapshot: GraphSnapshot, nodes: list[GraphNode]) -> list[tuple[int, int]]:
    index = {n.id: i for i, n in enumerate(nodes)}
    return [(index[s], index[d]) for s, d in snapshot.edges if s in index and d in index]


def _regions(nodes: list[GraphNode]) -> dict[int, list[int]]:
    regions: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        h = _region_of(n)
        if h is not None:
            regions.setdefault(h, []).append(i)
    return regions


def _region(graph: graphviz.Digraph, h: int, name: str | None, nodes: list[GraphNode], members: list[int],
            state: str, refused: bool, highlight: bool, reach: Reach) -> None:
    style = "filled,dashed" if state in _DASHED_STATES else "filled,rounded"
    head = ("▶ " if highlight else "") + f"h{h}" + (f" · {name}" if name else "")
    words = state_word(state) + (" · replay refused" if refused else "")
    colour = CURSOR_COLOUR if highlight else MARK_COLOURS["refused"] if refused else "#636363"
    with graph.subgraph(name=f"cluster_h{h}") as cluster:
        cluster.attr(label=dot_text(head, words), style=style, fillcolor=REGION_FILLS.get(state, "#ffffff"),
                     color=colour, penwidth="3" if highlight or refused else "1",
                     tooltip=dot_text(f"h{h}{f' {name}' if name else ''}: {words}"))
        if refused:
            cluster.attr(fontcolor=colour)
        excluded: dict[int, list[int]] = {}
        for i in members:
            exclude = nodes[i].exclude
            if exclude is not None:
                excluded.setdefault(exclude, []).append(i)
            else:
                _node(cluster, i, nodes[i], reach)
        for x, inner in excluded.items():  # an excluded region inside the checkpoint: kept, not recomputed
            with cluster.subgraph(name=f"cluster_x{x}_h{h}") as box:
                box.attr(label=dot_text(f"excluded region {x} · kept, not recomputed"), style="filled,dashed",
                         fillcolor=EXCLUDED_FILL, color=CATEGORY_COLOURS["excluded_outputs"], penwidth="2",
                         fontcolor=CATEGORY_COLOURS["excluded_outputs"])
                for i in inner:
                    _node(box, i, nodes[i], reach)


# The legend lives in the docstring (pytorchviz style) and in GRAPH_LEGEND, the app's caption.
render_graph.__doc__ = (render_graph.__doc__ or "").rstrip() + "\n" + "".join(
    f"        {line}\n" for line in GRAPH_LEGEND.splitlines()) + "    "


def _node(graph: graphviz.Digraph, i: int, node: GraphNode, reach: Reach) -> None:
    kind = node.kind
    owner = f" · h{node.handle_id}" if node.handle_id is not None else ""
    owner += f" · excluded region {node.exclude}" if node.exclude is not None else ""
    reached = f" · dx {'yes' if node.id in reach.dx else 'no'} · dw {'yes' if node.id in reach.dw else 'no'}"
    graph.node(f"n{i}", label=_label(node), shape=_NODE_SHAPES.get(kind, "box"),
               fillcolor=NODE_COLOURS.get(kind, NODE_COLOURS["backward"]),
               style="filled,rounded" if kind == "leaf" else "filled", tooltip=dot_text(f"{node.name} · {kind}{owner}"
                                                                                     f"{reached}"))


def _edge_lines(graph: graphviz.Digraph, nodes: list[GraphNode], edges: list[tuple[int, int]],
                block_of: dict[int, int], reach: Reach) -> None:
    merged: dict[tuple[str, str], list[bool]] = {}
    for s, d in edges:
        src = f"block{block_of[s]}" if s in block_of else f"n{s}"
        dst = f"block{block_of[d]}" if d in block_of else f"n{d}"
        if src == dst:
            continue
        flags = merged.setdefault((src, dst), [False, False])
        flags[0] |= nodes[s].id in reach.dx and nodes[d].id in reach.dx
        flags[1] |= nodes[s].id in reach.dw and nodes[d].id in reach.dw
    for (src, dst), (dx, dw) in merged.items():
        kind = _edge_kind(dx, dw)
        graph.edge(src, dst, color=EDGE_COLOURS[kind], penwidth="1.6" if kind != "none" else "1.0")


def _collapse(nodes: list[GraphNode], edges: list[tuple[int, int]], regions: dict[int, list[int]],
              states: Mapping[int, str], min_repeat: int, keep: set[int],
              reach: Reach) -> tuple[dict[int, int], list[tuple[list[int], int]]]:
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
        if owner in regions and (n.kind in ("leaf", "trigger") or _numel(n.shape) == 0):
            satellites[owner].append(i)

    def signature(h: int) -> tuple[Any, ...]:
        items = sorted((nodes[i].kind, _DIGITS.sub("#", nodes[i].name), tuple(nodes[i].shape or ()))
                       for i in [*regions[h], *satellites[h]])
        return (states.get(h), h in reach.missed_dx, h in reach.missed_dw, internal[h], tuple(items))

    block_of: dict[int, int] = {}
    blocks: list[tuple[list[int], int]] = []
    run: list[int] = []

    def close_run() -> None:
        if len(run) >= min_repeat:  # NOTE rule 3: the first region of the run stays drawn
            k = len(blocks)
            blocks.append((list(run[1:]), len(regions[run[0]]) + len(satellites[run[0]])))
            for h in run[1:]:
                for i in [*regions[h], *satellites[h]]:
                    block_of[i] = k

    previous = None
    for h in sorted(regions):
        sig = signature(h) if h not in keep else ("kept", h)  # NOTE rule 3: kept handles break a run
        if run and sig == previous and h == run[-1] + 1:
            run.append(h)
        else:
            close_run()
            run = [h]
        previous = sig
    close_run()
    return block_of, blocks


_TORCHVIZ_STYLES = {"dotted": {"style": "dotted"}, "undirected": {"dir": "none"}}


def render_torchviz_view(trace: Trace, seq: int | None = None, *, snapshot: GraphSnapshot | None = None,
                         rankdir: str = "TB") -> graphviz.Digraph | None:
    """torchviz's own drawing of the snapshot shown at `seq` (`GraphSnapshot.torchviz`), in make_dot's node style,
    labelled and laid out in `rankdir`; rebuilt from its nodes and edges (NOTE [ Text in a graph ]).

    Returns None when the snapshot holds no make_dot drawing (recorded without torchviz installed).
    See TORCHVIZ_LEGEND for its colours.
    """
    snapshot = snapshot if snapshot is not None else snapshot_before(trace, seq if seq is not None else _end(trace))
    if snapshot is None or snapshot.torchviz is None:
        return None
    drawing = snapshot.torchviz
    graph = graphviz.Digraph("torchviz", graph_attr={"rankdir": rankdir, "label": dot_text(snapshot.label),
                                                     "labelloc": "t", "fontname": "Helvetica", "fontsize": "12"},
                             node_attr={"style": "filled", "shape": "box", "align": "left", "fontsize": "10",
                                        "ranksep": "0.1", "height": "0.2", "fontname": "monospace"})
    known = set()
    for node in drawing.nodes:
        known.add(node.id)
        graph.node(node.id, label=dot_text(*node.label.split("\n")), **({"fillcolor": node.fill} if node.fill else {}))
    for edge in drawing.edges:
        if edge.tail in known and edge.head in known:
            graph.edge(edge.tail, edge.head, **_TORCHVIZ_STYLES.get(edge.style or "", {}))
    return graph
