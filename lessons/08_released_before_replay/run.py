"""Lesson 8: three broken orders of calls that use a checkpoint after its release, the Debugger's story of
each, and the fixed code beside it."""
from ckpt_viz import diagnose
from ckpt_viz.analysis.words import reason_word
from ckpt_viz.codes import DIAGNOSIS_CODES


def record_dw_before_dx():
    import torch

    import ckpt_viz

    torch.manual_seed(0)
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    with ckpt_viz.record() as rec:
        with ckpt_viz.reentrant_checkpoint_scope([w]) as handles:
            out = ckpt_viz.checkpoint(
                lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        loss = (out * out).sum()
        ckpt_viz.backward_weight(loss, None, [w], handles=handles)   # DW first
        try:
            ckpt_viz.backward_input(loss, None, [x], handles=handles)  # then DX
        except ckpt_viz.HandleReleasedError:
            pass  # the trace keeps it: an `error` event
    return rec.trace


def record_dx_then_dw():
    import torch

    import ckpt_viz

    torch.manual_seed(0)
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    with ckpt_viz.record() as rec:
        with ckpt_viz.reentrant_checkpoint_scope([w]) as handles:
            out = ckpt_viz.checkpoint(
                lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        loss = (out * out).sum()
        ckpt_viz.backward_input(loss, None, [x], handles=handles)    # DX first
        ckpt_viz.backward_weight(loss, None, [w], handles=handles)   # DW: the last use
    return rec.trace


def record_second_backward():
    import torch

    import ckpt_viz

    torch.manual_seed(0)
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    with ckpt_viz.record() as rec:
        out = ckpt_viz.checkpoint(
            lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        loss = (out * out).sum()
        loss.backward(retain_graph=True)  # replays the block, then releases it
        try:
            loss.backward()               # retain_graph kept autograd's graph only
        except ckpt_viz.HandleReleasedError:
            pass  # the trace keeps it: an `error` event
    return rec.trace


def record_two_backwards_in_a_session():
    import torch

    import ckpt_viz

    torch.manual_seed(0)
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    with ckpt_viz.record() as rec:
        with ckpt_viz.recompute_handle_collector_ctx() as handles:
            out = ckpt_viz.checkpoint(
                lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        loss = (out * out).sum()
        ckpt_viz.recompute_handle(handles[0], "twice")  # bind it to a session
        with ckpt_viz.recompute_session_ctx("twice", retain_on_unpack=True):
            loss.backward(retain_graph=True)            # the session keeps the replay
            loss.backward()
        ckpt_viz.clear_recompute_session("twice")       # then let it go
    return rec.trace


def record_prefire_after_backward():
    import torch

    import ckpt_viz

    torch.manual_seed(0)
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    with ckpt_viz.record() as rec:
        with ckpt_viz.recompute_handle_collector_ctx() as handles:
            out = ckpt_viz.checkpoint(
                lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        (out * out).sum().backward()                        # releases the handle
        try:
            ckpt_viz.recompute_handle(handles[0], "prefire")  # too late
        except ckpt_viz.HandleReleasedError:
            pass  # the trace keeps it: an `error` event
    return rec.trace


def record_prefire_first():
    import torch

    import ckpt_viz

    torch.manual_seed(0)
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    with ckpt_viz.record() as rec:
        with ckpt_viz.recompute_handle_collector_ctx() as handles:
            out = ckpt_viz.checkpoint(
                lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        ckpt_viz.recompute_handle(handles[0], "prefire")     # prefire first
        with ckpt_viz.recompute_session_ctx("prefire"):
            (out * out).sum().backward()                     # uses the prefired replay
        ckpt_viz.clear_recompute_session("prefire")
    return rec.trace


def _broken(trace, runs, fixed):
    """The Debugger's finding on the broken run, and the fixed run's figures (no finding there)."""
    (error,) = trace.of_kind("error")
    released = [e for e in trace.of_kind("released") if e.handle_id == error.handle_id]
    assert released and released[0].seq < error.seq, "no release before the error"
    found = [f for f in diagnose(trace) if not f.ok]
    assert found and found[0].code in DIAGNOSIS_CODES, found
    good = runs(fixed)
    assert good.count("error") == good.count("replay_refused") == 0, "the fixed run failed"
    assert not [f for f in diagnose(good) if not f.ok], diagnose(good)
    (fixed_release,) = good.of_kind("released") or (None,)
    return {"code": found[0].code, "cause": found[0].cause, "fix": found[0].fix, "released_at": released[0].seq,
            "reason": reason_word(released[0].reason), "error_at": error.seq, "error": error.type,
            "fixed_replays": good.count("replay_started"),
            "fixed_reason": reason_word(fixed_release.reason if fixed_release is not None else "session_cleared")}


def check_dw_before_dx(trace, runs):
    figures = _broken(trace, runs, "record_dx_then_dw")
    assert figures["code"] == "released_by_dw", figures
    return figures


def check_second_backward(trace, runs):
    figures = _broken(trace, runs, "record_two_backwards_in_a_session")
    assert figures["code"] == "released_by_ordinary_backward", figures
    assert figures["fixed_replays"] == 1, figures
    return figures


def check_prefire_after_backward(trace, runs):
    figures = _broken(trace, runs, "record_prefire_first")
    assert figures["code"] == "prefire_after_release", figures
    assert figures["fixed_replays"] == 1, figures
    return figures
