"""Unasked accumulation: an unscoped reentrant checkpoint's replay writing `.grad` nobody asked for.

Owns the check that `ReentrantCheckpointHandle._gradients` runs around the full inner
backward of a handle outside `reentrant_checkpoint_scope`, the once-per-run
`UserWarning`, and the `unasked_grads_accumulated` event. Imports torch and the bus;
never the UI.

NOTE [ Unasked accumulation ]
  1. What: a reentrant checkpoint outside a split scope answers every backward with a
     full `autograd.backward` over its replay graph (spec 1.5 `_gradients`), so every
     parameter it captured (a module's own, a closure's) accumulates into `.grad`. A
     `torch.autograd.grad(...)` or `backward(inputs=...)` that reaches it asked for
     other tensors: those writes are unasked, and the next backward adds to them.
     torch's stock pipeline stage does this in its I action (`stage_backward_input`)
     and in metadata inference, so the weights' gradients come out wrong (spec 3.5).
  2. Filtered or not: the checkpoint's `dummy` input is a leaf nobody can name, so the
     engine runs its `AccumulateGrad` exactly when the backward has no `inputs=` filter
     (`torch._C._will_engine_execute_node`; under `autograd.grad` it is never run).
     One C call per ordinary backward of an unscoped handle.
  3. Unasked: a captured parameter that is not among the running `backward(inputs=...)`
     (any parameter under `autograd.grad`, which never writes `.grad` itself), and whose
     `.grad` the replay's backward then wrote (a new tensor, or the old one written in
     place). A captured parameter has no edge in the outer graph, so the engine cannot
     say whether it was asked for; the `inputs` are read from torch's launching frame
     (`torch.autograd.graph._engine_run_backward`, on this thread's stack on CPU).
     Where that frame is not found (a device thread), every one counts as unasked.
  4. Reported: the event for every such backward while a recording listens; the warning
     once per run: once per process while nothing records, and once per recording.
     After that first warning, a backward that nobody records is not checked again, so
     the cost with nobody listening is one flag check per backward (rule 2's call only
     until the first warning).
  5. Not refused: the seed allows it (spec 1.5, 3.5), its gradients are the full
     backward's (right when the caller zeroes `.grad` afterwards or wants them), and a
     refusal raised inside the engine would abort a backward that torch's own
     checkpoint refuses before it starts; the warning names the fix instead.
"""
from __future__ import annotations

import os
import sys
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ckpt_viz import bus
from ckpt_viz.events import UnaskedGradsAccumulated
from ckpt_viz.runtime import memtags
from ckpt_viz.runtime.owners import qualname

__all__ = ["UnaskedAccumulationWarning", "after", "before", "checked_gradients", "pending"]

