"""Lesson 7: recompute sessions (the built-in mlp, split-nonreentrant) and a prefire run written with the runtime."""
from ckpt_viz import lessons


def record_session():
    return lessons.builtin("mlp", "split-nonreentrant")


record_prefire = lessons.runs.record_prefire  # the runtime written out: see its source in the step


def check_one_replay_two_passes(trace, runs):
    counts = lessons.replays(trace)
    assert sorted(counts) == [0, 1, 2, 3] and set(counts.values()) == {1}, counts
    activations = trace.of_kind("session_activated")
    assert [e.retain_on_unpack for e in activations] == [True, False]
    assert trace.count("tensor_unpacked") == 2 * trace.count("tensor_packed")
    return (f"{len(counts)} replays for 2 passes; {trace.count('tensor_unpacked')} unpacks of "
            f"{trace.count('tensor_packed')} holders (each twice)")


def check_prefire_before_backward(trace, runs):
    fired = trace.of_kind("prefired")
    assert len(fired) == 2 and {e.path for e in fired} == {"in_session"}
    counts = lessons.replays(trace)
    assert len(counts) == 2 and set(counts.values()) == {1}, counts
    first_unpack = trace.of_kind("tensor_unpacked")[0].seq
    assert all(e.seq < first_unpack for e in trace.of_kind("replay_started"))
    return "2 prefires, 1 replay per checkpoint, both before the first unpack"
