"""Excluded regions inside a reentrant checkpoint (spec 1.6, D4; NOTE [ Excluded regions ] rule 3).

Owns the local SAVE graph ("tape") a region records in the original forward and the
bridge that serves its output in the replay and runs the tape in backward, following its
handle's phase. `record_region` / `replay_region` are called by the wrapper. Imports
torch; never the UI.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ckpt_viz import bus
from ckpt_viz.errors import CheckpointUsageError, ExcludedRegionError
from ckpt_viz.events import ExcludeReused, ExcludeSaved
from ckpt_viz.runtime import memtags
from ckpt_viz.runtime.exclude_common import (
    SOURCE_ATTR,
    ExcludeCache,
    emit,
    nbytes,
    placeholders,
    rng_state,
    set_rng_state,
    tensor_leaves,
)

__all__ = ["record_region", "replay_region"]


class _Tape:
    """One excluded region's local SAVE graph inside a reentrant checkpoint."""

    __slots__ = (
        "__weakref__",
        "call_index",
        "chain",
        "chain_outputs",
        "input_leaves",
        "local_inputs",
        "output_count",
        "outputs",
        "released",
        "replay_values",
        "rng_after",
        "save_output",
        "structure",
        "wrapper_id",
    )

    def __init__(self) -> None:
        self.outputs: tuple | None = None
        self.local_inputs: list[torch.Tensor] = []
        self.input_leaves: list[int] = []
        self.chain: list[_Tape] = []
        self.save_output = True
        self.output_count = 0
        self.rng_after: Any = None
        self.call_index = 0
        self.replay_values: list[torch.Tensor] = []
        self.released = False
        self.wrapper_id = 0
        self.chain_outputs: tuple | None = None
        self.structure: tuple | None = None

    def all_local_inputs(self) -> list[torch.Tensor]:
        found = list(self.local_inputs)
        for upstream in self.chain:
            found.extend(upstream.all_local_inputs())
        return found

    def all_replay_values(self) -> list[torch.Tensor]:
        found = list(self.replay_values)
        for upstream in self.chain:
            found.extend(upstream.all_replay_values())
        return found

    def release(self) -> None:
        self.outputs = None
        self.local_inputs = []
        self.replay_values = []
        self.chain = []
        self.chain_outputs = None
        self.released = True


class _ExcludeBridge(torch.autograd.Function):
    """Returns the cached region output in a replay; its backward runs the region's tape."""

    @staticmethod
    def forward(ctx: Any, frame: Any, tape: _Tape, dummy: torch.Tensor, *inputs: torch.Tensor) -> tuple:
        # `dummy` requires grad, so the outputs do even when no input does: the tape may hold parameters.
        # The handle holds this node (its replay graph): a strong ctx.frame would be a cycle through C++ that
        # Python's collector cannot see, alive forever when a replayed handle is dropped unreleased (DX only).
        ctx.frame_ref, ctx.handle_id, ctx.tape, ctx.count = weakref.ref(frame), frame.handle_id, tape, len(inputs)
        if tape.save_output:
            outputs = tuple(o.detach() for o in tape.outputs)
            ctx.mark_non_differentiable(*(d for d, o in zip(outputs, tape.outputs) if not o.requires_grad))
        else:
            outputs = tuple(torch.empty(0) for _ in range(tape.output_count))
            ctx.mark_non_differentiable(*outputs)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        frame, tape = ctx.frame_ref(), ctx.tape
        if frame is None or tape.released or tape.outputs is None:
            raise ExcludedRegionError(
                f"ckpt_viz.checkpoint_exclude_wrapper: The retained reentrant checkpoint graph has already been "
                f"released (region of handle h{ctx.handle_id}).\nTip: run DX before DW; DW frees excluded-region "
                "graphs unless a retaining session holds them.", code="exclude_graph_released")
        pairs = [(o, g) for o, g in zip(tape.outputs, grads) if o.requires_grad and g is not None]
        local = tape.all_local_inputs()
        if not pairs:
            return (None, None, None, *([None] * ctx.count))
        values, sensitivities = zip(*pairs)
        if frame.split and frame.phase == "dx":
            targets = [t for t in local if t.requires_grad]
            got = iter(torch.autograd.grad(values, targets, sensitivities, retain_graph=True, allow_unused=True)
                       if targets else ())
            result = [next(got) if t.requires_grad else None for t in local]
        else:
            for t in local:
                if t.requires_grad:
                    t.grad = None
            keep = frame.retain_graph
            torch.autograd.backward(values, sensitivities, retain_graph=keep)
            result = [t.grad if t.requires_grad else None for t in local]
            if not keep:
                tape.release()
        return (None, None, None, *result)


