"""Lesson 9: the built-in excluded model (reentrant: its replay runs the whole block), beside mode none."""
from ckpt_viz import lessons


def record_excluded():
    return lessons.builtin("excluded", "reentrant")


def record_none():
    return lessons.builtin("excluded", "none")


def check_kept(trace, runs):
    saved = trace.of_kind("exclude_saved")
    assert len(saved) == 3, len(saved)
    kept = max(s.bytes_by_category["excluded_outputs"] for s in trace.memory)
    assert kept > 0
    return f"{len(saved)} excluded outputs saved; up to {lessons.kib(kept)} kept"


def check_reused_and_lower(trace, runs):
    reused = trace.of_kind("exclude_reused")
    assert len(reused) == 3 and trace.count("replay_started") == 3
    with_ckpt, without = lessons.peak(trace), lessons.peak(runs("record_none"))
    assert with_ckpt < 0.9 * without, (with_ckpt, without)
    return (f"3 replays reused 3 kept outputs; peak {lessons.kib(with_ckpt)} versus {lessons.kib(without)} "
            "without checkpointing")
