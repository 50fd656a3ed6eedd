"""The time cursor every page shares: one event position in the run, a slider, step buttons, a line in words.

`cursor_bar(run)` draws it and returns the event seq at the cursor; `window(run, seq)` gives
the views that read the events around the cursor a small trace on a big run.

The public API other pages use (keep it stable):
    cursor_seq(run) -> int           the seq at the cursor, without drawing anything
    cursor_position(run) -> int      its position in run.trace.events
    position_of(run, seq) -> int     the position of the event with that seq (or the last one before it)
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

from bisect import bisect_right

import streamlit as st

from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.words import describe_event
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import Kind
from ui.runs import Run, RunConfig

CURSOR = "cursor"
WINDOW = 2_000  # events either side of the cursor that per-cursor views read on a big trace
JUMPS: dict[str, Kind] = {"replay": "replay_started", "release": "released",  # "Next <name>" -> event kind
                         "refusal": "replay_refused", "error": "error"}


# See NOTE [ State that survives page changes ], rules 2 and 3.


def _store(config: RunConfig, position: int) -> None:
    st.session_state[CURSOR] = (config, position)


def position_of(run: Run, seq: int | None) -> int:
    """The position of the event with seq `seq` (or of the last one before it; None: the last event); 0 before
    the first event, -1 for an empty run."""
    events = run.trace.events
    if not events:
        return -1
    if seq is None:
        return len(events) - 1
    return max(bisect_right(events, seq, key=lambda e: e.seq) - 1, 0)


def seq_at(run: Run, position: int) -> int:
    """The seq of the event at `position` (clamped to the run)."""
    events = run.trace.events
    return events[min(max(position, 0), len(events) - 1)].seq


def set_cursor_position(run: Run, position: int) -> None:
    """Move the cursor to event position `position` of `run` (clamped to the run)."""
    n = len(run.trace.events)
    _store(run.config, min(max(int(position), 0), max(n - 1, 0)))


def set_cursor(run: Run, seq: int) -> None:
    """Move the cursor to the event with seq `seq` (or the last one before it)."""
    set_cursor_position(run, position_of(run, int(seq)))


def _from_slider(config: RunConfig) -> None:
    _store(config, int(st.session_state["cursor_slider"]))


def cursor_position(run: Run) -> int:
    """The cursor's event position in `run` (the first event when the run is new, or where the URL put it)."""
    from ui.url import pending_cursor, publish_cursor

    n = len(run.trace.events)
    config, position = st.session_state.get(CURSOR, (None, None))
    if config != run.config or position is None:
        position = 0
    if (seq := pending_cursor(run.config)) is not None:  # a reload, a link, the back button (ui/url.py)
        position = position_of(run, seq)
    position = min(max(int(position), 0), max(n - 1, 0))
    _store(run.config, position)
    publish_cursor(run.config, seq_at(run, position) if n else 0)
    return position


def cursor_seq(run: Run) -> int:
    """The event seq at the cursor, without drawing the bar (0 for an empty run)."""
    return seq_at(run, cursor_position(run)) if run.trace.events else 0


def _jumps(run: Run) -> dict[str, list[int]]:
    """The positions of the events of each `JUMPS` kind, in order: one pass over the run, kept with it."""
    found = run.memo.get("jumps")
    if found is None:
        events = run.trace.events
        found = {kind: [] for kind in JUMPS.values()}
        for i in run.trace.positions(*JUMPS.values()):
            found[events[i].kind].append(i)
        run.memo["jumps"] = found
    return found


def next_position(run: Run, kind: str, after: int) -> int | None:
    """The position of the first event of `kind` (one of `JUMPS`' kinds) after position `after`, or None."""
    positions = _jumps(run)[kind]
    i = bisect_right(positions, after)
    return positions[i] if i < len(positions) else None


def cursor_bar(run: Run) -> int:
    """Draw the time cursor (slider, step buttons, the event in words); return the event seq at the cursor."""
    n = len(run.trace.events)
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
            target = next_position(run, kind, p)
            row.button(f"Next {name}", key=f"cursor_next_{name}", on_click=_store,
                       args=(run.config, target if target is not None else p), disabled=target is None)
        event = run.trace.events[p]
        st.code(describe_event(event, handle_labels(run.trace)), language=None, width="stretch", wrap_lines=True)
    return event.seq


def window(run: Run, seq: int, radius: int = WINDOW) -> Trace:
    """The run's trace, or on a big trace a trace of the events within `radius` positions of `seq`.

    Only the events: the views that read a window (handle lists) need nothing else.
    """
    n = len(run.trace.events)
    if n <= 2 * radius + 1:
        return run.trace
    p = position_of(run, seq)
    return Trace(events=run.trace.events[max(0, p - radius):p + radius + 1], meta=dict(run.trace.meta))
