"""Lesson 4: the built-in mlp in split-reentrant mode (DX, then DW), beside reentrant and none."""
from ckpt_viz.lessons.helpers import builtin, kib, peak


def record_split():
    return builtin("mlp", "split-reentrant")


def record_reentrant():
    return builtin("mlp", "reentrant")


def record_none():
    return builtin("mlp", "none")


def check_dx_then_dw(trace, runs):
    phases = [e.phase for e in trace.of_kind("backward_entered")]
    assert phases == ["dx"] * 4 + ["dw"] * 4, phases
    reasons = {e.data["reason"] for e in trace.of_kind("released")}
    assert reasons == {"dw_complete"}, reasons
    return "4 DX backwards, then 4 DW backwards; every handle released when its DW completed"


def check_split_costs_memory(trace, runs):
    split, plain, none = peak(trace), peak(runs("record_reentrant")), peak(runs("record_none"))
    assert split > none > plain, (split, none, plain)
    return f"peak: split {kib(split)}, none {kib(none)}, reentrant {kib(plain)}"
