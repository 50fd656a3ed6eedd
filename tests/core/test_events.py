"""The events a reentrant run emits: whole sequences, fields, sites, tags and error events.

Sequences are compared whole (list equality). The `quiet_gc` fixture collects
earlier tests' graphs first and pauses the cyclic collector, so no stray
`node_collected` event of another test's graph can land in a recording.
"""
from __future__ import annotations

import gc
import os
import sys
from typing import Any

import pytest
import torch

import ckpt_viz
from ckpt_viz import bus
from ckpt_viz.errors import CheckpointError, CheckpointUsageError
from ckpt_viz.events import EVENT_TYPES, fields_of
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
    reentrant_checkpoint_scope,
)
from ckpt_viz.vocabulary import KINDS, RELEASE_REASONS
from traces import kinds

ORDINARY_RUN = [
    "handle_created", "forward_started", "forward_finished",
    "backward_called", "backward_entered", "replay_started", "replay_finished", "grads_routed", "released",
]
SPLIT_RUN = [
    "handle_created", "forward_started", "forward_finished",
    "phase_set", "backward_called", "backward_entered", "replay_started", "replay_finished", "grads_routed",
    "phase_set", "backward_called", "backward_entered", "grads_routed", "released",
]


@pytest.fixture
def quiet_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _next_line() -> int:
    """The line number after the caller's current line."""
    return sys._getframe(1).f_lineno + 1


def _assert_site(site: str | None, line: int) -> None:
    """`site` is `<...>/tests/core/test_events.py:<line>`: this file, in tests/core/, at that line."""
    assert site is not None
    path, _, lineno = site.rpartition(":")
    assert os.path.basename(path) == "test_events.py"
    assert os.path.basename(os.path.dirname(os.path.abspath(path))) == "core"
    assert int(lineno) == line


def _leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None):
    """Gradients of the same math without checkpointing."""
    x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    b = b.detach().clone().requires_grad_() if b is not None else None
    out = torch.tanh(x @ w + b) if b is not None else torch.tanh(x @ w)
    (out * out).sum().backward()
    return x.grad, w.grad, (b.grad if b is not None else None)


