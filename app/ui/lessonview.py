"""What the Lessons page draws for a step: its knobs, its views of a run (the app's own renderers and page
helpers), the memory-and-compute panel, the Debugger's story, and the links to the pages that go deeper.

Every figure is `ckpt_viz.analysis`'s; every drawing is a renderer's (`ckpt_viz.render.*`) shown the way
its page shows it (`ui.show.show_chart`, `ui.graphview.graph_view`). Text from a trace goes through `md`
or `st.code`. Only app/views/lessons.py uses this module.
"""
from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import streamlit as st

from ckpt_viz.analysis.actions import actions, bubble_lines, bubble_rows
from ckpt_viz.analysis.diagnosis import diagnose
from ckpt_viz.analysis.lifecycle import recompute_time
from ckpt_viz.analysis.memory import memory, memory_table, other_note, stage_peaks
from ckpt_viz.analysis.words import format_bytes
from ckpt_viz.lessons.helpers import ms, percent
from ckpt_viz.lessons.loader import Knob, Lesson, Step
from ckpt_viz.render.eventlog import event_rows, rows_text
from ckpt_viz.render.graph import render_graph
from ckpt_viz.render.memory import render_memory
from ckpt_viz.render.routing import render_routing
from ckpt_viz.render.swimlane import render_lifecycles
from ckpt_viz.render.timeline import render_bubbles, render_stage_memory, render_timeline
from ckpt_viz.trace import Trace
from ui.cursor import position_of
from ui.graphview import graph_view, snapshot_note
from ui.runs import Run
from ui.show import show_chart
from ui.text import md

# page name (ckpt_viz.lessons.loader.PAGES) -> (page file, title on the sidebar)
PAGE_FILES: dict[str, tuple[str, str]] = {
    "overview": ("views/overview.py", "Overview"), "graph": ("views/graph.py", "Autograd graph"),
    "memory": ("views/memory.py", "Memory"), "handles": ("views/handles.py", "Handles"),
    "debugger": ("views/debugger.py", "Debugger"), "routing": ("views/routing.py", "Routing (DX/DW)"),
    "timeline": ("views/timeline.py", "Schedule timeline"), "events": ("views/events.py", "Events"),
    "compare": ("views/compare.py", "Compare")}
VIEW_TITLES: dict[str, str] = {
    "graph": "Autograd graph", "memory": "Memory", "lanes": "Handle lanes", "routing": "Routing (DX/DW)",
    "events": "Events", "timeline": "Schedule timeline", "stages": "Memory per stage", "debugger": "Debugger",
    "cost": "Memory and compute", "curve": "The trade-off curve"}


def knob_key(lesson: Lesson, step: Step, knob: Knob) -> str:
    return f"knob_{lesson.number}_{lesson.steps.index(step)}_{knob.name}"


def knobs(lesson: Lesson, step: Step, defaults: dict[str, Any]) -> dict[str, Any]:
    """Draw the step's knobs in a row; return their values (the run function's defaults first)."""
    if not step.knobs:
        return {}
    picked: dict[str, Any] = {}
    with st.container(border=True):
        st.caption("Knobs: each change re-runs the code below and redraws the views.")
        row = st.columns(len(step.knobs))
        for column, knob in zip(row, step.knobs):
            key = knob_key(lesson, step, knob)
            with column:
                if knob.multi:
                    value = st.pills(knob.label, list(knob.values), selection_mode="multi",
                                     default=list(defaults[knob.name]), key=key, help=knob.help or None)
                    picked[knob.name] = tuple(value or ())
                elif isinstance(knob.values[0], bool):
                    picked[knob.name] = st.toggle(knob.label, value=defaults[knob.name], key=key,
                                                  help=knob.help or None)
                elif isinstance(knob.values[0], int):
                    picked[knob.name] = st.select_slider(knob.label, list(knob.values), value=defaults[knob.name],
                                                         key=key, help=knob.help or None)
                else:
                    picked[knob.name] = st.segmented_control(knob.label, list(knob.values),
                                                             default=defaults[knob.name], key=key, required=True,
                                                             help=knob.help or None)
    return picked


