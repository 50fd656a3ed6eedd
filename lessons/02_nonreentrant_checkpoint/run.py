"""Lesson 2: the built-in mlp with torch's non-reentrant checkpoint on every block."""
from ckpt_viz import lessons


def record_nonreentrant():
    return lessons.builtin("mlp", "nonreentrant")


def record_none():
    return lessons.builtin("mlp", "none")


def check_holders(trace, runs):
    packed = trace.of_kind("tensor_packed")
    per_handle = {h: sum(1 for e in packed if e.handle_id == h) for h in trace.handle_ids()}
    assert len(per_handle) == 4 and all(n > 0 for n in per_handle.values()), per_handle
    return f"{len(packed)} holders packed over {len(per_handle)} checkpoints"


def check_one_replay_each_in_reverse(trace, runs):
    counts = lessons.replays(trace)
    assert set(counts.values()) == {1}, counts
    order = [e.handle_id for e in trace.of_kind("replay_started")]
    assert order == sorted(order, reverse=True), order
    return "replay order: " + ", ".join(f"h{h}" for h in order)


def check_early_stop_and_lower_peak(trace, runs):
    assert trace.count("early_stopped") == trace.count("replay_started") == 4
    with_ckpt, without = lessons.peak(trace), lessons.peak(runs("record_none"))
    assert with_ckpt < 0.9 * without, (with_ckpt, without)
    return f"4 early stops; peak {lessons.kib(with_ckpt)} checkpointed versus {lessons.kib(without)} without"
