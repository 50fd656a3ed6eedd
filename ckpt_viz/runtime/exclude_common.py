"""What both kinds of excluded region share: the output cache, RNG snapshots, placeholders.

Owns `ExcludeCache` and small helpers used by `exclude_nonreentrant` and
`exclude_reentrant`. Imports torch; never the UI. See NOTE [ Excluded regions ] in
`runtime/exclude.py`.
"""
from __future__ import annotations

import collections
import itertools
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ckpt_viz import bus
from ckpt_viz.events import ExcludeReused, ExcludeSaved

__all__ = ["ExcludeCache"]

INPUT_ATTR = "_ckpt_viz_exclude_input"
SOURCE_ATTR = "_ckpt_viz_exclude_source"
CACHE_KEY = "ckpt_viz.exclude_cache"
WRAPPER_IDS = itertools.count()
TRIGGER: list[torch.Tensor] = []


def trigger() -> torch.Tensor:
    if not TRIGGER:
        TRIGGER.append(torch.empty(0, requires_grad=True))
    return TRIGGER[0]


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(tensors)[0] if isinstance(t, torch.Tensor))


def rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    cuda = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
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


def tensor_leaves(args: tuple, kwargs: dict) -> tuple[list, Any]:
    leaves, spec = tree_flatten((args, kwargs))
    return leaves, spec


def placeholders(count: int) -> Any:
    if count == 0:
        return ()
    if count == 1:
        return torch.empty(0)
    return tuple(torch.empty(0) for _ in range(count))


def emit(wrapper: Any, cls: type[ExcludeSaved | ExcludeReused], handle_id: int | None, **fields: Any) -> None:
    """An `exclude_saved` / `exclude_reused` event about `wrapper`."""
    bus.emit(cls, handle_id=handle_id, mode="exclude", capture_site=False, wrapper=wrapper._name,
             wrapper_id=wrapper.exclude_id, **fields)
