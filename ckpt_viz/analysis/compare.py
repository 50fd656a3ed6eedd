"""Two runs side by side, derived from each run's own analysis: their figures lined up by part of the step
and by pipeline action, their peaks by category, replays and bubbles, and the differences in sentences.

    c = compare(before, after, names=("before", "after"))
    c.a.summary.peak.total, c.b.passes[...]           each run's figures (RunSummary, PassFigures, ...)
    c.categories                                      (CategoryAtPeak("activations", 81_920, 0), ...)
    c.differences                                     (Difference(topic="peak", sentence="after peaks at ...",
                                                       a=..., b=...), ...)
    split_above(figures)                              the split modes that peak above the checkpointed ones

Every number a sentence states is one of the figures beside it (`Difference.a` and `.b` hold them), and its
comparative word ("lower", "higher", "the same") is chosen from those numbers, so a sentence cannot say
what the figures contradict. Standard library only; the pages lay these out and draw them with
`ckpt_viz.render.memory` and `ckpt_viz.render.timeline`.

NOTE [ Comparing two runs ]
  1. Parts of the step (`analysis.passes`): for each part either run has (forward, DX, DW, full
     backward), its events, the replays that started in it, the most bytes read in it (memory
     samples taken while that part ran) and its recorded time (the sum of its spans).
  2. Pipeline actions (`analysis.actions`): per kind (F, DX, DW, B), how many ran, their replays and
     their time (the sum of their boxes). Bubbles: the first recorded step of each run; they are
     compared only when both are in one unit (recorded time, or an in-process schedule's ticks).
  3. Peaks by category are each run's reading at its own peak (`MemoryFacts.peak.by_category`).
  4. Runs of different lengths line up by part of the step on the memory chart (`Passes.aligned_x`).
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from ckpt_viz.analysis.actions import StepBubbles, actions, bubbles
from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.passes import PARTS, passes
from ckpt_viz.analysis.summary import RunSummary, summary
from ckpt_viz.analysis.words import category_word, format_bytes, part_word
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import MEMORY_CATEGORIES

__all__ = ["ActionFigures", "CategoryAtPeak", "Comparison", "Difference", "PassFigures", "RunFigures", "compare",
           "figures", "split_above"]


@dataclass(frozen=True, slots=True)
class PassFigures:
    """One part of one run's step (NOTE [ Comparing two runs ], rule 1); `peak` is None without samples in it."""

    part: str
    events: int
    replays: int
    peak: int | None
    time_us: float


@dataclass(frozen=True, slots=True)
class ActionFigures:
    """The pipeline actions of one kind in one run (NOTE [ Comparing two runs ], rule 2)."""

    action: str
    count: int
    replays: int
    time_us: float


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One run's figures: its summary, its parts, its actions and its first step's bubbles (None: no actions)."""

    name: str
    summary: RunSummary
    passes: tuple[PassFigures, ...]
    actions: tuple[ActionFigures, ...]
    step: StepBubbles | None
    unit: str

    def part(self, part: str) -> PassFigures | None:
        return next((p for p in self.passes if p.part == part), None)


@dataclass(frozen=True, slots=True)
class CategoryAtPeak:
    """The bytes of one memory category at each run's peak."""

    category: str
    a: int
    b: int


@dataclass(frozen=True, slots=True)
class Difference:
    """One sentence about the two runs and the figures it states (`a` of the first run, `b` of the second)."""

    topic: str
    sentence: str
    a: Any
    b: Any


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two runs side by side (see the module docstring)."""

    a: RunFigures
    b: RunFigures
    categories: tuple[CategoryAtPeak, ...]
    differences: tuple[Difference, ...]


def _time_at(trace: Trace) -> dict[int, int]:
    return {e.seq: e.t_ns for e in trace.events}


def _pass_figures(trace: Trace) -> tuple[PassFigures, ...]:
    step, facts = passes(trace), memory(trace)
    counts: dict[str, int] = {}
    replays: dict[str, int] = {}
    for e, part in zip(trace.events, step.of_event):
        counts[part] = counts.get(part, 0) + 1
        if e.kind == "replay_started":
            replays[part] = replays.get(part, 0) + 1
    peaks: dict[str, int] = {}
    for seq, total in zip(facts.seqs, facts.totals):
        i = bisect_right(step.seqs, seq) - 1
        part = step.of_event[i] if i >= 0 else "F"
        peaks[part] = max(peaks.get(part, 0), total)
    t = _time_at(trace)
    spent: dict[str, float] = {}
    for span in step.spans:
        spent[span.part] = spent.get(span.part, 0.0) + (t[span.end_seq] - t[span.start_seq]) / 1000.0
    return tuple(PassFigures(part=p, events=counts[p], replays=replays.get(p, 0), peak=peaks.get(p),
                             time_us=spent.get(p, 0.0)) for p in PARTS if p in counts)


def _action_figures(trace: Trace) -> tuple[ActionFigures, ...]:
    found: dict[str, list[Any]] = {}
    for a in actions(trace):
        found.setdefault(a.action, []).append(a)
    return tuple(ActionFigures(action=k, count=len(found[k]), replays=sum(a.replays for a in found[k]),
                               time_us=sum(a.end_us - a.start_us for a in found[k])) for k in PARTS if k in found)


def figures(trace: Trace, name: str) -> RunFigures:
    """One run's figures for a comparison (NOTE [ Comparing two runs ]), named `name`."""
    found = bubbles(trace)
    return RunFigures(name=name, summary=summary(trace), passes=_pass_figures(trace),
                      actions=_action_figures(trace), step=found.steps[0] if found.steps else None, unit=found.unit)


