"""Excluded regions: keep an expensive op's output instead of recomputing it (spec 1.4, 1.6, D4).

Owns `checkpoint_exclude_wrapper`, the per-invocation output cache, the
non-reentrant deferred-input handles and boundary, and the reentrant local SAVE
graphs ("tapes") with their replay bridge. Emits `exclude_saved` /
`exclude_reused`; never imports the UI.

NOTE [ Excluded regions ]
  1. A region runs exactly once per forward and never in a replay. Outside any
     checkpoint the wrapper is transparent.
  2. Non-reentrant forward: the region's inputs get deferred-input handles; its own
     saved tensors are kept (inner hooks override the checkpoint's holders), except
     inputs, which stay deferred and are materialized from the replay. If an input
     was deferred, each output passes a boundary that saves a trigger under the
     checkpoint's hooks, so backward forces the replay before the region needs its
     inputs. The output is cached (FIFO per wrapper) for the replay.
  3. Reentrant forward: the region runs with grad enabled on detached inputs and
     records a local graph (the tape). The replay returns the cached output through
     a bridge whose backward runs the tape: in DX it returns input gradients and
     keeps the tape; in DW or an ordinary backward it also accumulates parameter
     gradients and frees the tape unless the handle retains.
  4. The RNG state after the region is recorded in the forward and restored in the
     replay (when the checkpoint preserves RNG state), so later random ops match.
  5. `save_output=False` is for a region whose output feeds straight into another
     excluded region: the output is not cached, the replay returns zero-element
     placeholders, and the downstream region's local graph carries the gradient.
"""
from __future__ import annotations

import collections
import itertools
import weakref
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ckpt_viz import bus
from ckpt_viz.errors import CheckpointUsageError
from ckpt_viz.runtime import memtags
from ckpt_viz.runtime.graphmark import EXCLUDE_KEY, mark_new_nodes
from ckpt_viz.runtime import reentrant as _reentrant
from ckpt_viz.runtime.recompute_state import get_recompute_state

__all__ = ["CheckpointExcludeWrapper", "ExcludeCache", "checkpoint_exclude_wrapper"]

_INPUT_ATTR = "_ckpt_viz_exclude_input"
_SOURCE_ATTR = "_ckpt_viz_exclude_source"
_CACHE_KEY = "ckpt_viz.exclude_cache"
_WRAPPER_IDS = itertools.count()
_TRIGGER: list[torch.Tensor] = []


def _trigger() -> torch.Tensor:
    if not _TRIGGER:
        _TRIGGER.append(torch.empty(0, requires_grad=True))
    return _TRIGGER[0]


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(tensors)[0] if isinstance(t, torch.Tensor))


def _rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    cuda = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        for i, s in enumerate(state[1]):
            torch.cuda.set_rng_state(s, i)


class ExcludeCache:
    """Outputs of excluded regions, FIFO per wrapper, for one checkpoint invocation."""

    def __init__(self) -> None:
        self._entries: dict[int, collections.deque] = {}

    def save(self, wrapper_id: int, entry: Any) -> None:
        self._entries.setdefault(wrapper_id, collections.deque()).append(entry)

    def pop(self, wrapper_id: int) -> Any:
        queue = self._entries.get(wrapper_id)
        if not queue:
            return None
        entry = queue.popleft()
        if not queue:
            del self._entries[wrapper_id]
        return entry

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return sum(len(q) for q in self._entries.values())


def _tensor_leaves(args: tuple, kwargs: dict) -> tuple[list, Any]:
    leaves, spec = tree_flatten((args, kwargs))
    return leaves, spec


def _placeholders(count: int) -> Any:
    if count == 0:
        return ()
    if count == 1:
        return torch.empty(0)
    return tuple(torch.empty(0) for _ in range(count))


# ---------------------------------------------------------------- non-reentrant mode

class _DeferredInput:
    """A region input saved as a promise; the replay materializes it."""

    __slots__ = ("leaf_index", "used", "value")

    def __init__(self, leaf_index: int) -> None:
        self.leaf_index = leaf_index
        self.used = False
        self.value: torch.Tensor | None = None


class _NonReentrantEntry:
    __slots__ = ("output", "bindings", "output_count", "rng_after", "call_index", "__weakref__")

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
        ctx.saved_tensors  # forces the outer checkpoint's replay; see NOTE rule 2
        return grad, None


def _with_boundaries(out: Any) -> Any:
    leaves, spec = tree_flatten(out)
    trigger = _trigger()
    return tree_unflatten([_RecomputeBoundary.apply(v, trigger) if isinstance(v, torch.Tensor) else v
                           for v in leaves], spec)


