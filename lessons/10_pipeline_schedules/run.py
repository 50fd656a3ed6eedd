"""Lesson 10: the built-in pipeline model, 4 micro-batches, under GPipe, 1F1B and ZB-H1."""
from ckpt_viz import lessons


def record_gpipe():
    return lessons.builtin("pipeline", "pipeline", schedule="GPipe", microbatches=4)


def record_1f1b():
    return lessons.builtin("pipeline", "pipeline", schedule="1F1B", microbatches=4)


def record_zbh1():
    return lessons.builtin("pipeline", "pipeline", schedule="ZB-H1", microbatches=4)


def lifetimes(trace):
    """Per stage, the mean number of events from a handle's creation to its release."""
    created = {e.handle_id: (e.seq, int(e.tags["stage"])) for e in trace.of_kind("handle_created")}
    spans = {}
    for e in trace.of_kind("released"):
        start, stage = created[e.handle_id]
        spans.setdefault(stage, []).append(e.seq - start)
    return {stage: sum(v) / len(v) for stage, v in sorted(spans.items())}


def stage_peaks(trace):
    peaks = {}
    for sample in trace.memory:
        for stage, cats in sample.by_stage.items():
            peaks[int(stage)] = max(peaks.get(int(stage), 0), sum(cats.values()))
    return peaks


def check_gpipe_holds_longest(trace, runs):
    mine, other = lifetimes(trace), lifetimes(runs("record_1f1b"))
    assert all(mine[s] > other[s] for s in mine), (mine, other)
    return "mean handle lifetime (events) per stage, GPipe: " + ", ".join(f"stage {s} {v:.0f}" for s, v in mine.items())


def check_1f1b_releases_sooner(trace, runs):
    mine, gpipe = stage_peaks(trace), stage_peaks(runs("record_gpipe"))
    assert all(mine[s] <= gpipe[s] for s in mine), (mine, gpipe)
    life = lifetimes(trace)
    return ("1F1B per stage: " + ", ".join(f"stage {s} peak {mine[s]:,} B (GPipe {gpipe[s]:,} B), "
                                          f"lifetime {life[s]:.0f}" for s in mine))


def check_zbh1_holds_until_dw(trace, runs):
    zb, one = lifetimes(trace), lifetimes(runs("record_1f1b"))
    assert zb[1] > one[1], (zb, one)
    assert stage_peaks(trace)[1] > stage_peaks(runs("record_1f1b"))[1]
    kinds = {a[0] for a in trace.meta["actions"]}
    assert kinds == {"F", "DX", "DW"}, kinds
    return f"stage 1 handle lifetime: ZB-H1 {zb[1]:.0f} events, 1F1B {one[1]:.0f}"
