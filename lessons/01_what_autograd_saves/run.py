"""Lesson 1: the built-in mlp without checkpointing; where its memory goes."""
from ckpt_viz import lessons


def record_none():
    return lessons.builtin("mlp", "none")


def check_activations_dominate(trace, runs):
    at_peak = lessons.peak_by_category(trace)
    largest = max(at_peak, key=at_peak.get)
    assert largest == "activations", f"the largest category at the peak is {largest}"
    assert at_peak["activations"] > 4 * at_peak["parameters"], at_peak
    acts, params = lessons.kib(at_peak["activations"]), lessons.kib(at_peak["parameters"])
    return f"at the peak: activations {acts}, parameters {params}"


def check_grows_then_falls(trace, runs):
    acts = [s.bytes_by_category["activations"] for s in trace.memory]
    top = acts.index(max(acts))
    assert 0 < top < len(acts) - 1, "the activations peak neither at the start nor at the end"
    rising = acts[:top + 1]
    assert rising == sorted(rising), "activations shrink during the forward"
    assert acts[-1] == 0, f"{acts[-1]} bytes of activations are left after the backward"
    return f"activations rise to {lessons.kib(acts[top])} over the forward and fall to 0 in the backward"
