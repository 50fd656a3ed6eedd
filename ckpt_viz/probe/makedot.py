"""torchviz's own drawing of a snapshot: `torchviz.make_dot` at snapshot time, with no replay.

Owns `make_dot_graph`: what `torchviz.make_dot(roots, params=...)` draws, as data
(`TorchvizGraph`), renumbered so it is the same on every run, for `GraphSnapshot.torchviz`.
Imports torch, graphviz and torchviz when called; never the UI.

NOTE [ make_dot without a replay ]
  1. `show_saved` and `show_attrs` read every node's `_saved_*` attributes; on a
     non-reentrant checkpoint each read unpacks a holder and recomputes the region.
     They stay False.
  2. Even with both False, make_dot reads `saved_tensors` of every custom autograd
     Function node it meets. A custom Function whose ctx saved a tensor under a
     non-reentrant checkpoint's hooks (ckpt_viz's own recompute boundary of an
     excluded region, or a user's Function inside a checkpoint) is then unpacked,
     and the whole region is replayed before backward has started.
  3. So make_dot walks a read-only view of the graph: `_Node` has the real node's
     type name, `next_functions` and (for AccumulateGrad) `variable`, and nothing
     else; `_Root` has the root tensor's size, grad_fn and view base. The drawing is
     make_dot's own (its shapes, colours, labels, param names); the only difference
     is that custom Functions' saved tensors (orange in torchviz) are not drawn.
  4. make_dot names nodes by `id()`; they are renumbered n0, n1, ... in order of
     first appearance, so two runs of the same model give the same drawing.
  5. make_dot's recursive inner function is a reference cycle whose `seen` set holds
     the views and the parameters (AccumulateGrad's `variable`). Left to the garbage
     collector it would free them at a collector-dependent moment of a later run (its
     node_collected events and its "other" bytes would move). So make_dot runs with
     the collector paused, every view is hollowed and the params dict emptied once
     drawn, and the youngest generation, which holds the whole cycle, is collected.

NOTE [ make_dot as data ]
  1. A trace never carries DOT text: DOT from a file handed to `dot` can write markup of its choosing into
     the SVG (fonts, URLs, HTML-like labels). make_dot runs with its `Digraph` swapped for one that records
     each `node(name, label, fillcolor=...)` and `edge(tail, head, ...)` call, and the snapshot keeps those
     as `TorchvizGraph`: labels as text, fills from torchviz's four colours, edge styles from two.
  2. `ckpt_viz.render.graph.render_torchviz_view` rebuilds the drawing with graphviz's `Digraph`, which
     quotes every label, in make_dot's own node style.
"""
from __future__ import annotations

import gc
import threading
import warnings
from typing import Any

from ckpt_viz.trace import TorchvizEdge, TorchvizGraph, TorchvizNode

__all__ = ["make_dot_graph"]

_TYPES: dict[str, type] = {}


class _Node:
    """What make_dot may read of one backward node; see NOTE [ make_dot without a replay ], rule 3."""

    __slots__ = ("__weakref__", "_real", "_views", "variable")

    def __init__(self, real: Any, views: dict[int, Any]) -> None:
        self._real, self._views = real, views

    @property
    def next_functions(self) -> tuple:
        return tuple((_view(fn, self._views) if fn is not None else None, i)
                     for fn, i in getattr(self._real, "next_functions", ()))


def _view(real: Any, views: dict[int, Any]) -> Any:
    key = id(real)
    if key not in views:
        name = type(real).__name__
        cls = _TYPES.get(name) or _TYPES.setdefault(name, type(name, (_Node,), {"__slots__": ()}))
        view = cls(real, views)
        if name == "AccumulateGrad":
            view.variable = real.variable
        views[key] = (view, real)  # the real node is kept alive so its id stays unique
    return views[key][0]


class _Root:
    """What make_dot reads of a root tensor: size, grad_fn, and its view base."""

    def __init__(self, tensor: Any, views: dict[int, Any], made: list[_Root]) -> None:
        self._tensor, self._views, self._made = tensor, views, made
        made.append(self)
        self.grad_fn = _view(tensor.grad_fn, views) if tensor.grad_fn is not None else None

    def size(self) -> Any:
        return self._tensor.size()

    def _is_view(self) -> bool:
        return bool(self._tensor._is_view())

    @property
    def _base(self) -> _Root:
        return _Root(self._tensor._base, self._views, self._made)


