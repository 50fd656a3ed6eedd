"""The event bus: subscribe/unsubscribe, the `enabled` flag, seq numbering, channels, and D8's zero cost."""
from __future__ import annotations

import contextvars
import gc
import sys
import threading
import time
from typing import Any

import pytest
import torch

import ckpt_viz
from ckpt_viz import bus, sites
from ckpt_viz.events import (
    Error,
    EventBase,
    ForwardFinished,
    ForwardStarted,
    HandleCreated,
    NodeCollected,
    PhaseSet,
    Released,
    SessionBound,
    SessionCleared,
)
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    reentrant_checkpoint_scope,
)
from traces import kinds

Event = EventBase


@pytest.fixture(autouse=True)
def _no_leftover_subscriber():
    assert bus.enabled is False, "a subscriber leaked from an earlier test"
    yield
    assert bus.enabled is False, "this test leaked a subscriber"


def test_subscribe_returns_unsubscribe() -> None:
    seen: list[Event] = []
    unsubscribe = bus.subscribe(seen.append)
    assert callable(unsubscribe)
    first = bus.emit(PhaseSet, handle_id=7, old="ordinary", new="dx")
    unsubscribe()
    assert bus.emit(PhaseSet, handle_id=7, old="ordinary", new="dx") is None
    assert seen == [first]
    assert isinstance(first, PhaseSet) and first.kind == "phase_set" and first.handle_id == 7
    assert (first.old, first.new) == ("ordinary", "dx")
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
        bus.emit(Error, where="test", type="T")
    late: list[Event] = []
    unsubscribe_late = bus.subscribe(late.append)  # not the first subscriber: no restart
    bus.emit(Error, where="test", type="T")
    unsubscribe()
    unsubscribe_late()
    assert [e.seq for e in first] == [0, 1, 2, 3]
    assert [e.seq for e in late] == [3]
    assert late[0] is first[3]  # one event object, handed to every subscriber

    again: list[Event] = []
    unsubscribe = bus.subscribe(again.append)
    bus.emit(Error, where="test", type="T")
    bus.emit(Error, where="test", type="T")
    unsubscribe()
    assert [e.seq for e in again] == [0, 1]


def test_each_subscriber_sees_every_event_in_order() -> None:
    a: list[str] = []
    b: list[str] = []
    off_a = bus.subscribe(lambda e: a.append(e.kind))
    off_b = bus.subscribe(lambda e: b.append(e.kind))
    try:
        for cls in (HandleCreated, ForwardStarted, ForwardFinished):
            bus.emit(cls)
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
            bus.emit(PhaseSet, old="ordinary", new="dx")
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
    bus.emit(SessionCleared, session_id=("stage", 1))
    bus.emit(SessionCleared, session_id="mb0")
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
    """Make emitting an event, reporting an error or walking the stack for a site record a call and fail.

    Every event is built inside `bus.emit` (no module of ckpt_viz builds one elsewhere: test_layering.py checks
    it), and the runtime reaches the bus as `bus.emit` / `bus.emit_error`, so these are all the doors."""
    calls: list[str] = []

    def trip(name: str):
        def tripped(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"instrumentation ran with no subscriber: {name}")
        return tripped

    monkeypatch.setattr(bus, "emit", trip("emit"))
    monkeypatch.setattr(bus, "emit_error", trip("emit_error"))
    monkeypatch.setattr(bus, "call_site", trip("call_site"))
    return calls


def test_d8_no_event_objects_or_sites_without_a_subscriber(tripwires: list[str]) -> None:
    torch.manual_seed(0)
    grads = _forward_backward()
    assert tripwires == []
    # The same run really computed gradients (the tripwires did not skip the work).
    assert all(g is not None for g in grads)


def test_d8_tripwires_fire_when_someone_listens(tripwires: list[str]) -> None:
    """Control: the same run with a subscriber does reach the patched functions."""
    unsubscribe = bus.subscribe(lambda e: None)
    try:
        with pytest.raises(AssertionError, match="instrumentation ran with no subscriber"):
            _forward_backward()
    finally:
        unsubscribe()
    assert tripwires[0] == "call_site"  # the checkpoint call walks to its site before it emits


