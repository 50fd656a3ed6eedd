"""The parameters a checkpointed region captures: a module's own (cached with weak keys), or a graph walk.

Owns `facts(module)`: the module's parameters and buffers in `module.parameters()` /
`module.buffers()` order, remembered per module so that a recording does not walk the
module tree on every checkpoint call (the captured-parameter report of the reentrant
checkpoint and the replay-divergence watch both read them); `captured_leaves` (the
parameters a replay graph reaches when no module owns the function); and the
`captured` report of a `grads_routed` event. Imports torch and the bus; never the UI.

NOTE [ Owner facts cache ]
  1. Keyed weakly by the module: a module that dies drops its entry. The entry holds
     the submodules and tensors strongly but never the module itself (that would
     keep the key alive), and nothing of it is put on the module.
  2. Each use checks the tree is unchanged: the identities and sizes of every
     `_parameters`, `_buffers` and `_modules` dict of the module and its submodules,
     and the identities of the values in them, compared as one tuple (C-level maps,
     no Python loop per tensor). Assigning, deleting or replacing a parameter, a
     buffer or a submodule anywhere in the tree rebuilds the entry. `requires_grad`
     is never cached: callers filter on it at each use.
  3. A module whose tree cannot be read this way (a custom `_parameters` that is no
     dict) is walked on every call, as before.

NOTE [ Captured report cache ]
  1. The `captured` field of `grads_routed` lists, per captured parameter, its shape,
     the name the innermost recording gives it and whether the backward accumulated
     into its `.grad`. Those three facts are read at every backward (shapes and names
     too: `p.data = ...` changes a shape, each recording names its own model), in
     C-level passes (`map`) where no name is given.
  2. The report is a pure function of those facts, so the tuple of `CapturedParam`s built
     for them is kept (bounded, `_MAX_REPORTS`) and shared by every later event with the
     same facts: events and their fields are frozen.
"""
from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Iterable
from operator import and_, is_not, ne, or_
from typing import Any

import torch

from ckpt_viz import bus
from ckpt_viz.events import CapturedParam

__all__ = ["OwnerFacts", "captured_leaves", "captured_report", "facts", "grad_states", "owned_parameters", "qualname"]

_DICTS = operator.attrgetter("_parameters", "_buffers", "_modules")
_chain = itertools.chain.from_iterable
_compress, _repeat = itertools.compress, itertools.repeat
_GRAD, _SHAPE, _REQUIRES_GRAD = (operator.attrgetter(n) for n in ("grad", "shape", "requires_grad"))
# endless, so shared by every map and zip: getattr(grad, "_version", -1) over a tuple of grads in C
_VERSION, _NO_VERSION, _NONE = _repeat("_version"), _repeat(-1), _repeat(None)


def _signature(modules: Iterable[torch.nn.Module]) -> tuple:
    dicts = list(_chain(map(_DICTS, modules)))
    return (*map(id, dicts), *map(len, dicts), *map(id, _chain(map(dict.values, dicts))))


class OwnerFacts:
    """One module's parameters and buffers (NOTE [ Owner facts cache ])."""

    __slots__ = ("buffers", "params", "signature", "submodules")

    def __init__(self, module: torch.nn.Module, signed: bool = True) -> None:
        modules = list(module.modules())
        self.submodules = tuple(m for m in modules if m is not module)
        self.params: tuple[torch.Tensor, ...] = tuple(module.parameters())
        self.buffers: tuple[torch.Tensor, ...] = tuple(module.buffers())
        self.signature = _signature(modules) if signed else None

    def current(self, module: torch.nn.Module) -> bool:
        return _signature((module, *self.submodules)) == self.signature


_CACHE: dict[int, tuple[weakref.ref, OwnerFacts]] = {}  # id(module) -> (weakref to it, its facts)


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _CACHE.get(key)
    if entry is not None and entry[0] is ref:
        del _CACHE[key]


