"""Lesson 4: the built-in mlp in split-reentrant mode (DX, then DW), beside reentrant and none."""
from ckpt_viz import lessons


def record_split():
    return lessons.builtin("mlp", "split-reentrant")


def record_reentrant():
    return lessons.builtin("mlp", "reentrant")


def record_none():
    return lessons.builtin("mlp", "none")


def check_dx_then_dw(trace, runs):
    phases = [e.phase for e in trace.of_kind("backward_entered")]
    assert phases == ["dx"] * 4 + ["dw"] * 4, phases
    reasons = {e.reason for e in trace.of_kind("released")}
    assert reasons == {"dw_complete"}, reasons
    return "4 DX backwards, then 4 DW backwards; every handle released when its DW completed"


def check_split_costs_memory(trace, runs):
    split, plain, none = (lessons.peak(t) for t in (trace, runs("record_reentrant"), runs("record_none")))
    assert split > none > plain, (split, none, plain)
    return f"peak: split {lessons.kib(split)}, none {lessons.kib(none)}, reentrant {lessons.kib(plain)}"
