"""Where `record(memory=True)` samples memory in the user's own loop: module boundaries, the passes, the optimizer.

Owns the process-wide hooks a memory recording needs beyond the runtime's events:
torch's global module forward hooks and optimizer step hooks, installed while any
sampler is attached and acting only for the samplers of the calling context (a
`record(memory=True)` block: ckpt_viz/recording.py). Never the UI.

NOTE [ Sampling points ]
  1. Every module's forward exit is a sampling point (`sampler.point()`: a reading
     tied to the last event before it; an entry follows its parent's entry or its
     sibling's exit with nothing allocated between, so it is not one). Between two
     points, the allocation probe also keeps the high-water mark (probe/allocations.py
     NOTE rule 7), so the peak of a step is the allocator's even where no point falls.
  2. The passes. A module called at depth 0 outside a backward opens the forward: its
     parameters and buffers count as "parameters" from then on (`sampler.module`),
     its tensor arguments as "inputs" (positional ones at entry, keyword ones at exit:
     torch's global pre-hook sees no keywords; the recording's own model also gets a
     hook that sees them at entry), what it returns as "outputs", and what is
     allocated inside as "activations" unless held for more (NOTE [ Memory categories ]
     rule 3 in probe/memory.py). An optimizer's `step()` is the optimizer pass: its
     state counts as "optimizer_state" (known at entry, so state from before the block
     counts from the start; new state at exit). The backward pass is opened by the
     recording's autograd watch (`backward_started` / `backward_ended`). A module run
     inside a backward (a checkpoint's recompute) is a point and nothing more.
  3. Events: where a pass opens the hooks emit a `memory_sampled` event (its `at`:
     "<name> forward" at a depth-0 module's entry, where <name> is the module's
     qualified name in the recorded model or else its class; "<Optimizer>.step" as a
     step begins); a top-level `torch.autograd.backward` / `grad` call has its own
     `backward_called` event from the recording's autograd watch. So a loop with no
     checkpoint still has an event to tie each pass's samples to. Where a pass closes
     there is a sampling point and no event: what follows is tied to the pass's last
     event until the next one.
  4. Hooks stay installed while any sampler is attached anywhere in the process (a
     count); a hook does nothing on a thread whose context has no sampler, so other
     threads' modules pay one context-variable read per call.
"""
from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ckpt_viz import bus
from ckpt_viz.events import EventBase, MemorySampled
from ckpt_viz.runtime import memtags

__all__ = ["Sampler", "Sampling", "Steps", "attach", "backward_ended", "backward_started", "model_inputs",
           "optimizer_state", "tensors_in"]


class Sampler(Protocol):
    """What a `record(memory=True)` block gives the hooks (ckpt_viz/recording.py)."""

    def point(self) -> None: ...  # a reading now, tied to the last event

    def phase(self, name: str | None) -> None: ...  # "forward", "backward", "optimizer" or None from now on

    def module(self, module: Any) -> None: ...  # count a module's parameters and buffers, or a parameter

    def name_of(self, module: torch.nn.Module) -> str | None: ...  # its qualified name in the recorded model


_SAMPLERS: contextvars.ContextVar[tuple[Sampler, ...]] = contextvars.ContextVar("ckpt_viz_samplers", default=())
_LOCK = threading.Lock()
_attached = 0
_handles: list[Any] = []
_THREAD = threading.local()  # .depth: module calls open on this thread; .phase: the pass open here


def attach(sampler: Sampler) -> Callable[[], None]:
    """Give `sampler` the points of this context (NOTE rule 4); return its detach function."""
    global _attached
    with _LOCK:
        if _attached == 0:
            _install()
        _attached += 1
    token_value = (*_SAMPLERS.get(), sampler)
    _SAMPLERS.set(token_value)
    done = []

    def detach() -> None:
        global _attached
        if done:
            return
        done.append(True)
        mine = _SAMPLERS.get()
        if sampler in mine:
            _SAMPLERS.set(tuple(s for s in mine if s is not sampler))
        if not _SAMPLERS.get():  # a block closed inside a module's forward leaves no depth behind on this thread
            _THREAD.depth, _THREAD.phase = 0, None
        with _LOCK:
            _attached -= 1
            if _attached == 0:
                _uninstall()

    return detach


def _install() -> None:
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer

    _handles.extend((nn_module.register_module_forward_pre_hook(_entered),
                     nn_module.register_module_forward_hook(_exited, with_kwargs=True, always_call=True),
                     optimizer.register_optimizer_step_pre_hook(_step_started),
                     optimizer.register_optimizer_step_post_hook(_step_ended)))


def _uninstall() -> None:
    for handle in _handles:
        handle.remove()
    _handles.clear()


def _here() -> tuple[Sampler, ...]:
    return bus.context_value(_SAMPLERS, ())


def _in_backward() -> bool:
    return getattr(_THREAD, "phase", None) == "backward" or torch._C._current_graph_task_id() != -1


def _set_phase(samplers: tuple[Sampler, ...], name: str | None) -> None:
    _THREAD.phase = name
    for sampler in samplers:
        sampler.phase(name)


def _label(samplers: tuple[Sampler, ...], module: torch.nn.Module) -> str:
    for sampler in samplers:
        name = sampler.name_of(module)
        if name:
            return name
    return type(module).__name__


def _emit(at: str) -> None:
    bus.emit(MemorySampled, capture_site=False, at=at)


def _hold(value: Any, category: str) -> None:
    for tensor in tensors_in(value):
        memtags.hold(None, tensor, category)


# ---------------------------------------------------------------- modules