def _times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1] if words else "nothing"


def _duration(value: float, unit: str) -> str:
    if unit == "tick":
        return f"{value:g} tick" + ("" if value == 1 else "s")
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.0f} µs"


def _peak(a: RunFigures, b: RunFigures) -> list[Difference]:
    pa, pb = a.summary.peak, b.summary.peak
    if pa is None or pb is None:
        missing = [r.name for r, p in ((a, pa), (b, pb)) if p is None]
        return [Difference("peak", f"{_listed(missing)} has no memory samples (recorded without memory=True), so the "
                                   "peaks are not compared.", pa and pa.total, pb and pb.total)]
    if pa.total == pb.total:
        return [Difference("peak", f"Both runs peak at {format_bytes(pa.total)}.", pa.total, pb.total)]
    word = "lower" if pb.total < pa.total else "higher"
    share = abs(pb.total - pa.total) / pa.total if pa.total else 0.0
    return [Difference("peak", f"{b.name} peaks at {format_bytes(pb.total)}, {format_bytes(abs(pb.total - pa.total))} "
                               f"({100 * share:.0f}%) {word} than {a.name} ({format_bytes(pa.total)}).",
                       pa.total, pb.total)]


def _categories(a: RunFigures, b: RunFigures) -> tuple[CategoryAtPeak, ...]:
    ca = a.summary.peak.by_category if a.summary.peak else {}
    cb = b.summary.peak.by_category if b.summary.peak else {}
    names = [c for c in MEMORY_CATEGORIES if c in ca or c in cb] + sorted(
        c for c in {*ca, *cb} if c not in MEMORY_CATEGORIES)
    return tuple(CategoryAtPeak(c, ca.get(c, 0), cb.get(c, 0)) for c in names if ca.get(c, 0) or cb.get(c, 0))


def _category(a: RunFigures, b: RunFigures, rows: tuple[CategoryAtPeak, ...]) -> list[Difference]:
    if a.summary.peak is None or b.summary.peak is None:
        return []
    changed = sorted((r for r in rows if r.a != r.b), key=lambda r: -abs(r.b - r.a))
    if not changed:
        return []
    top = changed[0]
    return [Difference("category", f"At the peaks, {category_word(top.category)} differ most: "
                                   f"{format_bytes(top.a)} in {a.name}, {format_bytes(top.b)} in {b.name}.",
                       top.a, top.b)]


def _counts(a: RunFigures, b: RunFigures) -> list[Difference]:
    out = []
    sa, sb = a.summary, b.summary
    if sa.handles == sb.handles:
        out.append(Difference("handles", f"Both runs have {sa.handles} checkpoint region(s).", sa.handles, sb.handles))
    else:
        out.append(Difference("handles", f"{a.name} has {sa.handles} checkpoint region(s), {b.name} {sb.handles}.",
                              sa.handles, sb.handles))
    if sa.replays == sb.replays:
        out.append(Difference("replays", f"Both runs replay {_times(sa.replays)}.", sa.replays, sb.replays))
    else:
        out.append(Difference("replays", f"{a.name} replays {_times(sa.replays)}, {b.name} {_times(sb.replays)}.",
                              sa.replays, sb.replays))
    if sa.findings != sb.findings:
        def said(s: RunSummary) -> str:
            return ", ".join(dict.fromkeys(s.findings)) if s.findings else "none"
        out.append(Difference("findings", f"Problems found: {said(sa)} in {a.name}; {said(sb)} in {b.name}.",
                              sa.findings, sb.findings))
    return out


