"""Memory-category hints: where the runtime tells a memory probe what a tensor is held for.

Owns a flag, a category context and a tag callback. The runtime calls these only
while a probe is attached (`enabled`), so with no probe each hook point costs one flag
check (spec D8). Imports nothing from torch; never the UI.

Categories (the memory view's vocabulary):
    parameters, gradients, activations, checkpoint_inputs, replay_activations,
    excluded_outputs, other
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

__all__ = ["CATEGORIES", "NULL", "category", "current", "enabled", "hold", "install"]

CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "activations", "checkpoint_inputs",
                               "replay_activations", "excluded_outputs", "other")

enabled: bool = False
NULL = contextlib.nullcontext()  # reusable; for `with (category(x) if enabled else NULL):`
_holder: Callable[[Any, Any, str], None] | None = None
_CATEGORY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ckpt_viz_mem_category", default=None)


def install(holder: Callable[[Any, Any, str], None] | None) -> None:
    """Attach (or, with None, detach) the probe's `hold(owner, tensor, category)` callback."""
    global enabled, _holder
    _holder = holder
    enabled = holder is not None


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
    """Say that `tensor`'s storage is held for `name` for as long as `owner` lives."""
    if _holder is not None:
        _holder(owner, tensor, name)
