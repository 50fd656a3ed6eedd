"""Every error ckpt_viz raises on purpose.

    CkptVizError
    ├── CheckpointError (RuntimeError)        the runtime refused or failed a transition
    │   ├── HandleReleasedError                 E6/E7: phase set on, or replay of, a released handle
    │   ├── GraphReleasedError                  E8: the autograd node died before the first replay
    │   └── PhaseNotSetError                    E9: a split handle was reached in phase "ordinary"
    ├── CheckpointUsageError (ValueError)     bad arguments or an unsupported nesting
    └── TraceError (ValueError)               a trace file that is wrong, truncated or too new

Messages follow one shape (spec D7): they start with the API name, say what
happened with the numbers and the handle id, keep PyTorch's key phrase so that a
search still finds it, and end with one next step. Standard library only.
"""
from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CheckpointUsageError",
    "CkptVizError",
    "GraphReleasedError",
    "HandleReleasedError",
    "PhaseNotSetError",
    "TraceError",
    "internal_assert",
]


class CkptVizError(Exception):
    """Base of every error ckpt_viz raises on purpose."""


class CheckpointError(CkptVizError, RuntimeError):
    """The checkpoint runtime refused or failed a transition."""


class CheckpointUsageError(CkptVizError, ValueError):
    """A checkpoint API was called with bad arguments or in an unsupported nesting."""


class TraceError(CkptVizError, ValueError):
    """A trace could not be read or validated."""


_RELEASE_TIPS = {
    "dw_complete": "run DX before DW; DW releases every handle it reaches (diagnosis released_by_dw).",
    "ordinary_backward_complete": (
        "to back-propagate through it twice, prefire it with recompute_handle(handle, sid) and run both "
        "backwards inside recompute_session_ctx(sid, retain_on_unpack=True) "
        "(diagnosis released_by_ordinary_backward)."
    ),
    "session_cleared": (
        "call clear_recompute_session(sid) only after the last consumer (DW) ran, and use one session "
        "id per micro-batch (diagnosis session_cleared_early)."
    ),
    "explicit_release": (
        "release() was called on it (cancellation); build a new micro-batch instead of reusing its handles "
        "(diagnosis released_explicitly)."
    ),
    "backward_exception": (
        "fix the first error raised in that backward; a failing backward releases handles that are not "
        "retained (diagnosis released_after_backward_error)."
    ),
    "forward_exception": (
        "the checkpointed forward raised, so the handle never became usable; fix that error first "
        "(diagnosis released_after_forward_error)."
    ),
}


def _released_by(reason: str | None, seq: int | None, site: str | None) -> str:
    if reason is None:
        return ""
    where = ""
    if seq is not None:
        where = f" at event #{seq}"
    if site:
        where += f" ({site})"
    return f" It was released{where} with reason {reason}."


class HandleReleasedError(CheckpointError):
    """E6/E7: a released reentrant handle was asked to replay or change phase."""

    def __init__(self, api: str, phrase: str, handle_id: int, reason: str | None,
                 seq: int | None = None, site: str | None = None) -> None:
        self.handle_id = handle_id
        self.reason = reason
        tip = _RELEASE_TIPS.get(reason or "", "do not use a handle after it was released.")
        super().__init__(
            f"{api}: {phrase} (handle h{handle_id}).{_released_by(reason, seq, site)}\nTip: {tip}"
        )


class GraphReleasedError(CheckpointError):
    """E8: the checkpoint's autograd node was collected before its first replay."""

    def __init__(self, api: str, handle_id: int, collected_seq: int | None = None) -> None:
        self.handle_id = handle_id
        seen = f" The node was collected at event #{collected_seq}." if collected_seq is not None else ""
        super().__init__(
            f"{api}: Reentrant checkpoint output graph was released before replay (handle h{handle_id}).{seen}\n"
            "Tip: every output of the checkpoint and everything computed from it was dropped; keep the loss "
            "(or the stage output) alive until the handle has replayed (diagnosis outputs_dropped_before_replay)."
        )


class PhaseNotSetError(CheckpointError):
    """E9: the engine reached a split handle whose phase is still "ordinary"."""

    def __init__(self, handle_id: int) -> None:
        self.handle_id = handle_id
        super().__init__(
            f"ckpt_viz.checkpoint (backward): Set dx or dw phase on reentrant handles before split backward "
            f"(handle h{handle_id} is split because it was created in reentrant_checkpoint_scope, and its phase is "
            "'ordinary').\nTip: call handle.set_phase('dx') before the DX pass and set_phase('dw') before the DW "
            "pass, or use ckpt_viz.runtime.backward_input / backward_weight, which do it for you."
        )


def internal_assert(condition: bool, what: str) -> None:
    """Guard an invariant of ckpt_viz itself (never a user mistake)."""
    if not condition:
        raise AssertionError(
            f"This is a bug in ckpt_viz: {what}. Please report it with the render_text output of the trace."
        )
