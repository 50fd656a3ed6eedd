"""The event bus: subscribe/unsubscribe, the `enabled` flag, seq numbering, and D8's zero cost."""
from __future__ import annotations

import contextvars

import pytest
import torch

import ckpt_viz
from ckpt_viz import bus, events
from ckpt_viz.events import Event
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    reentrant_checkpoint_scope,
)


@pytest.fixture(autouse=True)
def _no_leftover_subscriber():
    assert bus.enabled is False, "a subscriber leaked from an earlier test"
    yield
    assert bus.enabled is False, "this test leaked a subscriber"


def test_subscribe_returns_unsubscribe() -> None:
    seen: list[Event] = []
    unsubscribe = bus.subscribe(seen.append)
    assert callable(unsubscribe)
    first = bus.emit("phase_set", handle_id=7, data={"old": "ordinary", "new": "dx"})
    unsubscribe()
    assert bus.emit("phase_set", handle_id=7) is None
    assert seen == [first]
    assert isinstance(first, Event) and first.kind == "phase_set" and first.handle_id == 7
    assert dict(first.data) == {"old": "ordinary", "new": "dx"}
    unsubscribe()  # a second call is harmless
    assert bus.enabled is False


def test_subscribe_rejects_a_non_callable() -> None:
    with pytest.raises(TypeError, match="expected a callable"):
        bus.subscribe("not callable")  # type: ignore[arg-type]
    assert bus.enabled is False


def test_enabled_follows_the_subscribers() -> None:
    assert bus.enabled is False
    first = bus.subscribe(lambda e: None)
    assert bus.enabled is True
    second = bus.subscribe(lambda e: None)
    first()
    assert bus.enabled is True  # one listener is left
    second()
    assert bus.enabled is False


def test_record_toggles_enabled() -> None:
    with ckpt_viz.record():
        assert bus.enabled is True
    assert bus.enabled is False


def test_seq_restarts_for_a_fresh_first_subscriber_and_counts_by_one() -> None:
    first: list[Event] = []
    unsubscribe = bus.subscribe(first.append)
    for _ in range(3):
        bus.emit("error", data={"where": "test"})
    late: list[Event] = []
    unsubscribe_late = bus.subscribe(late.append)  # not the first subscriber: no restart
    bus.emit("error")
    unsubscribe()
    unsubscribe_late()
    assert [e.seq for e in first] == [0, 1, 2, 3]
    assert [e.seq for e in late] == [3]
    assert late[0] is first[3]  # one Event object, handed to every subscriber

    again: list[Event] = []
    unsubscribe = bus.subscribe(again.append)
    bus.emit("error")
    bus.emit("error")
    unsubscribe()
    assert [e.seq for e in again] == [0, 1]


def test_each_subscriber_sees_every_event_in_order() -> None:
    a: list[str] = []
    b: list[str] = []
    off_a = bus.subscribe(lambda e: a.append(e.kind))
    off_b = bus.subscribe(lambda e: b.append(e.kind))
    try:
        for kind in ("handle_created", "forward_started", "forward_finished"):
            bus.emit(kind)
    finally:
        off_a()
        off_b()
    assert a == b == ["handle_created", "forward_started", "forward_finished"]


def test_a_subscriber_that_raises_propagates() -> None:
    class Refused(Exception):
        pass

    def refuse(event: Event) -> None:
        raise Refused(event.kind)

    unsubscribe = bus.subscribe(refuse)
    try:
        with pytest.raises(Refused, match="phase_set"):
            bus.emit("phase_set")
        w = torch.randn(3, 3, requires_grad=True)
        with pytest.raises(Refused, match="handle_created"):
            checkpoint(lambda t: torch.tanh(t @ w), torch.randn(2, 3, requires_grad=True), use_reentrant=True)
    finally:
        unsubscribe()


def test_tag_merges_and_resets() -> None:
    assert dict(bus.current_tags()) == {}
    with bus.tag(stage=0):
        with ckpt_viz.tag(microbatch=2) as merged:
            assert dict(merged) == {"stage": 0, "microbatch": 2}
            assert dict(bus.current_tags()) == {"stage": 0, "microbatch": 2}
        assert dict(bus.current_tags()) == {"stage": 0}
    assert dict(bus.current_tags()) == {}


def test_session_id_is_json_ready() -> None:
    seen: list[Event] = []
    unsubscribe = bus.subscribe(seen.append)
    bus.emit("session_cleared", session_id=("stage", 1))
    bus.emit("session_cleared", session_id="mb0")
    unsubscribe()
    assert [e.session_id for e in seen] == [repr(("stage", 1)), "mb0"]


