"""Lesson 3: the reentrant checkpoint (use_reentrant=True): one autograd node per block, the replay inside it."""
from ckpt_viz import lessons
from ckpt_viz.analysis.lifecycle import lifecycle, recompute_time
from ckpt_viz.analysis.routing import snapshot_before


def make_blocks(depth, width=32, hidden=128):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.ModuleDict({
        f"block{i}": nn.Sequential(
            nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, width))
        for i in range(depth)})


def record_checkpointed(depth=4, batch=384, use_reentrant=True):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth)
    x = torch.randn(batch, 32, requires_grad=True)
    with ckpt_viz.record(memory=True, graphs=True, model=blocks) as rec:
        h = x
        for name, block in blocks.items():
            h = h + ckpt_viz.checkpoint(block, h, use_reentrant=use_reentrant)
            rec.mark(f"after {name}")
        loss = h.pow(2).sum()
        rec.mark("loss")
        loss.backward()   # the graph snapshot is taken just before it
        rec.mark("end")
    return rec.trace


def record_nonreentrant(depth=4, batch=384):
    return record_checkpointed(depth, batch, use_reentrant=False)


def check_no_holders(trace, runs):
    assert trace.count("tensor_packed") == 0
    handles = lifecycle(trace).handle_ids
    snapshot = snapshot_before(trace, trace.events[-1].seq)
    assert snapshot is not None, "no graph snapshot"
    regions = {n.handle_id for n in snapshot.nodes if n.handle_id is not None and n.kind != "trigger"}
    assert regions == set(handles), (regions, handles)
    return {"handles": len(handles), "nodes": len(snapshot.nodes), "regions": len(regions)}


def check_replay_inside_backward(trace, runs):
    order = ("backward_entered", "replay_started", "replay_finished", "grads_routed", "released")
    for h in lifecycle(trace).handle_ids:
        kinds = [e.kind for e in trace.for_handle(h)]
        at = [kinds.index(k) for k in order]
        assert at == sorted(at), f"h{h}: {kinds}"
    return {"order": " < ".join(order), "handles": len(lifecycle(trace).handle_ids)}


def check_both_kinds(trace, runs):
    other = runs("record_nonreentrant")
    mine, theirs = recompute_time(trace), recompute_time(other)
    handles = len(lifecycle(trace).handle_ids)
    assert mine.replays == theirs.replays == handles, (mine.replays, theirs.replays, handles)
    assert trace.count("tensor_packed") == 0 < other.count("tensor_packed")
    return {"blocks": handles, "peak_r": lessons.kib(lessons.peak(trace)),
            "peak_nr": lessons.kib(lessons.peak(other)), "time_r": lessons.ms(mine.replay_ns),
            "time_nr": lessons.ms(theirs.replay_ns), "holders": other.count("tensor_packed")}
