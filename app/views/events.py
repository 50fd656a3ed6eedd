"""The event log around the cursor: filter it, read it as a table (click a row to move the cursor) or as text."""
import bisect
from functools import partial

import pandas as pd
import streamlit as st

from ckpt_viz import EVENT_KINDS, event_rows, filter_events, palette, rows_text
from ui.cursor import cursor_bar, set_cursor
from ui.runs import current

run = current()
st.title("Events")
seq = cursor_bar(run)

a, b, c, d = st.columns([3, 2, 2, 2])
kinds = a.multiselect("Kinds", EVENT_KINDS, key="ev_kinds")
phases = b.multiselect("Phases", ("ordinary", "dx", "dw"), key="ev_phases", format_func=palette.phase_word)
handles_text = c.text_input("Handles", key="ev_handles", placeholder="e.g. 0, 3")
text = d.text_input("Search", key="ev_text", placeholder="text in any field")
rows_each_side = st.slider("Rows either side of the cursor", 5, 200, 10, key="ev_rows")
try:
    handles = tuple(int(h.strip().lstrip("h")) for h in handles_text.split(",") if h.strip())
except ValueError:
    st.error(f"Handles: expected ids separated by commas, like 0, 3 (got {handles_text!r}).")
    st.stop()

if kinds or phases or handles or text:
    matches = run.cached(lambda trace, k, p, h, t: filter_events(trace, kinds=k or None, phases=p or None,
                                                                handles=h or None, text=t or None),
                         tuple(kinds), tuple(phases), handles, text)
    i = bisect.bisect_left([e.seq for e in matches], seq) if len(matches) < 50_000 else \
        bisect.bisect_left(matches, seq, key=lambda e: e.seq)
    shown = matches[max(0, i - rows_each_side): i + rows_each_side + 1]
    st.caption(f"{len(matches):,} matching events; showing {len(shown)} around seq {seq}.")
else:
    p = run.index.position(seq)
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
    frame = pd.DataFrame([{"": "▶" if r["seq"] == seq else "", **r} for r in rows])
    shown_columns = ["", *(c for c in frame.columns if c and (c in ("seq", "kind", "details") or frame[c].any()))]
    key = f"ev_table_{seq}_{rows[0]['seq'] if rows else 0}_{len(rows)}"  # a fresh selection at each cursor
    at_cursor = [i for i, r in enumerate(rows) if r["seq"] == seq]
    st.dataframe(frame, hide_index=True, width="stretch", height=min(38 + 35 * len(rows), 1500), key=key,
                 selection_mode="single-row", column_order=shown_columns,
                 selection_default={"selection": {"rows": at_cursor}},
                 on_select=partial(_row_clicked, key, [r["seq"] for r in rows]),
                 column_config={"": st.column_config.TextColumn("", width=24),
                                "details": st.column_config.TextColumn("details", width="large")})
    # A table cell shows one line (Streamlit wraps cells only in some layouts): the cursor row's details, whole.
    event = run.trace.events[run.index.position(seq)]
    st.caption(f"Details of the event at the cursor (seq {event.seq}, {event.kind}), every field")
    st.code("\n".join(f"{k}={v}" for k, v in (event.data or {}).items()) or "(no data)", language=None,
            wrap_lines=True)
with plain:
    st.caption("The same rows and columns as the table; the cursor row starts with >.")
    st.code(rows_text(rows, marker=seq), language=None)
