"""Memory-category hints: where the runtime tells a memory probe what a tensor is held for.

Owns a flag, a category context and the probes' hold callbacks (per context). The
runtime calls these only while a probe is attached (`enabled`), so with no probe each
hook point costs one flag check (spec D8). Imports nothing from torch; never the UI.

Categories (the memory view's vocabulary; `ckpt_viz.trace.MEMORY_CATEGORIES`, in its order):
    parameters, gradients, optimizer_state, optimizer_step, activations, checkpoint_inputs,
    replay_activations, excluded_outputs, inputs, outputs, other
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

from ckpt_viz import bus

__all__ = ["CATEGORIES", "NULL", "category", "current", "enabled", "hold", "install", "seen"]

CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer_state", "optimizer_step", "activations",
                               "checkpoint_inputs", "replay_activations", "excluded_outputs", "inputs", "outputs",
                               "other")

enabled: bool = False  # a probe is attached somewhere in the process (the one cheap check at hook points)
NULL = contextlib.nullcontext()  # reusable; for `with (category(x) if enabled else NULL):`
_HOLDERS: contextvars.ContextVar[tuple[Callable[[Any, Any, str], None], ...] | None] = contextvars.ContextVar(
    "ckpt_viz_mem_holders", default=None)
_attached: list[Callable[[Any, Any, str], None]] = []
_CATEGORY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ckpt_viz_mem_category", default=None)


def install(holder: Callable[[Any, Any, str], None] | None) -> Callable[[], None]:
    """Attach the probe's `hold(owner, tensor, category)` to this context; return its detach function.

    Holders stack (nested probes each get every hold made in their context) and
    detach in any order; on an autograd worker thread the holders of the code that
    launched the backward apply (`bus.context_value`). `install(None)` detaches
    every holder everywhere (test isolation).
    """
    global enabled
    if holder is None:
        _attached.clear()
        _HOLDERS.set(None)
        enabled = False
        return lambda: None
    _HOLDERS.set((*(_HOLDERS.get() or ()), holder))
    _attached.append(holder)
    enabled = True

    def detach() -> None:
        global enabled
        mine = _HOLDERS.get() or ()
        if holder in mine:
            _HOLDERS.set(tuple(h for h in mine if h is not holder) or None)
        if holder in _attached:
            _attached.remove(holder)
        enabled = bool(_attached)

    return detach


@contextlib.contextmanager
def category(name: str) -> Iterator[None]:
    """Tensors saved for backward inside the block are held for `name`."""
    token = _CATEGORY.set(name)
    try:
        yield
    finally:
        _CATEGORY.reset(token)


def current() -> str | None:
    """The category open here, or None (then a saved tensor is a plain activation)."""
    return _CATEGORY.get()


def hold(owner: Any, tensor: Any, name: str) -> None:
    """Say that `tensor`'s storage is held for `name` for as long as `owner` lives (for this context's probes);
    owner None: for as long as the storage lives."""
    for holder in bus.context_value(_HOLDERS, ()):
        holder(owner, tensor, name)


def seen(tensor: Any) -> None:
    """Say that an op reads `tensor`, which may be older than the probes (a cache): count it from now.

    The dispatch tracker sees such a read itself; the allocation probe (ckpt_viz/probe/allocations.py
    NOTE rule 3) learns of it only here. Call it only `if enabled`.
    """
    for holder in bus.context_value(_HOLDERS, ()):
        holder(None, tensor, "other")