# ------------------------------------------------------------------ D8: nothing runs with nobody listening

def _forward_backward() -> tuple[torch.Tensor, ...]:
    """One ordinary and one split reentrant checkpoint, forward and backward; returns the grads."""
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3, requires_grad=True)
    out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
    (out * out).sum().backward()
    x2 = torch.randn(2, 3, requires_grad=True)
    with reentrant_checkpoint_scope([w]) as handles:
        out2 = checkpoint(lambda t, weight: torch.tanh(t @ weight), x2, w, use_reentrant=True)
    loss2 = (out2 * out2).sum()
    (dx2,) = backward_input(loss2, None, [x2], handles=handles)
    backward_weight(loss2, None, [w], handles=handles)
    assert handles[0].released
    return x.grad, dx2, w.grad


@pytest.fixture
def tripwires(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make building an Event, walking the stack for a site, or emitting record a call and fail."""
    calls: list[str] = []

    def trip(name: str):
        def tripped(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"instrumentation ran with no subscriber: {name}")
        return tripped

    monkeypatch.setattr(bus, "Event", trip("Event"))
    monkeypatch.setattr(events, "Event", trip("Event"))
    monkeypatch.setattr(bus, "call_site", trip("call_site"))
    return calls


def test_d8_no_event_objects_or_sites_without_a_subscriber(tripwires: list[str]) -> None:
    torch.manual_seed(0)
    grads = _forward_backward()
    assert tripwires == []
    # The same run really computed gradients (the tripwires did not skip the work).
    assert all(g is not None for g in grads)


def test_d8_tripwires_fire_when_someone_listens(tripwires: list[str]) -> None:
    """Control: the same run with a subscriber does reach the patched constructors."""
    unsubscribe = bus.subscribe(lambda e: None)
    try:
        with pytest.raises(AssertionError, match="instrumentation ran with no subscriber"):
            _forward_backward()
    finally:
        unsubscribe()
    assert tripwires[0] == "call_site"


def test_d8_emit_is_not_called_without_a_subscriber(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hook point is guarded by `if bus.enabled:`, so not even `emit` is called.

    Every event goes through `emit_row` or `emit_for` (the runtime calls them directly; `emit` calls
    `emit_row`), so that is where the calls are counted."""
    calls: list[str] = []
    bus.use_native()  # what the first recording does: after it, the patches below stay in place
    real_emit_row, real_emit_for = bus.emit_row, bus.emit_for

    def counting_emit_row(kind: str, *args, **kwargs):
        calls.append(kind)
        return real_emit_row(kind, *args, **kwargs)

    def counting_emit_for(handle, kind: str, *args, **kwargs):
        calls.append(kind)
        return real_emit_for(handle, kind, *args, **kwargs)

    monkeypatch.setattr(bus, "emit_row", counting_emit_row)
    monkeypatch.setattr(bus, "emit_for", counting_emit_for)
    _forward_backward()
    assert calls == []
    with ckpt_viz.record() as rec:
        _forward_backward()
    assert calls == rec.trace.kinds() and "released" in calls  # the same hook points, now live


def test_d8_same_gradients_with_and_without_a_recorder() -> None:
    torch.manual_seed(0)
    quiet = _forward_backward()
    torch.manual_seed(0)
    with ckpt_viz.record() as rec:
        recorded = _forward_backward()
    assert len(rec.trace) > 0
    for a, b in zip(quiet, recorded, strict=True):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ channels (bus NOTE [ Recording scopes ])

def test_each_channel_numbers_its_own_events_and_closing_in_any_order_keeps_the_rest() -> None:
    outer: list[Event] = []
    inner: list[Event] = []
    glob: list[Event] = []
    unsubscribe = bus.subscribe(glob.append)
    first = bus.open_channel(outer.append)
    bus.emit("phase_set", handle_id=0)
    second = bus.open_channel(inner.append)
    returned = bus.emit("phase_set", handle_id=1)
    first.close()  # out of order: the outer channel closes first
    first.close()  # harmless twice
    bus.emit("phase_set", handle_id=2)
    second.close()
    assert bus.emit("phase_set", handle_id=3) is not None  # only the global subscriber is left
    unsubscribe()
    assert [(e.seq, e.handle_id) for e in outer] == [(0, 0), (1, 1)]
    assert [(e.seq, e.handle_id) for e in inner] == [(0, 1), (1, 2)]
    assert [(e.seq, e.handle_id) for e in glob] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert returned is inner[0]  # emit returns the innermost channel's event
    assert bus.current_scope().channels == ()


def test_enabled_counts_open_channels_and_emit_builds_nothing_for_another_context() -> None:
    seen: list[Event] = []
    channel = bus.open_channel(seen.append)
    assert bus.enabled is True
    elsewhere = contextvars.Context()  # a context that never opened the channel
    assert elsewhere.run(bus.emit, "phase_set") is None
    assert bus.emit("phase_set") is seen[0]
    channel.close()
    assert bus.enabled is False and len(seen) == 1


def test_an_explicit_scope_wins_while_it_is_open() -> None:
    home: list[Event] = []
    here: list[Event] = []

    def open_home() -> tuple[bus.Channel, bus.Scope]:
        return bus.open_channel(home.append), bus.current_scope()

    home_channel, home_scope = contextvars.Context().run(open_home)  # opened in another context
    channel = bus.open_channel(here.append)
    bus.emit("node_collected", scope=home_scope)  # e.g. a handle's node collected on this thread
    assert (len(home), len(here)) == (1, 0)
    home_channel.close()
    bus.emit("node_collected", scope=home_scope)  # its recordings are closed: this context's scope instead
    assert (len(home), len(here)) == (1, 1)
    channel.close()


def test_name_of_reads_the_innermost_channel_that_names_the_object() -> None:
    thing, other = object(), object()
    outer = bus.open_channel(lambda e: None, names={id(thing): "outer.thing", id(other): "other"})
    inner = bus.open_channel(lambda e: None, names={id(thing): "inner.thing"})
    assert (bus.name_of(thing), bus.name_of(other)) == ("inner.thing", "other")
    inner.close()
    assert bus.name_of(thing) == "outer.thing"
    outer.close()
    assert bus.name_of(thing) is None


def test_a_keeping_channel_returns_event_rows_and_an_fn_channel_inside_it_gets_events() -> None:
    from ckpt_viz.events import EventRow
    from ckpt_viz.trace.rows import RecordedEvents

    rows = RecordedEvents()
    after: list[tuple[EventRow, int]] = []
    outer = bus.open_channel(rows=rows.keep, after=lambda row: after.append((row, rows.pending)))
    first = bus.emit("phase_set", handle_id=0, capture_site=False)
    inner_seen: list[Event] = []
    inner = bus.open_channel(inner_seen.append)
    second = bus.emit("phase_set", handle_id=1, capture_site=False)
    inner.close()
    outer.close()
    assert isinstance(first, EventRow) and (first.seq, first.handle_id, first.kind) == (0, 0, "phase_set")
    assert second is inner_seen[0] and second.seq == 0  # the innermost channel's own numbering
    assert [(row.seq, kept) for row, kept in after] == [(0, 1), (1, 2)]  # `after` runs right after each keep
    assert rows.pending == 2 and rows.column("handle_id") == [0, 1] and rows.column("seq") == [0, 1]
    assert [(e.seq, e.handle_id) for e in rows] == [(0, 0), (1, 1)] and rows[0] == first.event()
    assert rows.pending == 0 and rows.column("kind") == ["phase_set"] * 2
    with pytest.raises(TypeError, match="either fn or rows"):
        bus.open_channel(inner_seen.append, rows=rows.keep)
    with pytest.raises(TypeError, match="either fn or rows"):
        bus.open_channel()


def test_a_recording_numbered_by_position_gives_every_thread_the_seq_its_event_has() -> None:
    # NOTE [ Cost with nobody listening ], rule 5: no lock, no counter; seq = position (rows.py NOTE rule 4).
    import threading

    from ckpt_viz.events import KeptRow
    from ckpt_viz.trace.rows import RecordedEvents

    kept = RecordedEvents()
    channel = bus.open_channel(rows=kept.keep, seq_of=kept.seq_of)
    scope = bus.current_scope()
    assert scope.sole is channel
    got: dict[int, list] = {}
    start = threading.Barrier(4)

    def work(worker: int) -> None:
        with bus.enter_scope(scope):
            start.wait()
            got[worker] = [bus.emit_row("phase_set", worker, None, None, None, None, False, {"i": i})
                           for i in range(2000)]

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    half = kept[:100]  # a reader builds some events while the threads keep more
    for t in threads:
        t.join()
    mine = bus.emit("phase_set", handle_id=9, capture_site=False)
    channel.close()
    assert isinstance(mine, KeptRow) and mine.seq == 8000 and half == kept[:100]
    assert [e.seq for e in kept] == list(range(8001))
    for worker, rows in got.items():
        assert [kept[row.seq].data["i"] for row in rows] == list(range(2000))  # each row names its own event
        assert {kept[row.seq].handle_id for row in rows} == {worker} and rows[0].event() == kept[rows[0].seq]
    assert kept.seq_of((0,)) is None  # an event it never kept
