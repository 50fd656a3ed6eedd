"""The event log around the cursor: filter it, read it as a table (click a row to move the cursor) or as text."""
from bisect import bisect_left
from functools import partial

import pandas as pd
import streamlit as st

from ckpt_viz.analysis.words import phase_word
from ckpt_viz.render.eventlog import ROW_COLUMNS, event_fields, event_rows, filter_events, rows_text
from ckpt_viz.vocabulary import KINDS, PHASES
from ui.cursor import cursor_bar, position_of, set_cursor
from ui.downloads import download_csv_button
from ui.runs import current
from ui.text import md

run = current()
st.title("Events")
seq = cursor_bar(run)

a, b, c, d = st.columns([3, 2, 2, 2])
kinds = a.multiselect("Kinds", KINDS, key="ev_kinds")
phases = b.multiselect("Phases", PHASES, key="ev_phases", format_func=phase_word)
handles_text = c.text_input("Handles", key="ev_handles", placeholder="e.g. 0, 3")
text = d.text_input("Search", key="ev_text", placeholder="text in any field")
rows_each_side = st.slider("Rows either side of the cursor", 5, 200, 10, key="ev_rows")
try:
    handles = tuple(int(h.strip().lstrip("h")) for h in handles_text.split(",") if h.strip())
except ValueError:
    st.error(md(f"Handles: expected ids separated by commas, like 0, 3 (got {handles_text!r})."))
    st.stop()


def _matches(key: tuple) -> list:
    """The events passing the filters `key` (kinds, phases, handles, text), kept with the run (the last 8)."""
    kept = run.memo.setdefault("event_filters", {})
    if key not in kept:
        kinds, phases, handles, text = key
        kept[key] = filter_events(run.trace, kinds=kinds or None, phases=phases or None, handles=handles or None,
                                  text=text or None)
        while len(kept) > 8:
            kept.pop(next(iter(kept)))
    return kept[key]


if kinds or phases or handles or text:
    matches = _matches((tuple(kinds), tuple(phases), handles, text))
    i = bisect_left(matches, seq, key=lambda e: e.seq)
    shown = matches[max(0, i - rows_each_side): i + rows_each_side + 1]
    st.caption(f"{len(matches):,} matching events; showing {len(shown)} around seq {seq}.")
else:
    p = position_of(run, seq)
    shown = run.trace.events[max(0, p - rows_each_side): p + rows_each_side + 1]
    st.caption(f"{len(run.trace):,} events; showing {len(shown)} around seq {seq} (the cursor row is marked ▶).")


def _row_clicked(key: str, seqs: list[int]) -> None:
    """A click on a table row moves the cursor to that row's event."""
    rows = st.session_state[key].selection.rows
    if rows and 0 <= rows[0] < len(seqs):
        set_cursor(run, seqs[rows[0]])


rows = event_rows(shown)
table, plain = st.tabs(["Table", "Plain text"])
with table:
    st.caption("The cursor's row is selected (and marked ▶); select another row to move the cursor there. Its "
               "details are shown whole below the table.")
    frame = pd.DataFrame([{"": "▶" if r["seq"] == seq else "", **r} for r in rows], columns=["", *ROW_COLUMNS])
    shown_columns = ["", *(c for c in frame.columns if c and (c in ("seq", "kind", "details") or frame[c].any()))]
    key = f"ev_table_{seq}_{rows[0]['seq'] if rows else 0}_{len(rows)}"  # a fresh selection at each cursor
    at_cursor = [i for i, r in enumerate(rows) if r["seq"] == seq]
    st.dataframe(frame, hide_index=True, width="stretch", height=min(38 + 35 * len(rows), 1500), key=key,
                 selection_mode="single-row", column_order=shown_columns,
                 selection_default={"selection": {"rows": at_cursor}},
                 on_select=partial(_row_clicked, key, [r["seq"] for r in rows]),
                 column_config={"": st.column_config.TextColumn("", width=24),
                                "details": st.column_config.TextColumn("details", width="large")})
    download_csv_button(rows, f"events_seq{seq}", key="dl_events_csv")
    # A table cell shows one line (Streamlit wraps cells only in some layouts): the cursor row's details, whole.
    event = run.trace.events[position_of(run, seq)]
    st.caption(f"Details of the event at the cursor (seq {event.seq}, {md(event.kind)}), every field")
    st.code("\n".join(f"{k}={v}" for k, v in event_fields(event).items()) or "(no fields)", language=None,
            wrap_lines=True)
with plain:
    st.caption("The same rows and columns as the table; the cursor row starts with >.")
    st.code(rows_text(rows, marker=seq), language=None)