def test_ordinary_run_sequence_and_fields(quiet_gc) -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)

    def region(t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(t @ w)

    with ckpt_viz.record() as rec:
        created_line = _next_line()
        out = checkpoint(region, x, use_reentrant=True)
        loss = (out * out).sum()
        backward_line = _next_line()
        loss.backward()
    events = rec.trace.events
    assert kinds(rec.trace) == ORDINARY_RUN
    assert [e.seq for e in events] == list(range(len(ORDINARY_RUN)))
    assert [e.t_ns for e in events] == sorted(e.t_ns for e in events)
    called = events[3]  # the user's backward call: no handle yet
    assert (called.handle_id, called.mode, called.phase, called.api, called.inputs) == (
        None, None, None, "autograd.backward", None)
    about_the_handle = [e for e in events if e is not called]
    (hid,) = {e.handle_id for e in about_the_handle}
    assert isinstance(hid, int)
    assert {e.mode for e in about_the_handle} == {"reentrant"}
    assert [e.phase for e in about_the_handle] == ["ordinary"] * (len(ORDINARY_RUN) - 1)
    assert {e.session_id for e in events} == {None}
    assert all(dict(e.tags) == {} for e in events)

    created, _, finished, called, entered, started, replayed, routed, released = events
    _assert_site(created.site, created_line)
    for event in (called, entered, started, replayed, routed, released):
        _assert_site(event.site, backward_line)
    assert created.split is False and created.input_count == 1
    assert created.collector == "none"
    assert created.function.endswith("region")
    assert finished.non_differentiable == ()
    assert started.trigger == "backward" and replayed.trigger == "backward"
    assert routed.targets == (0,) and routed.explicit_params == ()
    assert [c.accumulated for c in routed.captured] == [True]  # w, through the closure
    assert released.reason == "ordinary_backward_complete"
    assert released.was_replayed is True

    gx, gw, _ = _reference(x, w)
    assert torch.equal(x.grad, gx) and torch.equal(w.grad, gw)


def test_split_run_sequence_and_fields(quiet_gc) -> None:
    x, w, b = _leaf(2, 3), _leaf(3, 3), _leaf(3)

    def region(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.tanh(t @ weight + b)  # w explicit, b captured

    with ckpt_viz.record() as rec:
        with reentrant_checkpoint_scope([w, b]) as handles:
            created_line = _next_line()
            out = checkpoint(region, x, w, use_reentrant=True)
        loss = (out * out).sum()
        dx_line = _next_line()
        (dx,) = backward_input(loss, None, [x], handles=handles)
        assert w.grad is None and b.grad is None  # DX leaves parameter .grad alone
        dw_line = _next_line()
        backward_weight(loss, None, [w, b], handles=handles)
    events = rec.trace.events
    assert kinds(rec.trace) == SPLIT_RUN
    calls = rec.trace.of_kind("backward_called")
    assert [(e.api, e.inputs, e.handle_id) for e in calls] == [("autograd.grad", 1, None),
                                                               ("autograd.backward", 3, None)]
    about_the_handle = [e for e in events if e.kind != "backward_called"]
    assert {e.handle_id for e in about_the_handle} == {handles[0].handle_id}
    assert {e.mode for e in about_the_handle} == {"reentrant"}
    assert [e.phase for e in about_the_handle] == ["ordinary"] * 3 + ["dx"] * 5 + ["dw"] * 4

    created = events[0]
    _assert_site(created.site, created_line)
    assert created.split is True and created.collector == "scope"
    assert created.param_input_mask == (False, True)
    for event in events[3:9]:
        _assert_site(event.site, dx_line)
    for event in events[9:]:
        _assert_site(event.site, dw_line)
    phase_sets = rec.trace.of_kind("phase_set")
    assert [fields_of(e) for e in phase_sets] == [{"old": "ordinary", "new": "dx", "outer_graph_freed": None},
                                                  {"old": "dx", "new": "dw", "outer_graph_freed": False}]
    dx_routed, dw_routed = rec.trace.of_kind("grads_routed")
    assert dx_routed.targets == (0,) and dx_routed.activations == (0,)
    assert dw_routed.targets == (1,) and dw_routed.explicit_params == (1,)
    assert dw_routed.discarded_activations == (0,)
    assert [c.accumulated for c in dw_routed.captured] == [True]  # b
    assert events[-1].reason == "dw_complete"
    assert handles[0].released is True

    gx, gw, gb = _reference(x, w, b)
    assert torch.equal(dx, gx) and torch.equal(w.grad, gw) and torch.equal(b.grad, gb)
    assert x.grad is None  # backward_input returns DX; it does not accumulate


def test_prefire_session_sequence(quiet_gc) -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
    h = handles[0]
    with ckpt_viz.record() as rec:
        line = _next_line()
        recompute_handle(h, "mb0")
        with recompute_session_ctx("mb0", retain_on_unpack=True):
            out.sum().backward()
        clear_recompute_session("mb0")
    assert kinds(rec.trace) == [
        "prefired", "session_bound", "session_activated", "replay_started", "replay_finished",
        "session_deactivated", "session_activated", "backward_called", "backward_entered", "grads_routed",
        "session_deactivated", "released", "session_cleared",
    ]
    prefired, _bound, activated = rec.trace.events[:3]
    _assert_site(prefired.site, line)
    assert prefired.path == "temporary_session" and prefired.session_id == "mb0"
    assert fields_of(activated) == {"retain_on_unpack": True, "handles": (h.handle_id,)}
    assert rec.trace.of_kind("replay_started")[0].trigger == "prefire"
    assert rec.trace.of_kind("released")[0].reason == "session_cleared"
    assert rec.trace.of_kind("session_cleared")[0].handles == (h.handle_id,)


def test_every_release_reason_is_in_the_vocabulary() -> None:
    w = _leaf(3, 3)

    def region(t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(t @ w)

    def boom(t: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("forward boom")

    with ckpt_viz.record() as rec:
        checkpoint(region, _leaf(2, 3), use_reentrant=True).sum().backward()  # ordinary_backward_complete
        with reentrant_checkpoint_scope([w]) as handles:
            out = checkpoint(region, _leaf(2, 3), use_reentrant=True)
        backward_weight(out.sum(), None, [w], handles=handles)  # dw_complete
        with recompute_handle_collector_ctx() as handles:
            out = checkpoint(region, _leaf(2, 3), use_reentrant=True)
        handles[0].release()  # explicit_release
        with recompute_handle_collector_ctx() as handles:
            out = checkpoint(region, _leaf(2, 3), use_reentrant=True)
        recompute_handle(handles[0], "mb")
        clear_recompute_session("mb")  # session_cleared
        with pytest.raises(RuntimeError, match="forward boom"):
            checkpoint(boom, _leaf(2, 3), use_reentrant=True)  # forward_exception
        with reentrant_checkpoint_scope([w]) as handles:
            out = checkpoint(region, _leaf(2, 3), use_reentrant=True)
        with pytest.raises(RuntimeError, match="Set dx or dw phase"):
            out.sum().backward()  # backward_exception
    reasons = [e.reason for e in rec.trace.of_kind("released")]
    assert reasons == ["ordinary_backward_complete", "dw_complete", "explicit_release", "session_cleared",
                       "forward_exception", "backward_exception"]
    assert set(reasons) == set(RELEASE_REASONS)
    assert set(kinds(rec.trace)) <= set(KINDS) == set(EVENT_TYPES)


def test_tags_are_stamped_on_events_inside_the_block(quiet_gc) -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with ckpt_viz.record() as rec:
        with ckpt_viz.tag(stage=0, microbatch=1):
            out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
            inside = len(rec.trace)
            with ckpt_viz.tag(chunk="a"):
                loss = out.sum()
                loss.backward(retain_graph=True)
            nested = len(rec.trace)
        with pytest.raises(CheckpointError):
            loss.backward()  # outside the tag block: E7
    events = rec.trace.events
    assert inside == 3 and nested == len(ORDINARY_RUN)
    assert [dict(e.tags) for e in events[:inside]] == [{"stage": 0, "microbatch": 1}] * inside
    assert [dict(e.tags) for e in events[inside:nested]] == [
        {"stage": 0, "microbatch": 1, "chunk": "a"}] * (nested - inside)
    assert [e.kind for e in events[nested:]] == ["backward_called", "backward_entered", "replay_refused", "error"]
    assert all(dict(e.tags) == {} for e in events[nested:])
    assert dict(bus.current_tags()) == {}


def test_error_event_when_an_exception_leaves_a_public_api(quiet_gc) -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with recompute_handle_collector_ctx() as handles:
        checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
    h = handles[0]
    with ckpt_viz.record() as rec:
        line = _next_line()
        with pytest.raises(CheckpointUsageError) as bad_phase:
            h.set_phase("dx")
        with pytest.raises(CheckpointUsageError) as bad_flag:
            checkpoint(lambda t: t, x, use_reentrant="yes")
        with recompute_session_ctx("s"):
            with pytest.raises(CheckpointError) as nested:
                with recompute_session_ctx("t"):
                    pass
    errors = rec.trace.of_kind("error")
    assert [(e.where, e.type, e.message) for e in errors] == [
        ("set_phase", "CheckpointUsageError", str(bad_phase.value)),
        ("checkpoint", "CheckpointUsageError", str(bad_flag.value)),
        ("ckpt_viz.recompute_session_ctx", "CheckpointError", str(nested.value)),
    ]
    assert errors[0].handle_id == h.handle_id and errors[0].mode == "reentrant"
    assert errors[0].phase == "ordinary"
    _assert_site(errors[0].site, line + 1)
    assert "use_reentrant must be bool" in errors[1].message
    assert "Nested recompute session contexts" in errors[2].message
    assert kinds(rec.trace) == ["error", "error", "session_activated", "error", "session_deactivated"]


def test_error_event_from_the_engine_callback(quiet_gc) -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with reentrant_checkpoint_scope([w]) as handles:
        out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
    with ckpt_viz.record() as rec:
        with pytest.raises(RuntimeError, match="Set dx or dw phase") as info:
            out.sum().backward()
    assert kinds(rec.trace) == ["backward_called", "backward_entered", "error", "released"]
    error = rec.trace.events[2]
    assert error.where == "backward" and error.type == "PhaseNotSetError"
    assert error.message == str(info.value) and error.handle_id == handles[0].handle_id


def test_exception_inside_record_block_emits_error_where_record() -> None:
    with pytest.raises(KeyError):
        with ckpt_viz.record() as rec:
            raise KeyError("user bug")
    assert kinds(rec.trace) == ["error"]
    (error,) = rec.trace.events
    assert fields_of(error) == {"where": "record", "type": "KeyError", "message": "'user bug'", "code": None,
                               "retain_graph": None}
    assert bus.enabled is False  # the recorder detached even though the block raised


def _dx_without_retain_graph() -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Spec R13: DX ran without retain_graph=True, so the DW that follows fails in the outer engine."""
    x, w = _leaf(2, 3), _leaf(3, 3)
    with reentrant_checkpoint_scope([w]) as handles:
        out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
    loss = (out * out).sum()
    handles[0].set_phase("dx")
    torch.autograd.grad(loss, [x])  # no retain_graph=True
    handles[0].set_phase("dw")
    return loss, w, handles[0]


def test_torch_error_inside_record_block_is_recorded(quiet_gc) -> None:
    loss, w, handle = _dx_without_retain_graph()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        with ckpt_viz.record() as rec:
            torch.autograd.backward(loss, inputs=[w, handle.backward_trigger])
    assert kinds(rec.trace) == ["backward_called", "error"]  # reported once, by the autograd call it left
    error = rec.trace.events[1]
    assert error.where == "autograd.backward" and error.type == "RuntimeError"
    assert "Trying to backward through the graph a second time" in error.message


def test_torch_error_caught_inside_record_block_is_still_recorded(quiet_gc) -> None:
    loss, w, handle = _dx_without_retain_graph()
    with ckpt_viz.record() as rec:
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            torch.autograd.backward(loss, inputs=[w, handle.backward_trigger])
    assert [(e.kind, getattr(e, "api", None) or e.where) for e in rec.trace.events] == [
        ("backward_called", "autograd.backward"), ("error", "autograd.backward")]
    assert rec.trace.events[0].retain_graph is None and rec.trace.events[1].retain_graph is None
    handle.release()


def test_record_error_site_is_in_the_users_file() -> None:
    with pytest.raises(KeyError):
        with ckpt_viz.record() as rec:
            raise KeyError("user bug")
    (error,) = rec.trace.events
    assert error.site is not None
    assert os.path.basename(error.site.rpartition(":")[0]) == "test_events.py"


def test_node_collected_says_a_released_handle_was_replayed(quiet_gc) -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with ckpt_viz.record() as rec:
        with recompute_handle_collector_ctx() as handles:
            out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        out.sum().backward()
        del out
    assert handles[0].replay_count == 1 and handles[0].released
    (collected,) = rec.trace.of_kind("node_collected")
    assert fields_of(collected) == {"was_replayed": True, "released": True}


_UNREPORTED = {
    "recompute_session_ctx(None)": lambda: recompute_session_ctx(None).__enter__(),
    "clear_recompute_session([1])": lambda: clear_recompute_session([1]),
    "backward_input(2 grads for 1 output)": lambda: backward_input(
        torch.ones(1, requires_grad=True), (torch.ones(1), torch.ones(1)), []),
}


@pytest.mark.parametrize("call", list(_UNREPORTED))
def test_argument_errors_leaving_public_apis_emit_error(call: str) -> None:
    with ckpt_viz.record() as rec:
        with pytest.raises(CheckpointUsageError) as info:
            _UNREPORTED[call]()
    assert [e.message for e in rec.trace.of_kind("error")] == [str(info.value)]
