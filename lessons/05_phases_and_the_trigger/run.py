"""Lesson 5: the built-in closure model in split-reentrant mode."""
from ckpt_viz import lessons


def record_closure():
    return lessons.builtin("closure", "split-reentrant")


def check_phases(trace, runs):
    for h in trace.handle_ids():
        moves = [(e.old, e.new) for e in trace.for_handle(h) if e.kind == "phase_set"]
        assert moves == [("ordinary", "dx"), ("dx", "dw")], f"h{h}: {moves}"
    return f"{len(trace.handle_ids())} handles, each set ordinary -> dx -> dw"


def check_captured_through_trigger(trace, runs):
    dw = [e for e in trace.of_kind("grads_routed") if e.phase == "dw"]
    assert len(dw) == 3 and all(e.targets == () for e in dw)
    names = sorted(c.name for e in dw for c in e.captured if c.accumulated)
    assert len(names) == 6, names
    return "DW accumulated the captured " + ", ".join(names)
