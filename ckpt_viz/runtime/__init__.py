"""ckpt_viz's own eager checkpoint runtime (spec D1). It emits events; it never draws."""
from ckpt_viz.errors import CheckpointError
from ckpt_viz.runtime.checkpoint import checkpoint
from ckpt_viz.runtime.exclude import checkpoint_exclude_wrapper
from ckpt_viz.runtime.reentrant import ReentrantCheckpointHandle, reentrant_checkpoint_scope
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
    "ReentrantCheckpointHandle",
    "backward_input",
    "backward_weight",
    "checkpoint",
    "checkpoint_exclude_wrapper",
    "clear_recompute_session",
    "noop_context_fn",
    "recompute_handle",
    "recompute_handle_collector_ctx",
    "recompute_session_ctx",
    "reentrant_checkpoint_scope",
]
