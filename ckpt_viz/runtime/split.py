"""Split backward helpers: the stage protocol of spec 3.2 in two calls (spec D6).

Owns `backward_input` (DX: gradients for activations, sent upstream at once) and
`backward_weight` (DW: gradients for weights, run later to fill bubbles), named as
in `torch.distributed.pipelining`. Imports torch and the runtime; never the UI.

NOTE [ One replay per micro-batch ]
  1. DX sets phase "dx" on the split reentrant handles and runs `autograd.grad`
     with the outer `retain_graph=True` (without it DW hits "Trying to backward
     through the graph a second time", scenario R13).
  2. DW sets phase "dw" and runs `autograd.backward(inputs=(*params, *triggers))`,
     so closure-only regions are reached through their triggers (scenario R12).
  3. With a `session_id`, every handle in `handles` is registered under it; DX runs
     in a retaining session and DW in a non-retaining one, so non-reentrant frames
     recompute once and serve both passes; DW clears the session when it finishes.
  4. Result: every region replays exactly once per micro-batch, for both kinds.
"""
from __future__ import annotations

import contextvars
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import torch

from ckpt_viz.errors import CheckpointUsageError
from ckpt_viz.runtime import session as _session
from ckpt_viz.runtime.handover import launch_context

__all__ = ["backward_input", "backward_weight", "running_helper"]

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar("ckpt_viz_split_helper", default=None)


def running_helper() -> str | None:
    """"ckpt_viz.backward_input" / "ckpt_viz.backward_weight" while that helper's autograd call runs, else None
    (a handle it reaches in phase "ordinary" was left out of its `handles=`); on an engine device thread, read in
    the context that launched the backward."""
    helper = _RUNNING.get()
    if helper is None:
        launched = launch_context()
        helper = launched.get(_RUNNING) if launched is not None else None
    return helper


def _as_tuple(value: Any) -> tuple:
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        return (value,)
    return tuple(value)


def _grad_outputs(outputs: tuple, grad_outputs: Any) -> tuple | None:
    grads = _as_tuple(grad_outputs)
    if not grads:
        return None
    if len(grads) != len(outputs):
        raise _session.emit_error(CheckpointUsageError(
            f"ckpt_viz.backward_input/backward_weight: got {len(outputs)} outputs but {len(grads)} grad_outputs.\n"
            "Tip: pass one gradient per output (None for a scalar loss)."
        ), "backward_input/backward_weight")
    return grads


def _prepare(handles: Iterable[Any], phase: str, session_id: Hashable | None) -> list:
    handles = list(handles)
    for handle in handles:
        if not getattr(handle, "_is_checkpoint_handle", False):
            api = f"ckpt_viz.backward_{'input' if phase == 'dx' else 'weight'}"
            raise _session.emit_error(CheckpointUsageError(
                f"{api}: handles must come from "
                f"reentrant_checkpoint_scope or recompute_handle_collector_ctx, got {type(handle).__name__}.\n"
                "Tip: pass the list the scope or collector yielded."
            ), api)
        if handle.mode == "reentrant" and handle.split:
            handle.set_phase(phase)
    if session_id is not None:
        for handle in handles:
            if handle.mode != "reentrant" or not handle.released:
                _session.register(handle, session_id)
    return handles


def backward_input(outputs: Any, grad_outputs: Any, inputs: Sequence[torch.Tensor], *,
                   handles: Iterable[Any] = (), session_id: Hashable | None = None) -> tuple:
    """DX: gradients of `inputs` (the stage's activations); parameter `.grad` stays untouched.

    Args:
        outputs: the stage output tensor(s) (or the loss on the last stage).
        grad_outputs: the gradient(s) received from the next stage (None for a scalar loss).
        inputs: the activations to differentiate; entries that need no grad get None.
        handles: the micro-batch's handles (reentrant and/or non-reentrant).
        session_id: replay non-reentrant frames once for DX and DW (see NOTE rule 3).

    Returns:
        One gradient (or None) per entry of `inputs`.
    """
    outputs = _as_tuple(outputs)
    grads = _grad_outputs(outputs, grad_outputs)
    inputs = _as_tuple(inputs)
    _prepare(handles, "dx", session_id)
    targets = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not targets:
        return (None,) * len(inputs)

    def run() -> tuple:
        token = _RUNNING.set("ckpt_viz.backward_input")
        try:
            return torch.autograd.grad(outputs, targets, grads, retain_graph=True, allow_unused=True)
        finally:
            _RUNNING.reset(token)

    if session_id is None:
        computed = iter(run())
    else:
        with _session.recompute_session_ctx(session_id, retain_on_unpack=True):
            computed = iter(run())
    return tuple(next(computed) if isinstance(t, torch.Tensor) and t.requires_grad else None for t in inputs)


def backward_weight(outputs: Any, grad_outputs: Any, params: Iterable[torch.Tensor], *,
                    handles: Iterable[Any] = (), session_id: Hashable | None = None) -> None:
    """DW: accumulate the weight gradients into `.grad` and release every reached handle.

    Args:
        outputs, grad_outputs: as for `backward_input` (the same objects).
        params: the stage's parameters.
        handles: the micro-batch's handles; their triggers are added to DW's inputs.
        session_id: the id given to `backward_input`; cleared when DW finishes.
    """
    outputs = _as_tuple(outputs)
    grads = _grad_outputs(outputs, grad_outputs)
    handles = _prepare(handles, "dw", session_id)
    triggers = [h.backward_trigger for h in handles
                if h.mode == "reentrant" and h.backward_trigger is not None]
    targets = [p for p in params if p.requires_grad] + triggers
    token = _RUNNING.set("ckpt_viz.backward_weight")
    try:
        if session_id is None:
            if targets:
                torch.autograd.backward(outputs, grads, inputs=targets)
            return
        try:
            with _session.recompute_session_ctx(session_id, retain_on_unpack=False):
                if targets:
                    torch.autograd.backward(outputs, grads, inputs=targets)
        finally:
            _session.clear_recompute_session(session_id)
    finally:
        _RUNNING.reset(token)
