"""The time cursor every page shares: one event position in the run, a slider, step buttons, a line in words.

`cursor_bar(run)` draws it and returns the event seq at the cursor; `window(run, seq)` gives
the views that read the events around the cursor a small trace on a big run.

The public API other pages use (keep it stable):
    cursor_seq(run) -> int           the seq at the cursor, without drawing anything
    cursor_position(run) -> int      its position in run.trace.events
    set_cursor(run, seq)             move it to the event with that seq (or the last one before it)
    set_cursor_position(run, p)      move it to position p (clamped)
    JUMPS                            "Next ..." buttons: button name -> the event kind it jumps to
Use `set_cursor` in an `on_click` / `on_change` callback (it runs before the page), or call
`st.rerun()` after it.

NOTE [ State that survives page changes ]
  1. Streamlit scopes a widget's identity to the page that draws it, so a widget drawn
     by a page forgets its value on a page change. The source picker is therefore drawn
     by the entrypoint (`source.source_sidebar`, before `pg.run()`), where it keeps its
     value, uploaded files included.
  2. The cursor is drawn by each page, so its truth lives in a plain session key,
     CURSOR = (config, position); the slider's key is set from it before the slider is
     drawn, and the slider and the step buttons write it back in callbacks.
  3. A new source or mode puts the cursor at the start of the run (its first event), so a
     learner sees the run unfold and "Next replay" has somewhere to go.
"""
from __future__ import annotations

import streamlit as st

from ckpt_viz import Trace, describe_event, event_column, event_data
from ui.runs import Run, RunConfig, next_position

CURSOR = "cursor"
WINDOW = 2_000  # events either side of the cursor that per-cursor views read on a big trace
JUMPS: dict[str, str] = {"replay": "replay_started", "release": "released",  # "Next <name>" -> event kind
                         "refusal": "replay_refused", "error": "error"}


# See NOTE [ State that survives page changes ], rules 2 and 3.


def _store(config: RunConfig, position: int) -> None:
    st.session_state[CURSOR] = (config, position)


def set_cursor_position(run: Run, position: int) -> None:
    """Move the cursor to event position `position` of `run` (clamped to the run)."""
    n = len(run.index.seqs)
    _store(run.config, min(max(int(position), 0), max(n - 1, 0)))


def set_cursor(run: Run, seq: int) -> None:
    """Move the cursor to the event with seq `seq` (or the last one before it)."""
    set_cursor_position(run, run.index.position(int(seq)))


def _from_slider(config: RunConfig) -> None:
    _store(config, int(st.session_state["cursor_slider"]))


def cursor_position(run: Run) -> int:
    """The cursor's event position in `run` (the first event when the run is new)."""
    n = len(run.index.seqs)
    config, position = st.session_state.get(CURSOR, (None, None))
    if config != run.config or position is None:
        position = 0
    position = min(max(int(position), 0), max(n - 1, 0))
    _store(run.config, position)
    return position


def cursor_seq(run: Run) -> int:
    """The event seq at the cursor, without drawing the bar."""
    return run.index.seq_at(cursor_position(run))


def handle_name(trace: Trace, handle_id: int | None) -> str | None:
    """The checkpointed function of one handle (the block's qualified name) from its last `handle_created` that
    names one; None when none does. Reads only that handle's events (found in C, list.index), so the cursor line
    of a big trace does not name every handle first."""
    if handle_id is None:
        return None
    handles, kinds, data = event_column(trace, "handle_id"), event_column(trace, "kind"), event_data(trace)
    name, i = None, -1
    while True:
        try:
            i = handles.index(handle_id, i + 1)
        except ValueError:
            return name
        if kinds[i] == "handle_created":
            function = data(i, "function")
            if function:
                name = str(function)


def cursor_bar(run: Run) -> int:
    """Draw the time cursor (slider, step buttons, the event in words); return the event seq at the cursor."""
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
        steps = (("first", "First", 0), ("prev", "−1", p - 1), ("next", "+1", p + 1), ("last", "Last", n - 1))
        for key, label, target in steps:
            target = min(max(target, 0), n - 1)
            row.button(label, key=f"cursor_{key}", on_click=_store, args=(run.config, target), disabled=target == p)
        for name, kind in JUMPS.items():
            target = next_position(run.trace, kind, p)
            row.button(f"Next {name}", key=f"cursor_next_{name}", on_click=_store,
                       args=(run.config, target if target is not None else p), disabled=target is None)
        seq = run.index.seqs[p]
        event = run.trace.events[p]
        name = run.cached(handle_name, event.handle_id)
        st.code(describe_event(event, {event.handle_id: name} if name else None), language=None, width="stretch",
                wrap_lines=True)
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
