"""`checkpoint()`: one entry point for both checkpoint kinds (spec D1).

Owns argument validation, the `use_reentrant` default (torch 2.13's: omitting it
warns and selects the reentrant checkpoint), the forward-time switches of
`runtime/compat.py` (they win over the keywords), the dispatch to the reentrant
checkpoint (`runtime/reentrant.py`) or the saved-tensor-hook checkpoint
(`runtime/nonreentrant.py`), and the fallback to PyTorch's own checkpoint while
compiling. Imports torch; never the UI.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ckpt_viz import bus
from ckpt_viz.errors import CheckpointUsageError
from ckpt_viz.runtime import compat
from ckpt_viz.runtime import debug as _debug
from ckpt_viz.runtime.handle_ids import _LIVE
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



def default_use_reentrant(api: str) -> bool:
    """What omitting `use_reentrant` means, as in torch 2.13: a warning at the caller's line, then True."""
    warnings.warn(
        f"{api}: the use_reentrant parameter should be passed explicitly. As in torch 2.13, omitting it selects "
        "use_reentrant=True (the reentrant checkpoint).\nTip: pass use_reentrant=False (PyTorch's "
        "recommendation) or use_reentrant=True to keep this choice and silence the warning.",
        UserWarning, stacklevel=3)  # this helper, the public API, then the caller
    return True

def checkpoint(function: Callable, *args: Any, use_reentrant: bool | None = None, preserve_rng_state: bool = True,
               context_fn: Callable = noop_context_fn, determinism_check: str = "default",
               early_stop: bool = True, debug: bool = False, **kwargs: Any) -> Any:
    """Run `function(*args, **kwargs)` without keeping its activations; replay it in backward.

    Args:
        function: the region to checkpoint.
        use_reentrant: True for the reentrant checkpoint (split DX/DW inside
            `reentrant_checkpoint_scope`), False for the saved-tensor-hook one.
            Omitted (None): a warning, then True, as in torch 2.13.
        preserve_rng_state: replay with the forward's RNG state (dropout matches).
        context_fn: factory of a (forward_context, recompute_context) pair.
        determinism_check: "default" (compare shape, dtype, device) or "none";
            non-reentrant only.
        early_stop: stop a non-reentrant recompute after its last saved tensor;
            `set_checkpoint_early_stop` wins over it.
        debug: errors raised while this checkpoint replays carry its event story;
            `set_checkpoint_debug_enabled` wins over it.

    Returns:
        What `function` returns, with tensors tracked by autograd.
    """
    if use_reentrant is None:
        use_reentrant = default_use_reentrant(_API)
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
    if not isinstance(debug, bool):
        raise _bad(f"debug must be bool, but got {type(debug).__name__}.\nTip: pass True or False.")
    if determinism_check not in _DETERMINISM:
        raise _bad(f"determinism_check must be one of {list(_DETERMINISM)}, but got {determinism_check!r}.\n"
                   "Tip: use 'none' to skip the metadata comparison.")
    override = compat.early_stop_override()
    early_stop = early_stop if override is None else override
    override = compat.debug_override()
    debug = debug if override is None else override
    if torch.compiler.is_compiling():
        if use_reentrant or context_fn is not noop_context_fn:
            unsupported = [name for name, bad in (("use_reentrant=True", use_reentrant),
                                                 ("context_fn", context_fn is not noop_context_fn)) if bad]
            raise _bad(f"compile mode does not support: {', '.join(unsupported)}.\n"
                       "Tip: use the non-reentrant checkpoint without context_fn under torch.compile.")
        from torch.utils.checkpoint import checkpoint as torch_checkpoint
        from torch.utils.checkpoint import set_checkpoint_early_stop
        with set_checkpoint_early_stop(early_stop):
            return torch_checkpoint(function, *args, use_reentrant=False, preserve_rng_state=preserve_rng_state,
                                    determinism_check=determinism_check, **kwargs)
    if debug and context_fn is not noop_context_fn and not use_reentrant:
        raise _bad("debug=True is incompatible with non-default context_fn (as in torch).\n"
                   "Tip: drop context_fn while debugging, or debug with ckpt_viz.record() instead.")
    if debug:
        with _debug.collecting(_LIVE):
            return _dispatch(function, args, kwargs, use_reentrant, preserve_rng_state, context_fn,
                             determinism_check, early_stop)
    return _dispatch(function, args, kwargs, use_reentrant, preserve_rng_state, context_fn, determinism_check,
                     early_stop)


def _dispatch(function: Callable, args: tuple, kwargs: dict, use_reentrant: bool, preserve_rng_state: bool,
              context_fn: Callable, determinism_check: str, early_stop: bool) -> Any:
    if use_reentrant:
        return reentrant_checkpoint(function, *args, preserve_rng_state=preserve_rng_state,
                                    context_fn=context_fn, **kwargs)
    from ckpt_viz.runtime.nonreentrant import nonreentrant_checkpoint
    return nonreentrant_checkpoint(function, *args, preserve_rng_state=preserve_rng_state, context_fn=context_fn,
                                   determinism_check=determinism_check, early_stop=early_stop, **kwargs)

