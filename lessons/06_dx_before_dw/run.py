"""Lesson 6: release at the end of DW; DW before DX is refused (the debugger's broken run "dx-after-dw")."""
from ckpt_viz import lessons


def record_split():
    return lessons.builtin("mlp", "split-reentrant")


def record_dw_first():
    return lessons.runs.broken("dx-after-dw")


def check_released_after_dw(trace, runs):
    for h in trace.handle_ids():
        kinds = [e.kind for e in trace.for_handle(h)]
        dw_routed = max(i for i, e in enumerate(trace.for_handle(h)) if e.kind == "grads_routed")
        assert kinds.index("released") > dw_routed, kinds
    return "every handle is released right after its DW routed the weight gradients"


def check_refused_after_release(trace, runs):
    (error,) = trace.of_kind("error")
    (released,) = trace.of_kind("released")
    assert released.handle_id == error.handle_id and released.seq < error.seq
    assert released.reason == "dw_complete", released
    assert error.type == "HandleReleasedError", error
    return f"h{error.handle_id} released by DW at seq {released.seq}; the DX after it raised HandleReleasedError"
