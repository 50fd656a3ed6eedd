"""The fixed names of ckpt_viz: event kinds, handle modes, phases, release reasons, handle states,
memory categories and run modes.

Each name is declared once here, as a `Literal` type a type checker reads and as a tuple a page or
a test iterates; the event types (`ckpt_viz.events`), the analysis and every page use these, never a
string of their own. Standard library only.

Two things are called "mode" and they are kept apart:
    HandleMode  what one checkpoint region is: "reentrant", "nonreentrant" or "exclude" (an event's
                `mode` field, spec section 7);
    RunMode     how a built-in run checkpoints its model: "none", "nonreentrant", "reentrant",
                "split-reentrant", "split-nonreentrant" or "pipeline" (the app's and CLI's mode picker).
"""
from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "HANDLE_MODES",
    "KINDS",
    "MEMORY_CATEGORIES",
    "NODE_KINDS",
    "PHASES",
    "RELEASE_REASONS",
    "RUNTIMES",
    "RUN_MODES",
    "STATES",
    "STATE_MEANINGS",
    "HandleMode",
    "Kind",
    "MemoryCategory",
    "NodeKind",
    "Phase",
    "ReleaseReason",
    "RunMode",
    "Runtime",
    "State",
]

Kind = Literal[
    "handle_created",
    "forward_started",
    "forward_finished",
    "forward_failed",
    "tensor_packed",
    "tensor_unpacked",
    "phase_set",
    "backward_called",
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
    "replay_diverged",
    "unasked_grads_accumulated",
    "dw_runner_called",
    "memory_sampled",
    "action_started",
    "action_finished",
    "error",
]
KINDS: tuple[Kind, ...] = get_args(Kind)

HandleMode = Literal["reentrant", "nonreentrant", "exclude"]
HANDLE_MODES: tuple[HandleMode, ...] = get_args(HandleMode)

Phase = Literal["ordinary", "dx", "dw"]
PHASES: tuple[Phase, ...] = get_args(Phase)

# Which checkpoint implementation a handle belongs to: ours, or torch.utils.checkpoint observed as it runs.
Runtime = Literal["ckpt_viz", "torch"]
RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)

ReleaseReason = Literal[
    "ordinary_backward_complete",
    "dw_complete",
    "backward_exception",
    "forward_exception",
    "session_cleared",
    "explicit_release",
]
RELEASE_REASONS: tuple[ReleaseReason, ...] = get_args(ReleaseReason)

RunMode = Literal["none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant", "pipeline"]
RUN_MODES: tuple[RunMode, ...] = get_args(RunMode)

MemoryCategory = Literal[
    "parameters",
    "gradients",
    "optimizer_state",
    "optimizer_step",
    "activations",
    "checkpoint_inputs",
    "replay_activations",
    "excluded_outputs",
    "inputs",
    "outputs",
    "other",
]
MEMORY_CATEGORIES: tuple[MemoryCategory, ...] = get_args(MemoryCategory)

NodeKind = Literal["backward", "leaf", "checkpoint", "trigger", "input"]
NODE_KINDS: tuple[NodeKind, ...] = get_args(NodeKind)

# The states of a handle's lifecycle (NOTE [ Handle states ] in ckpt_viz/analysis/lifecycle.py).
State = Literal["not_created", "recorded", "phase_dx", "phase_dw", "replaying", "replayed", "retained", "released",
                "collected"]
STATES: tuple[State, ...] = get_args(State)

STATE_MEANINGS: dict[State, str] = {
    "not_created": "Not built yet: its checkpoint has not run at this point of the run.",
    "recorded": "The forward ran; only the checkpoint's inputs are kept, and it waits for a backward.",
    "phase_dx": "Recorded and set to phase dx: the next backward computes its input grads (DX).",
    "phase_dw": "Recorded and set to phase dw: the next backward computes its weight grads (DW).",
    "replaying": "Its forward is being re-run now, to rebuild the activations that were dropped.",
    "replayed": "Re-run: the backward that asked for it is using the rebuilt activations.",
    "retained": "Re-run and kept after use, for a later backward (DW, or a retaining session).",
    "released": "Its rebuilt activations are freed and it will not replay again; the reason says why.",
    "collected": "Its autograd node was garbage-collected before any replay (all outputs dropped): it cannot replay.",
}
