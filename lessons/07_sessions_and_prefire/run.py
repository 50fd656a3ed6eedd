"""Lesson 7: recompute sessions (the built-in mlp, split-nonreentrant) and a prefire run written with the runtime."""
from ckpt_viz.lessons.helpers import builtin, replays


def record_session():
    return builtin("mlp", "split-nonreentrant")


def record_prefire():
    import torch

    from ckpt_viz import record
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


def check_one_replay_two_passes(trace, runs):
    counts = replays(trace)
    assert sorted(counts) == [0, 1, 2, 3] and set(counts.values()) == {1}, counts
    activations = trace.of_kind("session_activated")
    assert [e.data["retain_on_unpack"] for e in activations] == [True, False]
    assert trace.count("tensor_unpacked") == 2 * trace.count("tensor_packed")
    return (f"{len(counts)} replays for 2 passes; {trace.count('tensor_unpacked')} unpacks of "
            f"{trace.count('tensor_packed')} holders (each twice)")


def check_prefire_before_backward(trace, runs):
    fired = trace.of_kind("prefired")
    assert len(fired) == 2 and {e.data["path"] for e in fired} == {"in_session"}
    counts = replays(trace)
    assert len(counts) == 2 and set(counts.values()) == {1}, counts
    first_unpack = trace.of_kind("tensor_unpacked")[0].seq
    assert all(e.seq < first_unpack for e in trace.of_kind("replay_started"))
    return "2 prefires, 1 replay per checkpoint, both before the first unpack"
