"""Lesson 12: selective checkpointing per op with torch's policies (context_fn): which ops to save, what it costs."""
from ckpt_viz import lessons
from ckpt_viz.analysis.handles import observed_mode
from ckpt_viz.analysis.lifecycle import lifecycle


def make_blocks(depth, width=32, hidden=128):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.ModuleDict({
        f"block{i}": nn.Sequential(
            nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, width))
        for i in range(depth)})


def record_policy(save=("addmm",), checkpointed=True, depth=4, batch=384):
    import functools

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    import ckpt_viz

    kept = {getattr(torch.ops.aten, name).default for name in save}

    def policy(ctx, op, *args, **kwargs):  # asked for every op the block runs
        if op in kept:
            return CheckpointPolicy.MUST_SAVE        # keep its output
        return CheckpointPolicy.PREFER_RECOMPUTE     # recompute it in backward

    context = functools.partial(
        torch.utils.checkpoint.create_selective_checkpoint_contexts, policy)

    def step(blocks, x):
        h = x
        for block in blocks.values():
            if checkpointed:
                h = h + checkpoint(block, h, use_reentrant=False, context_fn=context)
            else:
                h = h + block(h)
        return h.pow(2).sum()

    blocks = make_blocks(depth)
    x = torch.randn(batch, 32)
    # torch's checkpoint, observed by ckpt_viz
    with ckpt_viz.record(memory=True, model=blocks) as rec:
        loss = step(blocks, x)
        rec.mark("loss")
        loss.backward()
        rec.mark("end")
    # the backward's FLOPs, counted on a second step outside the recording
    with FlopCounterMode(display=False) as flops:
        step(blocks, x).backward()
    rec.trace.meta["backward_flops"] = flops.get_total_flops()
    return rec.trace


def record_recompute_all(checkpointed=True, depth=4, batch=384):
    return record_policy((), checkpointed, depth, batch)


def record_none(depth=4, batch=384):
    return record_policy((), False, depth, batch)


def _mflop(n):
    return f"{n / 1e6:.1f}"


def _figures(trace, base):
    flops = trace.meta["backward_flops"]
    at_peak = lessons.peak_by_category(trace)
    return {"peak": lessons.kib(lessons.peak(trace)), "flops": _mflop(flops),
            "recompute": _mflop(flops - base), "other": lessons.kib(at_peak.get("other", 0)),
            "replays": lifecycle(trace).replay_count()}


def check_observed(trace, runs):
    none = runs("record_none")
    base = none.meta["backward_flops"]
    mine = _figures(trace, base)
    assert "torch" in observed_mode(trace), observed_mode(trace)
    assert trace.meta["backward_flops"] > base and lessons.peak(trace) < lessons.peak(none)
    return {**{f"{k}_ckpt": v for k, v in mine.items()}, "peak_none": lessons.kib(lessons.peak(none)),
            "flops_none": _mflop(base), "mode": observed_mode(trace)}


def check_keep_matmuls(trace, runs):
    base = runs("record_none").meta["backward_flops"]
    everything = runs("record_recompute_all")
    assert trace.meta["backward_flops"] < everything.meta["backward_flops"]
    assert lessons.peak(trace) > lessons.peak(everything)
    keep, redo = _figures(trace, base), _figures(everything, base)
    return {**{f"{k}_keep": v for k, v in keep.items()}, **{f"{k}_all": v for k, v in redo.items()}}


def check_any_policy(trace, runs, knobs):
    base = runs("record_none").meta["backward_flops"]
    mine = _figures(trace, base)
    assert trace.meta["backward_flops"] >= base
    both = runs("record_policy", save=("addmm", "tanh"))  # what the prose says of keeping both
    assert lessons.peak(both) > lessons.peak(runs("record_none")), "keeping both peaks below no checkpoint"
    saved = ", ".join(knobs["save"]) or "nothing"
    return {**mine, "saved": saved, "peak_none": lessons.kib(lessons.peak(runs("record_none")))}
