"""Lesson 1: a plain training step without checkpointing; what autograd keeps, by memory category."""
from ckpt_viz import lessons
from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.words import category_word


def make_blocks(depth, width=32, hidden=128):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.ModuleDict({
        f"block{i}": nn.Sequential(
            nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, width))
        for i in range(depth)})


def record_none(depth=4, batch=384):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth)
    x = torch.randn(batch, 32)
    with ckpt_viz.record(memory=True, model=blocks) as rec:
        h = x
        for name, block in blocks.items():
            h = h + block(h)          # a residual block; autograd saves its tensors
            rec.mark(f"after {name}")
        loss = h.pow(2).sum()
        rec.mark("loss")
        loss.backward()               # frees what it saved, block by block
        rec.mark("end")
    return rec.trace


def _per_block(trace):
    """Activations each block's forward added, read as each block's forward ended (model=blocks makes each
    block's exit a sampling point; a mark's seq can also carry the high-water samples that follow it)."""
    facts = memory(trace)
    marks = [e for e in trace.of_kind("memory_sampled") if (e.at or "").endswith(" forward")]
    acts = [facts.at(e.seq).get("activations", 0) for e in marks]
    return [b - a for a, b in zip([0, *acts], acts)]


def check_activations_dominate(trace, runs):
    at_peak = lessons.peak_by_category(trace)
    largest = max(at_peak, key=at_peak.get)
    assert largest == "activations", f"the largest category at the peak is {largest}"
    per_block = _per_block(trace)
    assert len(set(per_block)) == 1, f"the blocks save different amounts: {per_block}"
    return {"largest": category_word(largest), "acts": lessons.kib(at_peak["activations"]),
            "params": lessons.kib(at_peak["parameters"]), "per_block": lessons.kib(per_block[0]),
            "blocks": len(per_block), "times": f"{at_peak['activations'] / at_peak['parameters']:.1f}"}


def check_grows_then_falls(trace, runs):
    facts = memory(trace)
    acts = list(facts.by_category["activations"])
    top = acts.index(max(acts))
    assert 0 < top < len(acts) - 1, "the activations peak neither at the start nor at the end"
    assert acts[:top + 1] == sorted(acts[:top + 1]), "activations shrink during the forward"
    assert acts[-1] == 0, f"{acts[-1]} bytes of activations are left after the backward"
    per_block = _per_block(trace)
    assert len(set(per_block)) == 1, f"the blocks save different amounts: {per_block}"
    at_peak = facts.peak.by_category
    return {"per_block": lessons.kib(per_block[0]), "blocks": len(per_block), "top": lessons.kib(acts[top]),
            "peak": lessons.kib(facts.peak.total), "acts_share": lessons.percent(acts[top] / facts.peak.total),
            "params": lessons.kib(at_peak["parameters"])}
