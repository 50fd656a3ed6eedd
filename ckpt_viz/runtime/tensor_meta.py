"""What an event says about a tensor (`meta`): shape, dtype, device, requires_grad and bytes, as plain data.

Imports torch; never the UI.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["meta"]

_NAMES: dict[Any, str] = {}  # dtype or device -> its name: str() of either costs a microsecond per event


def _name(value: Any, prefix: str = "") -> str:
    name = _NAMES.get(value)
    if name is None:
        name = _NAMES[value] = str(value).removeprefix(prefix)
    return name


def meta(t: torch.Tensor) -> dict[str, Any]:
    """The tensor as an event's data gives it (`handle_created` inputs, `forward_finished` outputs)."""
    dtype = t.dtype
    return {"shape": list(t.shape), "dtype": _NAMES.get(dtype) or _name(dtype, "torch."),
            # a CPU tensor's device without building its torch.device
            "device": "cpu" if t.is_cpu else (_NAMES.get(device := t.device) or _name(device)),
            "requires_grad": t.requires_grad, "nbytes": t.nbytes}  # numel() * element_size()
