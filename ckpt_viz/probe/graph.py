"""Autograd graph snapshots as plain data: the torch-side reader behind `record(graphs=True)`.

Owns `capture_graph`: a walk over `grad_fn.next_functions` that names leaves from
`named_parameters`, finds checkpoint nodes and their handle ids, triggers, and the
nodes a DX pass and a DW pass reach. Never the UI.

NOTE [ Snapshots never replay ]
  1. The walk reads only node types, `next_functions`, `metadata` and, for leaves,
     `AccumulateGrad.variable`. It never reads `_saved_*` attributes: on a
     non-reentrant checkpoint each such read would unpack a holder and recompute
     the region (torchviz's `show_saved` does exactly that).
  2. A retained reentrant replay (`handle.replay_outputs`) is walked too, and drawn
     inside its handle's region; reading it does not replay anything.
  3. In a reentrant replay an excluded region is one bridge node (`_ExcludeBridge`,
     whose ctx has a weak reference to the handle as `frame_ref` and the region's tape
     as `tape`); it is drawn
     as a node of its handle's region with `exclude` set, and the region's own local
     graph (the tape's outputs, e.g. the LayerNorm kept from the forward) hangs off it.
  4. The snapshot also keeps `torchviz.make_dot`'s own drawing of the same roots (the
     app's "plain autograd (torchviz)" view) as data, drawn without a replay: see NOTE
     [ make_dot without a replay ] and NOTE [ make_dot as data ] in `ckpt_viz.probe.makedot`.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ckpt_viz.probe.makedot import make_dot_graph
from ckpt_viz.runtime.graphmark import EXCLUDE_KEY, HANDLE_KEY
from ckpt_viz.runtime.reentrant import ReentrantCheckpointHandle
from ckpt_viz.trace import GraphNode, GraphSnapshot

__all__ = ["capture_graph"]


def _shape(t: torch.Tensor) -> list[int]:
    return [int(d) for d in t.shape]


def capture_graph(roots: Any, *, label: str, seq: int = -1, names: dict[int, str] | None = None,
                  torchviz: bool = True) -> GraphSnapshot:
    """Walk the graph behind `roots` (tensors) and return it as plain data.

    Args:
        roots: a tensor or a structure of tensors (the loss, a stage output).
        label: what the snapshot shows, e.g. "before backward".
        seq: the event seq it belongs to.
        names: id(parameter) -> qualified name, e.g. from `model.named_parameters()`.
        torchviz: also keep `torchviz.make_dot`'s drawing of the roots (NOTE rule 4).

    Returns:
        A `GraphSnapshot`; nodes carry id, name, kind, handle_id, dx_reached,
        dw_reached, shape, and where known `exclude` (the excluded region's id) and
        `replay` (True for nodes of a retained reentrant replay); `torchviz` holds
        make_dot's drawing as data (None when torchviz is not installed).
    """
    names = names or {}
    ids: dict[int, int] = {}
    nodes: list[dict[str, Any]] = []
    edges: list[list[int]] = []
    triggers: dict[int, int] = {}
    keep_alive: list[Any] = []  # ids are only unique while the objects live
    params: dict[str, torch.Tensor] = {}  # for make_dot's params=: the named leaves the walk met

    def node_id(obj: Any) -> tuple[int, bool]:
        key = id(obj)
        if key in ids:
            return ids[key], False
        ids[key] = len(ids)
        keep_alive.append(obj)
        return ids[key], True

    def add(obj: Any, handle_id: int | None, replay: bool, exclude: Any = None) -> int:
        index, new = node_id(obj)
        if not new:
            return index
        name = type(obj).__name__
        entry: dict[str, Any] = {"id": index, "name": name, "kind": "backward", "handle_id": handle_id,
                                 "dx_reached": False, "dw_reached": False, "shape": None}
        if replay:
            entry["replay"] = True
        if exclude is not None:
            entry["exclude"] = exclude
        nodes.append(entry)
        frame = getattr(obj, "frame", None)
        tape = getattr(obj, "tape", None)
        if frame is None and tape is not None:  # a bridge holds its handle weakly (NOTE rule 3)
            ref = getattr(obj, "frame_ref", None)
            frame = ref() if callable(ref) else None
        if isinstance(frame, ReentrantCheckpointHandle) and tape is not None:  # NOTE rule 3: an excluded region
            region = getattr(tape, "wrapper_id", None)
            entry.update(handle_id=frame.handle_id, exclude=region)
            for root in _grad_fns(getattr(tape, "outputs", None) or ()):
                edges.append([index, add(root, frame.handle_id, True, region)])
        elif isinstance(frame, ReentrantCheckpointHandle):
            entry.update(kind="checkpoint", handle_id=frame.handle_id, split=frame.split,
                         released=frame.released, replayed=frame.replay_count > 0, phase=frame.phase)
            if frame.backward_trigger is not None:
                triggers[id(frame.backward_trigger)] = frame.handle_id
            if frame.replay_outputs is not None:  # See NOTE [ Snapshots never replay ], rule 2.
                for root in _grad_fns(frame.replay_outputs):
                    edges.append([index, add(root, frame.handle_id, True)])
        metadata = getattr(obj, "metadata", None) or {}
        if HANDLE_KEY in metadata and entry["handle_id"] is None:
            entry["handle_id"] = metadata[HANDLE_KEY]
        if EXCLUDE_KEY in metadata:
            entry["exclude"] = metadata[EXCLUDE_KEY]
        variable = getattr(obj, "variable", None) if name == "AccumulateGrad" else None
        if variable is not None:
            entry["shape"] = _shape(variable)
            if id(variable) in triggers:
                entry.update(kind="trigger", handle_id=triggers[id(variable)], name="backward_trigger")
            elif id(variable) in names or isinstance(variable, torch.nn.Parameter):
                entry.update(kind="leaf", name=names.get(id(variable), "parameter"))
                if id(variable) in names and not replay:
                    params[names[id(variable)]] = variable
            else:
                entry.update(kind="input", name="input")
        for child, _ in getattr(obj, "next_functions", ()):
            if child is not None:
                edges.append([index, add(child, entry["handle_id"] if replay else None, replay, exclude)])
        return index

    dot = None
    try:
        for root in _grad_fns(roots):
            add(root, None, False)
        # Triggers found after their leaf was visited (defensive: the checkpoint node comes first in practice).
        for entry, obj in zip(nodes, keep_alive):
            variable = getattr(obj, "variable", None) if entry["name"] == "AccumulateGrad" else None
            if variable is not None and id(variable) in triggers:
                entry.update(kind="trigger", handle_id=triggers[id(variable)], name="backward_trigger")
        if torchviz:
            dot = make_dot_graph(_with_grad_fn(roots), params)
    finally:
        # `add` refers to itself (a reference cycle that holds `keep_alive`): without this the graph's nodes
        # would live until the garbage collector ran, so their node_collected events and freed bytes
        # landed at a different point on every run.
        keep_alive.clear()
    _mark_reached(nodes, edges)
    return GraphSnapshot(seq=seq, label=label[:1024], nodes=tuple(_node(n) for n in nodes),
                         edges=tuple((a, b) for a, b in edges), torchviz=dot)


_NODE_FIELDS = frozenset(GraphNode.__struct_fields__)


def _node(entry: dict[str, Any]) -> GraphNode:
    fields = {k: v for k, v in entry.items() if k in _NODE_FIELDS and v is not None}
    if "shape" in fields:
        fields["shape"] = tuple(fields["shape"])
    fields["name"] = str(fields["name"])[:1024]
    return GraphNode(**fields)


def _with_grad_fn(roots: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(roots)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def _grad_fns(roots: Any) -> list[Any]:
    return [t.grad_fn for t in _with_grad_fn(roots)]


def _mark_reached(nodes: list[dict[str, Any]], edges: Iterable[list[int]]) -> None:
    """dx_reached: leads to an activation input; dw_reached: leads to a parameter or a trigger."""
    children: dict[int, list[int]] = {}
    for src, dst in edges:
        children.setdefault(src, []).append(dst)
    by_id = {n["id"]: n for n in nodes}
    for flag, kinds in (("dx_reached", {"input"}), ("dw_reached", {"leaf", "trigger"})):
        memo: dict[int, bool] = {}
        for start in by_id:
            stack = [(start, False)]
            while stack:  # iterative post-order, so deep graphs do not hit the recursion limit
                nid, done = stack.pop()
                if nid in memo:
                    continue
                node = by_id[nid]
                if node.get("replay"):
                    memo[nid] = False  # inner graph: reached through its checkpoint node, not by the outer pass
                    continue
                if done:
                    memo[nid] = node["kind"] in kinds or any(memo.get(c, False) for c in children.get(nid, ()))
                    continue
                stack.append((nid, True))
                stack.extend((c, False) for c in children.get(nid, ()) if c not in memo)
        for nid, reached in memo.items():
            by_id[nid][flag] = reached
