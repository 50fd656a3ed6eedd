"""Recordings across the autograd engine's threads: the launch-context reader and `carried`.

Owns the torch side of NOTE [ Recording scopes ], rule 5 (in `ckpt_viz/bus.py`).
Imports torch; never the UI.

NOTE [ Engine hand-over ]
  1. On CPU the engine runs backward on the calling thread, so hook points see the
     caller's ContextVars (its recordings, tags, memory holders) directly.
  2. On CUDA the engine runs nodes on a device thread. When a backward starts,
     torch's `_engine_run_backward` stashes `contextvars.copy_context()` of the
     calling thread in its thread-local state under "context", and the graph task
     carries that state to the device thread. `launch_context()` reads it there;
     `bus.context_value` / `bus.current_scope` fall back to it, so events emitted on
     the device thread reach the recordings of the code that called backward.
  3. A node that runs a nested backward on the device thread (the reentrant
     checkpoint's replay backward) would have the nested pass stash the device
     thread's own, empty context, and the stash is removed when the nested pass
     returns. So `_Checkpoint.backward` runs its body through `carried(fn)`: in a copy
     of the launch context (a Context cannot be entered by two threads at once, hence
     the copy), which the nested pass then carries on; an excluded region's bridge,
     which runs a local backward too, runs only inside such a replay.
  4. Where torch carries no launch context (older versions), events emitted on a
     device thread reach no recording; the CPU path is unaffected.
"""
from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import torch

from ckpt_viz import bus

__all__ = ["carried", "launch_context"]

_is_key = getattr(torch._C, "_is_key_in_tls", None)
_get_obj = getattr(torch._C, "_get_obj_in_tls", None)


def launch_context() -> contextvars.Context | None:
    """The context torch carried from the thread that launched the running backward, or None."""
    if _is_key is None or _get_obj is None or not _is_key("context"):
        return None
    context = _get_obj("context")
    return context if isinstance(context, contextvars.Context) else None


def carried(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn(*args)`, in a copy of the launch context when this thread has no recording of its own (rule 3)."""
    if not bus.enabled or bus._SCOPE.get() is not None:
        return fn(*args)
    launched = launch_context()
    if launched is None or launched.get(bus._SCOPE) is None:
        return fn(*args)
    return launched.copy().run(fn, *args)


bus.set_launch_context(launch_context)