class _Kept:
    """A tensor an excluded region keeps for its backward (its lifetime is the saved variable's)."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _deferred_pack(x: torch.Tensor) -> Any:
    handle = getattr(x, _INPUT_ATTR, None)
    if isinstance(handle, _DeferredInput):
        handle.used = True
        return handle
    return _Kept(x.detach())


def _deferred_unpack(saved: Any) -> torch.Tensor:
    if isinstance(saved, _DeferredInput):
        if saved.value is None:
            raise RuntimeError(
                "ckpt_viz.checkpoint_exclude_wrapper: Checkpoint-excluded input was requested before recomputation.\n"
                "Tip: backward reached the region before its checkpoint replayed; report the trace if you did not "
                "call the region's backward by hand.")
        return saved.value
    return saved.tensor


# ---------------------------------------------------------------- reentrant mode

class _Tape:
    """One excluded region's local SAVE graph inside a reentrant checkpoint."""

    __slots__ = ("outputs", "local_inputs", "input_leaves", "chain", "save_output", "output_count",
                 "rng_after", "call_index", "replay_values", "released", "wrapper_id", "chain_outputs",
                 "structure", "__weakref__")

    def __init__(self) -> None:
        self.outputs: tuple | None = None
        self.local_inputs: list[torch.Tensor] = []
        self.input_leaves: list[int] = []
        self.chain: list["_Tape"] = []
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
        ctx.frame, ctx.tape, ctx.count = frame, tape, len(inputs)
        if tape.save_output:
            outputs = tuple(o.detach() for o in tape.outputs)
            ctx.mark_non_differentiable(*(d for d, o in zip(outputs, tape.outputs) if not o.requires_grad))
        else:
            outputs = tuple(torch.empty(0) for _ in range(tape.output_count))
            ctx.mark_non_differentiable(*outputs)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        frame, tape = ctx.frame, ctx.tape
        if tape.released or tape.outputs is None:
            raise RuntimeError(
                f"ckpt_viz.checkpoint_exclude_wrapper: The retained reentrant checkpoint graph has already been "
                f"released (region of handle h{frame.handle_id}).\nTip: run DX before DW; DW frees excluded-region "
                "graphs unless a retaining session holds them.")
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


# ---------------------------------------------------------------- the wrapper

