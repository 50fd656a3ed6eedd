"""The reentrant checkpoint with split DX/DW backward (spec 1.5, 2 and 3).

Owns `ReentrantCheckpointHandle`, `reentrant_checkpoint_scope` and the autograd
Function that replays a region inside the engine's backward. Emits an event at
every transition; never imports the UI.

NOTE [ Handle lifetime ]
  1. The autograd node holds its handle strongly; the handle holds the node only
     through a weakref (`context_ref`), so looking a handle up never keeps a graph
     alive. When the node is collected the handle emits `node_collected`.
  2. A handle replays at most once. The replay graph stays alive in
     `replay_outputs` until the handle is released, so DX and DW share it.
  3. Release is terminal and idempotent; it frees the replay graph and every
     excluded-region tape, and records its reason (spec 7 `released`).
  4. Who releases: an ordinary backward that does not retain; DW always; any
     exception in backward unless retained; `clear_recompute_session`;
     `release()`; a failing forward. Nothing else.
  5. DX never releases: its inner `autograd.grad` keeps the replay graph.

  Worked example (split, one handle h0):
      forward in scope -> handle_created h0, forward_started, forward_finished
      set_phase('dx'); backward(inputs=acts, retain_graph=True)
          -> backward_entered, replay_started, replay_finished, grads_routed(dx)
      set_phase('dw'); backward(inputs=(*params, h0.backward_trigger))
          -> backward_entered, grads_routed(dw), released(dw_complete)

NOTE [ Split routing ]
  1. DX targets the replay inputs that require grad and are not scope parameters;
     it runs `autograd.grad` on the replay graph and writes no `.grad`.
  2. DW (and ordinary backward) runs `autograd.backward` over the whole replay
     graph: captured parameters accumulate straight into their `.grad`; explicit
     parameter inputs return their gradient through the node's input edge.
  3. The `backward_trigger` is a zero-element leaf that gives every split handle
     an outer edge DW can target, so closure-only regions are reached (spec 3.4).
     Its gradient is always None.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import operator
import weakref
from collections.abc import Callable, Iterator, Sequence
from operator import is_, is_not
from threading import get_ident
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ckpt_viz import bus
from ckpt_viz.errors import CheckpointError, CheckpointUsageError, PhaseNotSetError
from ckpt_viz.events import (
    BackwardEntered,
    ForwardFailed,
    ForwardFinished,
    ForwardStarted,
    GradsRouted,
    HandleCreated,
)
from ckpt_viz.runtime import divergence, memtags
from ckpt_viz.runtime import session as _session
from ckpt_viz.runtime.handover import carried
from ckpt_viz.runtime.labels import label_of
from ckpt_viz.runtime.reentrant_handle import (
    InputSlot,
    ReentrantCheckpointHandle,
    current_frame,
    fail,
    input_slot,
    meta,
    new_handle_id,
    qualname,
    tensors_of,
)
from ckpt_viz.runtime.split import running_helper
from ckpt_viz.runtime.state import ExecutionState, noop_context_fn

__all__ = [
    "ReentrantCheckpointHandle",
    "current_frame",
    "new_handle_id",
    "reentrant_checkpoint",
    "reentrant_checkpoint_scope",
]

_SCOPE: contextvars.ContextVar[list | None] = contextvars.ContextVar("ckpt_viz_reentrant_scope", default=None)
_API = "ckpt_viz.checkpoint"
_NULL = contextlib.nullcontext()


def _collected_callback(handle_ref: weakref.ref[ReentrantCheckpointHandle]) -> Callable[[Any], None]:
    def collected(_: Any) -> None:
        handle = handle_ref()
        if handle is not None:
            handle._on_node_collected()
    return collected


class _Checkpoint(torch.autograd.Function):
    """The outer-graph node: input edges, one trigger edge, and the replay inside backward."""

    @staticmethod
    def forward(ctx: Any, frame: ReentrantCheckpointHandle, dummy: torch.Tensor, *tensors: torch.Tensor) -> tuple:
        inputs = tensors[:frame.input_count]
        ctx.frame = frame
        ctx.save_for_backward(*inputs)
        frame.context_ref = weakref.ref(ctx, _collected_callback(weakref.ref(frame)))
        frame.state = ExecutionState.capture(frame.context_fn, frame.preserve_rng_state, inputs, api=_API)
        if bus.enabled:
            state = frame.state
            frame._emit(ForwardStarted, site=frame.site, capture_site=False,  # the creation's site
                        device_type=state.device_type, rng_captured=state.cpu_rng_state is not None)
        watch = frame.divergence  # See NOTE [ Replay divergence checks ] in divergence.py.
        context = frame.state.forward_context
        if watch is None and type(context) is contextlib.nullcontext:  # autograd runs forward without grad
            output = frame._call(inputs)
        else:
            with context, (watch.mode() if watch is not None else _NULL):
                output = frame._call(inputs)
        for entry in frame.entries:  # a save_output=False region's output was needed only during this forward
            entry.chain_outputs = None
        frame.state.check_device_state_preserved(frame.preserve_rng_state, api=_API)
        if isinstance(output, torch.Tensor):  # the usual case: one tensor (output_spec None: no pytree)
            originals = [output]
            frame.output_spec, frame.output_template = None, (input_slot(0),)
        else:
            leaves, frame.output_spec = tree_flatten(output)
            frame.output_template = tuple(
                input_slot(i) if isinstance(v, torch.Tensor) else v for i, v in enumerate(leaves)
            )
            originals = [v for v in leaves if isinstance(v, torch.Tensor)]
        if not originals:
            raise CheckpointUsageError(
                f"{_API}: Reentrant checkpoint requires at least one Tensor output (h{frame.handle_id}: "
                f"{qualname(frame.function)} returned {type(output).__name__}).\n"
                "Tip: return the tensor result, or do not checkpoint a function without tensor outputs."
            )
        outputs = tuple([v.detach() for v in originals])

        excluded = frame.excluded_output_mask

        def differentiable(original: torch.Tensor) -> bool:
            matched = excluded.get(id(original)) if excluded else None
            if matched is not None and matched[0]() is original:
                return matched[1]
            return original.is_floating_point() or original.is_complex()

        non_diff = [i for i, original in enumerate(originals) if not differentiable(original)]
        if non_diff:
            ctx.mark_non_differentiable(*(outputs[i] for i in non_diff))
        if excluded:
            excluded.clear()
        if watch is not None:
            watch.forward_done(outputs)
        if bus.enabled:
            frame._emit(ForwardFinished, site=frame.site, capture_site=False, outputs=tuple(map(meta, outputs)),
                        non_differentiable=tuple(non_diff), exclude_entries=len(frame.entries))
        return outputs

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple:
        return carried(_backward, ctx.frame, grad_outputs)  # See NOTE [ Engine hand-over ], rule 3.


_task: tuple[int, int] = (-1, -1)  # (graph task, thread) of the last backward that looked its site up
_task_site: str | None = None  # the user's line of that task's call
_graph_task_id = torch._C._current_graph_task_id


def _site_of_backward() -> str | None:
    """The user's line that launched the running backward: walked once per graph task and thread.

    While one backward call runs, the Python stack below the engine on a thread does not
    change, so every node of that task on that thread has the same user line.
    """
    global _task, _task_site
    task = (_graph_task_id(), get_ident())
    if task == _task:
        return _task_site
    site = bus.call_site(3)
    _task, _task_site = task, site
    return site


def _backward(frame: ReentrantCheckpointHandle, grad_outputs: tuple) -> tuple:
    if bus.enabled:
        frame._backward_site = _site_of_backward()
        frame._emit(BackwardEntered, split=frame.split, retain_graph=frame.retain_graph, grad_count=len(grad_outputs),
                    none_grads=sum(map(is_, grad_outputs, _NONES)))
    try:
        return _run_backward(frame, grad_outputs)
    except BaseException as exc:
        fail(exc, "backward", frame)
        if not frame.retain_graph:
            frame._release("backward_exception")
        raise
    finally:
        frame._backward_site = None


def _run_backward(frame: ReentrantCheckpointHandle, grad_outputs: tuple) -> tuple:
    if torch.is_grad_enabled():  # the engine enables grad mode in backward only for create_graph=True
        raise CheckpointError(
            f"{_API} (backward): create_graph=True is not supported through a reentrant checkpoint (handle "
            f"h{frame.handle_id}): its gradients come from a replay inside backward and would not be "
            "differentiable.\nTip: use use_reentrant=False for higher-order gradients, or drop create_graph=True.")
    if frame.split and frame.phase == "ordinary":
        raise PhaseNotSetError(frame.handle_id, running_helper())
    frame.recompute()
    outputs = tensors_of(frame.replay_outputs)
    if not any(v.requires_grad for v in outputs):
        raise CheckpointError(
            f"{_API} (backward): none of output has requires_grad=True, this checkpoint() is not necessary (handle "
            f"h{frame.handle_id}: the replay of {qualname(frame.function)} returned no tensor that requires grad)."
            "\nTip: checkpoint only regions whose outputs depend differentiably on their inputs or parameters "
            "(a .detach() or no_grad inside cuts them off).")
    selected = [(v, g) for v, g in zip(outputs, grad_outputs) if v.requires_grad and g is not None]
    input_grads = frame._gradients(*zip(*selected)) if selected else (None,) * frame.input_count
    if bus.enabled:
        key = (tuple(map(is_not, input_grads, _NONES)), frame.param_input_mask, frame.split and frame.phase == "dw")
        routing = _ROUTED.get(key) or _routed(key)
        captured = frame._captured_report or ()
        frame._captured_report = None
        frame._emit(GradsRouted, captured=captured, **routing)
    if frame.split:
        if frame.phase == "dw":
            frame._release("dw_complete")
    elif not frame.retain_graph:
        frame._release("ordinary_backward_complete")
    return (None, None, *input_grads, None)


_CREATED: dict[int, tuple[Any, tuple, dict[str, Any]]] = {}  # id(function) -> (weakref to it, key, fields)
_TENSOR_KEY = operator.attrgetter("shape", "dtype", "requires_grad", "is_cpu")  # what meta() reads, on the CPU


def _created(function: Callable, frame: ReentrantCheckpointHandle, collector: str, inputs: tuple) -> dict[str, Any]:
    """`handle_created`'s fields: kept per function (weakly) while its calls look the same, and then shared by
    their events (immutable facts; the function's name is read once); a function without weak references, or
    inputs off the CPU, build them each call."""
    label = label_of(function)
    key = (frame.split, frame.param_input_mask, collector, frame.preserve_rng_state, label,
           *map(_TENSOR_KEY, inputs))
    entry = _CREATED.get(id(function))
    if entry is not None and entry[0]() is function and entry[1] == key:
        return entry[2]
    data = {"split": frame.split, "input_count": frame.input_count, "param_input_mask": frame.param_input_mask,
            "collector": collector, "preserve_rng_state": frame.preserve_rng_state, "function": qualname(function),
            "label": label, "inputs": tuple([meta(t) for t in inputs])}
    if all(t.is_cpu for t in inputs):
        try:
            ref = weakref.ref(function)
        except TypeError:  # a builtin or another callable without weak references
            return data
        if len(_CREATED) >= 1024:
            _CREATED.clear()
        _CREATED[id(function)] = (ref, key, data)
    return data


_ROUTED: dict[tuple, dict[str, tuple[int, ...]]] = {}  # (got a grad, param_input_mask, in DW) -> grads_routed's routing
_NONES = itertools.repeat(None)


def _routed(key: tuple[tuple[bool, ...], tuple[bool, ...], bool]) -> dict[str, tuple[int, ...]]:
    """`grads_routed`'s routing fields, a function of which inputs got a gradient, which are parameters, and DW."""
    present, mask, dw = key
    got = tuple(i for i, hit in enumerate(present) if hit)
    params = tuple(i for i in got if mask[i])
    acts = tuple(i for i in got if not mask[i])
    if len(_ROUTED) >= 1024:
        _ROUTED.clear()
    # In DW the activation grads are returned but the engine drops them (they are not DW targets).
    _ROUTED[key] = data = ({"targets": params, "explicit_params": params, "discarded_activations": acts} if dw
                           else {"targets": got, "explicit_params": params, "activations": acts})
    return data


@contextlib.contextmanager
def reentrant_checkpoint_scope(parameters: Sequence[torch.Tensor] | Callable[[], Sequence[torch.Tensor]]
                               ) -> Iterator[list[ReentrantCheckpointHandle]]:
    """Make every reentrant checkpoint in the block split, and collect its handles.

    Args:
        parameters: the stage's parameters, or a zero-argument provider evaluated
            lazily at the first checkpoint (e.g. `stage.parameters`).

    Yields:
        The live list of handles. Set each handle's phase before DX and DW,
        include every `backward_trigger` in DW's `inputs`, and release them on
        cancellation; leaving the scope releases nothing.
    """
    if _SCOPE.get() is not None:
        raise fail(CheckpointUsageError(
            "ckpt_viz.reentrant_checkpoint_scope: Nested reentrant checkpoint scopes are not supported.\n"
            "Tip: open one scope per stage forward."), "reentrant_checkpoint_scope")
    scope: list = [parameters, [], None]
    token = _SCOPE.set(scope)
    try:
        yield scope[1]
    finally:
        _SCOPE.reset(token)


def _checkpoint_inputs(args: tuple, kwargs: dict) -> tuple[tuple, list, Any]:
    """Tensor leaves in order, the template that rebuilds (args, kwargs), and its spec.

    The spec is None when every argument is a positional tensor; the template is then
    empty (the handle calls the function with the tensors as they are).
    """
    if not kwargs:
        for a in args:
            if not (type(a) is torch.Tensor or isinstance(a, torch.Tensor)):
                break
        else:
            return args, [], None
    leaves, spec = tree_flatten((args, kwargs))
    inputs: list[torch.Tensor] = []
    template: list = []
    for item in leaves:
        if isinstance(item, torch.Tensor):
            template.append(input_slot(len(inputs)))
            inputs.append(item)
        else:
            template.append(item)
    return tuple(inputs), template, spec


def _scope_parameters(scope: list | None) -> tuple | None:
    if scope is None:
        return None
    if scope[2] is None:
        supplied = tuple(scope[0]() if callable(scope[0]) else scope[0])
        bad = [type(p).__name__ for p in supplied if not isinstance(p, torch.Tensor)]
        if bad:
            raise CheckpointUsageError(
                f"ckpt_viz.reentrant_checkpoint_scope: Scope parameters must be Tensors (got {', '.join(bad)}).\n"
                "Tip: pass `stage.parameters` (the method) or a list of tensors; a module itself would be called."
            )
        scope[2] = tuple({id(p): p for p in supplied if p.requires_grad}.values())
    return scope[2]


def reentrant_checkpoint(function: Callable, *args: Any, preserve_rng_state: bool = True,
                         context_fn: Callable = noop_context_fn, **kwargs: Any) -> Any:
    """Run `function` under a reentrant checkpoint; see `ckpt_viz.runtime.checkpoint`."""
    if current_frame() is not None:
        raise fail(CheckpointUsageError(
            f"{_API}: Nested reentrant checkpoints are not supported (inside h{current_frame().handle_id}).\n"
            "Tip: checkpoint the outer region only, or use use_reentrant=False for the inner one."), "checkpoint")
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    inputs, template, spec = _checkpoint_inputs(args, kwargs)
    scope = _SCOPE.get()
    try:
        params = _scope_parameters(scope)
    except BaseException as exc:
        raise fail(exc, "checkpoint")  # noqa: B904  (fail returns exc itself, reported once)
    frame = ReentrantCheckpointHandle(function, template, spec, params, preserve_rng_state, context_fn)
    frame.input_count = len(inputs)
    if params:
        param_ids = {id(p) for p in params}
        frame.param_input_mask = tuple(id(t) in param_ids for t in inputs)
    else:
        frame.param_input_mask = (False,) * len(inputs)
    frame.backward_trigger = torch.empty(0, requires_grad=True) if frame.split else None
    if scope is not None:
        collector, collector_name = scope[1], "scope"
    else:
        collector = _session.current_collector()
        collector_name = "unified" if collector is not None else "none"
    if collector is not None:
        collector.append(frame)
    if bus.enabled:  # the site walk starts at our caller (the runtime's frames below it are never the user's)
        site = bus.call_site(2)
        event = frame._emit(HandleCreated, site=site, capture_site=False,
                            **_created(function, frame, collector_name, inputs))
        frame.site = site if event is not None else None  # the event's site: given, never captured
        if divergence._checks_on:  # watch() would say None at once otherwise
            frame.divergence = divergence.watch(frame, args, kwargs, inputs, frame._home)
    try:
        with (memtags.category("checkpoint_inputs") if memtags.enabled else memtags.NULL):
            result = _Checkpoint.apply(frame, torch.empty(0, requires_grad=True), *inputs, frame.backward_trigger)
    except BaseException as exc:
        if bus.enabled:
            frame._emit(ForwardFailed, site=frame.site, capture_site=False, type=type(exc).__name__,
                        message=str(exc)[:65536])
        frame._release("forward_exception")
        if collector is not None:
            collector.remove(frame)
        raise fail(exc, "checkpoint", frame)  # noqa: B904  (see above)
    if frame.output_spec is None:  # one tensor output
        return result if isinstance(result, torch.Tensor) else result[0]
    tensors = iter((result,) if isinstance(result, torch.Tensor) else result)
    return tree_unflatten([next(tensors) if isinstance(item, InputSlot) else item
                           for item in frame.output_template], frame.output_spec)
