"""phase_spans / aligned_x / aligned_seq on hand-built traces: which pass each event belongs to."""
from __future__ import annotations

from ckpt_viz.render.phases import aligned_seq, aligned_x, event_actions, phase_spans
from ckpt_viz.trace import Trace
from traces import Builder, nonreentrant_trace, refused_trace, split_trace


def _spans(trace: Trace) -> list[tuple[str, int, int]]:
    return [(s["action"], s["start_seq"], s["end_seq"]) for s in phase_spans(trace)]


def test_split_reentrant_has_a_forward_a_dx_and_a_dw_pass() -> None:
    assert _spans(split_trace()) == [("F", 0, 6), ("DX", 6, 16), ("DW", 16, 25)]


def test_an_ordinary_backward_is_one_full_backward() -> None:
    assert _spans(refused_trace()) == [("F", 0, 3), ("B", 3, 10)]


def test_non_reentrant_split_passes_follow_its_sessions() -> None:
    # 5: a retaining session is activated (DX); 11: the next session (DW); 16: a new frame's forward.
    actions = event_actions(nonreentrant_trace())
    assert actions[:5] == ["F"] * 5 and actions[5:11] == ["DX"] * 6 and actions[11:16] == ["DW"] * 5
    assert actions[16] == "F"


def test_samples_alone_split_at_the_first_backward_sample() -> None:
    b = Builder()
    for at in ("blocks.0 forward", "loss", "blocks.0 backward", "end"):
        b.ev("memory_sampled", at=at)
    assert _spans(b.trace()) == [("F", 0, 2), ("B", 2, 3)]


def test_aligned_axis_and_its_inverse() -> None:
    trace = split_trace()
    _, xs = aligned_x(trace)
    assert xs[0] == 0.0 and xs[6] == 1.0 and xs[16] == 2.0 and xs[-1] == 3.0
    assert xs == sorted(xs)
    assert aligned_seq(trace, 1.0) == 6 and aligned_seq(trace, 0.49) == 3 and aligned_seq(trace, 9.0) == 25
    assert aligned_seq(Trace(), 1.0) is None and phase_spans(Trace()) == []
