"""`ckpt-viz info` and `ckpt-viz export`: read a saved trace (torch is never imported).

`info` states the run's figures as the app's pages do: the counts, end states and peak are
`ckpt_viz.analysis.summary.summary(trace)`, the problems `ckpt_viz.analysis.diagnosis.diagnose(trace)`
(the same cached objects the pages read), and every word a state, reason or memory category is
called by comes from `ckpt_viz.analysis.words`. Text from the trace (its model name, labels,
findings) is printed as it is: it is data, never formatted as markup.
"""
from __future__ import annotations

import argparse
import json
import sys

from ckpt_viz.analysis.actions import bubble_lines
from ckpt_viz.analysis.diagnosis import diagnose, replay_checks_note
from ckpt_viz.analysis.handles import handle_labels, mode_counts, observed_mode
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.memory import memory_table, other_note
from ckpt_viz.analysis.summary import summary
from ckpt_viz.analysis.words import format_bytes, reason_word, state_word
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import STATE_MEANINGS

__all__ = ["export_command", "handle_states_block", "info_command", "summarize"]

_NAMED = 8  # handles named on the "regions" line before "... (N more)"


def handle_states_block(trace: Trace, at: int | None = None) -> list[str]:
    """The "handle states" lines: how many handles are in each state at `at` (None: the end, the summary's
    states), each state in words with its meaning."""
    counts = summary(trace).states if at is None else lifecycle(trace).counts_at(at)
    head = f"handle states at {'the end' if at is None else f'event {at}'}:"
    return [head, *(f"  {state_word(state):<15} {n:>6}  {STATE_MEANINGS[state]}" for state, n in counts.items())]


def _regions(trace: Trace) -> str | None:
    labels = handle_labels(trace)
    if not labels:
        return None
    named = [f"h{h} {label}" for h, label in list(labels.items())[:_NAMED]]
    more = len(labels) - _NAMED
    return "regions: " + ", ".join(named) + (f", ... ({more} more)" if more > 0 else "")


def summarize(trace: Trace, *, at: int | None = None) -> str:
    """The text `ckpt-viz info` prints: what ran, handles, replays, releases, states, peak memory, problems.

    Handle figures are the lifecycle's, as in the app: a non-reentrant frame counts as released
    (its backward consumed every recomputed tensor, or its session was cleared) though no
    `released` event names it.

    Args:
        at: the event seq of the "handle states" block (inclusive); None: the end of the trace.
    """
    s = summary(trace)
    meta = trace.meta
    mode = s.mode or observed_mode(trace)  # a record() block without model=: what its handles were
    lines = [f"model {s.model or '?'}  mode {mode}" + (f"  schedule {s.schedule}" if s.schedule else ""),
             f"{s.events} events, {len(trace.memory)} memory samples, {len(trace.graphs)} graph snapshots"]
    if s.partial:  # a run stopped early, or ranks missing: say so before any figure
        lines.append(f"partial: {meta.get('partial_reason') or 'the run did not finish, or ranks are missing'}")
    modes = mode_counts(trace)
    lines.append(f"handles: {s.handles}" + (f" ({', '.join(f'{m} {n}' for m, n in modes.items())})" if modes else ""))
    regions = _regions(trace)
    if regions:
        lines.append(regions)
    lines.append(f"replays: {s.replays}" + (f", refused {s.refused}" if s.refused else ""))
    reasons = lifecycle(trace).released_reasons()
    lines.append(f"released: {s.released}" + (" (" + ", ".join(f"{reason_word(r)}: {n}" for r, n in
                                                                  reasons.items()) + ")" if reasons else ""))
    if s.handles:
        lines.extend(handle_states_block(trace, at))
    if s.peak is not None:
        lines.append(f"peak memory {format_bytes(s.peak.total)} at event {s.peak.seq}:")
        lines.extend(f"  {row['category']:<20} {row['size']:>12} {row['share']:>5}"
                     for row in memory_table({c: b for c, b in s.peak.by_category.items() if b}))
        note = other_note(s.peak.by_category)  # what "other" holds, when it is a large share
        if note:
            lines.append(f"  {note}")
    steps = bubble_lines(trace)  # a pipeline run: step time and bubble per rank and stage
    if steps:
        lines.append("pipeline steps:")
        lines.extend(f"  {line}" for line in steps)
    if s.errors:
        lines.append(f"errors: {s.errors}")
    lines.extend(_unobserved_lines(trace, s.handles))
    if s.findings:
        lines.append(f"problems: {len(s.findings)}")
    elif s.handles:  # a trace with unobserved regions vouches only for what it holds
        lines.append("problems: none" + (" among the handles recorded" if meta.get("unobserved") else ""))
    else:  # never "none" about a run nothing was seen of
        lines.append("problems: not checked: this trace holds no checkpoint handle")
        lines.append("  Tip: checkpoint inside the record() block (torch.utils.checkpoint, HF's "
                     "gradient_checkpointing_enable() or ckpt_viz.checkpoint); a run without checkpointing has "
                     "no handles to check.")
    lines.extend(f"  {'-' if d.handle_id is None else f'h{d.handle_id}'}: {d.code}: {d.summary}"
                 for d in diagnose(trace))
    if s.findings:
        lines.append("  (`ckpt-viz explain TRACE` tells what happened, in order, and the fix)")
    note = replay_checks_note(trace)  # replays the divergence checks skipped: "none" says nothing of them
    if note:
        lines.append(note.splitlines()[0])
    return "\n".join(lines)


def _unobserved_lines(trace: Trace, handles: int) -> list[str]:
    """What the recording could not see (meta "unobserved", NOTE [ Observing torch's checkpoint ], rule 4, in
    ckpt_viz/runtime/torch_observer.py), and, with no handle, the checkpoint nodes the graph snapshots show."""
    lines = []
    notes = trace.meta.get("unobserved")
    for note in notes if isinstance(notes, list) else ():
        if isinstance(note, dict):
            count = note.get("count")
            lines.append(f"not observed: {note.get('what')}" + (f" ({count} calls)" if isinstance(count, int) else ""))
    if not handles:
        nodes = max((sum(1 for n in g.nodes if n.name.startswith("CheckpointFunction")) for g in trace.graphs),
                    default=0)
        if nodes:
            lines.append(f"not observed: the graph snapshots hold {nodes} CheckpointFunctionBackward nodes that no "
                         "handle stands for (their forward ran before the record() block opened)")
    return lines


def info_command(args: argparse.Namespace) -> int:
    print(summarize(Trace.load(args.trace), at=getattr(args, "at", None)))
    return 0


def export_command(args: argparse.Namespace) -> int:
    """Write the trace as Chrome trace-event JSON: the output folder is tried before the trace is read,
    and the file is written as `Trace.save` writes (fsync-ed, then renamed)."""
    from ckpt_viz.render.perfetto import render_perfetto
    from ckpt_viz.trace.files import check_writable, write_atomically

    if not args.perfetto:
        print("ckpt-viz export: nothing to export.\nTip: pass --perfetto out.json", file=sys.stderr)
        return 2
    check_writable(args.perfetto, "ckpt-viz export")
    doc = render_perfetto(Trace.load(args.trace))
    write_atomically(args.perfetto, json.dumps(doc).encode("ascii"), "ckpt-viz export")
    print(f"wrote {args.perfetto}: {len(doc['traceEvents'])} trace events "
          "(open it at ui.perfetto.dev or chrome://tracing)")
    return 0
