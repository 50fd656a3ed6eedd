"""Execution state captured at a checkpoint's forward and restored for its replay.

Owns: device-type inference, RNG states (CPU and device), autocast settings and the
`context_fn` (forward_context, recompute_context) pair. Imports torch; never the UI.

NOTE [ What a replay must see ]
  1. The CPU RNG state as it was when the forward started (when preserve_rng_state),
     and the device RNG states when the device was already initialized; the replay
     runs inside `fork_rng`, so the caller's RNG stream is untouched (CPU-only state:
     the same save and restore of the CPU RNG state, done by hand).
  2. The autocast settings of the forward, for the device type and for the CPU
     (CPU-only state: `autocast` is entered only when it would change the CPU's
     settings; when they are off and equal already, entering it changes nothing).
  3. The recompute context of the `context_fn` pair; the forward context wraps the
     original forward. A one-shot context (a `@contextmanager` object) can be
     entered once only: a second replay of the same handle fails (spec E17).
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import DefaultDeviceType, get_device_states, set_device_states

from ckpt_viz.errors import CheckpointError, CheckpointUsageError

__all__ = ["ExecutionState", "infer_device_type", "noop_context_fn"]


_NULL = contextlib.nullcontext()  # stateless and reentrant: one shared instance serves every checkpoint
_NO_CONTEXTS = (_NULL, _NULL)


def noop_context_fn() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """The default `context_fn`: no forward context and no recompute context."""
    return _NO_CONTEXTS


def infer_device_type(args: Any) -> str:
    """The non-CPU device type of the tensors in `args` (cuda first), else torch's default."""
    if type(args) is tuple:  # the usual case, positional CPU tensors: no device object built per tensor
        for a in args:
            if not (isinstance(a, torch.Tensor) and a.is_cpu):
                break
        else:
            return DefaultDeviceType.get_device_type()
    found: list[str] = []
    leaves = args if isinstance(args, tuple) and all(isinstance(a, torch.Tensor) for a in args) \
        else tree_flatten(args)[0]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu" and leaf.device.type not in found:
            found.append(leaf.device.type)
    if len(found) > 1:
        warnings.warn(
            "ckpt_viz.checkpoint: tensor arguments span multiple non-CPU device types "
            f"{sorted(found)}; RNG state is preserved for one type only ({'cuda' if 'cuda' in found else found[0]}).",
            UserWarning,
            stacklevel=4,
        )
    if not found:
        return DefaultDeviceType.get_device_type()
    return "cuda" if "cuda" in found else found[0]


def _device_module(device_type: str) -> Any:
    return getattr(torch, device_type, None)


def _autocast_kwargs(device_type: str) -> dict[str, Any] | None:
    if not torch.amp.is_autocast_available(device_type):
        return None
    return {
        "enabled": torch.is_autocast_enabled(device_type),
        "dtype": torch.get_autocast_dtype(device_type),
        "cache_enabled": torch.is_autocast_cache_enabled(),
    }


def _autocast_unchanged(kwargs: dict[str, Any]) -> bool:
    """Whether entering `torch.amp.autocast("cpu", **kwargs)` now would leave CPU autocast off and as it is."""
    return (not kwargs["enabled"] and not torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == kwargs["dtype"]
            and torch.is_autocast_cache_enabled() == kwargs["cache_enabled"])