pending = True  # no warning yet in this process: check every unrecorded backward too (NOTE rule 4)
_warned_recordings: weakref.WeakSet[Any] = weakref.WeakSet()  # the innermost channels that warned
_will_run = torch._C._will_engine_execute_node
_ENGINE_RUN = getattr(getattr(torch.autograd.graph, "_engine_run_backward", None), "__code__", None)
_SKIP = (os.path.dirname(os.path.abspath(__file__)) + os.sep,  # the runtime, a recording's autograd wrapper, torch
         os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recording.py"),
         os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


class UnaskedAccumulationWarning(UserWarning):
    """A reentrant checkpoint outside a split scope wrote `.grad` of parameters a filtered backward did not ask
    for (NOTE [ Unasked accumulation ])."""


def _runs(node: Any) -> bool:
    try:
        return _will_run(node)
    except RuntimeError:  # a leaf input of autograd.grad: never our dummy, which nobody can name
        return False


def _asked() -> set[int] | None:
    """The ids of the tensors the running backward accumulates into: `backward(inputs=...)`'s, none for
    `autograd.grad`; None when its launching frame is not on this thread's stack (NOTE rule 3)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code is not _ENGINE_RUN:
        frame = frame.f_back
    if frame is None:
        return None
    launch = frame.f_locals
    args, kwargs = launch.get("args"), launch.get("kwargs")
    if not (isinstance(args, tuple) and len(args) > 3 and isinstance(kwargs, dict)):
        return None
    if not kwargs.get("accumulate_grad", False):
        return set()
    return {id(t) for t in args[3] or () if isinstance(t, torch.Tensor)}


def before(handle: Any, values: Sequence[torch.Tensor]) -> tuple | None:
    """None when the running backward has no `inputs=` filter (rule 2); else the captured parameters it did not ask
    for, each one's `.grad` and that grad's version (rule 3), read before the replay's backward."""
    ctx = handle.context_ref() if handle.context_ref is not None else None
    if ctx is None or _runs(ctx.next_functions[0][0]):  # edge 0: the dummy leaf (reentrant.py, _Checkpoint)
        return None
    asked = _asked() or set()
    params = [p for p in handle._captured(values) if p.requires_grad and p.is_leaf and id(p) not in asked]
    grads = [p.grad for p in params]
    return params, grads, [getattr(g, "_version", -1) for g in grads]


def checked_gradients(handle: Any, values: tuple, grads: tuple) -> tuple:
    """`ReentrantCheckpointHandle._gradients`' ordinary pass, checked, until this process warned (rule 4)."""
    states = before(handle, values)
    watch, handle.divergence = handle.divergence, None
    with watch.gradients(handle._emit) if watch is not None else memtags.NULL:
        torch.autograd.backward(values, grads, retain_graph=handle.retain_graph)
    after(handle, states)
    return tuple([item.grad if item.requires_grad else None for item in handle.replay_inputs])


def after(handle: Any, states: tuple | None) -> None:
    """Compare with `before`'s states after the replay's backward; report what it wrote (rule 4). None: nothing."""
    global pending
    if states is None:
        return
    params, old, versions = states
    hit = [p for p, g, v in zip(params, old, versions)
           if p.grad is not None and (p.grad is not g or p.grad._version != v)]
    if not hit:
        return
    recording = bus.enabled and bus.current_scope().channels
    channel = recording[-1] if recording else None
    warn = pending if channel is None else channel not in _warned_recordings
    names = [bus.name_of(p) for p in hit] if bus.enabled else [None] * len(hit)
    if bus.enabled:
        handle._emit(UnaskedGradsAccumulated, count=len(hit), params=tuple(names),
                     shapes=tuple(tuple(p.shape) for p in hit), function=qualname(handle.function), warned=warn)
    if not warn:
        return
    pending = False
    if channel is not None:
        _warned_recordings.add(channel)
    shown = [n or f"a {'x'.join(map(str, p.shape)) or 'scalar'} tensor" for n, p in zip(names, hit)]
    listed = ", ".join(shown[:4]) + (f", and {len(shown) - 4} more" if len(shown) > 4 else "")
    warnings.warn(UnaskedAccumulationWarning(
        f"ckpt_viz.checkpoint: reentrant checkpoint h{handle.handle_id} ({qualname(handle.function)}) outside a "
        "split scope was reached by torch.autograd.grad or backward(inputs=...), and its replay's full backward "
        f"accumulated into .grad of {len(hit)} parameter(s) that call did not ask for ({listed}); the next "
        "backward adds to them, so those gradients come out wrong (torch's stock PipelineStage does this in its I "
        "action and in metadata inference). Warned once per run.\nTip: build the stage with "
        "ckpt_viz.pipelining.PipelineStage instead of torch.distributed.pipelining.PipelineStage, or run the "
        "forward inside ckpt_viz.reentrant_checkpoint_scope(params) and drive it with backward_input / "
        "backward_weight."), stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The `stacklevel` of the innermost frame outside ckpt_viz's runtime and torch (the user's backward call)."""
    frame, level = sys._getframe(2), 2  # level 1 is our caller (`after`'s caller reads as 2 from warnings.warn)
    while frame is not None and _library(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1


def _library(filename: str) -> bool:
    return filename.startswith(_SKIP) or os.path.basename(filename) == "contextlib.py"
