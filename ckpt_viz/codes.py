"""The debugger's table: one `DiagnosisCode` per cause of a refused replay, a leak or a silent problem.

`DIAGNOSIS_CODES` is the only table keyed by diagnosis code: its cause, its fix, the tip of the error
that carries it, and the release reasons it follows from. The errors (`ckpt_viz.errors`), the
analysis (`ckpt_viz.analysis.findings`) and the docs' codes table (generated from it) all read it.
Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CODE_FOR_REASON", "DIAGNOSIS_CODES", "DiagnosisCode"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DiagnosisCode:
    """One cause of a refused replay or a leak: the only table keyed by diagnosis code.

    Attributes:
        code: the name `ckpt_viz.diagnose` reports and errors carry as `.code`.
        spec_id: the cause's id in spec section 4.2 ("R1"...), or "S1"... for a silent problem of the debugger;
            for docs and tests only; never shown to users.
        cause: what happened, in plain words.
        fix: the next step `Diagnosis.fix` gives.
        tip: the "Tip: ..." of the ckpt_viz error that carries this code, or None where no error of
            ckpt_viz carries it (the cause is found only by reading the trace).
        reasons: the release reasons (`released` event, `data.reason`) the cause follows from; empty
            when it is not a release (a collected node, a leak, a refused binding).
        plain: this code is what a release with its reason means when the trace says nothing more
            (`CODE_FOR_REASON`); the other codes of that reason need more evidence.
    """

    code: str
    spec_id: str
    cause: str
    fix: str
    tip: str | None = None
    reasons: tuple[str, ...] = ()
    plain: bool = False


_ORDINARY = ("ordinary_backward_complete",)

DIAGNOSIS_CODES: dict[str, DiagnosisCode] = {d.code: d for d in (
    DiagnosisCode(
        code="released_by_dw", spec_id="R1", reasons=("dw_complete",), plain=True,
        cause="DW already ran for this handle (DX after DW, or a second DW); DW releases every handle it reaches.",
        fix="Run DX (backward_input) before DW (backward_weight), and run DW once per micro-batch.",
        tip="run DX before DW; DW releases every handle it reaches."),
    DiagnosisCode(
        code="released_by_ordinary_backward", spec_id="R2", reasons=_ORDINARY, plain=True,
        cause="An earlier ordinary backward consumed the handle; retain_graph=True on that backward does not keep it.",
        fix="Bind the handle with recompute_handle(h, sid) before the first backward and run both backwards inside "
            "recompute_session_ctx(sid, retain_on_unpack=True).",
        tip="to back-propagate through it twice, prefire it with recompute_handle(handle, sid) and run both "
            "backwards inside recompute_session_ctx(sid, retain_on_unpack=True)."),
    DiagnosisCode(
        code="session_never_bound", spec_id="R3", reasons=_ORDINARY,
        cause="A retaining session was open, but the handle was never registered in it.",
        fix="Register the handle first: recompute_handle(h, sid) or h.bind_session(sid), then enter "
            "recompute_session_ctx(sid, retain_on_unpack=True)."),
    DiagnosisCode(
        code="session_not_retaining", spec_id="R4", reasons=_ORDINARY,
        cause="The handle's session was left, or made non-retaining, before a later consumer ran.",
        fix="Run every consumer inside recompute_session_ctx(sid, retain_on_unpack=True) and leave it only after "
            "the last one."),
    DiagnosisCode(
        code="phase_not_set", spec_id="R5", reasons=("backward_exception",),
        cause="A backward reached a split handle while its phase was still 'ordinary'.",
        fix="Set the phase of every scoped handle before each pass (h.set_phase('dx'/'dw')), or use "
            "backward_input / backward_weight, which do it.",
        tip="call handle.set_phase('dx') before the DX pass and set_phase('dw') before the DW pass, or use "
            "ckpt_viz.runtime.backward_input / backward_weight, which do it for you."),
    DiagnosisCode(
        code="released_after_backward_error", spec_id="R6", reasons=("backward_exception",), plain=True,
        cause="An exception inside a backward released the handle.",
        fix="Fix the error raised inside the backward (see the error event); a handle released by it cannot "
            "replay again.",
        tip="fix the first error raised in that backward; a failing backward releases handles that are not "
            "retained."),
    DiagnosisCode(
        code="released_after_forward_error", spec_id="R7", reasons=("forward_exception",), plain=True,
        cause="The checkpointed forward raised, so the handle was released before it could be used.",
        fix="Fix the error in the checkpointed forward; a handle from a failed forward cannot be used.",
        tip="the checkpointed forward raised, so the handle never became usable; fix that error first."),
    DiagnosisCode(
        code="session_cleared_early", spec_id="R8", reasons=("session_cleared",), plain=True,
        cause="The handle's session was cleared before its last consumer ran.",
        fix="Clear a session only after its last consumer (DW) ran, and use one session id per micro-batch.",
        tip="call clear_recompute_session(sid) only after the last consumer (DW) ran, and use one session id per "
            "micro-batch."),
    DiagnosisCode(
        code="released_explicitly", spec_id="R9", reasons=("explicit_release",), plain=True,
        cause="release() was called on the handle (a cancellation), and it was used afterwards.",
        fix="Do not use a handle after release(): drop it from the schedule when you cancel.",
        tip="release() was called on it (cancellation); build a new micro-batch instead of reusing its handles."),
    DiagnosisCode(
        code="outputs_dropped_before_replay", spec_id="R10",
        cause="Every output of the checkpoint was dropped before its first replay, so its autograd node was "
              "garbage-collected.",
        fix="Keep the checkpoint's outputs (or the loss built from them) alive until the handle has replayed.",
        tip="every output of the checkpoint and everything computed from it was dropped; keep the loss (or the "
            "stage output) alive until the handle has replayed."),
    DiagnosisCode(
        code="trigger_missing_in_dw", spec_id="R12",
        cause="DW's inputs lacked the handle's backward trigger: DW skipped it, so it was never released and its "
              "captured parameters got no gradient.",
        fix="Pass every handle's backward_trigger in DW's inputs, or use backward_weight(..., handles=...); then "
            "release() the leaked handle."),
    DiagnosisCode(
        code="dx_without_retain_graph", spec_id="R13",
        cause="DX ran without retain_graph=True, so DW failed with PyTorch's \"backward through the graph a second "
              "time\" and the handles it should have released leaked.",
        fix="Run DX with retain_graph=True (backward_input does), then release() the leaked handles."),
    DiagnosisCode(
        code="session_mismatch", spec_id="R14", reasons=_ORDINARY,
        cause="The handle is bound to one session id and was used, or bound, under another.",
        fix="Use one session id for recompute_handle / bind_session and recompute_session_ctx.",
        tip="bind inside the session with the same id, or outside any session."),
    DiagnosisCode(
        code="prefire_after_release", spec_id="R15", reasons=("ordinary_backward_complete", "dw_complete"),
        cause="A prefire came after an ordinary or DW backward had already released the handle.",
        fix="Prefire a micro-batch only before its first backward; skip handles already released."),
    # Problems that raise nothing, or that a non-reentrant replay reports (see ckpt_viz/debug/silent.py).
    DiagnosisCode(
        code="dw_skipped_handles", spec_id="S1",
        cause="A DW pass skipped handles that DX had reached: they were never released and their captured "
              "parameters got no weight gradient.",
        fix="Pass every handle of the micro-batch to backward_weight(..., handles=...) (or each one's "
            "backward_trigger in DW's inputs); release() handles you cancel."),
    DiagnosisCode(
        code="params_without_grad", spec_id="S2",
        cause="Parameters the checkpointed block captures got no gradient from its backward.",
        fix="Check that the block uses every parameter it owns in its forward, and that the replay reaches them "
            "(no detached copies, no cache of the forward's results)."),
    DiagnosisCode(
        code="session_never_cleared", spec_id="S3",
        cause="A recompute session had handles bound to it and was never cleared: its members and their "
              "replayed tensors stay alive.",
        fix="Call clear_recompute_session(sid) after the last consumer (DW) of each micro-batch, or pass "
            "session_id to backward_weight, which clears it."),
    DiagnosisCode(
        code="replayed_more_than_once", spec_id="S4",
        cause="A handle was replayed more than once for one micro-batch: its forward ran again each time "
              "(slower, and state such as BatchNorm statistics is updated again).",
        fix="Share one replay between DX and DW: pass the same session_id to backward_input and "
            "backward_weight, or bind the handle with recompute_handle(h, sid) in a retaining session."),
    DiagnosisCode(
        code="unasked_grads_accumulated", spec_id="S8",
        cause="A reentrant checkpoint outside a split scope was reached by a backward that asked for some gradients "
              "only (torch.autograd.grad, or backward(inputs=...)), and its replay's full backward accumulated into "
              ".grad of parameters that call did not ask for: a later backward adds to them again, so those "
              "gradients come out wrong, with no error (torch's stock PipelineStage does this in its I action and "
              "in metadata inference).",
        fix="Build the stage with ckpt_viz.pipelining.PipelineStage instead of "
            "torch.distributed.pipelining.PipelineStage, or run the forward inside "
            "ckpt_viz.reentrant_checkpoint_scope(params) and drive it with backward_input / backward_weight."),
    DiagnosisCode(
        code="unpacked_twice_in_session", spec_id="S5",
        cause="A non-reentrant checkpoint's saved tensor was unpacked twice in one non-retaining recompute "
              "session (two backwards through it in the same session).",
        fix="Run both passes inside recompute_session_ctx(sid, retain_on_unpack=True), or give the second pass "
            "its own session id."),
    DiagnosisCode(
        code="saved_count_mismatch", spec_id="S6",
        cause="The replay saved a different number of tensors than the forward: the checkpointed function took "
              "another path when it ran again.",
        fix="Make the checkpointed function do the same work in its replay: no data-dependent or stateful control "
            "flow, keep preserve_rng_state=True (or pass early_stop=True)."),
    DiagnosisCode(
        code="metadata_mismatch", spec_id="S7",
        cause="The replay produced tensors of other shapes or dtypes than the forward did.",
        fix="Keep the inputs, autocast and control flow of the checkpointed function the same between forward and "
            "replay, or pass determinism_check='none' if the difference is intended."),
    DiagnosisCode(
        code="torch_reentrant_with_grad", spec_id="X3",
        cause="torch's reentrant checkpoint (torch.utils.checkpoint with use_reentrant=True) was reached by "
              "torch.autograd.grad or backward(inputs=...), which it refuses: a pipeline stage's input-gradient "
              "pass (I) is such a call.",
        fix="Use use_reentrant=False for torch's checkpoint inside a pipeline stage, or ckpt_viz's checkpoint with "
            "ckpt_viz.pipelining.PipelineStage, which splits the backward into DX and DW."),
    # Facts of the run as a whole (ckpt_viz/analysis/diagnosis.py).
    DiagnosisCode(
        code="error_raised", spec_id="X1",
        cause="The run raised an error that no more specific finding explains.",
        fix="Read the error's message and its line of code (below); fix what it names, then record the run again."),
    DiagnosisCode(
        code="run_partial", spec_id="X2",
        cause="The run stopped before it finished (interrupted, killed, out of time, or ranks missing from a "
              "distributed run): what would have happened after that point is not in the trace.",
        fix="Look at the last events of the trace (and of each rank) for what was running; record the run again to "
            "its end, or merge the missing ranks' files if they exist."),
    # Replays that do not reproduce their forward (`replay_diverged` events; see ckpt_viz/runtime/divergence.py).
    DiagnosisCode(
        code="replay_lost_gradient", spec_id="V1",
        cause="The replay of a checkpointed block gave no gradient to parameters its forward used: its outputs look "
              "right, but those parameters' gradients are missing.",
        fix="Make the replay recompute what those parameters feed: when the block reads a mutable input (a Hugging "
            "Face KV cache), train with use_cache=False or checkpoint through model.gradient_checkpointing_enable(); "
            "otherwise look for values the block takes from outside its inputs (a cache, a detached tensor, a "
            "no_grad region)."),
    DiagnosisCode(
        code="replay_input_mutated", spec_id="V2",
        cause="An object handed to the checkpointed block (a cache, a list, a dict) changed between the forward and "
              "the replay: the block mutates it, so the replay ran on other state (a KV cache grows again).",
        fix="Hand checkpointed blocks only state they do not change: for Hugging Face models use_cache=False (or "
            "model.gradient_checkpointing_enable()); otherwise keep the mutable state outside the checkpoint."),
    DiagnosisCode(
        code="replay_outputs_differ", spec_id="V3",
        cause="The replay computed other values than the forward: randomness (dropout) without "
              "preserve_rng_state, or an input or captured tensor modified in place after the forward; the "
              "gradients belong to values the forward never produced.",
        fix="Keep preserve_rng_state=True for blocks with dropout, and do not modify a checkpointed block's inputs "
            "or captured tensors in place before its backward."),
    DiagnosisCode(
        code="replay_updated_buffers", spec_id="V4",
        cause="The replay updated buffers its forward had already updated (BatchNorm running statistics): under "
              "checkpointing every step updates them twice, silently.",
        fix="Keep the norm out of the replay with checkpoint_exclude_wrapper, checkpoint only the layers around it, "
            "or use a norm without running statistics (LayerNorm, GroupNorm)."),
)}

# The plain reading of each release reason (see DiagnosisCode.plain).
CODE_FOR_REASON: dict[str, str] = {
    reason: d.code for d in DIAGNOSIS_CODES.values() if d.plain for reason in d.reasons
}
