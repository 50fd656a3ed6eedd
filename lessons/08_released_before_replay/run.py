"""Lesson 8: the debugger's broken runs (ckpt_viz.run.broken) and their fixes, recorded with the runtime."""


def _broken(name):
    from ckpt_viz.run.broken import record_broken

    return record_broken(name)


def _codes(trace):
    from ckpt_viz import diagnose_all

    return {d.code for d in diagnose_all(trace)}


def record_dx_after_dw():
    return _broken("dx-after-dw")


def record_second_backward():
    return _broken("second-backward")


def record_prefire_after_backward():
    return _broken("prefire-after-backward")


def _leaves():
    import torch

    torch.manual_seed(0)
    return torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)


def record_dx_then_dw():
    import torch

    from ckpt_viz import record
    from ckpt_viz.runtime import backward_input, backward_weight, checkpoint, reentrant_checkpoint_scope

    x, w = _leaves()
    with record() as rec:
        with reentrant_checkpoint_scope([w]) as handles:
            out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        loss = (out * out).sum()
        backward_input(loss, None, [x], handles=handles)    # DX first
        backward_weight(loss, None, [w], handles=handles)   # then DW, the last use
    return rec.trace


def record_prefire_first():
    import torch

    from ckpt_viz import record
    from ckpt_viz.runtime import (
        checkpoint,
        clear_recompute_session,
        recompute_handle,
        recompute_handle_collector_ctx,
        recompute_session_ctx,
    )

    x, w = _leaves()
    with record() as rec:
        with recompute_handle_collector_ctx() as handles:
            out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        recompute_handle(handles[0], "prefire")             # prefire first
        with recompute_session_ctx("prefire"):
            (out * out).sum().backward()                    # the backward uses the prefired replay
        clear_recompute_session("prefire")
    return rec.trace


def _released_then_error(trace, name):
    from ckpt_viz.run.broken import BROKEN

    code = BROKEN[name].expected_code
    (error,) = trace.of_kind("error")
    released = [e for e in trace.of_kind("released") if e.handle_id == error.handle_id]
    assert released and released[0].seq < error.seq, "no release before the error"
    assert code in _codes(trace), f"the debugger says {_codes(trace)}, not {code}"
    return error, released[0]


def check_dx_after_dw(trace, runs):
    error, released = _released_then_error(trace, "dx-after-dw")
    return f"released at seq {released.seq} ({released.data['reason']}), error at seq {error.seq}: {error.data['type']}"


def check_second_backward(trace, runs):
    error, released = _released_then_error(trace, "second-backward")
    return f"released at seq {released.seq} ({released.data['reason']}), the second backward failed at seq {error.seq}"


def check_prefire_after_backward(trace, runs):
    error, released = _released_then_error(trace, "prefire-after-backward")
    return f"released at seq {released.seq} ({released.data['reason']}), the late prefire failed at seq {error.seq}"


def check_fixed_release(trace, runs):
    assert trace.count("error") == 0 and trace.count("replay_refused") == 0
    assert trace.count("replay_started") == 1 and trace.count("released") == 1
    assert not _codes(trace) - {"ok"}, _codes(trace)
    (released,) = trace.of_kind("released")
    return f"no error; one replay; released with reason {released.data['reason']}"