def facts(module: torch.nn.Module) -> OwnerFacts:
    """The module's parameters and buffers, from the cache when its tree is unchanged (NOTE rule 2)."""
    key = id(module)
    entry = _CACHE.get(key)
    try:
        if entry is not None and entry[0]() is module:
            found = entry[1]
            if _signature((module, *found.submodules)) == found.signature:  # found.current(module), inlined
                return found
        found = OwnerFacts(module)
        _CACHE[key] = (weakref.ref(module, lambda ref: _forget(key, ref)), found)
        return found
    except (AttributeError, TypeError):  # NOTE rule 3: not a plain module tree, or not weakly referenceable
        return OwnerFacts(module, signed=False)


def owned_parameters(module: Any, skip: set[int] | frozenset[int] = frozenset()) -> list[torch.Tensor]:
    """The module's parameters that require grad and whose id is not in `skip`, in `parameters()` order."""
    return [p for p in facts(module).params if p.requires_grad and id(p) not in skip]


def captured_leaves(values: tuple, replay_inputs: tuple) -> list[torch.Tensor]:
    """Leaf tensors the replay graph reaches that are not replay inputs (captured parameters)."""
    inputs = {id(t) for t in replay_inputs}
    seen: set[int] = set()
    found: list[torch.Tensor] = []
    stack = [v.grad_fn for v in values if v.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) not in inputs:
            found.append(variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def grad_states(params: Iterable[torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...], tuple[int, ...]]:
    """The parameters that require grad, each one's `.grad` and its version counter (-1 without one), read before
    a backward; `captured_report` reads them again after it."""
    params = tuple(params)
    params = tuple(_compress(params, map(_REQUIRES_GRAD, params)))
    grads = tuple(map(_GRAD, params))
    return params, grads, tuple(map(getattr, grads, _VERSION, _NO_VERSION))


_REPORTS: dict[tuple, tuple[CapturedParam, ...]] = {}  # (shapes, names, accumulated) -> the report (NOTE rule 2)
_MAX_REPORTS = 4096


def captured_report(before: tuple[tuple[torch.Tensor, ...], tuple[Any, ...], tuple[int, ...]]
                    ) -> tuple[CapturedParam, ...]:
    """The `captured` field of `grads_routed` from `grad_states` read before the backward: each parameter's shape,
    recorded name and whether the backward accumulated into it (NOTE [ Captured report cache ])."""
    key = _report_key(before, bus.current_scope().channels)
    report = _REPORTS.get(key)
    if report is None:
        if len(_REPORTS) >= _MAX_REPORTS:
            _REPORTS.clear()
        report = _REPORTS[key] = tuple(CapturedParam(shape=tuple(shape), name=name, accumulated=hit)
                                       for shape, name, hit in zip(key[0], key[1] or _NONE, key[2]))
    return report


def _report_key(before: tuple[tuple[torch.Tensor, ...], tuple[Any, ...], tuple[int, ...]],
                channels: tuple[Any, ...]) -> tuple[tuple, tuple, tuple[bool, ...]]:
    """`captured_report`'s key, (shapes, names, accumulated), from `grad_states` read before the backward and the
    channels of this context (innermost last)."""
    params, old, versions = before
    grads = tuple(map(_GRAD, params))
    # accumulated: a .grad now, and a new one or the old one written in place (its version moved)
    accumulated = tuple(map(and_, map(is_not, grads, _NONE),
                            map(or_, map(is_not, grads, old),
                                map(ne, map(getattr, grads, _VERSION, _NO_VERSION), versions))))
    # The innermost recording here that names the parameter (as bus.name_of); none named: every name is None.
    named = [c.names for c in reversed(channels) if c.names]
    names = tuple([next((n for d in named if (n := d.get(id(p))) is not None), None) for p in params]) if named else ()
    return tuple(map(_SHAPE, params)), names, accumulated


def qualname(function: Any) -> str:
    """The name of a checkpointed function: its `__qualname__`, else its type's name (a module's class). The
    region's name (the module's qualified name) is `ckpt_viz.runtime.labels.label_of`."""
    if isinstance(function, torch.nn.Module):  # getattr would go through Module.__getattr__ and fail
        return function.__dict__.get("__qualname__") or type(function).__name__
    return getattr(function, "__qualname__", None) or type(function).__name__
