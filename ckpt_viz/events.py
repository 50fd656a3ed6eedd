"""The trace vocabulary: one `Event` record per runtime transition.

Owns the event record and the fixed names of spec section 7 (event kinds, release
reasons, modes, phases). Standard library only: the app and the renderers read
events without importing torch.

Every event is a plain fact in the past tense. Its fields are ints, strs, None,
tuples and small dicts of the same, so `Event.to_dict()` is JSON-ready.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

__all__ = [
    "DIAGNOSIS_CODES",
    "EVENT_KINDS",
    "Event",
    "MODES",
    "Mode",
    "PHASES",
    "Phase",
    "RELEASE_REASONS",
]

Mode = Literal["reentrant", "nonreentrant", "exclude"]
Phase = Literal["ordinary", "dx", "dw"]

MODES: tuple[str, ...] = ("reentrant", "nonreentrant", "exclude")
PHASES: tuple[str, ...] = ("ordinary", "dx", "dw")

EVENT_KINDS: tuple[str, ...] = (
    "handle_created",
    "forward_started",
    "forward_finished",
    "forward_failed",
    "tensor_packed",
    "tensor_unpacked",
    "phase_set",
    "backward_entered",
    "replay_started",
    "replay_finished",
    "replay_failed",
    "early_stopped",
    "replay_refused",
    "grads_routed",
    "released",
    "node_collected",
    "session_bound",
    "session_activated",
    "session_deactivated",
    "session_cleared",
    "prefired",
    "exclude_saved",
    "exclude_reused",
    "memory_sampled",
    "error",
)

RELEASE_REASONS: tuple[str, ...] = (
    "ordinary_backward_complete",
    "dw_complete",
    "backward_exception",
    "forward_exception",
    "session_cleared",
    "explicit_release",
)

# Diagnosis code -> cause (spec section 4.2, R1..R15).
DIAGNOSIS_CODES: dict[str, str] = {
    "released_by_dw": "R1: DW already ran (DX after DW, or a second DW)",
    "released_by_ordinary_backward": "R2: an earlier ordinary backward consumed the handle",
    "session_never_bound": "R3: a retaining session was open but the handle was never registered in it",
    "session_not_retaining": "R4: the session was left, or made non-retaining, before the later consumer",
    "phase_not_set": "R5: a split handle was reached with phase 'ordinary'",
    "released_after_backward_error": "R6: an exception in backward released the handle",
    "released_after_forward_error": "R7: the checkpointed forward failed and released the handle",
    "session_cleared_early": "R8: the session was cleared before its last consumer ran",
    "released_explicitly": "R9: release() was called (cancellation)",
    "outputs_dropped_before_replay": "R10: every output was dropped before the first replay",
    "outer_saved_tensors_freed": "R11: the outer saved inputs were freed before the first replay",
    "trigger_missing_in_dw": "R12: DW skipped the handle; it was never released",
    "dx_without_retain_graph": "R13: DX ran without retain_graph=True; DW failed and handles leaked",
    "session_mismatch": "R14: the handle is bound to another session id",
    "prefire_after_release": "R15: prefire after an ordinary or DW backward released the handle",
}


@dataclass(frozen=True, slots=True)
class Event:
    """One runtime transition.

    Attributes:
        seq: position in emission order (assigned by the bus).
        t_ns: monotonic nanoseconds.
        kind: one of `EVENT_KINDS`.
        handle_id: the handle or frame it concerns (`h3` in the UI), or None.
        mode: "reentrant", "nonreentrant", "exclude" or None.
        phase: "ordinary", "dx", "dw" or None.
        session_id: the recompute session (as given, or its repr), or None.
        tags: user tags open at the time, such as stage and microbatch.
        site: the user's `file:line`, or None.
        thread_id: the emitting thread.
        data: the kind-specific rest.
    """

    seq: int
    t_ns: int
    kind: str
    handle_id: int | None = None
    mode: str | None = None
    phase: str | None = None
    session_id: Any = None
    tags: Mapping[str, Any] = field(default_factory=dict)
    site: str | None = None
    thread_id: int = 0
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (tags and data copied)."""
        return {
            "seq": self.seq,
            "t_ns": self.t_ns,
            "kind": self.kind,
            "handle_id": self.handle_id,
            "mode": self.mode,
            "phase": self.phase,
            "session_id": self.session_id,
            "tags": dict(self.tags),
            "site": self.site,
            "thread_id": self.thread_id,
            "data": dict(self.data),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Event":
        """Rebuild an event from `to_dict()` output."""
        return cls(
            seq=int(raw["seq"]),
            t_ns=int(raw["t_ns"]),
            kind=str(raw["kind"]),
            handle_id=raw.get("handle_id"),
            mode=raw.get("mode"),
            phase=raw.get("phase"),
            session_id=raw.get("session_id"),
            tags=dict(raw.get("tags") or {}),
            site=raw.get("site"),
            thread_id=int(raw.get("thread_id") or 0),
            data=dict(raw.get("data") or {}),
        )