def _parts(a: RunFigures, b: RunFigures) -> list[Difference]:
    pa, pb = [p.part for p in a.passes], [p.part for p in b.passes]
    if pa == pb:
        return []
    def said(parts: list[str]) -> str:
        return _listed([part_word(p) for p in parts])
    return [Difference("parts", f"{a.name} runs {said(pa)}; {b.name} runs {said(pb)}.", tuple(pa), tuple(pb))]


def _actions(a: RunFigures, b: RunFigures) -> list[Difference]:
    if not a.actions and not b.actions:
        return []
    ka, kb = {x.action: x.count for x in a.actions}, {x.action: x.count for x in b.actions}
    def said(counts: dict[str, int]) -> str:
        return _listed([f"{n} {k}" for k, n in counts.items()]) if counts else "no pipeline actions"
    if ka == kb:
        return [Difference("actions", f"Both runs run the same pipeline actions: {said(ka)}.", ka, kb)]
    return [Difference("actions", f"{a.name} runs {said(ka)}; {b.name} runs {said(kb)}.", ka, kb)]


def _bubbles(a: RunFigures, b: RunFigures) -> list[Difference]:
    if a.step is None or b.step is None:
        return []
    if a.unit != b.unit:
        def measure(f: RunFigures) -> str:
            return "schedule ticks" if f.unit == "tick" else "time"
        return [Difference("bubble", f"{a.name}'s step is measured in {measure(a)}, {b.name}'s in {measure(b)}: "
                                     "their bubbles are not compared.", a.step.bubble, b.step.bubble)]
    ra, rb = round(100 * a.step.bubble), round(100 * b.step.bubble)
    if ra == rb:
        bubble = f"Both runs idle {ra}% of the step (their bubble)."
    else:
        bubble = (f"{b.name}'s bubble is {rb}% of its step, {'less' if rb < ra else 'more'} than {a.name}'s {ra}%.")
    la, lb = _duration(a.step.length, a.unit), _duration(b.step.length, b.unit)
    time = (f"Both steps take {la}." if la == lb else
            f"{b.name}'s step takes {lb}, {'shorter' if b.step.length < a.step.length else 'longer'} than "
            f"{a.name}'s {la}.")
    return [Difference("bubble", bubble, a.step.bubble, b.step.bubble),
            Difference("step", time, a.step.length, b.step.length)]


def _gradients(a: Trace, b: Trace, names: tuple[str, str]) -> list[Difference]:
    """Whether the runs computed the same gradients: both traces' `meta["grad_sha256"]` (a built-in or model-file
    run's digest of every parameter's .grad), bit for bit."""
    ga, gb = a.meta.get("grad_sha256"), b.meta.get("grad_sha256")
    if not (isinstance(ga, str) and isinstance(gb, str) and ga and gb):
        return []
    if ga == gb:
        return [Difference("gradients", "Both runs computed the same gradients, bit for bit.", ga, gb)]
    return [Difference("gradients", f"The gradients of {names[0]} and {names[1]} differ (their digests are not "
                                    "equal): another model, batch or seed, or a change in what the step computes.",
                       ga, gb)]


def compare(a: Trace, b: Trace, names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Two runs side by side and their differences in sentences (see the module docstring)."""
    fa, fb = figures(a, names[0]), figures(b, names[1])
    rows = _categories(fa, fb)
    said = [*_peak(fa, fb), *_category(fa, fb, rows), *_counts(fa, fb), *_parts(fa, fb), *_actions(fa, fb),
            *_bubbles(fa, fb), *_gradients(a, b, names)]
    return Comparison(a=fa, b=fb, categories=rows, differences=tuple(said))


def split_above(peaks: dict[str, int]) -> tuple[Difference, ...]:
    """Of runs of one model by mode (mode -> peak bytes), each split mode that peaks above the lowest checkpointed
    mode without split ("reentrant", "nonreentrant"): the sentence and its two peaks (`a`: the checkpointed
    mode's, `b`: the split mode's). Empty when no split mode peaks higher, or no such mode ran."""
    plain = {m: t for m, t in peaks.items() if m in ("reentrant", "nonreentrant")}
    if not plain:
        return ()
    base = min(plain, key=plain.__getitem__)
    return tuple(Difference("split", f"{m} peaks at {format_bytes(t)}, {format_bytes(t - plain[base])} above {base} "
                                     f"({format_bytes(plain[base])})", plain[base], t)
                 for m, t in peaks.items() if m.startswith("split") and t > plain[base])
