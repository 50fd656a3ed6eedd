"""torchviz's own drawing of a snapshot: `torchviz.make_dot` at snapshot time, with no replay.

Owns `make_dot_source`: the DOT text `torchviz.make_dot(roots, params=...)` draws,
renumbered so it is the same on every run, for `GraphSnapshot.torchviz`. Imports torch
and torchviz when called; never the UI.

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
     first appearance, so two runs of the same model give the same text.
  5. make_dot's recursive inner function is a reference cycle whose `seen` set holds
     the views and the parameters (AccumulateGrad's `variable`). Left to the garbage
     collector it would free them at a collector-dependent moment of a later run (its
     node_collected events and its "other" bytes would move). So make_dot runs with
     the collector paused, every view is hollowed and the params dict emptied once
     drawn, and the youngest generation, which holds the whole cycle, is collected.
"""
from __future__ import annotations

import gc
import re
import warnings
from typing import Any

__all__ = ["make_dot_source"]

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


_NAME = re.compile(r"^(\s*)(\d+)( -> (\d+))?(?=[\s\[;]|$)")


def _renumber(source: str) -> str:
    """make_dot's id() node names become n0, n1, ... (NOTE rule 4); the size line torchviz adds is dropped."""
    names: dict[str, str] = {}

    def rename(name: str) -> str:
        return names.setdefault(name, f"n{len(names)}")

    def line_of(match: re.Match[str]) -> str:
        edge = f" -> {rename(match.group(4))}" if match.group(4) else ""
        return f"{match.group(1)}{rename(match.group(2))}{edge}"

    lines = []
    for line in source.splitlines():
        if line.strip().startswith("graph [") and "size=" in line:
            continue  # make_dot's `size` shrinks a big graph to 12 inches; the app sets the size itself
        lines.append(_NAME.sub(line_of, line, count=1))
    return "\n".join(lines) + "\n"


def make_dot_source(tensors: list[Any], params: dict[str, Any]) -> str | None:
    """The DOT source of `torchviz.make_dot(tensors, params=params)`, without a replay; None without torchviz.

    Args:
        tensors: the snapshot's root tensors (those with a grad_fn).
        params: qualified name -> parameter tensor, as `dict(model.named_parameters())`.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchviz 0.0.3 imports distutils' LooseVersion
            from torchviz import make_dot
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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchviz 0.0.3 imports distutils' LooseVersion
            dot = make_dot(tuple(roots) if len(roots) > 1 else roots[0], params=params,
                           show_attrs=False, show_saved=False)
        return _renumber(dot.source)
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
