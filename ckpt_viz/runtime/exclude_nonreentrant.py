"""Excluded regions inside a non-reentrant checkpoint (spec 1.4; NOTE [ Excluded regions ] rule 2).

Owns the deferred-input handles, the recompute boundary and the region's own saved-tensor
hooks: `record_region` runs a region in the original forward, `replay_region` serves its
cached output in the recompute. Imports torch; never the UI.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ckpt_viz import bus
from ckpt_viz.errors import ExcludedRegionError
from ckpt_viz.events import ExcludeReused, ExcludeSaved
from ckpt_viz.runtime import memtags
from ckpt_viz.runtime.exclude_common import (
    CACHE_KEY,
    INPUT_ATTR,
    SOURCE_ATTR,
    ExcludeCache,
    emit,
    nbytes,
    placeholders,
    rng_state,
    set_rng_state,
    tensor_leaves,
    trigger,
)
from ckpt_viz.runtime.graphmark import EXCLUDE_KEY, mark_new_nodes

__all__ = ["record_region", "replay_region"]


class _DeferredInput:
    """A region input saved as a promise; the replay materializes it."""

    __slots__ = ("leaf_index", "used", "value")

    def __init__(self, leaf_index: int) -> None:
        self.leaf_index = leaf_index
        self.used = False
        self.value: torch.Tensor | None = None


class _NonReentrantEntry:
    __slots__ = ("__weakref__", "bindings", "call_index", "output", "output_count", "rng_after")

    def __init__(self, output: Any, bindings: list, output_count: int, rng_after: Any, call_index: int) -> None:
        self.output = output
        self.bindings = bindings
        self.output_count = output_count
        self.rng_after = rng_after
        self.call_index = call_index


class _RecomputeBoundary(torch.autograd.Function):
    """Identity whose backward first unpacks a trigger saved under the checkpoint's hooks."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, trigger: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(trigger)
        return out.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        ctx.saved_tensors  # noqa: B018  forces the outer checkpoint's replay; see NOTE rule 2
        return grad, None


def _with_boundaries(out: Any) -> Any:
    leaves, spec = tree_flatten(out)
    leaf = trigger()
    return tree_unflatten([_RecomputeBoundary.apply(v, leaf) if isinstance(v, torch.Tensor) else v
                           for v in leaves], spec)


