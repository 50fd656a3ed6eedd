"""Lesson 8: the debugger's broken runs (ckpt_viz.run.broken) and their fixes, recorded with the runtime."""
from ckpt_viz import diagnose, lessons


def _codes(trace):
    return {d.code for d in diagnose(trace)}


def record_dx_after_dw():
    return lessons.runs.broken("dx-after-dw")


def record_second_backward():
    return lessons.runs.broken("second-backward")


def record_prefire_after_backward():
    return lessons.runs.broken("prefire-after-backward")


record_dx_then_dw = lessons.runs.record_dx_then_dw        # the fixes, written with the runtime
record_prefire_first = lessons.runs.record_prefire_first


def _released_then_error(trace, name):
    code = lessons.runs.expected_code(name)
    (error,) = trace.of_kind("error")
    released = [e for e in trace.of_kind("released") if e.handle_id == error.handle_id]
    assert released and released[0].seq < error.seq, "no release before the error"
    assert code in _codes(trace), f"the debugger says {_codes(trace)}, not {code}"
    return error, released[0]


def check_dx_after_dw(trace, runs):
    error, released = _released_then_error(trace, "dx-after-dw")
    return f"released at seq {released.seq} ({released.reason}), error at seq {error.seq}: {error.type}"


def check_second_backward(trace, runs):
    error, released = _released_then_error(trace, "second-backward")
    return f"released at seq {released.seq} ({released.reason}), the second backward failed at seq {error.seq}"


def check_prefire_after_backward(trace, runs):
    error, released = _released_then_error(trace, "prefire-after-backward")
    return f"released at seq {released.seq} ({released.reason}), the late prefire failed at seq {error.seq}"


def check_fixed_release(trace, runs):
    assert trace.count("error") == 0 and trace.count("replay_refused") == 0
    assert trace.count("replay_started") == 1 and trace.count("released") == 1
    assert not _codes(trace) - {"ok"}, _codes(trace)
    (released,) = trace.of_kind("released")
    return f"no error; one replay; released with reason {released.reason}"
