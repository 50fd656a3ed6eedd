"""`every_analysis(trace)`: ask every question the analysis layer answers, at several cursors, as the pages, the
CLI and the lessons do (ckpt_viz.analysis: summary, diagnosis, lifecycle, passes, routing, actions, memory,
handles, words). Used by the property test of tests/trace/test_fuzz.py and the hostile traces' tests: whatever
loaded must be answerable without an exception.
"""
from __future__ import annotations

import io
from typing import Any

from ckpt_viz.analysis import actions, diagnosis, handles, lifecycle, memory, passes, routing, summary, words
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import MEMORY_CATEGORIES, PHASES, RELEASE_REASONS, STATES


def cursors(trace: Trace, n: int = 6) -> list[int | None]:
    """None (the end), before and past the run, and `n` seqs spread over it."""
    seqs = [e.seq for e in trace.events]
    spread = [seqs[i * (len(seqs) - 1) // max(n - 1, 1)] for i in range(n)] if seqs else []
    return [None, -1, 0, *spread, *(s + 1 for s in seqs[-1:]), 2**62]


def every_analysis(trace: Trace) -> dict[str, Any]:
    """Every analysis of `trace`; returns a few of the results (the figures a page states)."""
    figures = summary.summary(trace)
    found = diagnosis.diagnose(trace)
    text = diagnosis.explain(trace, file=io.StringIO())
    diagnosis.replay_checks_note(trace)
    diagnosis.format_findings(found, title=str(trace.meta.get("model")))
    for finding in found:
        finding.reason, finding.seq, finding.ok  # noqa: B018
    life = lifecycle.lifecycle(trace)
    ids = trace.handle_ids()
    assert life.handle_ids == ids
    for h in [*ids, -1, 2**53]:
        diagnosis.diagnose_handle(trace, h)
        diagnosis.diagnose(trace, h)
        life.transitions(h), life.released(h), life.releases(h), life.refusals(h), life.replays(h)
    life.released_reasons(), life.replay_count()
    step = passes.passes(trace)
    step.spans, step.backwards, step.of_event  # noqa: B018
    for x in (-1.0, 0.0, 0.5, 3.7, 1e9):
        step.aligned_seq(x)
    facts = memory.memory(trace)
    memory.rank_memory(trace), memory.stage_memory(trace)
    for cursor in cursors(trace):
        life.states_at(cursor), life.counts_at(cursor)
        for h in ids[:20]:
            life.state_at(h, cursor), life.reason_at(h, cursor)
        at = cursor if cursor is not None else 2**62
        step.part_at(at), step.backward_at(at)
        r = routing.routing_at(trace, cursor)
        routing.pass_title(r)
        routing.routing_rows(trace, cursor)
        snapshot = routing.snapshot_before(trace, at)
        routing.handle_flow(snapshot, r.handles)
        for h in r.handles[:4]:
            routing.input_words(trace, h, 0)
            routing.input_words(trace, h, 1, parameter=True)
        reading = facts.at(cursor)
        facts.total_at(cursor), facts.index_at(cursor)
        memory.memory_table(reading)
        memory.other_note(reading)
    actions.actions(trace), actions.planned_vs_executed(trace), actions.bubbles(trace)
    handles.created_events(trace)
    labels = handles.handle_labels(trace)
    described = [words.describe_event(e, labels) for e in trace.events]
    for state in STATES:
        words.state_word(state)
    for phase in (*PHASES, None):
        words.phase_word(phase)
    for reason in (*RELEASE_REASONS, *lifecycle.DERIVED_REASONS, None):
        words.reason_word(reason)
    for category in MEMORY_CATEGORIES:
        words.category_word(category)
    for part in passes.PARTS:
        words.part_word(part)
    for n in (0, 1, 1023, 2**40, 9 * 2**56):
        words.format_bytes(n)
    return {"summary": figures, "findings": found, "explain": text, "described": described}