def test_d8_emit_is_not_called_without_a_subscriber(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hook point is guarded by `if bus.enabled:`, so not even `emit` is called."""
    calls: list[str] = []
    real_emit = bus.emit

    def counting_emit(cls: type[EventBase], *args: Any, **kwargs: Any) -> Any:
        calls.append(cls.kind)
        return real_emit(cls, *args, **kwargs)

    monkeypatch.setattr(bus, "emit", counting_emit)
    _forward_backward()
    assert calls == []
    with ckpt_viz.record() as rec:
        _forward_backward()
    assert calls == kinds(rec.trace) and "released" in calls  # the same hook points, now live


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

def _phase(handle_id: int | None = None, **common: Any) -> Any:
    return bus.emit(PhaseSet, handle_id=handle_id, old="ordinary", new="dx", **common)


def test_each_channel_numbers_its_own_events_and_closing_in_any_order_keeps_the_rest() -> None:
    outer: list[Event] = []
    inner: list[Event] = []
    glob: list[Event] = []
    unsubscribe = bus.subscribe(glob.append)
    first = bus.open_channel(outer.append)
    _phase(0)
    second = bus.open_channel(inner.append)
    returned = _phase(1)
    first.close()  # out of order: the outer channel closes first
    first.close()  # harmless twice
    _phase(2)
    second.close()
    assert _phase(3) is not None  # only the global subscriber is left
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
    assert elsewhere.run(_phase) is None
    assert _phase() is seen[0]
    channel.close()
    assert bus.enabled is False and len(seen) == 1


def test_an_explicit_scope_wins_while_it_is_open() -> None:
    home: list[Event] = []
    here: list[Event] = []

    def open_home() -> tuple[bus.Channel, bus.Scope]:
        return bus.open_channel(home.append), bus.current_scope()

    home_channel, home_scope = contextvars.Context().run(open_home)  # opened in another context
    channel = bus.open_channel(here.append)
    bus.emit(NodeCollected, scope=home_scope)  # e.g. a handle's node collected on this thread
    assert (len(home), len(here)) == (1, 0)
    bus.emit(NodeCollected, scope=bus.Scope())  # a scope with no open channel: this context's instead
    assert (len(home), len(here)) == (1, 1)
    home_channel.close()
    bus.emit(NodeCollected, scope=home_scope)  # its recordings are closed: this context's scope instead
    assert (len(home), len(here)) == (1, 2)
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


def test_a_listener_sees_each_event_before_the_next_is_built_and_nested_channels_number_their_own() -> None:
    # What the trace's seq means: a channel's listener gets its events one by one, in seq order, and the innermost
    # channel's event is what emit returns (a seq the runtime quotes back is the innermost recording's).
    outer_seen: list[tuple[int, int]] = []
    outer_events: list[Event] = []

    def keep(event: Event) -> None:
        outer_events.append(event)
        outer_seen.append((event.seq, len(outer_events)))

    outer = bus.open_channel(keep)
    first = _phase(0, capture_site=False)
    inner_seen: list[Event] = []
    inner = bus.open_channel(inner_seen.append)
    second = _phase(1, capture_site=False)
    inner.close()
    outer.close()
    assert isinstance(first, PhaseSet) and (first.seq, first.handle_id, first.kind) == (0, 0, "phase_set")
    assert first is outer_events[0] and first.site is None
    assert second is inner_seen[0] and second.seq == 0  # the innermost channel's own numbering
    assert outer_events[1].seq == 1 and outer_events[1] != second  # one event per channel, each its own seq
    assert outer_seen == [(0, 1), (1, 2)]


def test_threads_emitting_into_one_recording_get_the_seq_of_their_place_in_it() -> None:
    # NOTE [ Cost with nobody listening ], rule 5: seq = position, under the channel's lock.
    kept: list[Event] = []
    channel = bus.open_channel(kept.append)
    scope = bus.current_scope()
    got: dict[int, list[Any]] = {}
    start = threading.Barrier(4)

    def work(worker: int) -> None:
        with bus.enter_scope(scope):
            start.wait()
            got[worker] = [_phase(worker, session_id=i, capture_site=False) for i in range(2000)]

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(kept) < 100 and time.monotonic() < deadline:  # the threads may not have started yet
        time.sleep(0.001)
    half = list(kept[:100])  # a reader reads some events while the threads keep more
    assert len(half) == 100
    for t in threads:
        t.join()
    mine = _phase(9, capture_site=False)
    channel.close()
    assert mine.seq == 8000 and half == kept[:100]
    assert [e.seq for e in kept] == list(range(8001))
    for worker, events in got.items():
        assert [kept[e.seq].session_id for e in events] == list(range(2000))  # each event is its own place
        assert {kept[e.seq].handle_id for e in events} == {worker} and all(kept[e.seq] is e for e in events)
        assert {e.thread_id for e in events} == {threads[worker].ident}


# ------------------------------------------------------------------ what emit stamps on an event

class _Session:
    def __repr__(self) -> str:
        return "<session 1>"


def _site_here() -> str | None:  # a user line: this test file is not skipped
    return sites.call_site(1)


def test_emit_stamps_site_session_tags_clock_and_thread() -> None:
    kept: list[Event] = []
    channel = bus.open_channel(kept.append)
    start = time.monotonic_ns()
    try:
        _phase(3, site="given.py:1")
        line = sys._getframe().f_lineno + 1
        bus.emit(PhaseSet, handle_id=3, old="ordinary", new="dx")  # the site is captured here
        _phase(3, capture_site=False)
        for session in ("s", 7, 2.5, True, ("mb", 1), _Session()):  # the last two: their repr
            bus.emit(SessionBound, handle_id=1, session_id=session, capture_site=False)
        with bus.tag(stage=1):
            bus.emit(Released, handle_id=2, reason="dw_complete", capture_site=False)
            with bus.tag():
                bus.emit(Released, handle_id=2, reason="dw_complete", capture_site=False)
            with bus.tag(stage=[1, 2], microbatch=None):  # not a scalar: its repr
                bus.emit(Released, handle_id=2, reason="dw_complete", capture_site=False)
    finally:
        channel.close()
    end = time.monotonic_ns()
    assert kept[0].site == "given.py:1"
    assert kept[1].site == f"tests/core/test_bus.py:{line}" and kept[2].site is None
    assert [e.session_id for e in kept[3:9]] == ["s", 7, 2.5, True, repr(("mb", 1)), "<session 1>"]
    assert [dict(e.tags) for e in kept[9:]] == [{"stage": 1}, {"stage": 1}, {"stage": "[1, 2]", "microbatch": None}]
    assert all(e.tags == {} for e in kept[:9])
    t_ns = [e.t_ns for e in kept]
    assert all(start <= t <= end for t in t_ns) and t_ns == sorted(t_ns)
    assert {e.thread_id for e in kept} == {threading.get_ident()}
    assert _site_here() == f"tests/core/test_bus.py:{_site_here.__code__.co_firstlineno + 1}"  # depth 1: the caller
    assert sites.call_site(1) == f"tests/core/test_bus.py:{sys._getframe().f_lineno}"


def test_call_site_depth_out_of_the_stack_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        sites.call_site(10_000)


def test_a_listener_error_passes_through_and_later_events_are_numbered_on() -> None:
    kept: list[Event] = []

    def keep(event: Event) -> None:
        if event.handle_id == 1:
            raise RuntimeError("keep failed")
        kept.append(event)

    channel = bus.open_channel(keep)
    try:
        _phase(0)
        with pytest.raises(RuntimeError, match="keep failed"):
            _phase(1)
        _phase(2)
    finally:
        channel.close()
    assert [(e.seq, e.handle_id) for e in kept] == [(0, 0), (2, 2)]  # the failed one kept its seq


def test_an_event_of_the_wrong_field_type_is_refused_when_it_is_built() -> None:
    kept: list[Event] = []
    channel = bus.open_channel(kept.append)
    try:
        with pytest.raises(TypeError):
            bus.emit(PhaseSet, old="ordinary")  # `new` is required
        with pytest.raises(TypeError):
            bus.emit(PhaseSet, old="ordinary", new="dx", colour="red")  # no such field
    finally:
        channel.close()
    assert kept == []


def test_emits_hold_no_stray_references() -> None:
    kept: list[Event] = []
    channel = bus.open_channel(kept.append)
    session, tags, site = _Session(), {"k": 1}, "given.py:3"
    try:
        with bus.tag(**tags):
            for _ in range(3):  # warm: caches filled, site strings made
                bus.emit(SessionBound, handle_id=1, session_id=session, site=site)
                _phase(1)
            kept.clear()
            gc.collect()
            before = [sys.getrefcount(o) for o in (session, site, channel)]
            for _ in range(200):
                bus.emit(SessionBound, handle_id=1, session_id=session, site=site)
                _phase(1)
            kept.clear()
            gc.collect()
            assert [sys.getrefcount(o) for o in (session, site, channel)] == before
    finally:
        channel.close()
    assert bus.emit(SessionBound, handle_id=1) is None  # closed: nobody listens