class _Kept:
    """A tensor an excluded region keeps for its backward (its lifetime is the saved variable's)."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _deferred_pack(x: torch.Tensor) -> Any:
    handle = getattr(x, INPUT_ATTR, None)
    if isinstance(handle, _DeferredInput):
        handle.used = True
        return handle
    return _Kept(x.detach())


def _deferred_unpack(saved: Any) -> torch.Tensor:
    if isinstance(saved, _DeferredInput):
        if saved.value is None:
            raise ExcludedRegionError(
                "ckpt_viz.checkpoint_exclude_wrapper: Checkpoint-excluded input was requested before recomputation.\n"
                "Tip: backward reached the region before its checkpoint replayed; report the trace if you did not "
                "call the region's backward by hand.", code="exclude_input_not_ready")
        return saved.value
    return saved.tensor


def _without_graph(out: Any) -> Any:
    """`out` with each tensor detached (same storage, same requires_grad), for the cache.

    The cache lives in the frame's invocation; a cached tensor with its graph would reach the
    checkpoint's saved tensors, whose hooks hold the frame: a cycle through C++ that Python's
    collector cannot see, alive until the replay pops the entry (forever if the graph is
    dropped without one). The replay needs the values and their requires_grad only.
    """
    leaves, spec = tree_flatten(out)
    return tree_unflatten([v.detach().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v
                           for v in leaves], spec)


class _Replayed(torch.autograd.Function):
    """Identity that makes a cached leaf a non-leaf again, so the replay may change it in place as the forward did."""

    @staticmethod
    def forward(ctx: Any, cached: torch.Tensor) -> torch.Tensor:
        return cached.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _as_replayed(cached: Any) -> Any:
    leaves, spec = tree_flatten(cached)
    return tree_unflatten([_Replayed.apply(v) if isinstance(v, torch.Tensor) and v.requires_grad else v
                           for v in leaves], spec)


def record_region(wrapper: Any, state: Any, args: tuple, kwargs: dict) -> Any:
    cache = state.get_resource(CACHE_KEY, ExcludeCache)
    leaves, _spec = tensor_leaves(args, kwargs)
    bindings: list[_DeferredInput] = []
    marked: list[tuple[torch.Tensor, Any]] = []
    seen: set[int] = set()
    for index, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor) or isinstance(leaf, torch.nn.Parameter) or id(leaf) in seen:
            continue
        seen.add(id(leaf))
        if getattr(leaf, SOURCE_ATTR, None) == state.invocation_id:
            continue
        handle = _DeferredInput(index)
        marked.append((leaf, getattr(leaf, INPUT_ATTR, None)))
        setattr(leaf, INPUT_ATTR, handle)
        bindings.append(handle)
    saved_nbytes = [0]

    def pack(x: torch.Tensor) -> Any:
        packed = _deferred_pack(x)
        if isinstance(packed, _Kept):
            saved_nbytes[0] += packed.tensor.numel() * packed.tensor.element_size()
            if memtags.enabled:
                memtags.hold(packed, packed.tensor, "excluded_outputs")
        return packed

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, _deferred_unpack):
            out = wrapper._run(*args, **kwargs)
    finally:
        for leaf, previous in marked:
            if previous is None:
                delattr(leaf, INPUT_ATTR)
            else:
                setattr(leaf, INPUT_ATTR, previous)
    used = [b for b in bindings if b.used]
    if bus.enabled:
        mark_new_nodes(out, leaves, EXCLUDE_KEY, wrapper.exclude_id)
    if used:
        out = _with_boundaries(out)
    out_leaves = [v for v in tree_flatten(out)[0] if isinstance(v, torch.Tensor)]
    for value in out_leaves:
        setattr(value, SOURCE_ATTR, state.invocation_id)
    call_index = wrapper._calls
    wrapper._calls += 1
    rng_after = rng_state() if state.preserve_rng_state else None
    cached = _without_graph(out) if wrapper.save_output else None  # no cycle through autograd's C++ graph
    entry = _NonReentrantEntry(cached, used, len(out_leaves), rng_after, call_index)
    if memtags.enabled and wrapper.save_output:
        for value in out_leaves:
            memtags.hold(entry, value, "excluded_outputs")
    cache.save(wrapper.exclude_id, entry)
    if bus.enabled:
        emit(wrapper, ExcludeSaved, None, call_index=call_index, checkpoint_mode="nonreentrant",
                   save_output=wrapper.save_output, output_tensor_count=len(out_leaves),
                   used_inputs=tuple(b.leaf_index for b in used), boundary_added=bool(used),
                   cached_nbytes=nbytes(out) if wrapper.save_output else 0, saved_nbytes=saved_nbytes[0])
    return out


def replay_region(wrapper: Any, state: Any, args: tuple, kwargs: dict) -> Any:
    cache = state.get_resource(CACHE_KEY, ExcludeCache)
    entry = cache.pop(wrapper.exclude_id)
    if entry is None:
        raise ExcludedRegionError(
            f"ckpt_viz.checkpoint_exclude_wrapper: No cached forward output is available for this checkpoint "
            f"exclusion wrapper ({wrapper._name}).\nTip: a non-reentrant region replays once per forward; run DX and "
            "DW in one session (backward_input/backward_weight with session_id) so the checkpoint replays once.",
            code="exclude_cache_empty")
    leaves, _ = tensor_leaves(args, kwargs)
    for binding in entry.bindings:
        value = leaves[binding.leaf_index] if binding.leaf_index < len(leaves) else None
        if not isinstance(value, torch.Tensor):
            raise ExcludedRegionError(
                "ckpt_viz.checkpoint_exclude_wrapper: Checkpoint replay did not reproduce a tensor input required "
                f"by a checkpoint-excluded region ({wrapper._name}, input {binding.leaf_index}, got "
                f"{type(value).__name__}).\nTip: the checkpointed function must call the region with the same "
                "arguments in its replay.", code="exclude_input_changed")
        binding.value = value.detach()
    out = _as_replayed(entry.output) if wrapper.save_output else placeholders(entry.output_count)
    if entry.bindings:
        out = _with_boundaries(out)
    if entry.rng_after is not None:
        set_rng_state(entry.rng_after)
    if bus.enabled:
        emit(wrapper, ExcludeReused, None, call_index=entry.call_index, checkpoint_mode="nonreentrant",
                   placeholder=not wrapper.save_output, materialized_inputs=len(entry.bindings))
    return out

# -------------------------------------------- reentrant
