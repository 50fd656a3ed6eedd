"""Cheap fingerprints for the replay-divergence checks: object state, tensor values, names.

Owns what `ckpt_viz.runtime.divergence` compares between a region's forward and its
replay (NOTE [ Replay divergence checks ] there, rule 2): `state_of` (a mutable
object's state as path -> token), `fingerprint` / `differs` / `compare` (a tensor's
values), `nonzero_counts` (whether gradients are all zero, from samples first), and the
names shown for arguments, parameters and buffers; and `ForwardMode`, which sees the torch
calls of a region's forward when no module owns it (rule 2 there). Imports torch; never the UI.
"""
from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ckpt_viz.runtime import memtags

__all__ = ["ForwardMode", "argument_names", "buffer_names", "compare", "differs", "fingerprint", "mutable", "names_in",
           "nonzero_counts", "owner_of", "read", "read_prints", "same", "state_changes", "state_of", "strided",
           "tensor_label"]

_SAMPLES = 32
_STATE_ENTRIES = 256
_STATE_DEPTH = 4


# ---------------------------------------------------------------- object state

_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, range,
          enum.Enum, type)


def _skip(obj: Any) -> bool:
    return (isinstance(obj, torch.nn.Module) or (callable(obj) and not hasattr(obj, "__dict__"))
            or isinstance(obj, (type, functools.partial)) or type(obj).__name__ in ("function", "method", "module"))


def state_of(obj: Any, path: str = "", out: dict[str, tuple] | None = None, depth: int = 0,
             seen: set[int] | None = None) -> dict[str, tuple]:
    """A cheap fingerprint of a mutable object's state: path -> token (NOTE rule 2)."""
    out = {} if out is None else out
    seen = set() if seen is None else seen
    if len(out) >= _STATE_ENTRIES:
        return out
    if isinstance(obj, torch.Tensor):
        out[path] = ("tensor", id(obj), tuple(obj.shape), obj._version)
        return out
    if isinstance(obj, _ATOMS):
        if isinstance(obj, (bool, int, float)) or (isinstance(obj, str) and len(obj) <= 64) or obj is None:
            out[path] = ("value", obj)
        return out
    if _skip(obj) or id(obj) in seen or depth > _STATE_DEPTH:
        return out
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        out[path] = ("items", len(obj))
        for i, item in enumerate(obj[:32]):
            state_of(item, f"{path}[{i}]", out, depth + 1, seen)
    elif isinstance(obj, dict):
        out[path] = ("items", len(obj))
        for key in list(obj)[:32]:
            state_of(obj[key], f"{path}[{str(key)[:24]!r}]", out, depth + 1, seen)
    elif isinstance(obj, (set, frozenset)):
        out[path] = ("items", len(obj))
    else:
        fields = getattr(obj, "__dict__", None)
        names = list(fields) if isinstance(fields, dict) else list(getattr(type(obj), "__slots__", ()))
        out[path] = ("object", type(obj).__name__)
        for name in names[:32]:
            if not name.startswith("__") and hasattr(obj, name):
                state_of(getattr(obj, name), f"{path}.{name}", out, depth + 1, seen)
    return out


_IMMUTABLE = (torch.Tensor, *_ATOMS)


def mutable(obj: Any) -> bool:
    return not (isinstance(obj, _IMMUTABLE) or _skip(obj))


def _show(token: tuple | None) -> str:
    if token is None:
        return "absent"
    kind = token[0]
    if kind == "tensor":
        return f"tensor {list(token[2])}"
    if kind == "items":
        return f"{token[1]} items"
    if kind == "object":
        return f"a {token[1]}"
    return repr(token[1])[:40]


def state_changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    found = []
    for path in dict.fromkeys([*before, *after]):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if old and new and old[0] == new[0] == "tensor" and old[2] == new[2]:
            what = "modified in place" if old[1] == new[1] else f"replaced by another tensor {list(new[2])}"
            found.append(f"{path}: {what}")
        else:
            found.append(f"{path}: {_show(old)} -> {_show(new)}")
    return found


# ---------------------------------------------------------------- value fingerprints

