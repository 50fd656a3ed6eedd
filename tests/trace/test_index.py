"""TraceIndex: handle states (from the lifecycle), memory and snapshots at a cursor; fast on a million events."""
from __future__ import annotations

import gc
from pathlib import Path

import pytest

from ckpt_viz.trace import EventColumns, Trace
from ckpt_viz.trace.index import STATES, TraceIndex, derived, event_column
from ckpt_viz.trace.lifecycle import lifecycle
from traces import Builder, nonreentrant_trace, refused_trace, split_trace, synthetic_trace


def test_split_trace_states_at_every_step() -> None:
    index = TraceIndex(split_trace())
    assert index.handles == [0, 1]
    assert index.seqs == list(range(26))
    # 1. Forward: h1 does not exist until seq 3.
    assert index.handle_states(0) == {0: "recorded", 1: "not_created"}
    assert index.handle_states(3) == {0: "recorded", 1: "recorded"}
    # 2. Phase dx set at 6 (h0) and 7 (h1), before any replay.
    assert index.handle_states(6) == {0: "phase_dx", 1: "recorded"}
    # 3. DX: h1 replays at 9-10 and routes its grads at 11, h0 at 13-15; DX keeps both replays.
    assert index.handle_states(9) == {0: "phase_dx", 1: "replaying"}
    assert index.handle_states(10) == {0: "phase_dx", 1: "replayed"}
    assert index.handle_states(12) == {0: "phase_dx", 1: "retained"}
    assert index.handle_states(15) == {0: "retained", 1: "retained"}
    # 4. DW releases h1 at 20 and h0 at 23; node_collected does not change a released handle.
    assert index.handle_states(20) == {0: "retained", 1: "released"}
    assert index.handle_states(None) == {0: "released", 1: "released"}
    assert index.transitions(1) == [(3, "recorded"), (7, "phase_dx"), (9, "replaying"), (10, "replayed"),
                                    (11, "retained"), (20, "released")]
    assert set(index.handle_states(None).values()) <= set(STATES)


def test_handle_state_matches_handle_states_at_every_cursor() -> None:
    for trace in (split_trace(), refused_trace(), nonreentrant_trace()):
        index = TraceIndex(trace)
        for seq in index.seqs:
            assert index.handle_states(seq) == {h: index.handle_state(h, seq) for h in index.handles}


def test_handle_seen_first_without_handle_created_was_recorded_before() -> None:
    b = Builder()
    b.ev("phase_set", 7, phase="dw", old="ordinary", new="dw")
    b.ev("backward_entered", 7, phase="dw")
    b.ev("replay_started", 7, phase="dw", trigger="backward")
    index = TraceIndex(b.trace())
    # Recorded from the trace's first seq (a transition with no event), then phase_set at that same seq.
    assert [(t.seq, t.state, t.kind) for t in index.lifecycle.transitions(7)] == [
        (0, "recorded", None), (0, "phase_dw", "phase_set"), (2, "replaying", "replay_started")]
    assert index.handle_state(7, 0) == "phase_dw"
    assert index.handle_state(7, 1) == "phase_dw"
    assert index.handle_state(7, 2) == "replaying"
    assert index.handle_state(99, 2) == "not_created"


def test_failed_replay_goes_back_to_recorded_then_released() -> None:
    b = Builder()
    b.ev("handle_created", 0)
    b.ev("replay_started", 0, trigger="backward")
    b.ev("replay_failed", 0, type="ValueError", message="boom")
    b.ev("released", 0, reason="backward_exception", was_replayed=False)
    index = TraceIndex(b.trace())
    assert [index.handle_state(0, s) for s in range(4)] == ["recorded", "replaying", "recorded", "released"]


def test_node_collected_before_replay_is_its_own_state_after_replay_it_is_not() -> None:
    b = Builder()
    b.ev("handle_created", 0)
    b.ev("node_collected", 0, was_replayed=False, released=False)  # R10
    b.ev("handle_created", 1)
    b.ev("replay_started", 1, trigger="prefire")
    b.ev("replay_finished", 1, trigger="prefire")
    b.ev("node_collected", 1, was_replayed=True, released=False)  # a retained replay stays usable
    index = TraceIndex(b.trace())
    assert index.handle_states(None) == {0: "collected", 1: "retained"}  # a prefire keeps its replay


