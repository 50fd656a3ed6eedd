"""Lesson 4: split backward (DX, then DW) on a plain loop, its memory price, and the pipeline bubble DW fills."""
from ckpt_viz import lessons
from ckpt_viz.analysis.actions import bubbles
from ckpt_viz.analysis.lifecycle import held_replays, lifecycle


def make_blocks(depth, width=32, hidden=128):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.ModuleDict({
        f"block{i}": nn.Sequential(
            nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, width))
        for i in range(depth)})


def record_split(depth=4, batch=384):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth)
    params = list(blocks.parameters())
    x = torch.randn(batch, 32, requires_grad=True)
    with ckpt_viz.record(memory=True, graphs=True, model=blocks) as rec:
        with ckpt_viz.reentrant_checkpoint_scope(params) as handles:
            h = x
            for name, block in blocks.items():
                h = h + ckpt_viz.checkpoint(block, h, use_reentrant=True)
                rec.mark(f"after {name}")
        loss = h.pow(2).sum()
        rec.mark("loss")
        ckpt_viz.backward_input(loss, None, [x], handles=handles)      # DX
        rec.mark("after DX")
        ckpt_viz.backward_weight(loss, None, params, handles=handles)  # DW
        rec.mark("end")
    return rec.trace


def record_none(depth=4, batch=384):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth)
    x = torch.randn(batch, 32, requires_grad=True)
    with ckpt_viz.record(memory=True, model=blocks) as rec:
        h = x
        for name, block in blocks.items():
            h = h + block(h)
            rec.mark(f"after {name}")
        loss = h.pow(2).sum()
        rec.mark("loss")
        loss.backward()
        rec.mark("end")
    return rec.trace


def record_pipeline(schedule="1F1B", microbatches=4):
    import torch
    from torch import nn

    from ckpt_viz.run.pipeline import run_pipeline
    from ckpt_viz.run.zoo import ModelSpec

    torch.manual_seed(0)

    def block():
        return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))

    model = nn.ModuleDict({"stage0": nn.Sequential(block(), block()),
                           "stage1": nn.Sequential(block(), block())})
    spec = ModelSpec(
        "two stages", model, (torch.randn(128, 16),),
        checkpoint=("stage0.0", "stage0.1", "stage1.0", "stage1.1"),
        stages=("stage0", "stage1"))
    # each stage runs F, DX and DW actions in the schedule's order
    return run_pipeline(spec, schedule=schedule, microbatches=microbatches,
                        memory=True)


def record_zero_bubble(microbatches=4):
    return record_pipeline("ZB-H1", microbatches)


def check_dx_then_dw(trace, runs):
    phases = [e.phase for e in trace.of_kind("backward_entered")]
    n = len(lifecycle(trace).handle_ids)
    assert phases == ["dx"] * n + ["dw"] * n, phases
    reasons = {e.reason for e in trace.of_kind("released")}
    assert reasons == {"dw_complete"}, reasons
    return {"dx": n, "dw": n}


def check_split_costs_memory(trace, runs):
    none = runs("record_none")
    split, plain = lessons.peak(trace), lessons.peak(none)
    held = held_replays(trace)
    handles = lifecycle(trace).handle_ids
    assert held.most == len(handles), (held, handles)
    assert split > plain, (split, plain)
    return {"split": lessons.kib(split), "none": lessons.kib(plain), "held": held.most,
            "above": lessons.percent(split / plain - 1)}


def _bubble(trace):
    (step,) = bubbles(trace).steps
    return step


def check_bubble(trace, runs):
    zb = runs("record_zero_bubble")
    mine, theirs = _bubble(trace), _bubble(zb)
    assert bubbles(trace).unit == bubbles(zb).unit == "tick"
    assert theirs.bubble < mine.bubble, (theirs.bubble, mine.bubble)
    kinds = {e.tags.get("action") for e in zb.events if e.tags.get("action")}
    assert {"F", "DX", "DW"} <= kinds, kinds
    return {"bubble_1f1b": lessons.percent(mine.bubble), "bubble_zb": lessons.percent(theirs.bubble),
            "ticks_1f1b": f"{mine.length:g}", "ticks_zb": f"{theirs.length:g}"}
