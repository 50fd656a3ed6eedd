"""ckpt_viz's own eager checkpoint runtime (spec D1). It emits events; it never draws."""
from ckpt_viz.errors import CheckpointError
from ckpt_viz.runtime.checkpoint import checkpoint
from ckpt_viz.runtime.compat import GraphExecGroup, set_checkpoint_debug_enabled, set_checkpoint_early_stop
from ckpt_viz.runtime.exclude import checkpoint_exclude_wrapper
from ckpt_viz.runtime.reentrant import ReentrantCheckpointHandle, reentrant_checkpoint_scope
from ckpt_viz.runtime.sequential import checkpoint_sequential
from ckpt_viz.runtime.session import (
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
)
from ckpt_viz.runtime.split import backward_input, backward_weight
from ckpt_viz.runtime.state import noop_context_fn

__all__ = [
    "CheckpointError",
    "GraphExecGroup",
    "ReentrantCheckpointHandle",
    "backward_input",
    "backward_weight",
    "checkpoint",
    "checkpoint_exclude_wrapper",
    "checkpoint_sequential",
    "clear_recompute_session",
    "noop_context_fn",
    "recompute_handle",
    "recompute_handle_collector_ctx",
    "recompute_session_ctx",
    "reentrant_checkpoint_scope",
    "set_checkpoint_debug_enabled",
    "set_checkpoint_early_stop",
]