class _Capture:
    """What make_dot draws, kept as data: a `graphviz.Digraph` whose `node` and `edge` calls are recorded
    (NOTE [ make_dot as data ]). Built on first use, as a subclass of the Digraph torchviz imports."""

    cls: Any = None

    @classmethod
    def digraph(cls) -> Any:
        if cls.cls is None:
            from graphviz import Digraph

            class Recorded(Digraph):  # type: ignore[misc, valid-type]
                def __init__(self, *args: Any, **kwargs: Any) -> None:
                    super().__init__(*args, **kwargs)
                    self.drawn_nodes: dict[str, tuple[str, str | None]] = {}
                    self.drawn_edges: list[tuple[str, str, str | None]] = []

                def node(self, name: str, label: str | None = None, _attributes: Any = None, **attrs: Any) -> None:
                    self.drawn_nodes[str(name)] = (str(label if label is not None else name), attrs.get("fillcolor"))

                def edge(self, tail_name: str, head_name: str, label: str | None = None, _attributes: Any = None,
                         **attrs: Any) -> None:
                    style = "dotted" if attrs.get("style") == "dotted" else (
                        "undirected" if attrs.get("dir") == "none" else None)
                    self.drawn_edges.append((str(tail_name), str(head_name), style))

            cls.cls = Recorded
        return cls.cls


_LOCK = threading.Lock()  # make_dot's module attribute Digraph is swapped for the call


def _as_data(drawn: Any) -> TorchvizGraph:
    """The recorded drawing, node names renumbered n0, n1, ... in order of first appearance (NOTE rule 4)."""
    names: dict[str, str] = {}

    def rename(name: str) -> str:
        return names.setdefault(name, f"n{len(names)}")

    nodes = tuple(TorchvizNode(id=rename(name), label=label[:1024], fill=fill if fill in _FILLS else None)
                  for name, (label, fill) in drawn.drawn_nodes.items())
    edges = tuple(TorchvizEdge(tail=rename(tail), head=rename(head), style=style)
                  for tail, head, style in drawn.drawn_edges)
    return TorchvizGraph(nodes=nodes, edges=edges)


_FILLS = frozenset(("lightblue", "orange", "darkolivegreen1", "darkolivegreen3"))


def make_dot_graph(tensors: list[Any], params: dict[str, Any]) -> TorchvizGraph | None:
    """What `torchviz.make_dot(tensors, params=params)` draws, as data, without a replay; None without torchviz.

    Args:
        tensors: the snapshot's root tensors (those with a grad_fn).
        params: qualified name -> parameter tensor, as `dict(model.named_parameters())`.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchviz 0.0.3 imports distutils' LooseVersion
            from torchviz import dot as torchviz_dot
    except ImportError:  # an optional extra at run time: the snapshot keeps its own graph
        return None
    views: dict[int, Any] = {}
    params = dict(params)  # make_dot's closures keep this dict; it is emptied once drawn (NOTE rule 5)
    made: list[_Root] = []  # every root view, those make_dot makes of view bases included
    roots = [_Root(t, views, made) for t in tensors]
    if not roots:
        return None
    collecting = gc.isenabled()
    gc.disable()  # make_dot's cycle stays in the youngest generation, collected below (NOTE rule 5)
    try:
        with _LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchviz 0.0.3 imports distutils' LooseVersion
            original = torchviz_dot.Digraph
            torchviz_dot.Digraph = _Capture.digraph()
            try:
                drawn = torchviz_dot.make_dot(tuple(roots) if len(roots) > 1 else roots[0], params=params,
                                              show_attrs=False, show_saved=False)
            finally:
                torchviz_dot.Digraph = original
        return _as_data(drawn)
    except RecursionError:  # make_dot recurses once per node: a graph thousands of nodes deep
        return None
    finally:
        _hollow(views, made)
        params.clear()
        if collecting:
            gc.enable()
        gc.collect(0)


def _hollow(views: dict[int, Any], roots: list[_Root]) -> None:
    """Cut every view from its real node and tensor (NOTE [ make_dot without a replay ], rule 5)."""
    for view, _ in views.values():
        view._real = None
        if hasattr(view, "variable"):
            del view.variable
    for root in roots:
        root._tensor = root.grad_fn = None
    roots.clear()
    views.clear()
