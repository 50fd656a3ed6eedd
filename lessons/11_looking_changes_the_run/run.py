"""Lesson 11: count a non-reentrant checkpoint's forward calls under torchviz.make_dot and ckpt_viz's snapshots."""


def _setup():
    import torch

    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    calls = {"forward": 0}

    def block(t):
        calls["forward"] += 1
        return torch.tanh(t @ w) * 2

    return torch.randn(8, 16, requires_grad=True), w, block, calls


def record_make_dot_saved():
    import torchviz

    from ckpt_viz import record
    from ckpt_viz.runtime import checkpoint

    x, w, block, calls = _setup()
    with record() as rec:
        y = checkpoint(block, x, use_reentrant=False)
        after_forward = calls["forward"]
        torchviz.make_dot(y.sum(), params={"w": w}, show_attrs=True, show_saved=True)
        after_make_dot = calls["forward"]
        plain = checkpoint(block, x, use_reentrant=False)
        before_plain = calls["forward"]
        torchviz.make_dot(plain.sum(), params={"w": w})
        after_plain = calls["forward"]
    rec.trace.meta.update(after_forward=after_forward, after_make_dot=after_make_dot,
                          plain_make_dot=after_plain - before_plain)
    return rec.trace


def record_snapshot():
    from ckpt_viz import record
    from ckpt_viz.runtime import checkpoint

    x, _, block, calls = _setup()
    with record(graphs=True) as rec:
        y = checkpoint(block, x, use_reentrant=False)
        y.sum().backward()
    rec.trace.meta.update(forward_calls=calls["forward"])
    return rec.trace


def check_make_dot_replays(trace, runs):
    meta = trace.meta
    extra = meta["after_make_dot"] - meta["after_forward"]
    assert meta["after_forward"] == 1 and extra > 1, meta
    replays = trace.of_kind("replay_started")
    assert len(replays) == extra and {e.data["trigger"] for e in replays} == {"prefire"}
    assert meta["plain_make_dot"] == 0, meta
    return f"make_dot(show_saved=True) called the block's forward {extra} more times; plain make_dot 0 times"


def check_snapshot_does_not_replay(trace, runs):
    assert len(trace.graphs) >= 1, "no graph snapshot"
    assert trace.meta["forward_calls"] == 2, trace.meta
    (replay,) = trace.of_kind("replay_started")
    assert replay.data["trigger"] == "backward"
    return f"{len(trace.graphs)} graph snapshot(s); 2 forward calls (forward + the backward's replay)"
