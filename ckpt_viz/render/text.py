"""`render_text`: one line per event, for terminals, lessons, bug reports and golden tests.

Pure function of the typed events (`ckpt_viz.events`); standard library and msgspec only.

    seq  kind              handle  phase  details
      7  replay_started    h3      dx     trigger=backward
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ckpt_viz.events import Event

__all__ = ["format_event", "render_text"]

# The fields worth a column, per kind, in this order, each shown unless it is None or an empty list; the others are
# left out to keep one line short (the Events page's table shows every field).
_DETAILS: dict[str, tuple[str, ...]] = {
    "handle_created": ("function", "split", "collector", "input_count"),
    "forward_finished": ("saved_count", "non_differentiable", "exclude_entries"),
    "forward_failed": ("type", "message"),
    "tensor_packed": ("index", "shape", "dtype", "nbytes"),
    "tensor_unpacked": ("index", "key_source", "consumed"),
    "phase_set": ("old", "new"),
    "backward_entered": ("split", "retain_graph"),
    "replay_started": ("trigger", "key_source"),
    "replay_finished": ("trigger", "early_stopped"),
    "replay_failed": ("type", "message"),
    "early_stopped": ("saved_count",),
    "replay_refused": ("reason", "last_release_reason", "last_release_seq"),
    "grads_routed": ("targets", "explicit_params", "activations", "discarded_activations"),
    "released": ("reason", "was_replayed"),
    "node_collected": ("was_replayed", "released"),
    "session_bound": ("retain",),
    "session_activated": ("retain_on_unpack", "handles"),
    "session_deactivated": ("handles",),
    "session_cleared": ("handles", "frames"),
    "prefired": ("path",),
    "exclude_saved": ("wrapper", "call_index", "save_output", "cached_nbytes"),
    "exclude_reused": ("wrapper", "call_index", "placeholder"),
    "replay_diverged": ("divergence", "code", "region", "count"),
    "memory_sampled": ("at",),
    "error": ("where", "type", "message", "code"),
}


def _value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_value(v) for v in value) + "]"
    text = str(value)
    first_line = text.splitlines()[0] if text else text
    return first_line if len(first_line) <= 60 else first_line[:57] + "..."


def _details(event: Event) -> str:
    values = ((k, getattr(event, k)) for k in _DETAILS.get(event.kind, ()) if hasattr(event, k))
    return "  ".join(f"{k}={_value(v)}" for k, v in values if v is not None and v != ())


def format_event(event: Event, *, site: bool = False) -> str:
    """One event as one line (no trailing newline)."""
    handle = f"h{event.handle_id}" if event.handle_id is not None else "-"
    tags = "".join(f" {k}={v}" for k, v in event.tags.items())
    session = f" sid={event.session_id}" if event.session_id is not None else ""
    line = (f"{event.seq:5d}  {event.kind:<19} {handle:<5} {event.phase or '-':<8} "
            f"{_details(event)}{session}{tags}").rstrip()
    if site and event.site:
        line += f"  @ {event.site}"
    return line


def render_text(events: Iterable[Event], *, site: bool = False) -> str:
    """All events, one line each, with a header; `site=True` appends the user's file:line."""
    lines = [f"{'seq':>5}  {'kind':<19} {'hdl':<5} {'phase':<8} details"]
    lines.extend(format_event(e, site=site) for e in events)
    return "\n".join(lines) + "\n"
