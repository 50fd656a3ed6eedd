"""Lesson 11: count a non-reentrant checkpoint's forward calls under torchviz.make_dot and ckpt_viz's snapshots."""
from ckpt_viz import lessons

record_make_dot_saved = lessons.runs.record_make_dot_saved  # torchviz on a non-reentrant checkpoint, counted
record_snapshot = lessons.runs.record_snapshot              # ckpt_viz's own snapshot, counted


def check_make_dot_replays(trace, runs):
    meta = trace.meta
    extra = meta["after_make_dot"] - meta["after_forward"]
    assert meta["after_forward"] == 1 and extra > 1, meta
    replays = trace.of_kind("replay_started")
    assert len(replays) == extra and {e.trigger for e in replays} == {"prefire"}
    assert meta["plain_make_dot"] == 0, meta
    return f"make_dot(show_saved=True) called the block's forward {extra} more times; plain make_dot 0 times"


def check_snapshot_does_not_replay(trace, runs):
    assert len(trace.graphs) >= 1, "no graph snapshot"
    assert trace.meta["forward_calls"] == 2, trace.meta
    (replay,) = trace.of_kind("replay_started")
    assert replay.trigger == "backward"
    return f"{len(trace.graphs)} graph snapshot(s); 2 forward calls (forward + the backward's replay)"
