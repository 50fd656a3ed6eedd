"""The runs the lessons write with the runtime itself (the code a step shows): torch is imported inside each.

Lesson scripts (lessons/*/run.py) use only `ckpt_viz`'s public names and never torch, so the
runs that call the runtime directly live here, and a lesson's run.py names them
(`record_prefire = lessons.runs.record_prefire`); the step shows this function's source.
"""
from __future__ import annotations

from typing import Any

from ckpt_viz.trace import Trace

__all__ = ["broken", "expected_code", "record_dx_then_dw", "record_make_dot_saved", "record_prefire",
           "record_prefire_first", "record_snapshot"]


def broken(name: str) -> Trace:
    """The debugger's broken run `name` (see `ckpt_viz.run.broken.BROKEN`), its error included."""
    from ckpt_viz.run.broken import record_broken

    return record_broken(name)


def expected_code(name: str) -> str:
    """The finding the debugger must report for the broken run `name`."""
    from ckpt_viz.run.broken import BROKEN

    return BROKEN[name].expected_code


def record_prefire() -> Trace:
    import torch

    from ckpt_viz.recording import record
    from ckpt_viz.runtime import (
        checkpoint,
        clear_recompute_session,
        recompute_handle,
        recompute_handle_collector_ctx,
        recompute_session_ctx,
    )

    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    w1, w2 = (torch.randn(32, 32, requires_grad=True) for _ in range(2))
    with record() as rec:
        with recompute_handle_collector_ctx() as frames:
            h = checkpoint(lambda t: torch.tanh(t @ w1), x, use_reentrant=False)
            y = checkpoint(lambda t: torch.tanh(t @ w2), h, use_reentrant=False)
        with recompute_session_ctx("mb0", retain_on_unpack=True):
            for frame in frames:
                recompute_handle(frame, "mb0")                       # prefire: replay now
            torch.autograd.grad(y.sum(), [x], retain_graph=True)     # DX
            torch.autograd.backward(y.sum(), inputs=[w1, w2])        # DW
        clear_recompute_session("mb0")
    return rec.trace


def _leaves() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)


def record_dx_then_dw() -> Trace:
    import torch

    from ckpt_viz.recording import record
    from ckpt_viz.runtime import backward_input, backward_weight, checkpoint, reentrant_checkpoint_scope

    x, w = _leaves()
    with record() as rec:
        with reentrant_checkpoint_scope([w]) as handles:
            out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        loss = (out * out).sum()
        backward_input(loss, None, [x], handles=handles)    # DX first
        backward_weight(loss, None, [w], handles=handles)   # then DW, the last use
    return rec.trace


def record_prefire_first() -> Trace:
    import torch

    from ckpt_viz.recording import record
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


def _counted_block() -> Any:
    import torch

    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    calls = {"forward": 0}

    def block(t: torch.Tensor) -> torch.Tensor:
        calls["forward"] += 1
        return torch.tanh(t @ w) * 2

    return torch.randn(8, 16, requires_grad=True), w, block, calls


def record_make_dot_saved() -> Trace:
    import torchviz

    from ckpt_viz.recording import record
    from ckpt_viz.runtime import checkpoint

    x, w, block, calls = _counted_block()
    with record() as rec:
        y = checkpoint(block, x, use_reentrant=False)
        after_forward = calls["forward"]
        torchviz.make_dot(y.sum(), params={"w": w}, show_attrs=True, show_saved=True)
        after_make_dot = calls["forward"]
        plain = checkpoint(block, x, use_reentrant=False)
        before_plain = calls["forward"]
        torchviz.make_dot(plain.sum(), params={"w": w})
        after_plain = calls["forward"]
    rec.trace.meta.update(after_forward=after_forward, after_make_dot=after_make_dot,
                          plain_make_dot=after_plain - before_plain)
    return rec.trace


def record_snapshot() -> Trace:
    from ckpt_viz.recording import record
    from ckpt_viz.runtime import checkpoint

    x, _, block, calls = _counted_block()
    with record(graphs=True) as rec:
        y = checkpoint(block, x, use_reentrant=False)
        y.sum().backward()
    rec.trace.meta.update(forward_calls=calls["forward"])
    return rec.trace