def record_region(wrapper: Any, frame: Any, args: tuple, kwargs: dict) -> Any:
    if frame.recording_exclude:
        raise CheckpointUsageError(
            f"ckpt_viz.checkpoint_exclude_wrapper: nested excluded regions are not supported (inside handle "
            f"h{frame.handle_id}).\nTip: exclude the outer region only.")
    tape = _Tape()
    tape.save_output = wrapper.save_output
    tape.wrapper_id = wrapper.exclude_id
    leaves, spec = tensor_leaves(args, kwargs)
    local_leaves = list(leaves)
    for index, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor) or isinstance(leaf, torch.nn.Parameter):
            continue
        source = getattr(leaf, SOURCE_ATTR, None)
        if source is not None and source[0] is frame and not source[1].save_output:
            upstream, k = source[1], source[2]
            local_leaves[index] = upstream.chain_outputs[k]
            if upstream not in tape.chain:
                tape.chain.append(upstream)
            continue
        local = leaf.detach()
        if local.is_floating_point() or local.is_complex():
            local.requires_grad_(True)
        local_leaves[index] = local
        tape.local_inputs.append(local)
        tape.input_leaves.append(index)
    local_args, local_kwargs = tree_unflatten(local_leaves, spec)
    frame.recording_exclude = True
    try:
        with torch.enable_grad(), (memtags.category("excluded_outputs") if memtags.enabled else memtags.NULL):
            out = wrapper._run(*local_args, **local_kwargs)
    finally:
        frame.recording_exclude = False
    out_leaves, out_spec = tree_flatten(out)
    tensors = [v for v in out_leaves if isinstance(v, torch.Tensor)]
    tape.output_count = len(tensors)
    tape.outputs = tuple(tensors)
    if memtags.enabled and wrapper.save_output:
        for value in tensors:
            memtags.hold(tape, value, "excluded_outputs")
    tape.structure = ([None if isinstance(v, torch.Tensor) else v for v in out_leaves], out_spec)
    tape.rng_after = rng_state() if frame.preserve_rng_state else None
    tape.call_index = wrapper._calls
    wrapper._calls += 1
    detached = []
    for k, value in enumerate(tensors):
        d = value.detach()
        frame.excluded_output_mask[id(d)] = (weakref.ref(d), bool(value.requires_grad))
        setattr(d, SOURCE_ATTR, (frame, tape, k))
        detached.append(d)
    if not wrapper.save_output:
        # The downstream region continues this graph; see NOTE [ Excluded regions ], rule 5.
        tape.chain_outputs = tape.outputs
        tape.outputs = None
    if frame.exclude_cache is None:
        frame.exclude_cache = ExcludeCache()
    frame.exclude_cache.save(wrapper.exclude_id, tape)
    frame.entries.append(tape)
    if bus.enabled:
        emit(wrapper, ExcludeSaved, frame.handle_id, call_index=tape.call_index, checkpoint_mode="reentrant",
                   save_output=wrapper.save_output, output_tensor_count=len(tensors),
                   used_inputs=tuple(tape.input_leaves), boundary_added=False,
                   cached_nbytes=nbytes(tensors) if wrapper.save_output else 0)
    it = iter(detached)
    return tree_unflatten([next(it) if isinstance(v, torch.Tensor) else v for v in out_leaves], out_spec)


def replay_region(wrapper: Any, frame: Any, args: tuple, kwargs: dict) -> Any:
    tape = frame.exclude_cache.pop(wrapper.exclude_id) if frame.exclude_cache is not None else None
    if tape is None:
        raise ExcludedRegionError(
            f"ckpt_viz.checkpoint_exclude_wrapper: Checkpoint replay executed an unmatched checkpoint exclusion "
            f"wrapper call ({wrapper._name}, handle h{frame.handle_id}).\nTip: the replay must call each excluded "
            "region as often as the forward did.", code="exclude_cache_empty")
    leaves, _ = tensor_leaves(args, kwargs)
    values = []
    for index in tape.input_leaves:
        value = leaves[index] if index < len(leaves) else None
        if not isinstance(value, torch.Tensor):
            raise ExcludedRegionError(
                f"ckpt_viz.checkpoint_exclude_wrapper: Checkpoint exclusion Tensor input count changed between "
                f"original forward and replay ({wrapper._name}, input {index} is {type(value).__name__}).\n"
                "Tip: call the region with the same arguments in forward and replay.", code="exclude_input_changed")
        values.append(value)
    tape.replay_values = values
    outputs = _ExcludeBridge.apply(frame, tape, torch.empty(0, requires_grad=True), *tape.all_replay_values())
    if tape.rng_after is not None:
        set_rng_state(tape.rng_after)
    if bus.enabled:
        emit(wrapper, ExcludeReused, frame.handle_id, call_index=tape.call_index, checkpoint_mode="reentrant",
                   placeholder=not wrapper.save_output, materialized_inputs=len(values), bridge=True)
    if not wrapper.save_output:
        return placeholders(tape.output_count)
    if tape.output_count == 1 and not isinstance(outputs, tuple):
        outputs = (outputs,)
    return _rebuild_like(tape, outputs)


def _rebuild_like(tape: _Tape, outputs: tuple) -> Any:
    leaves, spec = tape.structure
    it = iter(outputs)
    return tree_unflatten([next(it) if v is None else v for v in leaves], spec)
