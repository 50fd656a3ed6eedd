"""`checkpoint()`: one entry point for both checkpoint kinds (spec D1).

Owns argument validation and the dispatch to the reentrant checkpoint
(`runtime/reentrant.py`) or the saved-tensor-hook checkpoint
(`runtime/nonreentrant.py`), and the fallback to PyTorch's own checkpoint while
compiling. Imports torch; never the UI.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ckpt_viz import bus
from ckpt_viz.errors import CheckpointUsageError
from ckpt_viz.runtime.reentrant import reentrant_checkpoint
from ckpt_viz.runtime.state import noop_context_fn

__all__ = ["checkpoint"]

_API = "ckpt_viz.checkpoint"
_DETERMINISM = ("default", "none")


def _bad(message: str) -> CheckpointUsageError:
    exc = CheckpointUsageError(f"{_API}: {message}")
    if bus.enabled:
        bus.emit_error(exc, "checkpoint")
    return exc


def checkpoint(function: Callable, *args: Any, use_reentrant: bool = False, preserve_rng_state: bool = True,
               context_fn: Callable = noop_context_fn, determinism_check: str = "default",
               early_stop: bool = True, debug: bool = False, **kwargs: Any) -> Any:
    """Run `function(*args, **kwargs)` without keeping its activations; replay it in backward.

    Args:
        function: the region to checkpoint.
        use_reentrant: True for the reentrant checkpoint (split DX/DW inside
            `reentrant_checkpoint_scope`), False for the saved-tensor-hook one.
        preserve_rng_state: replay with the forward's RNG state (dropout matches).
        context_fn: factory of a (forward_context, recompute_context) pair.
        determinism_check: "default" (compare shape, dtype, device) or "none";
            non-reentrant only.
        early_stop: stop a non-reentrant recompute after its last saved tensor.
        debug: not supported in eager mode.

    Returns:
        What `function` returns, with tensors tracked by autograd.
    """
    if not isinstance(use_reentrant, bool):
        raise _bad(f"use_reentrant must be bool, got {type(use_reentrant).__name__} {use_reentrant!r}.\n"
                   "Tip: pass True (reentrant) or False (saved-tensor hooks).")
    if not isinstance(early_stop, bool):
        raise _bad(f"early_stop must be bool, but got {type(early_stop).__name__}.\nTip: pass True or False.")
    if not isinstance(preserve_rng_state, bool):
        raise _bad(f"preserve_rng_state must be bool, but got {type(preserve_rng_state).__name__}.\n"
                   "Tip: pass True or False.")
    if not callable(context_fn):
        raise _bad(f"context_fn must be callable. Got {context_fn!r}.\n"
                   "Tip: pass a factory returning (forward_context, recompute_context), e.g. noop_context_fn.")
    if determinism_check not in _DETERMINISM:
        raise _bad(f"determinism_check must be one of {list(_DETERMINISM)}, but got {determinism_check!r}.\n"
                   "Tip: use 'none' to skip the metadata comparison.")
    if torch.compiler.is_compiling():
        if use_reentrant or context_fn is not noop_context_fn:
            unsupported = [name for name, bad in (("use_reentrant=True", use_reentrant),
                                                 ("context_fn", context_fn is not noop_context_fn)) if bad]
            raise _bad(f"compile mode does not support: {', '.join(unsupported)}.\n"
                       "Tip: use the non-reentrant checkpoint without context_fn under torch.compile.")
        from torch.utils.checkpoint import checkpoint as torch_checkpoint, set_checkpoint_early_stop
        with set_checkpoint_early_stop(early_stop):
            return torch_checkpoint(function, *args, use_reentrant=False, preserve_rng_state=preserve_rng_state,
                                    determinism_check=determinism_check, **kwargs)
    if debug:
        raise _bad("debug=True is not supported in eager mode.\nTip: record a trace with ckpt_viz.record() instead.")
    if use_reentrant:
        return reentrant_checkpoint(function, *args, preserve_rng_state=preserve_rng_state,
                                    context_fn=context_fn, **kwargs)
    from ckpt_viz.runtime.nonreentrant import nonreentrant_checkpoint
    return nonreentrant_checkpoint(function, *args, preserve_rng_state=preserve_rng_state, context_fn=context_fn,
                                   determinism_check=determinism_check, early_stop=early_stop, **kwargs)
