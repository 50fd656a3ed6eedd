"""What a checkpointed region is called: the checkpointed module's qualified name (`model.layers.3`).

Owns `label_of(function)`, the name every runtime gives a handle in `handle_created`'s
`data["function"]`: ckpt_viz's checkpoint (`owners.qualname`), torch's as observed
(`ckpt_viz.runtime.torch_observer`) and Hugging Face's layers (`ckpt_viz.hf`). Imports torch;
never the UI.

NOTE [ Region labels ]
  1. The function is unwrapped to the module it runs: a module itself; a `functools.partial`
     whose function is a module's bound method (`partial(layer.__call__)`, transformers before
     4.52) or whose first argument is a module (`partial(Layer.forward, layer, **kwargs)`,
     transformers' `GradientCheckpointingLayer`); a bound method of a module; torch's
     `CheckpointWrapper`'s keyword packer (`my_function`, which closes over the wrapper).
     torch's `checkpoint_sequential` segment (`run_function.<locals>.forward`) is named after
     its modules: `layers[0:4]` (a slice of one container, end excluded), else `first..last`, or
     `checkpoint_sequential[0:4]` when they have no names (no `model=` and no parent on the stack).
  2. A module's name is its qualified name in the model given to `record(model=...)`
     (`bus.name_of`: the recording maps modules as well as parameters); else in the outermost
     module whose `forward` is on the call stack and holds it (looked for once per module, at its
     first checkpoint, and remembered weakly, found or not); else its class name. Wrapper
     segments that torch strips from state-dict keys (`_checkpoint_wrapped_module`,
     `_fsdp_wrapped_module`, `_orig_mod`) are dropped: a torchtitan layer reads `layers.0`, not
     `layers.0._checkpoint_wrapped_module`.
  3. A function with a `__qualname__` of its own (ckpt_viz's `labelled`, a lambda, a plain
     function) keeps it: `labelled` already carries the qualified name and the call index.
"""
from __future__ import annotations

import functools
import sys
import types
import weakref
from typing import Any

import torch

from ckpt_viz import bus

__all__ = ["found_name", "label_of", "module_name", "module_of"]

_WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod")
_SEQUENTIAL = "checkpoint_sequential.<locals>.run_function.<locals>.forward"
_PACKER = "CheckpointWrapper.forward.<locals>.my_function"
_MAX_FRAMES = 256
# rule 2's remembered names ("": looked for, none found)
_names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
_roots: weakref.WeakKeyDictionary[torch.nn.Module, dict[int, str]] = weakref.WeakKeyDictionary()


def _closure(function: Any) -> dict[str, Any]:
    code = getattr(function, "__code__", None)
    cells = getattr(function, "__closure__", None) or ()
    if code is None or len(code.co_freevars) != len(cells):
        return {}
    try:
        return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
    except ValueError:  # an empty cell
        return {}


def module_of(function: Any) -> torch.nn.Module | None:
    """The module `function` runs, or None (NOTE [ Region labels ], rule 1)."""
    for _ in range(8):  # a partial of a partial of a bound method: a few levels at most
        if isinstance(function, torch.nn.Module):
            return function
        if isinstance(function, functools.partial):
            inner = function.func
            if isinstance(inner, types.MethodType) and isinstance(inner.__self__, torch.nn.Module):
                return inner.__self__
            if function.args and isinstance(function.args[0], torch.nn.Module):
                return function.args[0]
            function = inner
            continue
        if isinstance(function, types.MethodType):
            owner = function.__self__
            return owner if isinstance(owner, torch.nn.Module) else None
        if getattr(function, "__qualname__", None) == _PACKER:
            owner = _closure(function).get("self")
            return owner if isinstance(owner, torch.nn.Module) else None
        return None
    return None


def _strip(name: str) -> str:
    parts = [p for p in name.split(".") if p not in _WRAPPER_SEGMENTS]
    return ".".join(parts)


def _named_in(root: torch.nn.Module, module: torch.nn.Module) -> str | None:
    table = _roots.get(root)
    if table is None or id(module) not in table:  # built once per root; again when a module was added since
        table = _roots[root] = {id(m): n for n, m in root.named_modules(remove_duplicate=False) if n}
    return table.get(id(module))


def _from_stack(module: torch.nn.Module) -> str | None:
    """The name of `module` in the outermost module running on this thread's stack that holds it (rule 2)."""
    frame = sys._getframe(2)
    found: str | None = None
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module) and owner is not module:
                name = _named_in(owner, module)
                if name is not None:
                    found = name  # keep walking: an outer module gives the longer, model-level name
        frame = frame.f_back
    return found


def found_name(module: torch.nn.Module) -> str | None:
    """`module`'s qualified name as found (NOTE [ Region labels ], rule 2), wrapper segments kept; None: not found."""
    name = bus.name_of(module) if bus.enabled else None
    if name is None:
        name = _names.get(module)
        if name is None:
            name = _names[module] = _from_stack(module) or ""  # "": looked for and not found
    return name or None


def module_name(module: torch.nn.Module) -> str:
    """`module`'s qualified name (NOTE [ Region labels ], rule 2), or its class name when none is found."""
    name = found_name(module)
    return (_strip(name) if name is not None else "") or type(module).__name__


def _sequential_label(function: Any) -> str | None:
    cells = _closure(function)
    start, end, functions = cells.get("start"), cells.get("end"), cells.get("functions")
    if not isinstance(start, int) or not isinstance(end, int) or not isinstance(functions, (list, tuple)):
        return None
    if not 0 <= start <= end < len(functions):
        return None
    first, last = functions[start], functions[end]
    found = [found_name(f) if isinstance(f, torch.nn.Module) else None for f in (first, last)]
    if None in found:  # unnamed (no model given, none on the stack): by position, as ckpt_viz's own sequential
        return f"checkpoint_sequential[{start}:{end + 1}]"
    names = [_strip(n) for n in found]  # type: ignore[arg-type]
    heads = [n.rpartition(".") for n in names]
    if heads[0][0] and heads[0][0] == heads[1][0] and heads[0][2].isdigit() and heads[1][2].isdigit():
        return f"{heads[0][0]}[{heads[0][2]}:{int(heads[1][2]) + 1}]"
    return names[0] if start == end else f"{names[0]}..{names[1]}"


def label_of(function: Any) -> str:
    """The name of a checkpointed region (NOTE [ Region labels ]).

    Example: HF's `partial(LlamaDecoderLayer.forward, layer, ...)` -> "model.layers.3" inside
    `record(model=model)`, or inside the model's own forward.
    """
    if isinstance(function, torch.nn.Module):  # getattr would go through Module.__getattr__ and fail
        own = function.__dict__.get("__qualname__")
        return own if own else module_name(function)
    qualname = getattr(function, "__qualname__", None)
    if qualname == _SEQUENTIAL:
        label = _sequential_label(function)
        if label is not None:
            return label
    module = module_of(function)
    if module is not None:
        return module_name(module)
    return qualname or type(function).__name__
