"""The time cursor every page shares: one event position in the run, a slider and step buttons.

`cursor_bar(run)` draws it and returns the event seq at the cursor; `window(run, seq)` gives
the views that read the events around the cursor a small trace on a big run.

NOTE [ State that survives page changes ]
  1. Streamlit scopes a widget's identity to the page that draws it, so a widget drawn
     by a page forgets its value on a page change. The source picker is therefore drawn
     by the entrypoint (`source.source_sidebar`, before `pg.run()`), where it keeps its
     value, uploaded files included.
  2. The cursor is drawn by each page, so its truth lives in a plain session key,
     CURSOR = (config, position); the slider's key is set from it before the slider is
     drawn, and the slider and the step buttons write it back in callbacks.
  3. A new source or mode resets the cursor to the end of the run.
"""
from __future__ import annotations

import bisect

import streamlit as st

from ckpt_viz import Trace, format_event
from ui.runs import Run, RunConfig

CURSOR = "cursor"
WINDOW = 2_000  # events either side of the cursor that per-cursor views read on a big trace


# See NOTE [ State that survives page changes ], rules 2 and 3.


def _set_cursor(config: RunConfig, position: int) -> None:
    st.session_state[CURSOR] = (config, position)


def _from_slider(config: RunConfig) -> None:
    _set_cursor(config, int(st.session_state["cursor_slider"]))


def cursor_position(run: Run) -> int:
    """The cursor's event position in `run` (the last event when the run is new)."""
    n = len(run.index.seqs)
    config, position = st.session_state.get(CURSOR, (None, None))
    if config != run.config or position is None:
        position = n - 1
    position = min(max(int(position), 0), n - 1)
    _set_cursor(run.config, position)
    return position


def cursor_bar(run: Run) -> int:
    """Draw the time cursor (slider and step buttons); return the event seq at the cursor."""
    n = len(run.index.seqs)
    if n == 0:
        st.info("This trace holds no events.")
        st.stop()
    p = cursor_position(run)
    with st.container(border=True):
        if n > 1:
            st.session_state["cursor_slider"] = p
            st.slider(f"Time cursor: event position (0 to {n - 1:,})", 0, n - 1, key="cursor_slider",
                      on_change=_from_slider, args=(run.config,))
        row = st.container(horizontal=True, gap="small", vertical_alignment="center")
        steps = (("first", "First", ":material/first_page:", 0), ("prev", "−1", ":material/chevron_left:", p - 1),
                 ("next", "+1", ":material/chevron_right:", p + 1), ("last", "Last", ":material/last_page:", n - 1))
        for key, label, icon, target in steps:
            target = min(max(target, 0), n - 1)
            row.button(label, key=f"cursor_{key}", icon=icon, on_click=_set_cursor, args=(run.config, target),
                       disabled=target == p)
        for name, positions in run.marks.items():
            i = bisect.bisect_right(positions, p)
            target = positions[i] if i < len(positions) else None
            row.button(f"Next {name}", key=f"cursor_next_{name}", icon=":material/skip_next:", on_click=_set_cursor,
                       args=(run.config, target if target is not None else p), disabled=target is None)
        seq = run.index.seqs[p]
        st.code(format_event(run.trace.events[p], site=True), language=None, width="stretch")
    return seq


def window(run: Run, seq: int, radius: int = WINDOW) -> Trace:
    """The run's trace, or on a big trace a trace of the events within `radius` positions of `seq`.

    Only the events: the views that read a window (lifecycles, handle lists) need nothing else.
    See NOTE [ Big traces ] in runs.py, rule 1.
    """
    n = len(run.index.seqs)
    if n <= 2 * radius + 1:
        return run.trace
    p = run.index.position(seq)
    return Trace(events=run.trace.events[max(0, p - radius):p + radius + 1], meta=dict(run.trace.meta))
