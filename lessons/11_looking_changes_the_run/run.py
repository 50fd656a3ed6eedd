"""Lesson 11: count a non-reentrant checkpoint's forward calls under torchviz.make_dot and ckpt_viz's snapshots."""
from collections import Counter

from ckpt_viz.analysis.lifecycle import lifecycle


def record_make_dot_saved():
    import torch
    import torchviz

    import ckpt_viz

    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(8, 16, requires_grad=True)
    calls = {"forward": 0}

    def block(t):
        calls["forward"] += 1                  # count every run of the block
        return torch.tanh(t @ w) * 2

    with ckpt_viz.record() as rec:
        y = ckpt_viz.checkpoint(block, x, use_reentrant=False)
        after_forward = calls["forward"]
        torchviz.make_dot(y.sum(), params={"w": w}, show_attrs=True, show_saved=True)
        after_saved = calls["forward"]
        torchviz.make_dot(y.sum(), params={"w": w})  # plain: no saved tensor read
        after_plain = calls["forward"]
    rec.trace.meta.update(forward_calls=[after_forward, after_saved, after_plain])
    return rec.trace


def record_snapshot():
    import torch

    import ckpt_viz

    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(8, 16, requires_grad=True)
    calls = {"forward": 0}

    def block(t):
        calls["forward"] += 1
        return torch.tanh(t @ w) * 2

    with ckpt_viz.record(graphs=True) as rec:  # a snapshot before each backward
        y = ckpt_viz.checkpoint(block, x, use_reentrant=False)
        y.sum().backward()
    rec.trace.meta.update(forward_calls=[calls["forward"]])
    return rec.trace


def check_make_dot_replays(trace, runs):
    after_forward, after_saved, after_plain = trace.meta["forward_calls"]
    replays = trace.of_kind("replay_started")
    assert after_forward == 1 and after_saved - after_forward == len(replays) > 1, trace.meta
    assert {e.trigger for e in replays} == {"prefire"}, replays
    assert after_plain == after_saved, "plain make_dot ran the block"
    reads = Counter(e.index for e in trace.of_kind("tensor_unpacked"))
    saved = trace.count("tensor_packed")
    assert len(reads) == saved and sum(reads.values()) == len(replays), (reads, saved, len(replays))
    each = set(reads.values())
    assert len(each) == 1, reads
    return {"saved": saved, "reads": each.pop(), "replays": len(replays), "extra": after_saved - after_forward}


def check_snapshot_does_not_replay(trace, runs):
    assert len(trace.graphs) >= 1, "no graph snapshot"
    (calls,) = trace.meta["forward_calls"]
    (replay,) = trace.of_kind("replay_started")
    assert replay.trigger == "backward" and calls == 1 + lifecycle(trace).replay_count()
    return {"snapshots": len(trace.graphs), "calls": calls, "nodes": len(trace.graphs[0].nodes)}