class CheckpointExcludeWrapper(torch.nn.Module):
    """Runs `module_or_fn` once per forward and reuses its output in checkpoint replays."""

    def __init__(self, module_or_fn: Callable, save_output: bool = True) -> None:
        super().__init__()
        if not callable(module_or_fn):
            raise CheckpointUsageError(
                "ckpt_viz.checkpoint_exclude_wrapper: module must be a PyTorch Module or callable, got "
                f"{type(module_or_fn).__name__}.\nTip: pass the module (or a function) to exclude from recompute.")
        if not isinstance(save_output, bool):
            raise CheckpointUsageError(
                f"ckpt_viz.checkpoint_exclude_wrapper: save_output must be a bool, got {type(save_output).__name__}.\n"
                "Tip: pass True (cache the output) or False (only when it feeds another excluded region).")
        if isinstance(module_or_fn, torch.nn.Module):
            self.module = module_or_fn
            self._fn = None
        else:
            self.module = None
            self._fn = module_or_fn
        self.save_output = save_output
        self.exclude_id = next(_WRAPPER_IDS)
        self._calls = 0
        self._name = type(module_or_fn).__name__ if self.module is not None else \
            getattr(module_or_fn, "__qualname__", type(module_or_fn).__name__)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs) if self.module is not None else self._fn(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        frame = _reentrant.current_frame()
        if frame is not None:
            if frame.replaying:
                return self._reentrant_replay(frame, args, kwargs)
            return self._reentrant_forward(frame, args, kwargs)
        state = get_recompute_state()
        if state is None:
            return self._run(*args, **kwargs)
        if state.is_recomputing:
            return self._nonreentrant_replay(state, args, kwargs)
        return self._nonreentrant_forward(state, args, kwargs)

    def _emit(self, kind: str, handle_id: int | None, **data: Any) -> None:
        bus.emit(kind, handle_id=handle_id, mode="exclude", capture_site=False,
                 data={"wrapper": self._name, "wrapper_id": self.exclude_id, **data})

    # -------------------------------------------- non-reentrant

    def _nonreentrant_forward(self, state: Any, args: tuple, kwargs: dict) -> Any:
        cache = state.get_resource(_CACHE_KEY, ExcludeCache)
        leaves, spec = _tensor_leaves(args, kwargs)
        bindings: list[_DeferredInput] = []
        marked: list[tuple[torch.Tensor, Any]] = []
        seen: set[int] = set()
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor) or isinstance(leaf, torch.nn.Parameter) or id(leaf) in seen:
                continue
            seen.add(id(leaf))
            if getattr(leaf, _SOURCE_ATTR, None) == state.invocation_id:
                continue
            handle = _DeferredInput(index)
            marked.append((leaf, getattr(leaf, _INPUT_ATTR, None)))
            setattr(leaf, _INPUT_ATTR, handle)
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
                out = self._run(*args, **kwargs)
        finally:
            for leaf, previous in marked:
                if previous is None:
                    delattr(leaf, _INPUT_ATTR)
                else:
                    setattr(leaf, _INPUT_ATTR, previous)
        used = [b for b in bindings if b.used]
        if bus.enabled:
            mark_new_nodes(out, leaves, EXCLUDE_KEY, self.exclude_id)
        if used:
            out = _with_boundaries(out)
        out_leaves = [v for v in tree_flatten(out)[0] if isinstance(v, torch.Tensor)]
        for value in out_leaves:
            setattr(value, _SOURCE_ATTR, state.invocation_id)
        call_index = self._calls
        self._calls += 1
        rng_after = _rng_state() if state.preserve_rng_state else None
        entry = _NonReentrantEntry(out if self.save_output else None, used, len(out_leaves), rng_after, call_index)
        if memtags.enabled and self.save_output:
            for value in out_leaves:
                memtags.hold(entry, value, "excluded_outputs")
        cache.save(self.exclude_id, entry)
        if bus.enabled:
            self._emit("exclude_saved", None, call_index=call_index, checkpoint_mode="nonreentrant",
                       save_output=self.save_output, output_tensor_count=len(out_leaves),
                       used_inputs=[b.leaf_index for b in used], boundary_added=bool(used),
                       cached_nbytes=_nbytes(out) if self.save_output else 0, saved_nbytes=saved_nbytes[0])
        return out

    def _nonreentrant_replay(self, state: Any, args: tuple, kwargs: dict) -> Any:
        cache = state.get_resource(_CACHE_KEY, ExcludeCache)
        entry = cache.pop(self.exclude_id)
        if entry is None:
            raise RuntimeError(
                f"ckpt_viz.checkpoint_exclude_wrapper: No cached forward output is available for this checkpoint "
                f"exclusion wrapper ({self._name}).\nTip: a non-reentrant region replays once per forward; run DX and "
                "DW in one session (backward_input/backward_weight with session_id) so the checkpoint replays once.")
        leaves, _ = _tensor_leaves(args, kwargs)
        for binding in entry.bindings:
            value = leaves[binding.leaf_index] if binding.leaf_index < len(leaves) else None
            if not isinstance(value, torch.Tensor):
                raise RuntimeError(
                    "ckpt_viz.checkpoint_exclude_wrapper: Checkpoint replay did not reproduce a tensor input required "
                    f"by a checkpoint-excluded region ({self._name}, input {binding.leaf_index}, got "
                    f"{type(value).__name__}).\nTip: the checkpointed function must call the region with the same "
                    "arguments in its replay.")
            binding.value = value.detach()
        out = entry.output if self.save_output else _placeholders(entry.output_count)
        if entry.bindings:
            out = _with_boundaries(out)
        if entry.rng_after is not None:
            _set_rng_state(entry.rng_after)
        if bus.enabled:
            self._emit("exclude_reused", None, call_index=entry.call_index, checkpoint_mode="nonreentrant",
                       placeholder=not self.save_output, materialized_inputs=len(entry.bindings))
        return out

    # -------------------------------------------- reentrant

    def _reentrant_forward(self, frame: Any, args: tuple, kwargs: dict) -> Any:
        if frame.recording_exclude:
            raise CheckpointUsageError(
                f"ckpt_viz.checkpoint_exclude_wrapper: nested excluded regions are not supported (inside handle "
                f"h{frame.handle_id}).\nTip: exclude the outer region only.")
        tape = _Tape()
        tape.save_output = self.save_output
        tape.wrapper_id = self.exclude_id
        leaves, spec = _tensor_leaves(args, kwargs)
        local_leaves = list(leaves)
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor) or isinstance(leaf, torch.nn.Parameter):
                continue
            source = getattr(leaf, _SOURCE_ATTR, None)
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
                out = self._run(*local_args, **local_kwargs)
        finally:
            frame.recording_exclude = False
        out_leaves, out_spec = tree_flatten(out)
        tensors = [v for v in out_leaves if isinstance(v, torch.Tensor)]
        tape.output_count = len(tensors)
        tape.outputs = tuple(tensors)
        if memtags.enabled and self.save_output:
            for value in tensors:
                memtags.hold(tape, value, "excluded_outputs")
        tape.structure = ([None if isinstance(v, torch.Tensor) else v for v in out_leaves], out_spec)
        tape.rng_after = _rng_state() if frame.preserve_rng_state else None
        tape.call_index = self._calls
        self._calls += 1
        detached = []
        for k, value in enumerate(tensors):
            d = value.detach()
            frame.excluded_output_mask[id(d)] = (weakref.ref(d), bool(value.requires_grad))
            setattr(d, _SOURCE_ATTR, (frame, tape, k))
            detached.append(d)
        if not self.save_output:
            # The downstream region continues this graph; see NOTE [ Excluded regions ], rule 5.
            tape.chain_outputs = tape.outputs
            tape.outputs = None
        if frame.exclude_cache is None:
            frame.exclude_cache = ExcludeCache()
        frame.exclude_cache.save(self.exclude_id, tape)
        frame.entries.append(tape)
        if bus.enabled:
            self._emit("exclude_saved", frame.handle_id, call_index=tape.call_index, checkpoint_mode="reentrant",
                       save_output=self.save_output, output_tensor_count=len(tensors),
                       used_inputs=tape.input_leaves, boundary_added=False,
                       cached_nbytes=_nbytes(tensors) if self.save_output else 0)
        it = iter(detached)
        return tree_unflatten([next(it) if isinstance(v, torch.Tensor) else v for v in out_leaves], out_spec)

    def _reentrant_replay(self, frame: Any, args: tuple, kwargs: dict) -> Any:
        tape = frame.exclude_cache.pop(self.exclude_id) if frame.exclude_cache is not None else None
        if tape is None:
            raise RuntimeError(
                f"ckpt_viz.checkpoint_exclude_wrapper: Checkpoint replay executed an unmatched checkpoint exclusion "
                f"wrapper call ({self._name}, handle h{frame.handle_id}).\nTip: the replay must call each excluded "
                "region as often as the forward did.")
        leaves, _ = _tensor_leaves(args, kwargs)
        values = []
        for index in tape.input_leaves:
            value = leaves[index] if index < len(leaves) else None
            if not isinstance(value, torch.Tensor):
                raise RuntimeError(
                    f"ckpt_viz.checkpoint_exclude_wrapper: Checkpoint exclusion Tensor input count changed between "
                    f"original forward and replay ({self._name}, input {index} is {type(value).__name__}).\n"
                    "Tip: call the region with the same arguments in forward and replay.")
            values.append(value)
        tape.replay_values = values
        outputs = _ExcludeBridge.apply(frame, tape, torch.empty(0, requires_grad=True), *tape.all_replay_values())
        if tape.rng_after is not None:
            _set_rng_state(tape.rng_after)
        if bus.enabled:
            self._emit("exclude_reused", frame.handle_id, call_index=tape.call_index, checkpoint_mode="reentrant",
                       placeholder=not self.save_output, materialized_inputs=len(values), bridge=True)
        if not self.save_output:
            return _placeholders(tape.output_count)
        if tape.output_count == 1 and not isinstance(outputs, tuple):
            outputs = (outputs,)
        return _rebuild_like(tape, outputs)

    def extra_repr(self) -> str:
        return f"save_output={self.save_output}"


def _rebuild_like(tape: _Tape, outputs: tuple) -> Any:
    leaves, spec = tape.structure
    it = iter(outputs)
    return tree_unflatten([next(it) if v is None else v for v in leaves], spec)


def checkpoint_exclude_wrapper(module_or_fn: Callable, *, save_output: bool = True) -> CheckpointExcludeWrapper:
    """Exclude a region from recompute: it runs once per forward and its output is reused in replays.

    Args:
        module_or_fn: the module or function to exclude.
        save_output: cache the output (default). False only when the output feeds
            straight into another excluded region (see NOTE [ Excluded regions ], rule 5).

    Returns:
        A module that behaves like `module_or_fn` (transparent outside checkpoints).
    """
    return CheckpointExcludeWrapper(module_or_fn, save_output=save_output)