def strided(t: torch.Tensor) -> torch.Tensor:
    """Up to _SAMPLES evenly strided elements of `t` in its flat order: a view when `t` is contiguous or
    1-d, else gathered with `torch.take` (never a copy of the whole tensor)."""
    n = t.numel()
    step = n // _SAMPLES or 1
    count = min(_SAMPLES, -(-n // step))
    if t.is_contiguous():  # as_strided keeps t's storage offset
        return t.as_strided((count,), (step,))
    if t.dim() == 1:
        return t.as_strided((count,), (step * t.stride(0),))
    index = _indexes(step, count, t.device)
    if memtags.enabled:  # a cached tensor, maybe older than the memory probe: count it from this read on
        memtags.seen(index)
    return torch.take(t, index)


@functools.lru_cache(maxsize=64)
def _indexes(step: int, count: int, device: torch.device) -> torch.Tensor:
    return torch.arange(0, step * count, step, device=device)


_SUM_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}  # else the tensor's own dtype


def fingerprint(t: torch.Tensor, keep: bool = False) -> tuple[Any, Any] | None:
    """(sum, up to 32 evenly strided elements) of a floating tensor: two small ops.

    On the CPU both are read at once into Python numbers (no copy kept, no sync to save); on a
    device they stay there (read later, all at once, by `read_prints`). Half-precision sums
    accumulate in float32.
    keep: on a device, copy the samples (a forward's fingerprint outlives the moment; a view would
    keep the tensor).
    """
    if not t.is_floating_point():
        return None
    n = t.numel()
    if n == 0:
        return None
    if torch.is_grad_enabled():  # a replay's outputs may require grad: build no graph for the print
        with torch.no_grad():
            return fingerprint(t, keep)
    wide = _SUM_DTYPE.get(t.dtype)
    total = t.sum() if wide is None else t.sum(dtype=wide)
    if t.is_contiguous():  # strided(t), inlined: this runs for every output of every region
        step = n // _SAMPLES or 1
        samples = t.as_strided((min(_SAMPLES, -(-n // step)),), (step,))
    else:
        samples = strided(t)
    if t.is_cpu:
        return total.item(), samples.tolist()
    return total, samples.clone() if keep else samples


def same(a: tuple[Any, Any] | None, b: tuple[Any, Any] | None) -> bool:
    """Whether two fingerprints read on the CPU are bit for bit the same (the usual case); False otherwise,
    also for prints still on a device (compare those with `read_prints` and `differs`)."""
    return a is not None and b is not None and type(a[0]) is float and a == b


def read_prints(prints: list[tuple[Any, Any]]) -> list[list[float]]:
    """Each fingerprint as [sum, *samples] in Python numbers; those still on a device in one read."""
    on_device = [t for print_ in prints if isinstance(print_[0], torch.Tensor) for t in print_]
    values = iter(read(on_device)) if on_device else iter(())
    return [[*next(values), *next(values)] if isinstance(print_[0], torch.Tensor) else [print_[0], *print_[1]]
            for print_ in prints]


def read(tensors: list[torch.Tensor]) -> list[list[float]]:
    """The values of small tensors as lists: each read directly on the CPU, one sync per device otherwise."""
    if all(t.device.type == "cpu" for t in tensors):
        return [t.tolist() if t.dim() == 1 else t.reshape(-1).tolist() for t in tensors]
    flat = torch.cat([t.reshape(-1).to(tensors[0].device, torch.float64) for t in tensors]).tolist()
    out, at = [], 0
    for t in tensors:
        out.append(flat[at:at + t.numel()])
        at += t.numel()
    return out


def differs(a: list[float], b: list[float], numel: int, dtype: torch.dtype) -> bool:
    """Whether two fingerprints differ beyond what another kernel's rounding explains."""
    if a == b:  # the usual case: the same kernels gave the same bits
        return False
    rtol = 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2
    if len(a) != len(b):
        return True
    samples = [abs(v) for v in (*a[1:], *b[1:])]
    mean_abs = sum(samples) / max(len(samples), 1)
    if abs(a[0] - b[0]) > rtol * mean_abs * max(numel, 1) + 1e-12:
        return True
    return any(abs(x - y) > rtol * (abs(x) + mean_abs) + 1e-12 for x, y in zip(a[1:], b[1:]))


def compare(pairs: list[tuple[str, tuple, tuple | None, int, torch.dtype]]) -> list[str]:
    """(what, forward print, replay print, numel, dtype) -> a line for each pair that differs."""
    pairs = [p for p in pairs if p[1] is not None and p[2] is not None]
    values = read_prints([print_ for _, old, again, _, _ in pairs for print_ in (old, again)]) if pairs else []
    found = []
    for k, (what, _, _, n, dtype) in enumerate(pairs):
        a, b = values[2 * k], values[2 * k + 1]
        if differs(a, b, n, dtype):
            found.append(f"{what}: sum {a[0]:.6g} in the forward, {b[0]:.6g} in the replay")
    return found


def nonzero_counts(grads: dict[int, torch.Tensor]) -> dict[int, int]:
    """key -> nonzero count (or a positive stand-in): 32 strided elements of each first (`read`), a full
    count only where that sample is all zero."""
    counts: dict[int, int] = {}
    on_device = []
    for key, grad in grads.items():
        if grad.is_cpu:
            counts[key] = 1 if any(strided(grad).tolist()) else int(torch.count_nonzero(grad))
        else:
            on_device.append((key, grad))
    if on_device:  # one read for all of them
        looks = read([strided(g) for _, g in on_device])
        counts.update((key, 1 if any(look) else int(torch.count_nonzero(grad)))
                      for (key, grad), look in zip(on_device, looks))
    return counts


def owner_of(function: Any) -> torch.nn.Module | None:
    """The module a checkpointed function belongs to, for naming its parameters and buffers."""
    if isinstance(function, functools.partial):
        inner = owner_of(function.func)
        return inner if inner is not None else next(
            (a for a in function.args if isinstance(a, torch.nn.Module)), None)
    if isinstance(function, torch.nn.Module):
        return function
    owner = getattr(function, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) else None


def _positional_names(function: Any, count: int) -> list[str]:
    """The names of the first `count` positional parameters, from the function or its module's forward."""
    owner = owner_of(function)
    for target in (function, getattr(type(owner), "forward", None) if owner is not None else None):
        if target is None:
            continue
        try:
            params = list(inspect.signature(target).parameters.values())
        except (TypeError, ValueError):
            continue
        if params and params[0].name == "self" and not inspect.ismethod(target):
            params = params[1:]
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(names) >= count:
            return names[:count]
    return [f"argument {i}" for i in range(count)]


def _any_mutable(values: Any) -> bool:
    for value in values:
        if type(value) is not torch.Tensor and mutable(value):
            return True
    return False


def argument_names(function: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    if not (_any_mutable(args) or (kwargs and _any_mutable(kwargs.values()))
            or isinstance(function, functools.partial)):
        return []  # the common case: tensors and plain values only
    named = [*zip(_positional_names(function, len(args)), args), *((str(k), v) for k, v in kwargs.items())]
    if isinstance(function, functools.partial):
        named += [(f"partial argument {i}", a) for i, a in enumerate(function.args)]
        named += [(str(k), v) for k, v in function.keywords.items()]
    leaves = []
    for name, value in named:  # lists, tuples and dicts of arguments are looked into one level
        if type(value) in (list, tuple):
            leaves += [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        elif type(value) is dict:
            leaves += [(f"{name}[{k!r}]", v) for k, v in value.items()]
        else:
            leaves.append((name, value))
    return leaves


def names_in(function: Any, what: str) -> dict[int, str]:
    owner = owner_of(function)
    if owner is None:
        return {}
    items = owner.named_parameters() if what == "parameters" else owner.named_buffers()
    return {id(t): n for n, t in items}


def buffer_names(updated: list[torch.Tensor], names: dict[int, str]) -> list[str]:
    """One line per module: a BatchNorm's running statistics are named together (its version-counted
    num_batches_tracked moves; the kernel updates running_mean and running_var in place without a bump)."""
    lines: dict[str, str] = {}
    for t in updated:
        name = names.get(id(t))
        if name is None:
            lines[str(id(t))] = f"{tensor_label(t)}: updated again in the replay"
            continue
        module, _, _ = name.rpartition(".")
        siblings = [n for n in names.values() if n.rpartition(".")[0] == module]
        lines[module] = f"{', '.join(siblings)}: updated again in the replay"
    return list(lines.values())


def tensor_label(t: torch.Tensor) -> str:
    return f"a tensor of shape {list(t.shape)}"


# ---------------------------------------------------------------- the forward's view of the world

_IGNORED_NAMES = frozenset({"__get__", "__set__", "detach", "detach_", "requires_grad_", "size", "dim", "numel",
                            "data_ptr", "element_size", "is_floating_point", "is_complex", "stride",
                            "__repr__", "__format__", "__len__", "__hash__", "__eq__"})


def _tensors(args: tuple, kwargs: dict | None) -> Iterator[torch.Tensor]:
    for value in (*args, *(kwargs.values() if kwargs else ())):
        if isinstance(value, torch.Tensor):
            yield value
        elif type(value) in (list, tuple):
            for item in value:
                if isinstance(item, torch.Tensor):
                    yield item


class ForwardMode(TorchFunctionMode):
    """Sees a region's torch calls in its forward (NOTE [ Replay divergence checks ], rule 2, in divergence.py):
    `watch` is its ReplayWatch (params, outside, inputs, made, frame_recording_exclude)."""

    def __init__(self, watch: Any) -> None:
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        w = self.watch
        if w.frame_recording_exclude() or getattr(func, "__name__", "") in _IGNORED_NAMES:
            return func(*args, **kwargs)
        skip, made = w.inputs, w.made
        for t in _tensors(args, kwargs):
            key = id(t)
            if key in skip or key in made:
                continue
            if t.requires_grad:
                if t.is_leaf and key not in w.params:
                    w.params[key] = t
            elif key not in w.outside:
                w.outside[key] = (t, t._version)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            made.add(id(out))
        elif type(out) in (tuple, list):
            made.update(id(o) for o in out if isinstance(o, torch.Tensor))
        return out
