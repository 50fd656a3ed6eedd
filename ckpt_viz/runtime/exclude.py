"""Excluded regions: keep an expensive op's output instead of recomputing it (spec 1.4, 1.6, D4).

Owns `checkpoint_exclude_wrapper`, the per-invocation output cache, the
non-reentrant deferred-input handles and boundary, and the reentrant local SAVE
graphs ("tapes") with their replay bridge. Emits `exclude_saved` /
`exclude_reused`; never imports the UI.

NOTE [ Excluded regions ]
  1. A region runs exactly once per forward and never in a replay. Outside any
     checkpoint the wrapper is transparent.
  2. Non-reentrant forward: the region's inputs get deferred-input handles; its own
     saved tensors are kept (inner hooks override the checkpoint's holders), except
     inputs, which stay deferred and are materialized from the replay. If an input
     was deferred, each output passes a boundary that saves a trigger under the
     checkpoint's hooks, so backward forces the replay before the region needs its
     inputs. The output is cached (FIFO per wrapper) for the replay, detached from its
     graph (which reaches the frame's hooks: a cycle the collector cannot see).
  3. Reentrant forward: the region runs with grad enabled on detached inputs and
     records a local graph (the tape). The replay returns the cached output through
     a bridge whose backward runs the tape: in DX it returns input gradients and
     keeps the tape; in DW or an ordinary backward it also accumulates parameter
     gradients and frees the tape unless the handle retains.
  4. The RNG state after the region is recorded in the forward and restored in the
     replay (when the checkpoint preserves RNG state), so later random ops match.
  5. `save_output=False` is for a region whose output feeds straight into another
     excluded region: the output is not cached, the replay returns zero-element
     placeholders, and the downstream region's local graph carries the gradient.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ckpt_viz.errors import CheckpointUsageError
from ckpt_viz.runtime import exclude_nonreentrant as _nonreentrant
from ckpt_viz.runtime import exclude_reentrant as _reentrant
from ckpt_viz.runtime.exclude_common import WRAPPER_IDS, ExcludeCache
from ckpt_viz.runtime.recompute_state import get_recompute_state
from ckpt_viz.runtime.reentrant import current_frame

__all__ = ["CheckpointExcludeWrapper", "ExcludeCache", "checkpoint_exclude_wrapper"]


class CheckpointExcludeWrapper(torch.nn.Module):
    """Runs `module_or_fn` once per forward and reuses its output in checkpoint replays."""

    def __init__(self, module_or_fn: Callable, save_output: bool = True) -> None:
        super().__init__()
        if not callable(module_or_fn):
            raise CheckpointUsageError(
                "ckpt_viz.checkpoint_exclude_wrapper: module must be a PyTorch Module or callable, got "
                f"{type(module_or_fn).__name__}.\nTip: pass the module (or a function) to exclude from recompute.")
        if not isinstance(save_output, bool):
            raise CheckpointUsageError(
                f"ckpt_viz.checkpoint_exclude_wrapper: save_output must be a bool, got {type(save_output).__name__}.\n"
                "Tip: pass True (cache the output) or False (only when it feeds another excluded region).")
        if isinstance(module_or_fn, torch.nn.Module):
            self.module = module_or_fn
            self._fn = None
        else:
            self.module = None
            self._fn = module_or_fn
        self.save_output = save_output
        self.exclude_id = next(WRAPPER_IDS)
        self._calls = 0
        self._name = type(module_or_fn).__name__ if self.module is not None else \
            getattr(module_or_fn, "__qualname__", type(module_or_fn).__name__)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs) if self.module is not None else self._fn(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is not None:
            if frame.replaying:
                return _reentrant.replay_region(self, frame, args, kwargs)
            return _reentrant.record_region(self, frame, args, kwargs)
        state = get_recompute_state()
        if state is None:
            return self._run(*args, **kwargs)
        if state.is_recomputing:
            return _nonreentrant.replay_region(self, state, args, kwargs)
        return _nonreentrant.record_region(self, state, args, kwargs)

    def extra_repr(self) -> str:
        return f"save_output={self.save_output}"


def checkpoint_exclude_wrapper(module_or_fn: Callable, *, save_output: bool = True) -> CheckpointExcludeWrapper:
    """Exclude a region from recompute: it runs once per forward and its output is reused in replays.

    Args:
        module_or_fn: the module or function to exclude.
        save_output: cache the output (default). False only when the output feeds
            straight into another excluded region (see NOTE [ Excluded regions ], rule 5).

    Returns:
        A module that behaves like `module_or_fn` (transparent outside checkpoints).
    """
    return CheckpointExcludeWrapper(module_or_fn, save_output=save_output)
