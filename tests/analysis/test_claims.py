"""ckpt_viz.analysis.claims (and lifecycle.held_replays, routing.no_pass_words / snapshot_relation): each sentence a
page states about a run, checked against the run's own data on every built-in model in every mode, a pipeline
schedule and the broken runs; the numbers recomputed here by brute force (the state of every handle at every event),
not read back from the function under test.

The issue's cases: mlp split-reentrant keeps all four replays at once, so its page must not say "one block at a
time"; a run with a problem must not read "No problem found"; Routing during a backward that reached no checkpoint
must say what runs, never "not started".
"""
from __future__ import annotations

import re

import pytest

from ckpt_viz.analysis.claims import (
    held_at_peak_claim,
    outcome_claim,
    passes_claim,
    peak_claim,
    replay_claim,
    run_claims,
)
from ckpt_viz.analysis.diagnosis import diagnose
from ckpt_viz.analysis.lifecycle import HELD_STATES, held_replays, lifecycle
from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.passes import passes
from ckpt_viz.analysis.routing import no_pass_words, routing_at, snapshot_before, snapshot_relation
from ckpt_viz.analysis.summary import summary
from ckpt_viz.analysis.words import format_bytes, part_word
from ckpt_viz.catalog import BUILTIN_MODEL_NAMES
from ckpt_viz.run.obtain import RunRequest, obtain_trace
from ckpt_viz.trace import Trace

MODES = ("none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant")
RUNS = [("builtin", m, mode) for m in BUILTIN_MODEL_NAMES for mode in MODES] + [
    ("builtin", "pipeline", "pipeline"), ("broken", "dx-after-dw", ""), ("broken", "second-backward", ""),
    ("broken", "cache-in-replay", ""), ("broken", "session-never-cleared", "")]
_TRACES: dict[tuple[str, str, str], Trace] = {}


def _trace(source: str, target: str, mode: str) -> Trace:
    key = (source, target, mode)
    if key not in _TRACES:
        _TRACES[key] = obtain_trace(RunRequest(source, target, mode=mode or "split-reentrant"))
    return _TRACES[key]


def _held_by_brute_force(trace: Trace) -> tuple[int, int | None]:
    """(most handles holding a replay at once, the first seq where they did), from the state of every handle at
    every event."""
    life = lifecycle(trace)
    most, where = 0, None
    for e in trace.events:
        n = sum(state in HELD_STATES for state in life.states_at(e.seq).values())
        if n > most:
            most, where = n, e.seq
    return most, where


@pytest.mark.parametrize("run", RUNS, ids=["-".join(filter(None, r)) for r in RUNS])
def test_each_sentence_states_the_runs_own_figures(run: tuple[str, str, str]) -> None:
    trace = _trace(*run)
    life, s = lifecycle(trace), summary(trace)
    most, where = _held_by_brute_force(trace)
    held = held_replays(trace)
    assert (held.most, held.seq) == (most, where)

    said = replay_claim(trace)
    assert said is not None
    if not s.handles:
        assert said == "Nothing was checkpointed in this run: no handle, so no replay."
    elif not s.replays:
        assert "none was replayed" in said
    else:
        assert "one block at a time" in said if s.handles > 1 and most == 1 else "one block at a time" not in said
        if s.handles > 1:
            numbers = re.search(r"([\d,]+) replays? of ([\d,]+) handles?", said)
            assert (int(numbers[1].replace(",", "")), int(numbers[2].replace(",", ""))) == (s.replays, s.handles)
        if most > 1:
            assert f"held up to {most} replays at once (at seq {where}, in {part_word(passes(trace).part_at(where))}" \
                in said

    peak = memory(trace).peak
    said = peak_claim(trace)
    if peak is None:
        assert said is None
    else:
        assert said.startswith(f"Memory peaked at {format_bytes(peak.total)} at seq {peak.seq}, in "
                               f"{part_word(passes(trace).part_at(peak.seq))}")
        at_peak = [h for h in life.handle_ids if life.state_at(h, peak.seq) in HELD_STATES]
        assert (f"{len(at_peak)} replay" in said) == bool(at_peak), said
        claim = held_at_peak_claim(trace)
        assert (claim is not None) == (len(at_peak) > 1)
        if claim:
            assert f"{len(at_peak)} replays were held at once" in claim
    assert run_claims(trace) == tuple(c for c in (replay_claim(trace), peak_claim(trace)) if c)

    said = outcome_claim(trace)
    problems = diagnose(trace)
    assert said.startswith("No problem found") == (not problems), said
    assert f"{s.refused} refused replay" in said and f"{s.errors} error" in said
    if s.handles:
        assert f"{s.released} of {s.handles} handle" in said

    said = passes_claim(trace)
    step = passes(trace)
    if not step.backwards:
        assert said is None
    else:
        assert said.startswith(f"{len(step.backwards)} backward pass")
        ends = [routing_at(trace, p.end_seq) for p in step.backwards]
        assert [p.replays for p in step.backwards] == [len(r.replayed) + len(r.replaying) for r in ends]
        assert [p.released for p in step.backwards] == [len(r.released) for r in ends]
        replays = sum(len(r.replayed) + len(r.replaying) for r in ends)
        counted = sum(int(n) for n in re.findall(r"(\d+) replays?\b", said))
        assert counted == replays, said


def test_the_issues_first_page_mlp_split_reentrant_never_says_one_block_at_a_time() -> None:
    split, plain = _trace("builtin", "mlp", "split-reentrant"), _trace("builtin", "mlp", "reentrant")
    assert replay_claim(split).startswith("Backward held up to 4 replays at once")
    assert replay_claim(plain) == ("Backward recomputed one block at a time: 4 replays of 4 handles, never more than "
                                   "one replay held at once.")
    assert "4 replays held then (h" in peak_claim(split) and "1 replay held then" in peak_claim(plain)
    assert held_at_peak_claim(plain) is None and held_at_peak_claim(split) is not None


def test_routing_names_what_runs_before_a_pass_reaches_a_checkpoint() -> None:
    for mode in ("reentrant", "nonreentrant", "split-reentrant", "split-nonreentrant"):
        trace = _trace("builtin", "mlp", mode)
        step = passes(trace)
        for e in trace.events:
            r = routing_at(trace, e.seq)
            if r.start_seq is not None:
                continue
            said = no_pass_words(trace, r)
            if step.part_at(e.seq) == "F":
                assert said.startswith("The forward is running here"), (mode, e.seq, said)
            else:  # a backward is running: never "not started"
                assert "is running here" in said and "not started" not in said, (mode, e.seq, said)
                assert not said.startswith("The forward"), (mode, e.seq, said)
    assert no_pass_words(_trace("builtin", "mlp", "none"), routing_at(_trace("builtin", "mlp", "none"), 0)) == (
        "This run has no checkpoint handle: no backward pass routes gradients through a checkpoint.")


def test_the_snapshot_shown_is_placed_relative_to_the_cursor() -> None:
    trace = _trace("builtin", "mlp", "split-reentrant")
    first, last = trace.graphs[0], trace.graphs[-1]
    assert snapshot_relation(trace, 0) == (f"taken at seq {first.seq}, {first.seq} seqs after the cursor (seq 0): "
                                           "none was taken by then")
    assert snapshot_relation(trace, first.seq) == f"taken at seq {first.seq}, at the cursor"
    end = trace.events[-1].seq
    assert snapshot_before(trace, end) is last
    assert snapshot_relation(trace, end) == (f"taken at seq {last.seq}, {end - last.seq} seqs before the cursor "
                                             f"(seq {end}): the last one by then")
    assert snapshot_relation(Trace(), 3) == ""
