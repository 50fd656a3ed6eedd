"""`ckpt-viz lesson`: list the lessons; `ckpt-viz lesson N` walks lesson N in the terminal.

The same steps as the app's Lessons page, with the same reveal (NOTE [ Numbers come from the run ] in
ckpt_viz/lessons/loader.py): each step prints its prose and the code it runs (runnable as it is), then
its question; only once it is answered does the run show: whether the answer was right, the
explanation, the claim its check asserted, and its views in text (the peak by category, the lanes'
states, the events around the cursor, the bubbles, the Debugger's story, the recompute time). On a
terminal it asks for the answer (a number) and waits for Enter between steps; otherwise (a pipe, CI)
it runs straight through, printing the answer after the question. `--set name=value` sets a knob.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["lesson_command", "text_view", "walk"]

_AROUND = 6  # events shown either side of the cursor


def _pause(out: TextIO, prompt: str, interactive: bool, read: Callable[[], str]) -> str:
    if not interactive:
        return ""
    out.write(prompt)
    out.flush()
    return read()


def _indent(text: str) -> str:
    return "".join(f"    {line}\n" if line else "\n" for line in text.rstrip().splitlines())


def text_view(name: str, trace: Any, seq: int) -> str:
    """View `name` of `trace` at cursor `seq` in text: the analysis's figures, as the app's view shows them."""
    from ckpt_viz.analysis.actions import actions, bubble_lines
    from ckpt_viz.analysis.diagnosis import diagnose, format_findings
    from ckpt_viz.analysis.handles import handle_labels
    from ckpt_viz.analysis.lifecycle import lifecycle, recompute_time
    from ckpt_viz.analysis.memory import memory, memory_table, stage_peaks
    from ckpt_viz.analysis.routing import routing_rows, snapshot_before
    from ckpt_viz.analysis.words import format_bytes, reason_word, state_word
    from ckpt_viz.lessons.helpers import ms, percent
    from ckpt_viz.render.text import render_text

    if name == "memory" or name == "cost":
        facts = memory(trace)
        lines = []
        if facts.peak is not None:
            lines.append(f"Peak {format_bytes(facts.peak.total)} (at seq {facts.peak.seq}), by category:")
            lines += [f"  {r['category']:<22} {r['size']:>11}  {r['share']:>4}"
                      for r in memory_table(facts.peak.by_category) if r["size"] != "0 B"]
        if name == "cost":
            spent = recompute_time(trace)
            lines.append(f"Recompute: {spent.replays} replay(s), {ms(spent.replay_ns)} "
                         f"({percent(spent.share)} of the {ms(spent.step_ns)} recorded)")
        return "\n".join(lines) or "(no memory samples)"
    if name == "lanes":
        life, labels = lifecycle(trace), handle_labels(trace)
        rows = []
        for h in life.handle_ids:
            states = " -> ".join(state_word(t.state) + (f" ({reason_word(t.reason)})" if t.state == "released"
                                                         and t.reason else "") for t in life.transitions(h))
            rows.append(f"  h{h} {labels.get(h, '')}: {states}")
        return "Handle lanes (state by state):\n" + "\n".join(rows) if rows else "(no handles)"
    if name == "events":
        events = trace.events
        at = next((k for k, e in enumerate(events) if e.seq >= seq), len(events) - 1)
        return f"Events around the cursor (seq {seq}):\n" + render_text(events[max(0, at - _AROUND): at + _AROUND + 1])
    if name == "routing":
        rows = routing_rows(trace, seq)
        return "Routing at the cursor:\n" + "\n".join("  " + ", ".join(f"{k}: {v}" for k, v in r.items())
                                                     for r in rows) if rows else "(no routing at the cursor)"
    if name == "graph":
        snapshot = snapshot_before(trace, seq)
        if snapshot is None:
            return "(no graph snapshot)"
        regions = sorted({n.handle_id for n in snapshot.nodes if n.handle_id is not None and n.kind != "trigger"})
        triggers = sorted({n.handle_id for n in snapshot.nodes if n.kind == "trigger"})
        return (f"Autograd graph {snapshot.label!r}: {len(snapshot.nodes)} nodes; checkpoint regions "
                + (", ".join(f"h{h}" for h in regions) or "none")
                + ("; backward triggers of " + ", ".join(f"h{h}" for h in triggers) if triggers else ""))
    if name == "timeline":
        done = actions(trace)
        order = " ".join(f"{a.stage}{a.action}{a.microbatch}" for a in sorted(done, key=lambda a: (a.tick or 0,
                                                                                                 a.start_seq)))
        return "Schedule (stage, action, micro-batch, in tick order): " + order + "\n" + "\n".join(bubble_lines(trace))
    if name == "stages":
        return "Peak per stage: " + ", ".join(f"stage {s} {format_bytes(b)}" for s, b in stage_peaks(trace).items())
    if name == "debugger":
        found = [f for f in diagnose(trace) if not f.ok]
        return format_findings(found[:1], title="The Debugger") if found else "The Debugger finds no problem."
    if name == "curve":
        import ckpt_viz.plan as plan

        points = plan.curve(plan.profile_of(trace))
        return "Trade-off curve (peak, recompute):\n" + "\n".join(
            f"  {format_bytes(p.peak):>11}  {ms(p.recompute_ns):>9}  {len(p.blocks)} block(s) checkpointed"
            for p in points)
    return ""


def walk(number: int, *, out: TextIO = sys.stdout, interactive: bool = False, knobs: dict[str, Any] | None = None,
         read: Callable[[], str] = sys.stdin.readline) -> int:
    """Print lesson `number` step by step (asking its questions when `interactive`); 0 when every check held.

    Args:
        knobs: knob values by name, for the steps that have that knob (the others keep their defaults).
        read: reads one answer line (stdin's by default).
    """
    from ckpt_viz.errors import CkptVizError
    from ckpt_viz.lessons.loader import load_lessons
    from ckpt_viz.lessons.runner import show_step

    lessons = {lesson.number: lesson for lesson in load_lessons()}
    if number not in lessons:
        raise CkptVizError(f"ckpt-viz lesson: no lesson {number}; there are {min(lessons)} to {max(lessons)}.\n"
                           "Tip: `ckpt-viz lesson` lists them.")
    lesson = lessons[number]
    knobs = dict(knobs or {})
    names = {k.name for s in lesson.steps for k in s.knobs}
    if set(knobs) - names:
        raise CkptVizError(f"ckpt-viz lesson: lesson {number} has no knob {', '.join(sorted(set(knobs) - names))}.\n"
                           f"Tip: its knobs are {', '.join(sorted(names)) or 'none'}.")
    out.write(f"Lesson {lesson.number}: {lesson.title}\n{lesson.summary}\n")
    for i, step in enumerate(lesson.steps, 1):
        out.write(f"\n== Step {i}/{len(lesson.steps)}: {step.title} ==\n\n")
        mine = {k.name: _parsed(k, knobs[k.name]) for k in step.knobs if k.name in knobs}
        shown = show_step(lesson, step, mine)
        out.write(f"{shown.prose.strip()}\n\n")
        if step.knobs:
            out.write("Knobs: " + "; ".join(f"{k.label} {k.name}={_word(shown.knobs[k.name])} (of "
                                            f"{', '.join(map(str, k.values))})" for k in step.knobs)
                      + f". Set one: ckpt-viz lesson {number} --set {step.knobs[0].name}=...\n\n")
        if step.compare:
            out.write(f"Code, {step.sides[0]}:\n{_indent(shown.code)}\nCode, {step.sides[1]}:\n"
                      f"{_indent(shown.other_code)}")
        else:
            out.write("Code (runnable as it is; `trace` holds the run):\n" + _indent(shown.code))
        q = shown.question
        if q is not None:
            out.write(f"\nQuestion: {q.ask}\n" + "".join(f"  {k + 1}. {c}\n" for k, c in enumerate(q.choices)))
            pick = _answer(out, len(q.choices), interactive, read)
            if pick is None:
                out.write(f"Answer: {q.answer + 1}. {q.choices[q.answer]}. {q.explain}\n")
            elif pick == q.answer:
                out.write(f"Right. {q.explain}\n")
            else:
                out.write(f"Not quite: the answer is {q.answer + 1}. {q.choices[q.answer]}. {q.explain}\n")
        out.write(f"\nChecked on the run: {shown.claim}\n")
        names = [n for n in step.views if not (n == "memory" and "cost" in step.views)]  # cost holds the peak
        views = [("", name, shown.trace, shown.seq) for name in names]
        if shown.other is not None:
            views = [(f"[{step.sides[0]}] ", name, shown.trace, shown.seq) for name in names] + [
                (f"[{step.sides[1]}] ", name, shown.other, shown.other_seq) for name in names]
        for side, name, trace, seq in views:
            text = text_view(name, trace, seq)
            if text:
                out.write(f"\n{side}{text}\n")
        if step.see:
            out.write(f"\nSee it in the app (streamlit run app): the {', '.join(step.see)} page(s).\n")
        if i < len(lesson.steps):
            _pause(out, "\nPress Enter for the next step... ", interactive, read)
    following = lessons.get(number + 1)
    out.write(f"\nEnd of lesson {lesson.number}."
              + (f" Next: ckpt-viz lesson {following.number} ({following.title})" if following else "") + "\n")
    return 0


def _answer(out: TextIO, count: int, interactive: bool, read: Callable[[], str]) -> int | None:
    """The choice picked (0-based), asked until it is a number from 1 to `count`; None when not interactive."""
    while interactive:
        line = _pause(out, f"Your answer (1-{count}): ", True, read)
        if not line:  # end of input: show the answer
            return None
        if line.strip().isdigit() and 1 <= int(line) <= count:
            return int(line) - 1
        out.write(f"Type a number from 1 to {count}.\n")
    return None


def _word(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _parsed(knob: Any, text: str) -> Any:
    """A knob's value from `--set name=text`: an int, a string, or (multi) comma-separated values."""
    from ckpt_viz.errors import CkptVizError

    if not isinstance(text, str):  # a value given in Python (walk(..., knobs=...)): the runner checks it
        return text
    kind = type(knob.values[0])
    if kind is bool:
        words = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
        kind = words.__getitem__  # type: ignore[assignment]
        text = text.lower()
    try:
        parts = [kind(p.strip()) for p in text.split(",") if p.strip()] if knob.multi else [kind(text.strip())]
    except (ValueError, KeyError):
        parts = None
    if parts is None or any(p not in knob.values for p in parts):
        raise CkptVizError(f"ckpt-viz lesson: --set {knob.name}={text!r}: expected "
                           f"{'any of' if knob.multi else 'one of'} {', '.join(map(str, knob.values))}.\n"
                           f"Tip: --set {knob.name}={knob.values[0]}")
    return tuple(parts) if knob.multi else parts[0]


def lesson_command(args: Any) -> int:
    from ckpt_viz.errors import CkptVizError
    from ckpt_viz.lessons.loader import load_lessons

    if args.number is None:
        for lesson in load_lessons():
            print(f"{lesson.number:>2}. {lesson.title}  ({len(lesson.steps)} steps)")
        print("\nWalk one: ckpt-viz lesson N")
        return 0
    knobs = {}
    for item in args.set or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CkptVizError(f"ckpt-viz lesson: --set {item!r} is not name=value.\nTip: --set depth=8")
        knobs[name.strip()] = value
    interactive = sys.stdin.isatty() and sys.stdout.isatty() and not args.no_pause
    return walk(args.number, interactive=interactive, knobs=knobs)