def test_nonreentrant_frame_is_released_when_consumed_or_cleared() -> None:
    index = TraceIndex(nonreentrant_trace())
    # Recompute at 6-7, then a retaining DX session: unpacks keep the recomputed tensors.
    assert [index.handle_state(0, s) for s in (5, 6, 7, 8, 9)] == [
        "recorded", "replaying", "replayed", "retained", "retained"]
    # DW consumes both saved tensors: released at the second consumed unpack (seq 13).
    assert index.handle_state(0, 12) == "retained"
    assert index.handle_state(0, 13) == "released"
    assert lifecycle(nonreentrant_trace()).released(0).reason == "consumed"
    # h1 keeps its tensor until session_cleared lists it (seq 20).
    assert index.handle_state(1, 19) == "retained"
    assert index.handle_state(1, 20) == "released"


def test_memory_snapshot_and_position_at_a_cursor() -> None:
    trace = split_trace()
    index = TraceIndex(trace)
    assert index.memory_at(5) is trace.memory[5]
    assert index.memory_at(None) is trace.memory[-1]
    assert index.snapshot_at(2) is trace.graphs[0]  # before every snapshot: the first one
    assert index.snapshot_at(None) is trace.graphs[0]
    assert index.position(7) == 7 and index.position(None) == 25 and index.position(10_000) == 25


def test_gaps_in_seqs_and_sparse_memory() -> None:
    trace = split_trace()
    trace = Trace(events=trace.events[::2], memory=trace.memory[::5], graphs=trace.graphs)
    index = TraceIndex(trace)
    assert index.seqs == list(range(0, 26, 2))
    assert index.position(5) == 2  # the last event with seq <= 5 is seq 4
    assert index.memory_at(4).seq == 0 and index.memory_at(5).seq == 5 and index.memory_at(9).seq == 5
    assert list(index.window(3, 9)) == [2, 3, 4]  # seqs 4, 6, 8
    assert TraceIndex(Trace()).memory_at(3) is None and TraceIndex(Trace()).snapshot_at(3) is None


def test_loaded_trace_columns_give_the_same_answers(tmp_path: Path) -> None:
    trace = split_trace()
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    assert isinstance(loaded.events, EventColumns) and not loaded.events.materialized
    a, b = TraceIndex(trace), TraceIndex(loaded)
    assert all(a.handle_states(s) == b.handle_states(s) for s in a.seqs)
    assert b.memory_at(9) == a.memory_at(9)
    assert event_column(loaded, "kind") == [e.kind for e in trace.events]
    assert not loaded.events.materialized  # read through the columns, never turned into a list


def test_derived_is_computed_once_and_dropped_when_the_trace_grows_or_dies() -> None:
    trace = refused_trace()
    calls: list[int] = []

    def count(t: Trace) -> int:
        calls.append(1)
        return len(t.events)

    assert derived(trace, "n", count) == 11 and derived(trace, "n", count) == 11
    assert len(calls) == 1
    trace.events.append(trace.events[-1])
    assert derived(trace, "n", count) == 12 and len(calls) == 2
    assert TraceIndex.of(trace) is TraceIndex.of(trace)
    from ckpt_viz.trace import cache as module
    key = id(trace)
    del trace
    gc.collect()
    assert key not in module._DERIVED


@pytest.mark.slow
def test_a_million_events_index_and_answer_cursor_queries() -> None:
    # How fast: benchmarks/bench_views.py (build < 10 s, each cursor query < 0.05 s).
    trace = synthetic_trace(1_000_000)
    index = TraceIndex(trace)
    assert len(index.handles) == 77_000  # 1,000,000 / 13 steps per handle
    for cursor in (0, 500_000, 999_999):
        states = index.handle_states(cursor)
        sample = index.memory_at(cursor)
        position = index.position(cursor)
        assert position == cursor and sample is not None and sample.seq == cursor - cursor % 10
        assert len(states) == 77_000
    # Wave 38 (events 494,000..506,999) is at step 6 (replay_finished) for seqs 500,000..500,999.
    mid = index.handle_states(500_000)
    assert mid[38_000] == "replayed" and mid[38_001] == "replaying"
    assert mid[0] == "released" and mid[76_999] == "not_created"
