"""Lesson 2: torch's default (non-reentrant) checkpoint through ckpt_viz.checkpoint, on a plain loop."""
from ckpt_viz import lessons
from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.lifecycle import lifecycle, recompute_time
from ckpt_viz.analysis.memory import memory


def make_blocks(depth, width=32, hidden=128):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.ModuleDict({
        f"block{i}": nn.Sequential(
            nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, width))
        for i in range(depth)})


def record_checkpointed(checkpointed=(0, 1, 2, 3), depth=4, batch=384):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth)
    x = torch.randn(batch, 32)
    with ckpt_viz.record(memory=True, model=blocks) as rec:
        h = x
        for i, block in enumerate(blocks.values()):
            if i in checkpointed:   # keep the input, drop the rest, replay in backward
                h = h + ckpt_viz.checkpoint(block, h, use_reentrant=False)
            else:
                h = h + block(h)
            rec.mark(f"after block{i}")
        loss = h.pow(2).sum()
        rec.mark("loss")
        loss.backward()
        rec.mark("end")
    return rec.trace


def record_none(depth=4, batch=384):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth)
    x = torch.randn(batch, 32)
    with ckpt_viz.record(memory=True, model=blocks) as rec:
        h = x
        for i, block in enumerate(blocks.values()):
            h = h + block(h)
            rec.mark(f"after block{i}")
        loss = h.pow(2).sum()
        rec.mark("loss")
        loss.backward()
        rec.mark("end")
    return rec.trace


def check_holders(trace, runs):
    packed = trace.of_kind("tensor_packed")
    handles = lifecycle(trace).handle_ids
    per_handle = {h: sum(1 for e in packed if e.handle_id == h) for h in handles}
    assert per_handle and 0 not in per_handle.values(), per_handle
    end_of_forward = trace.of_kind("forward_finished")[-1].seq
    at = memory(trace).at(end_of_forward)
    assert at.get("activations", 0) < at["checkpoint_inputs"], at
    return {"holders": len(packed), "handles": len(handles), "each": ", ".join(map(str, per_handle.values())),
            "inputs": lessons.kib(at["checkpoint_inputs"]), "acts": lessons.kib(at.get("activations", 0))}


def check_one_replay_each_in_reverse(trace, runs):
    counts = lessons.replays(trace)
    assert set(counts.values()) == {1}, counts
    order = [e.handle_id for e in trace.of_kind("replay_started")]
    assert order == sorted(order, reverse=True), order
    labels = handle_labels(trace)
    return {"order": ", ".join(f"h{h} ({labels[h]})" for h in order), "first": labels[order[0]],
            "last": labels[order[-1]], "blocks": len(order)}


def check_early_stop_and_the_trade(trace, runs):
    checkpointed = runs("record_checkpointed")
    stopped = checkpointed.count("early_stopped")
    assert stopped == checkpointed.count("replay_started") == len(lifecycle(checkpointed).handle_ids), stopped
    assert recompute_time(trace).replays == 0
    with_ckpt, without = lessons.peak(checkpointed), lessons.peak(trace)
    assert with_ckpt < 0.9 * without, (with_ckpt, without)
    spent = recompute_time(checkpointed)
    assert spent.replay_ns > 0
    return {"stopped": stopped, "with": lessons.kib(with_ckpt), "without": lessons.kib(without),
            "saved": lessons.percent(1 - with_ckpt / without), "recompute": lessons.ms(spent.replay_ns),
            "replays": spent.replays}


def check_which_blocks(trace, runs):
    handles = lifecycle(trace).handle_ids
    spent = recompute_time(trace)
    assert spent.replays == len(handles), (spent.replays, handles)
    assert (spent.replay_ns > 0) == bool(handles)
    labels = handle_labels(trace)
    return {"count": len(handles), "names": ", ".join(labels[h] for h in handles) or "none",
            "peak": lessons.kib(lessons.peak(trace)), "replays": spent.replays,
            "recompute": lessons.ms(spent.replay_ns)}
