"""Compare: the sidebar's run beside another (a saved trace, or a built-in run; kept in the URL as `vs`), or the same
model in several modes; lined up by part of the step, by pipeline action, peak by category, replays and bubbles, with
the differences stated by `ckpt_viz.analysis.compare`."""
import streamlit as st

from ckpt_viz.analysis.actions import bubble_lines
from ckpt_viz.analysis.compare import compare, split_above
from ckpt_viz.analysis.passes import PARTS
from ckpt_viz.analysis.summary import summary
from ckpt_viz.analysis.words import category_word, format_bytes, part_word
from ckpt_viz.lessons.glossary import SPLIT_COST
from ckpt_viz.render.memory import render_memory, render_peaks
from ckpt_viz.render.timeline import render_timeline
from ui.cursor import cursor_bar
from ui.downloads import download_png_button
from ui.partner import partner_param, partner_picker
from ui.runs import current, load_run, runs_for_modes
from ui.show import show_chart
from ui.text import md, md_table

VIEWS = ("Two runs", "Modes of this model")

run = current()
view = st.session_state.get("compare_view") or VIEWS[1 if run.config.runs_model and not partner_param() else 0]
st.title("Compare two runs" if view == VIEWS[0] else "Compare modes")
seq = cursor_bar(run)
st.radio("Compare", VIEWS, index=VIEWS.index(view), horizontal=True, key="compare_view",
         label_visibility="collapsed",
         help="Two runs: this run beside a saved trace or a built-in run (e.g. before and after a fix, checkpointing "
              "off and on, two schedules). Modes: this model run in several checkpoint modes.")


def _names(a: str, b: str) -> tuple[str, str]:
    """The two runs' names, told apart when they read the same."""
    return (a, b) if a != b else (f"{a} (1)", f"{b} (2)")


def _signed(nbytes: int) -> str:
    return ("+" if nbytes > 0 else "−" if nbytes < 0 else "") + format_bytes(abs(nbytes))


def two_runs() -> None:
    partner = partner_picker(run)
    if partner is None:
        st.info("Pick the run to compare this one with: a saved trace (its path, or upload it), or a built-in run.")
        st.stop()
    loaded = load_run(partner)
    if loaded.error is not None or loaded.run is None:
        st.warning(md(f"The run to compare with could not be opened: {loaded.error}"))
        st.stop()
    other = loaded.run.trace
    name_a, name_b = _names(run.config.label, partner.label)
    c = compare(run.trace, other, (name_a, name_b))
    st.markdown(f"**A** = {md(name_a)} (the sidebar's run) · **B** = {md(name_b)}")

    st.subheader("What differs")
    st.markdown("\n".join(f"- {md(d.sentence)}" for d in c.differences))

    sa, sb = c.a.summary, c.b.summary
    steps = [bubble_lines(t) for t in (run.trace, other)]
    figures = [("events", sa.events, sb.events), ("checkpoint regions", sa.handles, sb.handles),
               ("replays", sa.replays, sb.replays), ("released", sa.released, sb.released),
               ("refused replays", sa.refused, sb.refused), ("errors", sa.errors, sb.errors),
               ("peak", *(format_bytes(s.peak.total) if s.peak else "no samples" for s in (sa, sb))),
               ("problems found", *(", ".join(dict.fromkeys(s.findings)) or "none" for s in (sa, sb))),
               ("step and bubble", *(lines[0] if lines else "no pipeline actions" for lines in steps))]
    st.table(md_table([{"": k, "A": x, "B": y} for k, x, y in figures]))

    st.subheader("Memory, lined up by part of the step")
    chart = show_chart(render_memory, {name_a: run.trace, name_b: other}, cursor=seq, cursor_in=run.trace,
                       pick=run, key="compare_two_chart")
    st.caption("Each run's forward, DX and DW line up (a full backward spans both), whatever the runs' lengths. The "
               "magenta rule is A's cursor; click a line to move it there.")
    download_png_button(chart, "compare_two_runs", key="dl_compare_two_png")
    parts = [p for p in PARTS if c.a.part(p) or c.b.part(p)]
    rows = []
    for p in parts:
        fa, fb = c.a.part(p), c.b.part(p)
        row = {"part of the step": part_word(p)}
        for side, f in (("A", fa), ("B", fb)):
            row.update({f"{side} events": f.events if f else 0, f"{side} replays": f.replays if f else 0,
                        f"{side} peak": format_bytes(f.peak) if f and f.peak is not None else "-",
                        f"{side} recorded time": f"{f.time_us / 1000:.2f} ms" if f else "-"})
        rows.append(row)
    st.table(md_table(rows))

    st.subheader("Peak by category")
    show_chart(render_peaks, {name_a: run.trace, name_b: other})
    st.table(md_table([{"category": category_word(r.category), "A": format_bytes(r.a), "B": format_bytes(r.b),
                        "B − A": _signed(r.b - r.a)} for r in c.categories]))

    if c.a.actions or c.b.actions:
        st.subheader("By pipeline action")
        kinds = [k for k in PARTS if any(x.action == k for x in (*c.a.actions, *c.b.actions))]
        got = {(side, x.action): x for side, f in (("A", c.a), ("B", c.b)) for x in f.actions}
        rows = []
        for k in kinds:
            row = {"action": part_word(k)}
            for side in ("A", "B"):
                x = got.get((side, k))
                row.update({f"{side} count": x.count if x else 0, f"{side} replays": x.replays if x else 0,
                            f"{side} recorded time": f"{x.time_us / 1000:.2f} ms" if x else "-"})
            rows.append(row)
        st.table(md_table(rows))
        if c.a.actions and c.b.actions:
            left, right = st.columns(2)
            for column, name, trace, lines in ((left, name_a, run.trace, steps[0]), (right, name_b, other, steps[1])):
                with column:
                    show_chart(render_timeline, trace, title=name)
                    st.caption(md("; ".join(lines)))


