"""Lesson 14: how much memory for which recompute: the planner's trade-off curve from one profiled step
(`ckpt_viz.plan`), a budget's recommendation, and its check by running it."""
from ckpt_viz import lessons


def make_model(depth=8, width=32, hidden=128):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)

        def forward(self, x):
            return x + self.fc2(torch.tanh(self.fc1(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Block() for _ in range(depth))
            self.head = nn.Linear(width, 8)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    torch.manual_seed(0)
    return Net()


def record_profile(depth=8, batch=512):
    import torch

    import ckpt_viz
    import ckpt_viz.plan as plan

    model = make_model(depth)
    x = torch.randn(batch, 32)
    with plan.profiling(model, tensors=(x,)) as prof:  # one step, no checkpoint
        model(x).pow(2).sum().backward()
    model.zero_grad(set_to_none=True)
    # the same step, recorded: a profile and memory=True both read the
    # allocator, so one at a time
    with ckpt_viz.record(memory=True, model=model, tensors=(x,)) as rec:
        loss = model(x).pow(2).sum()
        rec.mark("loss")
        loss.backward()
        rec.mark("end")
    plan.attach(rec.trace, prof.profile)  # the profile travels with the trace
    return rec.trace


def record_budget(budget=70, depth=8, batch=512):
    import torch

    import ckpt_viz
    import ckpt_viz.plan as plan

    model = make_model(depth)
    x = torch.randn(batch, 32)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).sum().backward()

    with plan.profiling(model, tensors=(x,)) as prof:
        step()
    none = plan.predict(prof.profile, plan.Policy())  # nothing checkpointed
    advice = plan.recommend(prof.profile, budget=none.peak * budget // 100)
    # run it and measure its peak
    checked = plan.verify(advice, model=model, step=step, tensors=(x,))
    with plan.apply(model, advice.prediction.policy):  # the same policy, recorded
        with ckpt_viz.record(memory=True, model=model, tensors=(x,)) as rec:
            step()
    trace = rec.trace
    plan.attach(trace, prof.profile)
    trace.meta["plan"] = {"words": advice.words, "predicted": advice.prediction.peak,
                          "measured": checked.measured_peak,
                          "blocks": sorted(advice.prediction.policy.blocks),
                          "code": plan.code(advice.prediction.policy, runtime="torch")}
    return trace


def check_curve(trace, runs):
    import ckpt_viz.plan as plan

    profile = plan.profile_of(trace)
    points = sorted(plan.curve(profile), key=lambda p: p.recompute_ns)
    peaks = [p.peak for p in points]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks), peaks
    assert not points[0].blocks, "the curve's cheapest point checkpoints something"
    depth = len(profile.blocks)
    least = points[-1]
    assert len(points) < 2 ** depth
    last = profile.blocks[-1].name
    assert not any(last in p.blocks for p in points), f"a point of the curve checkpoints {last}"
    return {"points": len(points), "subsets": 2 ** depth, "depth": depth,
            "most": lessons.kib(points[0].peak), "least": lessons.kib(least.peak),
            "least_blocks": len(least.blocks), "least_ms": lessons.ms(least.recompute_ns)}


def check_budget(trace, runs, knobs):
    facts = trace.meta["plan"]
    error = (facts["predicted"] - facts["measured"]) / facts["measured"]
    assert abs(error) <= 0.05, facts
    return {"words": facts["words"], "predicted": lessons.kib(facts["predicted"]),
            "measured": lessons.kib(facts["measured"]), "error": lessons.percent(abs(error)),
            "blocks": ", ".join(facts["blocks"]) or "none"}
