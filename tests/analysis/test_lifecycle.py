"""ckpt_viz.analysis.lifecycle on hand-built traces: every transition of NOTE [ Handle states ], with exact seqs and
reasons."""
from __future__ import annotations

from pathlib import Path

from ckpt_viz.analysis.lifecycle import DERIVED_REASONS, Transition, lifecycle
from ckpt_viz.events import HandleCreated
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import STATE_MEANINGS, STATES
from traces import Builder, nonreentrant_trace, refused_trace, split_trace


def _changes(trace: Trace, h: int) -> list[tuple]:
    return [(t.seq, t.state, t.kind, t.reason) for t in lifecycle(trace).transitions(h)]


def test_one_vocabulary_with_a_plain_words_meaning_for_every_state() -> None:
    assert STATES == ("not_created", "recorded", "phase_dx", "phase_dw", "replaying", "replayed", "retained",
                      "released", "collected")
    assert tuple(STATE_MEANINGS) == STATES
    assert all(meaning.endswith(".") and len(meaning) < 120 for meaning in STATE_MEANINGS.values())
    assert set(DERIVED_REASONS) == {"consumed", "session_cleared"}


def test_split_reentrant_handle_dx_keeps_the_replay_dw_releases_it() -> None:
    trace = split_trace()
    assert lifecycle(trace).handle_ids == [0, 1]
    assert _changes(trace, 1) == [(3, "recorded", "handle_created", None), (7, "phase_dx", "phase_set", None),
                                  (9, "replaying", "replay_started", None), (10, "replayed", "replay_finished", None),
                                  (11, "retained", "grads_routed", None), (20, "released", "released", "dw_complete")]
    # 1. phase_set dw at 17 changes nothing: the handle is retained, the phase is only remembered.
    assert lifecycle(trace).state_at(1, 17) == "retained"
    # 2. node_collected after the release (seq 24) keeps it released.
    assert lifecycle(trace).state_at(1, None) == "released"
    assert lifecycle(trace).released(1) == Transition(seq=20, handle_id=1, state="released", kind="released",
                                                      reason="dw_complete")
    assert lifecycle(trace).replays(1) == 1 and lifecycle(trace).refusals(1) == []


def test_ordinary_release_then_a_refused_replay_is_a_mark_not_a_state() -> None:
    trace = refused_trace()
    life = lifecycle(trace)
    assert _changes(trace, 0) == [(0, "recorded", "handle_created", None), (4, "replaying", "replay_started", None),
                                  (5, "replayed", "replay_finished", None),
                                  (7, "released", "released", "ordinary_backward_complete")]
    assert life.refusals(0) == [Transition(seq=9, handle_id=0, state="released", kind="replay_refused",
                                           reason="released")]
    assert life.state_at(0, 9) == life.state_at(0, 10) == "released"
    assert life.reason_at(0, 10) == "ordinary_backward_complete" and life.reason_at(0, 3) is None


def test_phases_before_a_replay_and_a_failed_replay_back_to_the_waiting_phase() -> None:
    b = Builder()
    b.ev("handle_created", 0)                                    # 0
    b.ev("phase_set", 0, old="ordinary", new="dw")               # 1
    b.ev("phase_set", 0, old="dw", new="ordinary")               # 2
    b.ev("phase_set", 0, old="ordinary", new="dx")               # 3
    b.ev("replay_started", 0, trigger="backward")                # 4
    b.ev("replay_failed", 0, type="ValueError", message="boom")  # 5
    b.ev("released", 0, reason="backward_exception")             # 6
    b.ev("handle_created", 1)                                    # 7
    b.ev("replay_started", 1, trigger="backward")                # 8
    b.ev("replay_failed", 1, type="ValueError", message="boom")  # 9 no phase: back to recorded
    trace = b.trace()
    assert [(s, st) for s, st, _, _ in _changes(trace, 0)] == [
        (0, "recorded"), (1, "phase_dw"), (2, "recorded"), (3, "phase_dx"), (4, "replaying"), (5, "phase_dx"),
        (6, "released")]
    assert lifecycle(trace).released(0).reason == "backward_exception"
    assert [st for _, st, _, _ in _changes(trace, 1)] == ["recorded", "replaying", "recorded"]


