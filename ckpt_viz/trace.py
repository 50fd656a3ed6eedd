"""`Trace`: what a recorded run leaves behind (events now; memory and graphs grow here).

Standard library only, so the app can open a trace without torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from ckpt_viz.events import Event

__all__ = ["Trace"]


@dataclass
class Trace:
    """A recorded run.

    Attributes:
        events: every event in emission order.
        meta: free-form facts about the run (model, mode, versions).
    """

    events: list[Event] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def kinds(self) -> list[str]:
        """The kind of every event, in order."""
        return [e.kind for e in self.events]

    def of_kind(self, *kinds: str) -> list[Event]:
        """The events of the given kinds, in order."""
        wanted = set(kinds)
        return [e for e in self.events if e.kind in wanted]

    def count(self, kind: str) -> int:
        """How many events of `kind` the trace holds."""
        return sum(1 for e in self.events if e.kind == kind)

    def for_handle(self, handle_id: int) -> list[Event]:
        """The events about one handle, in order."""
        return [e for e in self.events if e.handle_id == handle_id]

    def handle_ids(self) -> list[int]:
        """Handle ids in order of first appearance."""
        seen: dict[int, None] = {}
        for e in self.events:
            if e.handle_id is not None:
                seen.setdefault(e.handle_id, None)
        return list(seen)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def extend(self, events: Iterable[Event]) -> None:
        self.events.extend(events)
