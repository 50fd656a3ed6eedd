"""Lesson 9: an excluded region: a long convolution, costly to recompute and cheap to keep, kept from the forward
and reused by the replay."""
from ckpt_viz import lessons
from ckpt_viz.analysis.handles import created_events
from ckpt_viz.analysis.lifecycle import lifecycle, recompute_time
from ckpt_viz.analysis.memory import memory


def make_blocks(depth, exclude, kernel=63, width=32):
    import torch
    from torch import nn

    import ckpt_viz

    class ConvBlock(nn.Module):
        """A long convolution over the sequence, then an MLP over the features."""

        def __init__(self):
            super().__init__()
            conv = nn.Conv1d(width, width, kernel, padding=kernel // 2)
            # excluded: run once in the forward, its output kept for the replay
            self.conv = ckpt_viz.checkpoint_exclude_wrapper(conv) if exclude else conv
            self.mlp = nn.Sequential(
                nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x):  # x: (batch, length, width)
            x = x + self.conv(x.transpose(1, 2)).transpose(1, 2)
            return x + self.mlp(x)

    torch.manual_seed(0)
    return nn.ModuleDict({f"block{i}": ConvBlock() for i in range(depth)})


def record_excluded(exclude=True, kernel=63, depth=3):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth, exclude, kernel)
    x = torch.randn(8, 512, 32)
    with ckpt_viz.record(memory=True, model=blocks) as rec:
        h = x
        for name, block in blocks.items():
            # reentrant: the replay runs the whole block again
            h = ckpt_viz.checkpoint(block, h, use_reentrant=True)
            rec.mark(f"after {name}")
        loss = h.pow(2).sum()
        rec.mark("loss")
        loss.backward()
        rec.mark("end")
    return rec.trace


def record_recomputed(kernel=63, depth=3):
    return record_excluded(False, kernel, depth)


def _conv_gflop(trace, kernel):
    """One convolution's GFLOP: 2 x batch x length x width^2 x kernel, from the shape the checkpoint recorded."""
    batch, length, width = next(iter(created_events(trace).values())).inputs[0].shape
    return f"{2 * batch * length * width * width * kernel / 1e9:.2f}"


def check_kept(trace, runs, knobs):
    saved = trace.of_kind("exclude_saved")
    handles = lifecycle(trace).handle_ids
    assert len(saved) == len(handles), (len(saved), handles)
    end = trace.of_kind("forward_finished")[-1].seq
    kept = memory(trace).at(end).get("excluded_outputs", 0)
    cached = sum(e.cached_nbytes for e in saved)
    assert kept >= cached > 0, (kept, cached)
    return {"saved": len(saved), "kept": lessons.kib(kept), "each": lessons.kib(saved[0].cached_nbytes),
            "cached": lessons.kib(cached), "gflop": _conv_gflop(trace, knobs["kernel"])}


def check_reused(trace, runs, knobs):
    other = runs("record_recomputed")
    reused = trace.of_kind("exclude_reused")
    replays = recompute_time(trace)
    assert len(reused) == replays.replays == recompute_time(other).replays, (len(reused), replays.replays)
    assert other.count("exclude_reused") == 0
    kept = max(memory(trace).by_category.get("excluded_outputs", (0,)))
    return {"reused": len(reused), "t_kept": lessons.ms(replays.replay_ns),
            "t_recomputed": lessons.ms(recompute_time(other).replay_ns), "kept": lessons.kib(kept),
            "peak_kept": lessons.kib(lessons.peak(trace)), "peak_recomputed": lessons.kib(lessons.peak(other)),
            "gflop": _conv_gflop(trace, knobs["kernel"])}


def check_knobs(trace, runs, knobs):
    spent = recompute_time(trace)
    reused = trace.count("exclude_reused")
    excluded = trace.count("exclude_saved") > 0
    assert reused == (spent.replays if excluded else 0), (reused, spent.replays)
    kept = max(memory(trace).by_category.get("excluded_outputs", (0,)))
    assert (kept > 0) == excluded
    return {"replays": spent.replays, "time": lessons.ms(spent.replay_ns), "kept": lessons.kib(kept),
            "peak": lessons.kib(lessons.peak(trace)), "how": "kept" if excluded else "recomputed",
            "gflop": _conv_gflop(trace, knobs["kernel"])}