def test_prefire_and_a_retaining_ordinary_backward_keep_the_replay() -> None:
    b = Builder()
    b.ev("handle_created", 0, phase="ordinary")                      # 0
    b.ev("replay_started", 0, phase="ordinary", trigger="prefire")   # 1
    b.ev("replay_finished", 0, phase="ordinary", trigger="prefire")  # 2 prefire: retained
    b.ev("backward_entered", 0, phase="ordinary")                    # 3
    b.ev("grads_routed", 0, phase="ordinary", targets=[0])           # 4
    b.ev("handle_created", 1, phase="ordinary")                      # 5
    b.ev("backward_entered", 1, phase="ordinary")                    # 6
    b.ev("replay_started", 1, phase="ordinary", trigger="backward")  # 7
    b.ev("replay_finished", 1, phase="ordinary", trigger="backward")  # 8
    b.ev("grads_routed", 1, phase="ordinary", targets=[0])           # 9 no release follows: retained from 9
    b.ev("backward_entered", 1, phase="ordinary")                    # 10
    b.ev("grads_routed", 1, phase="ordinary", targets=[0])           # 11 this time the release follows
    b.ev("released", 1, phase="ordinary", reason="ordinary_backward_complete")  # 12
    b.ev("handle_created", 2, phase="ordinary")                      # 13
    b.ev("replay_started", 2, phase="ordinary", trigger="backward")  # 14
    b.ev("replay_finished", 2, phase="ordinary", trigger="backward")  # 15
    b.ev("grads_routed", 2, phase="ordinary", targets=[0])           # 16 last event: retained
    trace = b.trace()
    assert [(s, st, k) for s, st, k, _ in _changes(trace, 0)] == [
        (0, "recorded", "handle_created"), (1, "replaying", "replay_started"), (2, "retained", "replay_finished")]
    assert [(s, st) for s, st, _, _ in _changes(trace, 1)] == [
        (5, "recorded"), (7, "replaying"), (8, "replayed"), (9, "retained"), (12, "released")]
    assert lifecycle(trace).state_at(1, 11) == "retained"
    assert [(s, st) for s, st, _, _ in _changes(trace, 2)] == [
        (13, "recorded"), (14, "replaying"), (15, "replayed"), (16, "retained")]


def test_node_collected_before_any_replay_is_collected_after_a_replay_it_changes_nothing() -> None:
    b = Builder()
    b.ev("handle_created", 0)                                      # 0
    b.ev("phase_set", 0, old="ordinary", new="dx")                 # 1
    b.ev("node_collected", 0, was_replayed=False, released=False)  # 2 R10, even with a phase set
    b.ev("replay_refused", 0, reason="node_collected")             # 3
    b.ev("released", 0, reason="explicit_release")                 # 4
    b.ev("handle_created", 1)                                      # 5
    b.ev("replay_started", 1, trigger="prefire")                   # 6
    b.ev("replay_finished", 1, trigger="prefire")                  # 7
    b.ev("node_collected", 1, was_replayed=True, released=False)   # 8 a retained replay stays usable
    trace = b.trace()
    life = lifecycle(trace)
    assert [(s, st) for s, st, _, _ in _changes(trace, 0)] == [
        (0, "recorded"), (1, "phase_dx"), (2, "collected"), (4, "released")]
    assert life.refusals(0)[0].state == "collected" and life.refusals(0)[0].reason == "node_collected"
    assert life.states_at(None) == {0: "released", 1: "retained"}