def cost(trace: Trace) -> None:
    """Memory and compute together: the peak by category, and what the replays cost in time."""
    facts = memory(trace)
    spent = recompute_time(trace)
    left, right = st.columns([3, 2])
    if facts.peak is not None:
        left.markdown(f"**Peak {md(format_bytes(facts.peak.total))}**, by category:")
        rows = [r for r in memory_table(facts.peak.by_category) if r["size"] != "0 B"]
        left.dataframe([{k: r[k] for k in ("category", "size", "share")} for r in rows], hide_index=True,
                       width="stretch")
        note = other_note(facts.peak.by_category)
        if note:
            left.caption(md(note))
    else:
        left.caption("This run has no memory samples.")
    right.metric("Recompute time", ms(spent.replay_ns),
                 help="The replays' time on the recorded clock (a memory recording slows every op alike).")
    right.metric("Replays", spent.replays)
    if spent.step_ns:
        right.caption(md(f"{percent(spent.share)} of the {ms(spent.step_ns)} recorded from the run's first event "
                         "to its last."))


def finding(trace: Trace) -> None:
    """The Debugger's story of the run's first problem: its cause, what happened, the line of code, the fix."""
    found = [f for f in diagnose(trace) if not f.ok]
    if not found:
        st.success("The Debugger finds no problem in this run.")
        return
    f = found[0]
    st.error(f"**{md(f.cause or f.summary)}**")
    st.markdown("**What happened**")
    st.code(f.explanation, language=None, wrap_lines=True)
    st.info(f"**Fix:** {md(f.fix)}")


def view(name: str, run: Run, seq: int, *, key: str) -> None:
    """Draw view `name` of `run` at cursor `seq` with the app's own renderer."""
    trace = run.trace
    st.markdown(f"**{VIEW_TITLES[name]}**")
    if name == "memory" and len(trace.memory):
        show_chart(render_memory, {run.config.label: trace}, cursor=seq, max_points=300)
    elif name == "lanes" and trace.handle_ids():
        show_chart(render_lifecycles, trace, cursor=seq)
    elif name == "routing" and trace.handle_ids():
        graph_view(render_routing(trace, seq), key=f"{key}_zoom", name=f"lesson routing seq {seq}")
    elif name == "graph" and trace.graphs:
        graph_view(render_graph(trace, seq, collapse=False), key=f"{key}_zoom", name=f"lesson graph seq {seq}",
                   note=snapshot_note(run, seq))
    elif name == "events":
        at = position_of(run, seq)
        st.code(rows_text(event_rows(trace.events[max(0, at - 8): at + 9]), marker=seq), language=None)
    elif name == "timeline" and actions(trace):
        show_chart(render_timeline, trace, x="tick")
        for line in bubble_lines(trace):
            st.markdown(md(line))
        st.table(bubble_rows(trace))
        show_chart(render_bubbles, trace)
    elif name == "stages" and stage_peaks(trace):
        show_chart(render_stage_memory, trace, x="tick")
        st.table([{"stage": stage, "peak": format_bytes(nbytes)} for stage, nbytes in stage_peaks(trace).items()])
    elif name == "debugger":
        finding(trace)
    elif name == "cost":
        cost(trace)
    elif name == "curve":
        curve(trace)
    else:
        st.caption("This run has nothing to draw here.")


def curve(trace: Trace) -> None:
    """The planner's trade-off curve of the profile the run recorded (`ckpt_viz.plan`)."""
    import ckpt_viz.plan as plan
    from ckpt_viz.render.plan import curve_chart

    profile = plan.profile_of(trace)
    points = plan.curve(profile)
    show_chart(curve_chart, points, names=[b.name for b in profile.blocks])


_FOLDER: list[Path] = []
_SAVED: weakref.WeakKeyDictionary[Trace, Path] = weakref.WeakKeyDictionary()


def saved(trace: Trace, name: str) -> Path:
    """The trace in a file of this server's lesson folder (a page opens it by path: `?trace=...`), written once
    per trace."""
    if trace in _SAVED:
        return _SAVED[trace]
    if not _FOLDER:
        _FOLDER.append(Path(tempfile.mkdtemp(prefix="ckpt_viz-lessons-")))
        atexit.register(shutil.rmtree, _FOLDER[0], True)  # the server's lesson files go with it
    data = trace.to_json()
    path = _FOLDER[0] / f"{name}-{hashlib.sha1(data).hexdigest()[:12]}.json.gz"
    if not path.exists():
        trace.save(path)
    _SAVED[trace] = path
    return path


def see_links(pages: tuple[str, ...], trace: Trace, seq: int, name: str) -> None:
    """"See it on the X page": links that open page X with this step's run (saved, opened by path) at its
    cursor."""
    if not pages:
        return
    path = saved(trace, name)
    row = st.container(horizontal=True, gap="small")
    for page in pages:
        file, title = PAGE_FILES[page]
        row.page_link(file, label=f"See it on the {title} page", icon=":material/open_in_new:",
                      query_params={"trace": str(path), "cursor": str(seq)})
