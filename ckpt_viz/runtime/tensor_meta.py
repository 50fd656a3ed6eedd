"""What an event says about a tensor (`meta`): shape, dtype, device, requires_grad and bytes, as plain data.

Imports torch; never the UI.

NOTE [ Shared tensor facts ]
  A plain CPU tensor's facts are a function of (type, shape, dtype, requires_grad, layout), so the `TensorMeta`
  made for them is kept (bounded) and shared by every later event with the same key: it is frozen. Other tensors
  (off the CPU, a subclass) get one of their own each time.
"""
from __future__ import annotations

import operator
from typing import Any

import torch

from ckpt_viz.events import TensorMeta

__all__ = ["meta"]

_NAMES: dict[Any, str] = {}  # dtype or device -> its name: str() of either costs a microsecond per event
_KEY = operator.attrgetter("__class__", "shape", "dtype", "requires_grad", "layout", "is_cpu")
_METAS: dict[tuple, TensorMeta] = {}  # _KEY(t) of a plain CPU tensor -> its meta (NOTE)
_MAX_METAS = 4096


def _name(value: Any, prefix: str = "") -> str:
    name = _NAMES.get(value)
    if name is None:
        name = _NAMES[value] = str(value).removeprefix(prefix)
    return name


def meta(t: torch.Tensor) -> TensorMeta:
    """The tensor as an event's data gives it (`handle_created` inputs, `forward_finished` outputs)."""
    key = _KEY(t)
    found = _METAS.get(key)
    if found is None:
        found = _meta(t)
        if key[5] and key[0] is torch.Tensor:  # a plain CPU tensor (NOTE)
            if len(_METAS) >= _MAX_METAS:
                _METAS.clear()
            _METAS[key] = found
    return found


def _meta(t: torch.Tensor) -> TensorMeta:
    dtype = t.dtype
    return TensorMeta(shape=tuple(t.shape), dtype=_NAMES.get(dtype) or _name(dtype, "torch."),
                      # a CPU tensor's device without building its torch.device
                      device="cpu" if t.is_cpu else (_NAMES.get(device := t.device) or _name(device)),
                      requires_grad=t.requires_grad, nbytes=t.nbytes)  # numel() * element_size()