def test_nonreentrant_frames_are_released_when_consumed_or_when_their_session_is_cleared() -> None:
    trace = nonreentrant_trace()
    assert _changes(trace, 0) == [(0, "recorded", "handle_created", None), (6, "replaying", "replay_started", None),
                                  (7, "replayed", "replay_finished", None), (8, "retained", "tensor_unpacked", None),
                                  (13, "released", "tensor_unpacked", "consumed")]
    assert _changes(trace, 1) == [(16, "recorded", "handle_created", None),
                                  (17, "replaying", "replay_started", None), (18, "replayed", "replay_finished", None),
                                  (19, "retained", "tensor_unpacked", None),
                                  (20, "released", "session_cleared", "session_cleared")]
    # The session_cleared at 15 lists h0, already released: nothing changes.
    assert lifecycle(trace).releases(0) == [lifecycle(trace).released(0)]
    assert trace.count("released") == 0


def test_a_nonreentrant_frame_recomputed_by_a_new_backward_is_released_again() -> None:
    b = Builder()
    kw = {"mode": "nonreentrant"}
    b.ev("handle_created", 0, **kw)                                              # 0
    b.ev("forward_finished", 0, saved_count=1, **kw)                             # 1
    for _ in range(2):                                                           # 2-4, 5-7: two graph tasks
        b.ev("replay_started", 0, trigger="backward", **kw)
        b.ev("replay_finished", 0, trigger="backward", saved_count=1, **kw)
        b.ev("tensor_unpacked", 0, index=0, key_source="graph_task", retain=False, consumed=True, **kw)
    b.ev("session_cleared", frames=[0])                                          # 8 released already
    trace = b.trace()
    life = lifecycle(trace)
    assert [(s, st) for s, st, _, _ in _changes(trace, 0)] == [
        (0, "recorded"), (2, "replaying"), (3, "replayed"), (4, "released"), (5, "replaying"), (6, "replayed"),
        (7, "released")]
    assert life.replays(0) == 2 and [t.seq for t in life.releases(0)] == [4, 7] and life.released(0).seq == 4


def test_a_session_cleared_while_a_frame_is_only_recorded_changes_nothing() -> None:
    b = Builder()
    b.ev("handle_created", 0, mode="nonreentrant")  # 0
    b.ev("session_cleared", frames=[0])             # 1
    assert lifecycle(b.trace()).states_at(None) == {0: "recorded"}


def test_a_handle_first_seen_after_the_recording_started_was_recorded_from_the_first_seq() -> None:
    b = Builder()
    b.ev("handle_created", 3)                        # 0
    b.ev("backward_entered", 7)                      # 1
    b.ev("replay_started", 7, trigger="backward")    # 2
    trace = b.trace()
    assert _changes(trace, 7) == [(0, "recorded", None, None), (2, "replaying", "replay_started", None)]
    assert lifecycle(trace).state_at(99, 2) == "not_created" and lifecycle(trace).transitions(99) == []


def test_state_at_states_at_and_counts_at_agree_at_every_seq() -> None:
    for trace in (split_trace(), refused_trace(), nonreentrant_trace()):
        life = lifecycle(trace)
        for seq in [e.seq for e in trace.events] + [None]:
            states = life.states_at(seq)
            assert states == {h: life.state_at(h, seq) for h in life.handle_ids}
            assert sum(life.counts_at(seq).values()) == len(states)
            assert list(life.counts_at(seq)) == [s for s in STATES if s in states.values()]
    assert lifecycle(split_trace()).counts_at(4) == {"recorded": 2}
    assert lifecycle(split_trace()).counts_at(2) == {"not_created": 1, "recorded": 1}


def test_cached_per_trace_rebuilt_when_it_grows_and_equal_on_a_loaded_trace(tmp_path: Path) -> None:
    trace = split_trace()
    assert lifecycle(trace) is lifecycle(trace)
    before = lifecycle(trace)
    trace.events.append(HandleCreated(seq=26, t_ns=26_000, handle_id=9))
    assert lifecycle(trace) is not before and lifecycle(trace).handle_ids == [0, 1, 9]
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    assert all(lifecycle(loaded).transitions(h) == lifecycle(trace).transitions(h) for h in (0, 1, 9))
    assert lifecycle(Trace()).handle_ids == [] and lifecycle(Trace()).states_at(None) == {}