def _entered(module: torch.nn.Module, args: tuple) -> None:
    samplers = _here()
    if not samplers:
        return
    depth = getattr(_THREAD, "depth", 0)
    _THREAD.depth = depth + 1
    if depth == 0 and not _in_backward():
        for sampler in samplers:
            sampler.module(module)
        _hold(args, "inputs")
        _set_phase(samplers, "forward")
        _emit(f"{_label(samplers, module)} forward")


def _exited(module: torch.nn.Module, args: tuple, *rest: Any) -> None:
    samplers = _here()
    if not samplers:
        return
    depth = max(getattr(_THREAD, "depth", 1) - 1, 0)
    _THREAD.depth = depth
    if depth == 0 and getattr(_THREAD, "phase", None) == "forward":
        kwargs, result = (rest[0], rest[1]) if len(rest) == 2 else ({}, rest[0] if rest else None)
        _hold((args, kwargs), "inputs")
        _hold(result, "outputs")
        _set_phase(samplers, None)
    for sampler in samplers:
        sampler.point()


def model_inputs(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """A forward pre-hook (with kwargs) for the recorded model: its keyword inputs count from its entry."""
    if _here() and getattr(_THREAD, "depth", 0) <= 1 and not _in_backward():
        _hold(kwargs, "inputs")


# ---------------------------------------------------------------- the optimizer and the backward

def optimizer_state(optimizer: torch.optim.Optimizer, samplers: tuple[Sampler, ...] | None = None) -> None:
    """Count `optimizer`'s parameters as "parameters" and its state's tensors as "optimizer_state"."""
    for sampler in _here() if samplers is None else samplers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                sampler.module(p)
    for state in list(optimizer.state.values()):
        if isinstance(state, dict):
            _hold(list(state.values()), "optimizer_state")


def _step_started(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    samplers = _here()
    if not samplers:
        return
    optimizer_state(optimizer, samplers)
    _set_phase(samplers, "optimizer")
    _emit(f"{type(optimizer).__name__}.step")


def _step_ended(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    samplers = _here()
    if not samplers:
        return
    optimizer_state(optimizer, samplers)
    _set_phase(samplers, None)
    for sampler in samplers:
        sampler.point()


def backward_started() -> None:
    """A top-level `torch.autograd.backward` / `grad` call begins (the recording's autograd watch)."""
    samplers = _here()
    if samplers:  # its event is the recording's backward_called, emitted just before
        _set_phase(samplers, "backward")


def backward_ended() -> None:
    samplers = _here()
    if samplers:
        _set_phase(samplers, None)
        for sampler in samplers:
            sampler.point()


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts (HF's ModelOutput is a dict)."""
    found: list[torch.Tensor] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found


class Sampling:
    """The memory side of one `record(memory=True)` block: its probe's readings at events and points.

    Args:
        probe: the block's open probe (`open_probe` in probe/allocations.py).
        keep: where a reading goes, keep(seq, t_ns, totals, device, by_stage) (the recording's `_keep_sample`).
        names: id(module) -> its qualified name in the recorded model.
    """

    def __init__(self, probe: Any, keep: Callable[..., None], names: dict[int, str]) -> None:
        self.probe = probe
        self._keep = Steps(keep)
        self._names = names
        self.last_seq: int | None = None
        if probe.deferred:  # its readings come as the stream is replayed (probe/allocations.py NOTE rule 1)
            probe.keep = self._keep

    def on_event(self, event: EventBase) -> None:
        """Read memory right after `event` (the recording's channel calls it in seq order)."""
        self.last_seq = event.seq
        self._read(event.seq, event.t_ns)

    def point(self) -> None:
        if self.last_seq is not None:  # no event yet: nothing to tie a reading to
            self._read(self.last_seq, time.monotonic_ns())

    def _read(self, seq: int, t_ns: int) -> None:
        probe = self.probe
        if probe.deferred:  # an AllocationProbe: read when it closes (probe/allocations.py NOTE rule 1)
            probe.mark(seq, t_ns)
            return
        totals, by_stage, device = probe.sample()
        self._keep(seq, t_ns, totals, device, by_stage)

    def phase(self, name: str | None) -> None:
        self.probe.set_phase(name)

    def module(self, module: Any) -> None:
        if isinstance(module, torch.nn.Module):
            self.probe.add_module(module)
        else:
            self.probe.add_param(module)

    def name_of(self, module: torch.nn.Module) -> str | None:
        return self._names.get(id(module))

    def finish(self) -> None:
        """Hand the deferred readings over (after the probe closed)."""
        if self.probe.deferred:
            self.probe.finish(self._keep)
            self.probe.keep = None


class Steps:
    """Memory as a step function: hands on a reading only where it changes, so the memory at an event is its
    sample's, or the last one's before it.

    The first sample of a seq is the reading right after that event: several samples share a seq (the event's,
    then points and high-water marks after it, in time order), so an event's reading equal to the last one kept
    is held back and kept only if a later sample of the same seq differs.
    """

    def __init__(self, keep: Callable[..., None]) -> None:
        self._keep = keep
        self._last: Any = None
        self._seq: int | None = None
        self._held: tuple | None = None

    def __call__(self, seq: int, t_ns: int, totals: dict, device: int | None, by_stage: dict) -> None:
        reading = (totals, device, by_stage)
        if seq != self._seq:  # the event's own reading
            self._seq, self._held = seq, None
            if reading == self._last:
                self._held = (seq, t_ns, totals, device, by_stage)
                return
        elif reading == self._last:
            return
        elif self._held is not None:
            self._keep(*self._held)
            self._held = None
        self._last = reading
        self._keep(seq, t_ns, totals, device, by_stage)