def modes() -> None:
    if not run.config.runs_model:
        st.info("Compare modes runs one model in several modes: pick a built-in model or a model file in the sidebar "
                "(a saved trace holds one mode, and a broken run uses its own). Two runs compares any two.")
        st.stop()
    chosen = st.multiselect("Modes", ("none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant"),
                            default=("none", "nonreentrant", "reentrant", "split-reentrant"), key="compare_modes")
    if not chosen:
        st.info("Pick at least one mode.")
        st.stop()
    runs = runs_for_modes(run.config, chosen)
    if not runs:
        st.stop()
    # The cursor is the sidebar run's; each run's parts (forward, DX, DW) share one axis, so it falls at the same part.
    chart = show_chart(render_memory, {m: r.trace for m, r in runs.items()}, cursor=seq, cursor_in=run.trace,
                       pick=run, key="compare_chart")
    st.caption(f"Each run's forward, DX and DW line up (a full backward spans both DX and DW), whatever the "
               f"runs' lengths. The magenta rule is the cursor of the **{md(run.config.mode)}** run in the sidebar; "
               "click a line to move it to that point of the step. Hover a point for its bytes and event.")
    download_png_button(chart, "compare_modes", key="dl_compare_png")
    # The figures of each run (NOTE [ Figures of a run ] in ui/runs.py): the same as the Overview's for that run.
    figures = {mode: summary(r.trace) for mode, r in runs.items()}
    rows = []
    for mode, s in figures.items():
        at_peak = s.peak.by_category if s.peak else {}
        rows.append({"mode": mode, "events": s.events, "handles": s.handles, "replays": s.replays,
                     "refused": s.refused, "released": s.released,
                     "peak": format_bytes(s.peak.total) if s.peak else "-",
                     **{f"at the peak: {category_word(c)}": format_bytes(b) for c, b in at_peak.items() if b}})
    st.subheader("Replays and peak memory by category")
    st.dataframe(rows, hide_index=True, width="stretch")
    show_chart(render_peaks, {m: r.trace for m, r in runs.items()})
    above = split_above({m: s.peak.total for m, s in figures.items() if s.peak})
    if above:  # the glossary's words, only where this run's peaks bear them out
        st.info(md(SPLIT_COST + " Here: " + "; ".join(d.sentence for d in above) + "."))


if view == VIEWS[0]:
    two_runs()
else:
    modes()
