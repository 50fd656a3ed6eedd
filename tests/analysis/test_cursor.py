"""What the views ask at one cursor, from the analysis: handle states, the memory reading and the snapshot at a seq,
with gaps in the seqs and sparse samples, on a recorded and a loaded trace; each result computed once per trace and
rebuilt when the trace changes, and gone with its trace. (Re-homes tests/trace/test_index.py's TraceIndex.)
"""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.passes import passes
from ckpt_viz.analysis.routing import snapshot_before
from ckpt_viz.analysis.summary import summary
from ckpt_viz.events import Released
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import STATES
from traces import Builder, nonreentrant_trace, refused_trace, split_trace, synthetic_trace


def test_split_trace_states_at_every_step() -> None:
    life = lifecycle(split_trace())
    assert life.handle_ids == [0, 1]
    # 1. Forward: h1 does not exist until seq 3.
    assert life.states_at(0) == {0: "recorded", 1: "not_created"}
    assert life.states_at(3) == {0: "recorded", 1: "recorded"}
    # 2. Phase dx set at 6 (h0) and 7 (h1), before any replay.
    assert life.states_at(6) == {0: "phase_dx", 1: "recorded"}
    # 3. DX: h1 replays at 9-10 and routes its grads at 11, h0 at 13-15; DX keeps both replays.
    assert life.states_at(9) == {0: "phase_dx", 1: "replaying"}
    assert life.states_at(10) == {0: "phase_dx", 1: "replayed"}
    assert life.states_at(12) == {0: "phase_dx", 1: "retained"}
    assert life.states_at(15) == {0: "retained", 1: "retained"}
    # 4. DW releases h1 at 20 and h0 at 23; node_collected does not change a released handle.
    assert life.states_at(20) == {0: "retained", 1: "released"}
    assert life.states_at(None) == {0: "released", 1: "released"}
    assert [(t.seq, t.state) for t in life.transitions(1)] == [(3, "recorded"), (7, "phase_dx"), (9, "replaying"),
                                                               (10, "replayed"), (11, "retained"), (20, "released")]
    assert set(life.states_at(None).values()) <= set(STATES)


def test_a_handle_seen_first_by_a_phase_set_is_recorded_then_in_its_phase_at_the_first_seq() -> None:
    b = Builder()
    b.ev("phase_set", 7, phase="dw", old="ordinary", new="dw")
    b.ev("backward_entered", 7, phase="dw")
    b.ev("replay_started", 7, phase="dw", trigger="backward")
    life = lifecycle(b.trace())
    assert [(t.seq, t.state, t.kind) for t in life.transitions(7)] == [
        (0, "recorded", None), (0, "phase_dw", "phase_set"), (2, "replaying", "replay_started")]
    assert [life.state_at(7, s) for s in (0, 1, 2)] == ["phase_dw", "phase_dw", "replaying"]
    assert life.state_at(99, 2) == "not_created"


def test_memory_and_snapshot_at_a_cursor() -> None:
    trace = split_trace()
    facts = memory(trace)
    assert facts.at(5) == trace.memory[5].bytes_by_category and facts.index_at(5) == 5
    assert facts.at(None) == trace.memory[-1].bytes_by_category
    assert facts.total_at(None) == trace.memory[-1].total_nbytes
    assert snapshot_before(trace, 2) is trace.graphs[0]  # before every snapshot: the first one
    assert snapshot_before(trace, 10_000) is trace.graphs[0]
    assert passes(trace).part_at(7) == "DX" and passes(trace).part_at(1) == "F" and passes(trace).part_at(-1) is None


def test_gaps_in_seqs_and_sparse_memory() -> None:
    whole = split_trace()
    trace = Trace(events=whole.events[::2], memory=whole.memory[::5], graphs=whole.graphs)
    facts = memory(trace)
    assert [e.seq for e in trace.events] == list(range(0, 26, 2))
    assert facts.seqs == (0, 5, 10, 15, 20, 25)
    assert facts.at(4) == whole.memory[0].bytes_by_category  # the last sample at or before the cursor
    assert facts.index_at(5) == 1 and facts.index_at(9) == 1 and facts.index_at(-1) is None and facts.at(-1) == {}
    assert lifecycle(trace).states_at(5) == lifecycle(trace).states_at(4)  # no event at 5: the state at 4
    empty = Trace()
    assert memory(empty).at(3) == {} and memory(empty).peak is None and snapshot_before(empty, 3) is None


def test_a_loaded_trace_gives_the_same_answers(tmp_path: Path) -> None:
    trace = split_trace()
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    for seq in [*range(-1, 27), None]:
        assert lifecycle(loaded).states_at(seq) == lifecycle(trace).states_at(seq)
        assert memory(loaded).at(seq) == memory(trace).at(seq)
    assert memory(loaded).peak == memory(trace).peak and summary(loaded) == summary(trace)


def test_each_result_is_computed_once_rebuilt_when_the_trace_changes_and_gone_with_it() -> None:
    trace = refused_trace()
    first = lifecycle(trace)
    assert lifecycle(trace) is first and summary(trace) is summary(trace)
    trace.events.append(Released(seq=11, t_ns=11, handle_id=5, reason="explicit_release"))  # grows
    assert lifecycle(trace) is not first and lifecycle(trace).handle_ids == [0, 5]
    before = summary(trace)
    trace.meta = {"model": "renamed"}  # replaced
    assert summary(trace) is not before and summary(trace).model == "renamed"
    for other in (split_trace(), nonreentrant_trace()):
        assert lifecycle(other) is not lifecycle(trace)
    alive = weakref.ref(trace)
    del trace, first, before
    gc.collect()
    assert alive() is None  # nothing outside the trace keeps it (its results live on it)


@pytest.mark.slow
def test_a_million_events_answer_cursor_queries() -> None:
    # How fast: benchmarks (bench_views.py); here, that the answers are right at that size.
    trace = synthetic_trace(1_000_000)
    life, facts = lifecycle(trace), memory(trace)
    assert len(life.handle_ids) == 77_000  # 1,000,000 / 13 steps per handle
    for cursor in (0, 500_000, 999_999):
        assert len(life.states_at(cursor)) == 77_000
        assert facts.seqs[facts.index_at(cursor)] == cursor - cursor % 10
    # Wave 38 (events 494,000..506,999) is at step 6 (replay_finished) for seqs 500,000..500,999.
    mid = life.states_at(500_000)
    assert mid[38_000] == "replayed" and mid[38_001] == "replaying"
    assert mid[0] == "released" and mid[76_999] == "not_created"
