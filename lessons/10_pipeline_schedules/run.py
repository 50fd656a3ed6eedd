"""Lesson 10: one 2-stage model under GPipe, 1F1B and ZB-H1: the Schedule timeline, its bubble, memory per stage."""
from ckpt_viz import lessons
from ckpt_viz.analysis.actions import bubbles
from ckpt_viz.analysis.lifecycle import recompute_time
from ckpt_viz.analysis.memory import stage_peaks


def record_pipeline(schedule="GPipe", microbatches=4):
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
    return run_pipeline(spec, schedule=schedule, microbatches=microbatches,
                        memory=True)


def record_1f1b(microbatches=4):
    return record_pipeline("1F1B", microbatches)


def record_zbh1(microbatches=4):
    return record_pipeline("ZB-H1", microbatches)


def _figures(trace, name):
    (step,) = bubbles(trace).steps
    peaks = stage_peaks(trace)
    return {f"bubble_{name}": lessons.percent(step.bubble), f"ticks_{name}": f"{step.length:g}",
            f"stages_{name}": ", ".join(f"stage {s} {lessons.kib(b)}" for s, b in peaks.items())}, step, peaks


def check_gpipe_against_1f1b(trace, runs):
    gpipe, g_step, g_peaks = _figures(trace, "gpipe")
    one, o_step, o_peaks = _figures(runs("record_1f1b"), "1f1b")
    assert abs(g_step.bubble - o_step.bubble) < 1e-9, (g_step.bubble, o_step.bubble)
    assert all(o_peaks[s] <= g_peaks[s] for s in g_peaks) and o_peaks != g_peaks, (o_peaks, g_peaks)
    handles = {e.handle_id: e.tags.get("stage") for e in trace.of_kind("handle_created")}
    per_stage = {s: sum(1 for h, st in handles.items() if st == s) for s in set(handles.values())}
    mb = len({e.tags.get("microbatch") for e in trace.of_kind("handle_created")})
    assert len(set(per_stage.values())) == 1, per_stage
    return {**gpipe, **one, "stages": len(per_stage), "per_stage": next(iter(per_stage.values())) // mb}


def check_zbh1_against_1f1b(trace, runs):
    one, o_step, o_peaks = _figures(trace, "1f1b")
    zb, z_step, z_peaks = _figures(runs("record_zbh1"), "zb")
    assert z_step.bubble < o_step.bubble, (z_step.bubble, o_step.bubble)
    last = list(z_peaks)[-1]
    assert z_peaks[last] > o_peaks[last], (z_peaks, o_peaks)
    return {**one, **zb, "last": last}


def check_any_schedule(trace, runs):
    figures, _, peaks = _figures(trace, "run")
    spent = recompute_time(trace)
    assert spent.replays > 0 and len(peaks) == 2
    return {**figures, "replays": spent.replays, "time": lessons.ms(spent.replay_ns)}
