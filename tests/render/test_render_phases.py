"""The parts of a step the charts draw (`ckpt_viz.analysis.passes`, NOTE [ Parts of a step ]) on hand-built traces:
which part each event belongs to, the spans the memory chart bands, and Compare's aligned axis and its inverse."""
from __future__ import annotations

from ckpt_viz.analysis.passes import passes
from ckpt_viz.trace import Trace
from traces import Builder, nonreentrant_trace, refused_trace, split_trace


def _spans(trace: Trace) -> list[tuple[str, int, int]]:
    return [(s.part, s.start_seq, s.end_seq) for s in passes(trace).spans]


def test_split_reentrant_has_a_forward_a_dx_and_a_dw_part() -> None:
    assert _spans(split_trace()) == [("F", 0, 6), ("DX", 6, 16), ("DW", 16, 25)]


def test_an_ordinary_backward_is_one_full_backward() -> None:
    assert _spans(refused_trace()) == [("F", 0, 3), ("B", 3, 10)]


def test_non_reentrant_split_parts_follow_its_sessions() -> None:
    # 5: a retaining session is activated (DX); 11: the next session (DW); 16: a new frame's forward.
    parts = list(passes(nonreentrant_trace()).of_event)
    assert parts[:5] == ["F"] * 5 and parts[5:11] == ["DX"] * 6 and parts[11:16] == ["DW"] * 5
    assert parts[16] == "F"


def test_samples_alone_split_at_the_first_backward_sample() -> None:
    b = Builder()
    for at in ("blocks.0 forward", "loss", "blocks.0 backward", "end"):
        b.ev("memory_sampled", at=at)
    assert _spans(b.trace()) == [("F", 0, 2), ("B", 2, 3)]


def test_aligned_axis_and_its_inverse() -> None:
    trace = split_trace()
    step = passes(trace)
    xs = step.aligned_x
    assert xs[0] == 0.0 and xs[6] == 1.0 and xs[16] == 2.0 and xs[-1] == 3.0
    assert list(xs) == sorted(xs)
    assert step.aligned_seq(1.0) == 6 and step.aligned_seq(0.49) == 3 and step.aligned_seq(9.0) == 25
    assert passes(Trace()).aligned_seq(1.0) is None and passes(Trace()).spans == ()
    assert step.part_at(7) == "DX" and step.part_at(-1) is None
