"""The sentences a page states about a run, built from the analysis results so they cannot contradict them.

A page never writes a fact about the run in its own words ("recomputes one block at a time", "why the split
modes peak higher", "every handle was released"): it lays out these sentences. Each function reads the
facts it states (`lifecycle`, `held_replays`, `memory`, `passes`, `routing`, `summary`) and says nothing
when its general explanation does not hold for this run (it returns None). Sentences that compare two runs
are `ckpt_viz.analysis.compare`'s.

    replay_claim(trace)           -> "Backward recomputed one block at a time: 4 replays of 4 handles, ..."
    peak_claim(trace)             -> "Memory peaked at 1.4 MiB at seq 40, in DX (input grads); ..."
    outcome_claim(trace)          -> "No problem found in this run: 0 refused replays, 0 errors; 4 of 4 handles ..."
    run_claims(trace)             -> the Overview's list: (replay_claim, peak_claim) that apply
    passes_claim(trace)           -> "3 backward passes: 1 DX pass (4 replays), 1 DW pass (no replay; 4 released)"
    held_at_peak_claim(trace)     -> "At the peak (seq 40) 4 replays were held at once: h0, h1, h2, h3." or None

Standard library only.
"""
from __future__ import annotations

from ckpt_viz.analysis.lifecycle import held_replays, lifecycle
from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.passes import passes
from ckpt_viz.analysis.summary import summary
from ckpt_viz.analysis.words import category_word, format_bytes, part_word, reason_word, state_word
from ckpt_viz.trace import Trace

__all__ = ["held_at_peak_claim", "outcome_claim", "passes_claim", "peak_claim", "replay_claim", "run_claims"]


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def _handles(hs: tuple[int, ...] | list[int], most: int = 6) -> str:
    shown = ", ".join(f"h{h}" for h in hs[:most])
    return shown + (f" and {len(hs) - most} more" if len(hs) > most else "")


def _part(trace: Trace, seq: int) -> str:
    part = passes(trace).part_at(seq)
    return part_word(part) if part is not None else "the start of the run"


def replay_claim(trace: Trace) -> str | None:
    """What backward recomputed, and how many replays it held at once (`held_replays`): "one block at a time"
    only when it never held more than one. None for a trace without events."""
    if not trace.events:
        return None
    life = lifecycle(trace)
    n, replays = len(life.handle_ids), life.replay_count()
    if not n:
        return "Nothing was checkpointed in this run: no handle, so no replay."
    if not replays:
        return f"{_plural(n, 'checkpointed region')} recorded; none was replayed (no backward reached them)."
    held = held_replays(trace)
    what = f"{_plural(replays, 'replay')} of {_plural(n, 'handle')}"
    if n == 1:
        return f"Backward replayed the one checkpointed block {_plural(replays, 'time')}."
    if held.most <= 1:
        return f"Backward recomputed one block at a time: {what}, never more than one replay held at once."
    assert held.seq is not None
    reasons = life.released_reasons()
    released = "; released because " + ", ".join(f"{reason_word(r)} ({k})" for r, k in reasons.most_common()) \
        if reasons else ""
    return (f"Backward held up to {held.most} replays at once (at seq {held.seq}, in {_part(trace, held.seq)}: "
            f"{_handles(held.handles)}): {what}{released}.")


def peak_claim(trace: Trace) -> str | None:
    """Where memory peaked, in which part of the step, what filled it, and how many replays were held then;
    None without memory samples."""
    peak = memory(trace).peak
    if peak is None:
        return None
    top = ", ".join(f"{category_word(c)} {format_bytes(b)}" for c, b in peak.top)
    held = held_replays(trace).at(trace, peak.seq)
    holding = f"; {_plural(len(held), 'replay')} held then ({_handles(held)})" if held else ""
    return (f"Memory peaked at {format_bytes(peak.total)} at seq {peak.seq}, in {_part(trace, peak.seq)}"
            + (f": {top}" if top else "") + f"{holding}.")


def outcome_claim(trace: Trace) -> str:
    """How the run ended in figures (`summary`): refused replays, errors, and the handles' end states; "No problem
    found" only when the diagnosis found none."""
    s = summary(trace)
    head = ("No problem found" if not s.findings else f"{_plural(len(s.findings), 'problem')} found") + " in this run"
    counts = f"{_plural(s.refused, 'refused replay')}, {_plural(s.errors, 'error')}"
    if not s.handles:
        return f"{head}: {counts}; no checkpoint handle."
    others = [f"{k} {state_word(state)}" for state, k in s.states.items() if state != "released"]
    return (f"{head}: {counts}; {s.released} of {_plural(s.handles, 'handle')} released by the end of the run"
            + (f" ({', '.join(others)})" if others else "") + ".")


def run_claims(trace: Trace) -> tuple[str, ...]:
    """The Overview's sentences about the run: what backward recomputed, and where memory peaked."""
    return tuple(c for c in (replay_claim(trace), peak_claim(trace)) if c)


_KINDS = {"DX": "DX", "DW": "DW", "B": "full backward", "F": "full backward"}


def passes_claim(trace: Trace) -> str | None:
    """The run's backward passes by kind (DX, DW or full: the part of the step each starts in, `passes`), with
    their replays and releases (each pass's, as `routing_at` at its end counts them); None when no backward pass
    reached a checkpoint."""
    step = passes(trace)
    found = step.backwards
    if not found:
        return None
    kinds: dict[str, list[int]] = {}
    for p in found:
        totals = kinds.setdefault(_KINDS[step.of_event[p.positions[0]]], [0, 0, 0])
        totals[0] += 1
        totals[1] += p.replays
        totals[2] += p.released
    parts = []
    for kind, (count, replays, released) in kinds.items():
        name = _plural(count, f"{kind} pass", f"{kind} passes") if kind != "full backward" else \
            _plural(count, "full backward")
        said = [_plural(replays, "replay") if replays else "no replay"]
        if released:
            said.append(f"{released:,} released")
        parts.append(f"{name} ({'; '.join(said)})")
    return f"{_plural(len(found), 'backward pass', 'backward passes')} reached a checkpoint: " + ", ".join(parts) + "."


def held_at_peak_claim(trace: Trace) -> str | None:
    """How many replays were held at the memory peak, when more than one (the split modes' cost); else None."""
    peak = memory(trace).peak
    if peak is None:
        return None
    held = held_replays(trace).at(trace, peak.seq)
    if len(held) <= 1:
        return None
    return (f"At the peak (seq {peak.seq}, in {_part(trace, peak.seq)}) {len(held)} replays were held at once "
            f"({_handles(held)}): each replay's activations stay until the pass that needs them last has run.")
