"""Lesson 7: recompute sessions (one replay serving DX and DW) and prefire, written with the runtime."""
from ckpt_viz import lessons
from ckpt_viz.analysis.lifecycle import lifecycle, recompute_time


def make_blocks(depth, width=32, hidden=128):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.ModuleDict({
        f"block{i}": nn.Sequential(
            nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, width))
        for i in range(depth)})


def record_session(depth=4, batch=384, retain=True):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth)
    params = list(blocks.parameters())
    x = torch.randn(batch, 32, requires_grad=True)
    with ckpt_viz.record(memory=True, model=blocks) as rec:
        with ckpt_viz.recompute_handle_collector_ctx() as frames:
            h = x
            for block in blocks.values():
                h = h + ckpt_viz.checkpoint(block, h, use_reentrant=False)
        loss = h.pow(2).sum()
        session = "step" if retain else None  # None: no session binds the passes
        ckpt_viz.backward_input(loss, None, [x], handles=frames, session_id=session)
        ckpt_viz.backward_weight(loss, None, params, handles=frames, session_id=session)
    return rec.trace


def record_no_session(depth=4, batch=384):
    return record_session(depth, batch, retain=False)


def record_prefire():
    import torch

    import ckpt_viz

    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    w1, w2 = (torch.randn(32, 32, requires_grad=True) for _ in range(2))
    def layer(w):
        return lambda t: torch.tanh(t @ w)

    with ckpt_viz.record() as rec:
        with ckpt_viz.recompute_handle_collector_ctx() as frames:
            h = ckpt_viz.checkpoint(layer(w1), x, use_reentrant=False)
            y = ckpt_viz.checkpoint(layer(w2), h, use_reentrant=False)
        with ckpt_viz.recompute_session_ctx("mb0", retain_on_unpack=True):
            for frame in frames:
                ckpt_viz.recompute_handle(frame, "mb0")          # prefire: replay now
            torch.autograd.grad(y.sum(), [x], retain_graph=True)  # DX
            torch.autograd.backward(y.sum(), inputs=[w1, w2])     # DW
        ckpt_viz.clear_recompute_session("mb0")
    return rec.trace


def check_one_replay_two_passes(trace, runs):
    other = runs("record_no_session")
    handles = lifecycle(trace).handle_ids
    counts, twice = lessons.replays(trace), lessons.replays(other)
    assert set(counts.values()) == {1} and len(counts) == len(handles), counts
    assert set(twice.values()) == {2}, twice
    activations = trace.of_kind("session_activated")
    assert [e.retain_on_unpack for e in activations][:1] == [True], activations
    return {"blocks": len(handles), "with": sum(counts.values()), "without": sum(twice.values()),
            "time_with": lessons.ms(recompute_time(trace).replay_ns),
            "time_without": lessons.ms(recompute_time(other).replay_ns),
            "twice": 2 * len(handles), "unpacks": trace.count("tensor_unpacked"),
            "holders": trace.count("tensor_packed")}


def check_prefire_before_backward(trace, runs):
    fired = trace.of_kind("prefired")
    counts = lessons.replays(trace)
    assert len(fired) == len(counts) and set(counts.values()) == {1}, (fired, counts)
    first_unpack = trace.of_kind("tensor_unpacked")[0].seq
    assert all(e.seq < first_unpack for e in trace.of_kind("replay_started"))
    return {"prefires": len(fired), "checkpoints": len(counts)}
