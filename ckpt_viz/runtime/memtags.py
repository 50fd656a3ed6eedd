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

__all__ = ["CATEGORIES", "NULL", "category", "current", "enabled", "install", "tag"]

CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "activations", "checkpoint_inputs",
                               "replay_activations", "excluded_outputs", "other")

enabled: bool = False
NULL = contextlib.nullcontext()  # reusable; for `with (category(x) if enabled else NULL):`
_tagger: Callable[[Any, str], None] | None = None
_CATEGORY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ckpt_viz_mem_category", default=None)


def install(tagger: Callable[[Any, str], None] | None) -> None:
    """Attach (or, with None, detach) the probe's tag callback."""
    global enabled, _tagger
    _tagger = tagger
    enabled = tagger is not None


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


def tag(tensor: Any, name: str) -> None:
    """Say that `tensor`'s storage is held for `name`."""
    if _tagger is not None:
        _tagger(tensor, name)
