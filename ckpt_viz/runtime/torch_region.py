"""One region of torch's checkpoint, observed, as a ckpt_viz handle: its id, its events, its end.

Owns `TorchRegion` (what ckpt_viz/runtime/torch_observer.py makes for each call of torch's
checkpoint it observes; see NOTE [ Observing torch's checkpoint ] there) and the data of its
events. Imports torch; never the UI.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ckpt_viz import bus
from ckpt_viz.events import (
    EarlyStopped,
    EventBase,
    ForwardFailed,
    ForwardFinished,
    ForwardStarted,
    HandleCreated,
    NodeCollected,
    Released,
    ReplayFailed,
    ReplayFinished,
    ReplayStarted,
)
from ckpt_viz.runtime.handle_ids import new_handle_id
from ckpt_viz.runtime.labels import found_name, label_of, module_of
from ckpt_viz.runtime.owners import qualname
from ckpt_viz.runtime.tensor_meta import meta

__all__ = ["RegionState", "TorchRegion"]

_WRAPPED = "_checkpoint_wrapped_module"  # where torch's CheckpointWrapper keeps the module it checkpoints


def _tensor_facts(values: Any) -> tuple[Any, ...]:
    return tuple(meta(t) for t in values if isinstance(t, torch.Tensor))


def _via(function: Any) -> str:
    """Which front door led to torch's checkpoint: "checkpoint", "checkpoint_sequential", "transformers" or
    "checkpoint_wrapper" (read off the function; NOTE [ Region labels ] in labels.py)."""
    qualname = getattr(function, "__qualname__", "") or ""
    if qualname.startswith("checkpoint_sequential."):
        return "checkpoint_sequential"
    if qualname.startswith("CheckpointWrapper."):
        return "checkpoint_wrapper"
    module = module_of(function)
    if module is not None:
        if type(module).__module__.startswith("transformers."):
            return "transformers"
        if type(module).__name__ == "CheckpointWrapper" or (found_name(module) or "").endswith(_WRAPPED):
            return "checkpoint_wrapper"
    return "checkpoint"


class RegionState:
    """What a region's events need, apart from the region itself: the finalizer holds this, never the region."""

    __slots__ = ("backward_site", "forward_done", "handle_id", "home", "mode", "phase", "released", "replays",
                 "site")

    def __init__(self, handle_id: int, mode: str, home: Any) -> None:
        self.handle_id, self.mode, self.home = handle_id, mode, home
        self.phase = "ordinary" if mode == "reentrant" else None
        self.forward_done = self.released = False
        self.replays = 0
        self.site: str | None = None  # the forward's line (handle_created's site)
        self.backward_site: str | None = None  # the line of the backward that last reached the region

    def emit(self, cls: type[EventBase], *, site: str | None = None, capture_site: bool = False,
             **fields: Any) -> Any:
        if not bus.enabled:
            return None
        home = self.home if self.home is not None and self.home.is_open() else None
        return bus.emit(cls, handle_id=self.handle_id, mode=self.mode, phase=self.phase, site=site,
                        capture_site=capture_site, scope=home, **fields)


def _collected(state: RegionState) -> None:
    """The region's node (reentrant) or saved tensors (non-reentrant) are gone: NOTE rule 3."""
    if state.released or not state.forward_done:
        return
    state.released = True
    if state.replays:
        state.emit(Released, reason="ordinary_backward_complete", was_replayed=True, site=state.backward_site)
    else:
        state.emit(NodeCollected, was_replayed=False, released=False, site=state.site)


class TorchRegion:
    """One torch checkpoint call being observed; its `handle_id` is the handle's (NOTE [ Handle numbering ])."""

    __slots__ = ("__weakref__", "function", "handle_id", "state")

    def __init__(self, function: Callable, mode: str, scope: Any) -> None:
        self.handle_id = new_handle_id(self, scope)
        self.function = function
        self.state = RegionState(self.handle_id, mode, scope)
        finalizer = weakref.finalize(self, _collected, self.state)
        finalizer.atexit = False

    def created(self, args: tuple, **facts: Any) -> None:
        state = self.state
        inputs = _tensor_facts(args)
        event = state.emit(HandleCreated, runtime="torch", via=_via(self.function), function=qualname(self.function),
                           label=label_of(self.function), input_count=len(inputs), inputs=inputs,
                           capture_site=True, **facts)
        state.site = event.site if event is not None else None
        state.emit(ForwardStarted, site=state.site)

    def forward_ended(self, exc: BaseException | None, outputs: Any = None) -> None:
        state = self.state
        if exc is None:
            state.forward_done = True
            flat = () if outputs is None else outputs if isinstance(outputs, (tuple, list)) else (outputs,)
            state.emit(ForwardFinished, outputs=_tensor_facts(flat), site=state.site)
            return
        state.released = True
        state.emit(ForwardFailed, type=type(exc).__name__, message=str(exc)[:65536], site=state.site)
        state.emit(Released, reason="forward_exception", was_replayed=False, site=state.site)

    def replay_started(self) -> str | None:
        state = self.state
        state.replays += 1
        event = state.emit(ReplayStarted, trigger="backward", replay_index=state.replays,
                           site=state.backward_site if state.mode == "reentrant" else None,
                           capture_site=state.mode != "reentrant")
        site = event.site if event is not None else None
        state.backward_site = site
        return site

    def replay_ended(self, exc: BaseException | None, site: str | None, *, early_stopped: bool = False) -> None:
        state = self.state
        if exc is not None and not early_stopped:
            state.emit(ReplayFailed, type=type(exc).__name__, message=str(exc)[:65536], site=site)
            return
        if early_stopped:
            state.emit(EarlyStopped, saved_count=0, site=site)
        state.emit(ReplayFinished, trigger="backward", early_stopped=early_stopped, site=site)