class ExecutionState:
    """What the forward saw; see NOTE [ What a replay must see ]."""

    __slots__ = (
        "cpu_autocast",
        "cpu_rng_state",
        "device_autocast",
        "device_ids",
        "device_rng_states",
        "device_type",
        "device_was_initialized",
        "forward_context",
        "recompute_context",
    )

    def __init__(self) -> None:
        self.device_type = "cpu"
        self.device_autocast: dict[str, Any] | None = None
        self.cpu_autocast: dict[str, Any] = {}
        self.cpu_rng_state: torch.Tensor | None = None
        self.device_ids: list[int] = []
        self.device_rng_states: list[torch.Tensor] = []
        self.device_was_initialized = False
        self.forward_context: Any = _NULL
        self.recompute_context: Any = _NULL

    @classmethod
    def capture(cls, context_fn: Callable[[], Any], preserve_rng_state: bool, args: Any,
                api: str = "ckpt_viz.checkpoint") -> ExecutionState:
        """Capture the state of the forward that is about to run."""
        state = cls()
        state.device_type = infer_device_type(args)
        contexts = context_fn()
        if not (isinstance(contexts, tuple) and len(contexts) == 2):
            raise CheckpointUsageError(
                f"{api}: context_fn must return a (forward_context, recompute_context) tuple, "
                f"got {type(contexts).__name__} {contexts!r}.\n"
                "Tip: pass a factory such as `lambda: (nullcontext(), nullcontext())`, not a context manager."
            )
        state.forward_context, state.recompute_context = contexts
        state.device_autocast = _autocast_kwargs(state.device_type)
        state.cpu_autocast = (state.device_autocast if state.device_type == "cpu" else _autocast_kwargs("cpu")) or {}
        module = _device_module(state.device_type)
        state.device_was_initialized = bool(getattr(module, "_initialized", False))
        if preserve_rng_state:
            state.cpu_rng_state = torch.get_rng_state()
            if state.device_was_initialized:
                state.device_ids, state.device_rng_states = get_device_states(*tree_flatten(args)[0])
        return state

    def check_device_state_preserved(self, preserve_rng_state: bool, api: str = "ckpt_viz.checkpoint") -> None:
        """Refuse a forward that initialized the device after its RNG state was captured (spec E12)."""
        if not preserve_rng_state or self.device_was_initialized:
            return
        module = _device_module(self.device_type)
        if getattr(module, "_initialized", False):
            raise CheckpointError(
                f"{api}: device state was initialized inside a checkpoint forward ({self.device_type}), so its "
                "RNG state could not be preserved for the replay.\n"
                "Tip: Initialize the device before entering checkpoint (for example by creating one tensor on it)."
            )

    def recompute_fn(self, function: Callable[..., Any], kwargs: dict[str, Any], *args: Any) -> Any:
        """Run `function(*args, **kwargs)` under the forward's RNG, autocast and recompute context."""
        preserve = self.cpu_rng_state is not None
        cpu_autocast = self.cpu_autocast
        if self.device_type == "cpu" and not self.device_ids and cpu_autocast:
            # The CPU-only case by hand, as torch's fork_rng and autocast would do it (about 10 us less per
            # replay): save and restore the CPU RNG state, and enter autocast only when it changes something.
            saved = torch.get_rng_state() if preserve else None
            try:
                if preserve:
                    torch.set_rng_state(self.cpu_rng_state)
                context = self.recompute_context
                if _autocast_unchanged(cpu_autocast):
                    if type(context) is contextlib.nullcontext:
                        return function(*args, **kwargs)
                    with context:
                        return function(*args, **kwargs)
                with torch.amp.autocast("cpu", **cpu_autocast), context:
                    return function(*args, **kwargs)
            finally:
                if saved is not None:
                    torch.set_rng_state(saved)
        devices = self.device_ids if preserve else []
        with torch.random.fork_rng(devices=devices, enabled=preserve, device_type=self.device_type):
            if preserve:
                torch.set_rng_state(self.cpu_rng_state)
                if self.device_ids:
                    set_device_states(self.device_ids, self.device_rng_states, device_type=self.device_type)
            device_autocast = (
                torch.amp.autocast(device_type=self.device_type, **self.device_autocast)
                if self.device_autocast is not None and self.device_type != "cpu"
                else contextlib.nullcontext()
            )
            with device_autocast, torch.amp.autocast("cpu", **self.cpu_autocast), self.recompute_context:
                return function(*args, **kwargs)
