"""Every way a reentrant handle fails (spec 4.1 E1..E16 and 4.2 R1..R15), with its trace.

Each "released before replay" cause is reproduced for real and checked three ways:
the error (type and key phrase), the `released` event with its reason that came
before the error, and the `replay_refused` event where the runtime refused a replay.
The error messages also follow spec D7 (API name first, handle id, a closing Tip), and
every error carries its `code`, which the `error` event stores. R11 has no reproduction:
its tests show why it cannot happen (and so it has no diagnosis code).
"""
from __future__ import annotations

import contextvars
import gc
import re
import sys

import pytest
import torch

import ckpt_viz
from ckpt_viz.codes import CODE_FOR_REASON
from ckpt_viz.errors import (
    CheckpointError,
    CheckpointUsageError,
    CkptVizError,
    GraphReleasedError,
    HandleReleasedError,
    PhaseNotSetError,
    SessionMismatchError,
)
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
from ckpt_viz.runtime.reentrant import current_frame
from setups import E6, E7
from setups import leaf as _leaf
from setups import ordinary as _ordinary
from setups import region as _region
from setups import split as _split

# ------------------------------------------------------------------ helpers


def _next_line() -> int:
    """The line number after the caller's current line."""
    return sys._getframe(1).f_lineno + 1


def _kinds(rec: ckpt_viz.Recording, handle) -> list[str]:
    return [e.kind for e in rec.trace.for_handle(handle.handle_id)]


def _released(rec: ckpt_viz.Recording, handle) -> list:
    return [e for e in rec.trace.for_handle(handle.handle_id) if e.kind == "released"]


def _error_event(rec: ckpt_viz.Recording, exc: BaseException):
    """The `error` event that reported `exc` as it left the public API (the last one); it stores the code."""
    matching = [e for e in rec.trace.of_kind("error") if e.message == str(exc)]
    assert matching, f"no error event for {exc!r}"
    assert matching[-1].type == type(exc).__name__
    if isinstance(exc, CkptVizError):
        assert matching[-1].code == exc.code
    return matching[-1]


def _assert_released_then_refused(rec: ckpt_viz.Recording, handle, reason: str, exc: BaseException,
                                  *, refused: bool = True) -> None:
    """One `released` event with `reason` before the error; the E7 message names that event (D7)."""
    released = _released(rec, handle)
    assert [e.reason for e in released] == [reason]
    error = _error_event(rec, exc)
    assert released[0].seq < error.seq
    assert exc.code == CODE_FOR_REASON[reason]  # E6/E7 carry the diagnosis code of the release reason
    assert handle.released is True and handle.release_reason == reason
    refusals = [e for e in rec.trace.for_handle(handle.handle_id) if e.kind == "replay_refused"]
    if refused:
        assert len(refusals) == 1
        assert refusals[0].reason == "released"
        assert refusals[0].last_release_reason == reason
        assert refusals[0].last_release_seq == released[0].seq
        assert released[0].seq < refusals[0].seq < error.seq
    else:
        assert refusals == []
    # D7: while recording, the message says which event released the handle and why.
    assert f"event #{released[0].seq}" in str(exc)
    assert f"with reason {reason}" in str(exc)


def _assert_d7(exc: BaseException, api: str = "ckpt_viz.", handle=None) -> None:
    """Spec D7: API name first, the handle named h<id>, a last line that starts with Tip:; and a code."""
    assert isinstance(exc, CkptVizError) and exc.code, repr(exc)
    message = str(exc)
    assert message.startswith(api), message
    if handle is not None:
        assert re.search(rf"\bh{handle.handle_id}\b", message), message
    assert message.splitlines()[-1].startswith("Tip: "), message


@pytest.fixture(autouse=True)
def _collect_old_graphs():
    """Collect earlier tests' graphs first, so their node_collected events stay out of our traces."""
    gc.collect()


# ------------------------------------------------------------------ R1..R15 (spec 4.2)

def test_r1_dx_after_dw_refuses_replay_with_dw_complete() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        h.set_phase("dw")
        # retain_graph=True keeps the outer graph, so the next pass reaches the node itself.
        torch.autograd.backward(loss, inputs=[w, h.backward_trigger], retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E7) as info:
            torch.autograd.grad(loss, [x])  # a DX pass after DW: the node is still in phase dw
    _assert_released_then_refused(rec, h, "dw_complete", info.value)
    assert _error_event(rec, info.value).where == "backward"
    _assert_d7(info.value, "ckpt_viz.checkpoint (backward):", h)
    assert h.phase == "dw"


def test_r1_set_phase_dx_after_dw_raises_e6() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        backward_input(loss, None, [x], handles=[h])
        backward_weight(loss, None, [w], handles=[h])
        with pytest.raises(HandleReleasedError, match=E6) as info:
            h.set_phase("dx")
    _assert_released_then_refused(rec, h, "dw_complete", info.value, refused=False)
    assert _error_event(rec, info.value).where == "set_phase"
    _assert_d7(info.value, "ckpt_viz.ReentrantCheckpointHandle.set_phase:", h)
    assert h.phase == "dw"


def test_r1_second_dw_refuses_replay() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        h.set_phase("dw")
        torch.autograd.backward(loss, inputs=[w, h.backward_trigger], retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E7) as info:
            torch.autograd.backward(loss, inputs=[w, h.backward_trigger])
    _assert_released_then_refused(rec, h, "dw_complete", info.value)


def test_r2_second_ordinary_backward_refuses_replay() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        loss.backward(retain_graph=True)  # the outer retain does not keep the handle
        with pytest.raises(HandleReleasedError, match=E7) as info:
            loss.backward()
    _assert_released_then_refused(rec, h, "ordinary_backward_complete", info.value)
    _assert_d7(info.value, "ckpt_viz.checkpoint (backward):", h)
    assert "recompute_handle" in str(info.value).splitlines()[-1]  # the Tip names the fix


def test_r2_autograd_grad_twice_refuses_replay() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        torch.autograd.grad(loss, [x], retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E7) as info:
            torch.autograd.grad(loss, [x])
    _assert_released_then_refused(rec, h, "ordinary_backward_complete", info.value)


def test_r3_session_ctx_without_binding_does_not_retain() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        with recompute_session_ctx("r3", retain_on_unpack=True):
            assert h.retain_graph is False  # never registered under "r3": the activation skips it
            loss.backward(retain_graph=True)
            with pytest.raises(HandleReleasedError, match=E7) as info:
                loss.backward()
    _assert_released_then_refused(rec, h, "ordinary_backward_complete", info.value)
    activated = rec.trace.of_kind("session_activated")
    assert [e.handles for e in activated] == [()]
    assert rec.trace.of_kind("session_bound") == []


def test_r4_prefire_then_backward_outside_the_session() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        recompute_handle(h, "r4")  # replays inside a temporary retaining session, then leaves it
        assert h.retain_graph is False and h.replay_outputs is not None
        loss.backward(retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E7) as info:
            loss.backward()
    _assert_released_then_refused(rec, h, "ordinary_backward_complete", info.value)
    assert _kinds(rec, h).count("replay_started") == 1
    clear_recompute_session("r4")


def test_r4_session_switched_to_non_retaining() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        recompute_handle(h, "r4b")
        with recompute_session_ctx("r4b", retain_on_unpack=False):
            assert h.retain_graph is False
            loss.backward(retain_graph=True)
            with pytest.raises(HandleReleasedError, match=E7) as info:
                loss.backward()
    _assert_released_then_refused(rec, h, "ordinary_backward_complete", info.value)
    clear_recompute_session("r4b")


def test_r4_control_retaining_session_serves_both_backwards() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        recompute_handle(h, "r4c")
        with recompute_session_ctx("r4c", retain_on_unpack=True):
            loss.backward(retain_graph=True)
            loss.backward()
    assert h.released is False and h.replay_count == 1
    assert _released(rec, h) == [] and rec.trace.of_kind("error") == []
    clear_recompute_session("r4c")
    assert h.released is True and h.release_reason == "session_cleared"


def test_r5_forgotten_set_phase_raises_e9_and_releases() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        with pytest.raises(PhaseNotSetError, match="Set dx or dw phase") as e9:
            loss.backward(retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E6) as e6:
            h.set_phase("dx")
    assert isinstance(e9.value, RuntimeError) and e9.value.code == "phase_not_set"
    _assert_d7(e9.value, "ckpt_viz.checkpoint (backward):", h)
    assert _error_event(rec, e9.value).where == "backward"
    _assert_released_then_refused(rec, h, "backward_exception", e6.value, refused=False)
    assert "replay_started" not in _kinds(rec, h)  # E9 fires before any replay


def test_r6_failing_replay_releases_then_retry_refuses() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    calls: list[int] = []

    def region(t: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:  # the forward succeeds, the replay fails
            raise ValueError("replay failed on purpose")
        return torch.tanh(t @ w)

    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(region, x, use_reentrant=True)
    h, loss = handles[0], (out * out).sum()
    with ckpt_viz.record() as rec:
        with pytest.raises(ValueError, match="replay failed on purpose"):
            loss.backward(retain_graph=True)
        assert h.released is True and h.replay_outputs is None
        with pytest.raises(HandleReleasedError, match=E7) as info:
            loss.backward()
    _assert_released_then_refused(rec, h, "backward_exception", info.value)
    assert _kinds(rec, h)[:5] == ["backward_entered", "replay_started", "replay_failed", "error", "released"]
    assert len(calls) == 2  # the retry never ran the function


def test_r7_failing_forward_releases_a_handle_kept_elsewhere() -> None:
    x = _leaf(2, 3)
    kept = []

    def region(t: torch.Tensor) -> torch.Tensor:
        kept.append(current_frame())  # a reference the user keeps although checkpoint() raised
        raise KeyError("forward failed on purpose")

    with ckpt_viz.record() as rec:
        with recompute_handle_collector_ctx() as handles:
            with pytest.raises(KeyError, match="forward failed on purpose"):
                checkpoint(region, x, use_reentrant=True)
        assert handles == []  # removed from the collector
        h = kept[0]
        with pytest.raises(HandleReleasedError, match=E7) as info:
            recompute_handle(h, "r7")
    _assert_released_then_refused(rec, h, "forward_exception", info.value)
    assert _kinds(rec, h)[:5] == ["handle_created", "forward_started", "forward_failed", "released", "error"]
    _assert_d7(info.value, "ckpt_viz.recompute_handle:", h)


def test_r8_session_cleared_between_prefire_and_backward() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        recompute_handle(h, "r8")
        clear_recompute_session("r8")
        with pytest.raises(HandleReleasedError, match=E7) as info:
            loss.backward()
    _assert_released_then_refused(rec, h, "session_cleared", info.value)
    cleared = rec.trace.of_kind("session_cleared")
    assert [e.handles for e in cleared] == [(h.handle_id,)]
    assert _released(rec, h)[0].session_id == "r8"


def test_r8_shared_session_id_releases_another_microbatch() -> None:
    w = _leaf(3, 3)
    (h0, loss0), (h1, loss1) = _ordinary(_leaf(2, 3), w), _ordinary(_leaf(2, 3), w)
    with ckpt_viz.record() as rec:
        recompute_handle(h0, "shared")
        recompute_handle(h1, "shared")  # the same id for micro-batch 1: a bug in the schedule
        with recompute_session_ctx("shared", retain_on_unpack=True):
            loss0.backward()
        clear_recompute_session("shared")  # micro-batch 0 is done ... and takes micro-batch 1 along
        with pytest.raises(HandleReleasedError, match=E7) as info:
            loss1.backward()
    _assert_released_then_refused(rec, h1, "session_cleared", info.value)
    assert h0.release_reason == "session_cleared"


def test_r8_session_cleared_after_dx_refuses_dw() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        backward_input(loss, None, [x], handles=[h], session_id="r8dx")
        clear_recompute_session("r8dx")
        with pytest.raises(HandleReleasedError, match=E6) as info:
            backward_weight(loss, None, [w], handles=[h], session_id="r8dx")
    _assert_released_then_refused(rec, h, "session_cleared", info.value, refused=False)
    assert w.grad is None


def test_r9_explicit_release_refuses_replay() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        h.release()
        h.release()  # idempotent: still one released event
        with pytest.raises(HandleReleasedError, match=E7) as info:
            loss.backward()
    _assert_released_then_refused(rec, h, "explicit_release", info.value)
    assert w.grad is None and x.grad is None


def test_r10_outputs_dropped_before_replay_is_e8_not_a_release() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with ckpt_viz.record() as rec:
        with recompute_handle_collector_ctx() as handles:
            out = checkpoint(_region(w), x, use_reentrant=True)
        h = handles[0]
        del out  # nothing downstream: the autograd node dies now
        gc.collect()
        with pytest.raises(GraphReleasedError, match="output graph was released before replay") as info:
            recompute_handle(h, "r10")
    events = rec.trace.for_handle(h.handle_id)
    kinds = [e.kind for e in events]
    assert "released" not in kinds
    collected = events[kinds.index("node_collected")]
    refused = events[kinds.index("replay_refused")]
    assert collected.seq < refused.seq < _error_event(rec, info.value).seq
    assert (collected.was_replayed, collected.released) == (False, False)
    assert refused.reason == "node_collected"
    assert refused.collected_seq == collected.seq
    assert f"event #{collected.seq}" in str(info.value)
    assert isinstance(info.value, RuntimeError) and info.value.code == "outputs_dropped_before_replay"
    assert h.released is False and h.node_collected is True
    _assert_d7(info.value, "ckpt_viz.recompute_handle:", h)
    clear_recompute_session("r10")


def test_r10_live_downstream_keeps_the_node() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, _loss = _ordinary(x, w)  # `out` itself is gone; only the loss keeps the node alive
    gc.collect()
    assert h.node_collected is False
    recompute_handle(h, "r10b")
    assert h.replay_outputs is not None
    clear_recompute_session("r10b")


def test_r11_not_reproducible_replay_is_cached_after_a_successful_pass() -> None:
    """R11 (outer saved inputs freed before the first replay) has no known repro, so it has no diagnosis code.

    This documents why: once an outer pass succeeded, the replay is cached and a later
    `recompute()` returns without touching the autograd node's saved tensors.
    """
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        backward_input(loss, None, [x], handles=[h])
        h.recompute()
        recompute_handle(h, "r11")
    assert h.replay_count == 1 and h.replay_outputs is not None and h.released is False
    assert _kinds(rec, h).count("replay_started") == 1
    assert rec.trace.of_kind("error") == [] and rec.trace.of_kind("replay_refused") == []
    clear_recompute_session("r11")


def test_r11_not_reproducible_saved_inputs_survive_a_failed_retained_pass() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    calls: list[int] = []

    def region(t: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("first replay fails")
        return torch.tanh(t @ w)

    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(region, x, use_reentrant=True)
    h, loss = handles[0], (out * out).sum()
    h.bind_session("r11b")
    with recompute_session_ctx("r11b", retain_on_unpack=True):
        with pytest.raises(ValueError, match="first replay fails"):
            loss.backward(retain_graph=True)
        assert h.released is False  # retained: the failure did not release
        loss.backward()  # the retry reads the saved inputs again: no "backward ... second time"
    assert h.replay_count == 2 and x.grad is not None
    clear_recompute_session("r11b")


def test_r12_dw_without_trigger_skips_the_handle() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        backward_input(loss, None, [x], handles=[h])
        h.set_phase("dw")
        torch.autograd.backward(loss, inputs=[w], retain_graph=True)  # no trigger: node unreachable
    assert w.grad is None
    assert h.released is False and h.replay_outputs is not None
    assert _released(rec, h) == []
    assert _kinds(rec, h).count("backward_entered") == 1  # DX only
    # Contrast: with the trigger, DW reaches the node, fills the captured param and releases.
    with ckpt_viz.record() as rec:
        torch.autograd.backward(loss, inputs=[w, h.backward_trigger])
    assert [e.reason for e in _released(rec, h)] == ["dw_complete"]
    w_ref, x_ref = w.detach().clone().requires_grad_(), x.detach().clone()
    out_ref = torch.tanh(x_ref @ w_ref)
    (out_ref * out_ref).sum().backward()
    assert torch.equal(w.grad, w_ref.grad)


def test_r13_dx_without_outer_retain_graph_leaks_the_handle() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        h.set_phase("dx")
        torch.autograd.grad(loss, [x])  # no retain_graph=True: the outer mul node frees `out`
        h.set_phase("dw")
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            torch.autograd.backward(loss, inputs=[w, h.backward_trigger])
    (error,) = rec.trace.of_kind("error")  # torch's own error, classified once where record() caught it
    assert (error.where, error.code) == ("autograd.backward", "second_backward_through_graph")
    assert _released(rec, h) == []
    assert h.released is False and h.replay_outputs is not None  # still REPLAYED, graph pinned
    assert w.grad is None
    h.release()
    assert h.release_reason == "explicit_release"


def test_r14_bind_inside_another_session_is_e10() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, _ = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        with recompute_session_ctx("b"):
            with pytest.raises(ValueError, match="Active session does not match") as info:
                h.bind_session("a")
    assert isinstance(info.value, SessionMismatchError) and isinstance(info.value, CheckpointUsageError)
    assert info.value.code == "session_mismatch"
    _assert_d7(info.value, "ckpt_viz.ReentrantCheckpointHandle.bind_session:", h)
    assert _error_event(rec, info.value).where == "bind_session"
    assert rec.trace.of_kind("session_bound") == []
    clear_recompute_session("a")
    assert h.released is False  # it was never registered under "a"


def test_r14_handle_bound_to_a_is_not_retained_by_session_b() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    h.bind_session("a")
    with ckpt_viz.record() as rec:
        with recompute_session_ctx("b", retain_on_unpack=True):
            assert h.retain_graph is False
            loss.backward(retain_graph=True)
            with pytest.raises(HandleReleasedError, match=E7) as info:
                loss.backward()
    _assert_released_then_refused(rec, h, "ordinary_backward_complete", info.value)
    clear_recompute_session("a")


def test_r15_prefire_after_ordinary_backward_is_e7() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        loss.backward()
        with pytest.raises(HandleReleasedError, match=E7) as info:
            recompute_handle(h, "r15")
    _assert_released_then_refused(rec, h, "ordinary_backward_complete", info.value)
    _assert_d7(info.value, "ckpt_viz.recompute_handle:", h)
    assert _error_event(rec, info.value).where == "recompute_handle"
    clear_recompute_session("r15")


# ------------------------------------------------------------------ E1..E16 (spec 4.1)

def test_e1_nested_reentrant_checkpoint() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)

    def outer(t: torch.Tensor) -> torch.Tensor:
        return checkpoint(_region(w), t, use_reentrant=True)

    with ckpt_viz.record() as rec:
        with recompute_handle_collector_ctx() as handles:
            with pytest.raises(ValueError, match="Nested reentrant checkpoints") as info:
                checkpoint(outer, x, use_reentrant=True)
    assert isinstance(info.value, CheckpointUsageError)
    assert handles == []
    created = rec.trace.of_kind("handle_created")
    assert len(created) == 1  # the inner call never built a handle
    outer_id = created[0].handle_id
    _assert_d7(info.value, "ckpt_viz.checkpoint:")
    assert f"h{outer_id}" in str(info.value)  # names the handle it is nested in
    released = [e for e in rec.trace.for_handle(outer_id) if e.kind == "released"]
    assert [e.reason for e in released] == ["forward_exception"]
    # The nested call reports the error as it is raised; the outer handle is released as it propagates.
    assert _error_event(rec, info.value).seq < released[0].seq


def test_e2_scope_parameters_must_be_tensors() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with ckpt_viz.record() as rec:
        with reentrant_checkpoint_scope([w, "not a tensor"]) as handles:
            with pytest.raises(ValueError, match="Scope parameters must be Tensors") as info:
                checkpoint(_region(w), x, use_reentrant=True)
    assert handles == [] and rec.trace.of_kind("handle_created") == []
    _assert_d7(info.value, "ckpt_viz.reentrant_checkpoint_scope:")
    assert "str" in str(info.value)
    assert _error_event(rec, info.value).where == "checkpoint"


def test_e3_nested_scopes() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with ckpt_viz.record() as rec:
        with reentrant_checkpoint_scope([w]) as handles:
            with pytest.raises(ValueError, match="Nested reentrant checkpoint scopes") as info:
                with reentrant_checkpoint_scope([w]):
                    pass
            checkpoint(_region(w), x, use_reentrant=True)  # the outer scope is intact
    assert len(handles) == 1 and handles[0].split
    _assert_d7(info.value, "ckpt_viz.reentrant_checkpoint_scope:")
    assert _error_event(rec, info.value).where == "reentrant_checkpoint_scope"


def test_e4_no_tensor_output_releases_and_removes_the_handle() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with ckpt_viz.record() as rec:
        with reentrant_checkpoint_scope([w]) as handles:
            with pytest.raises(ValueError, match="at least one Tensor output") as info:
                checkpoint(lambda t: {"n": 3}, x, use_reentrant=True)
    assert handles == []
    (created,) = rec.trace.of_kind("handle_created")
    hid = created.handle_id
    assert [e.kind for e in rec.trace.for_handle(hid)][:5] == [
        "handle_created", "forward_started", "forward_failed", "released", "error"]
    assert [e.reason for e in rec.trace.for_handle(hid) if e.kind == "released"] == ["forward_exception"]
    assert f"h{hid}" in str(info.value) and "returned dict" in str(info.value)
    _assert_d7(info.value, "ckpt_viz.checkpoint:")


def test_e5_set_phase_on_a_non_split_handle() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, _ = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        with pytest.raises(ValueError, match=r"require phase='dx' or phase='dw'") as info:
            h.set_phase("dx")
    assert h.phase == "ordinary"
    _assert_d7(info.value, "ckpt_viz.ReentrantCheckpointHandle.set_phase:", h)
    assert _error_event(rec, info.value).where == "set_phase"
    assert rec.trace.of_kind("phase_set") == []


@pytest.mark.parametrize("phase", ["ordinary", "DX", "dz"])
def test_e5_set_phase_with_a_bad_phase(phase: str) -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, _ = _split(x, w)
    with pytest.raises(CheckpointUsageError, match=r"require phase='dx' or phase='dw'") as info:
        h.set_phase(phase)
    assert repr(phase) in str(info.value)
    assert h.phase == "ordinary"
    _assert_d7(info.value, "ckpt_viz.ReentrantCheckpointHandle.set_phase:", h)


def test_e6_e7_without_recorder_still_name_the_reason() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, _loss = _split(x, w)
    h.release()
    with pytest.raises(HandleReleasedError, match=E6) as e6:
        h.set_phase("dw")
    with pytest.raises(HandleReleasedError, match=E7) as e7:
        h.recompute()
    for info in (e6, e7):
        assert "with reason explicit_release" in str(info.value)
        assert "event #" not in str(info.value)  # nobody recorded, so there is no event to point at
        assert info.value.handle_id == h.handle_id and info.value.reason == "explicit_release"
        assert isinstance(info.value, CheckpointError) and isinstance(info.value, RuntimeError)
    _assert_d7(e6.value, "ckpt_viz.ReentrantCheckpointHandle.set_phase:", h)
    _assert_d7(e7.value, "ckpt_viz.recompute_handle:", h)


def test_e7_message_names_the_releasing_event_and_site() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, _loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        line = _next_line()
        h.release()
        with pytest.raises(HandleReleasedError, match=E7) as info:
            h.recompute()
    (released,) = _released(rec, h)
    assert released.site is not None and released.site.endswith(f"test_reentrant_errors.py:{line}")
    assert f"event #{released.seq} ({released.site}) with reason explicit_release" in str(info.value)


def test_e11_bind_session_while_bound_to_another_session() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, _ = _ordinary(x, w)
    h.bind_session("a")
    with ckpt_viz.record() as rec:
        with recompute_session_ctx("a"):
            assert h.active_session is not None and h.active_session.session_id == "a"
            # A fresh context has no current activation (as on another thread), so E10 does not apply;
            # it is handed the recording (a fresh context is not in it otherwise: bus NOTE [ Recording scopes ]).
            def bind_elsewhere() -> None:
                with rec.attach():
                    h.bind_session("b")

            with pytest.raises(RuntimeError, match="Concurrent reentrant recompute sessions") as info:
                contextvars.Context().run(bind_elsewhere)
    assert isinstance(info.value, CheckpointError)
    _assert_d7(info.value, "ckpt_viz.ReentrantCheckpointHandle.bind_session:", h)
    assert _error_event(rec, info.value).where == "bind_session"
    clear_recompute_session("a")
    clear_recompute_session("b")


def test_e11_activating_a_second_session_on_a_bound_handle() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, _ = _ordinary(x, w)
    h.bind_session("a")
    h.bind_session("b")  # registered under both ids; nothing is active yet, so this is allowed

    def enter_b() -> None:
        with recompute_session_ctx("b"):
            pass

    with recompute_session_ctx("a", retain_on_unpack=True):
        with pytest.raises(RuntimeError, match="Concurrent reentrant recompute sessions") as info:
            contextvars.Context().run(enter_b)
        assert h.active_session.session_id == "a" and h.retain_graph is True  # "a" intact
    assert h.active_session is None and h.retain_graph is False
    _assert_d7(info.value, "ckpt_viz.recompute_session_ctx:", h)
    clear_recompute_session("a")
    clear_recompute_session("b")


def test_e13_context_fn_must_return_a_pair() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with ckpt_viz.record() as rec:
        with recompute_handle_collector_ctx() as handles:
            with pytest.raises(ValueError, match="context_fn must return a") as info:
                checkpoint(_region(w), x, use_reentrant=True, context_fn=lambda: (None,))
    assert handles == []
    (created,) = rec.trace.of_kind("handle_created")
    released = [e for e in rec.trace.for_handle(created.handle_id) if e.kind == "released"]
    assert [e.reason for e in released] == ["forward_exception"]
    assert released[0].seq < _error_event(rec, info.value).seq
    _assert_d7(info.value, "ckpt_viz.checkpoint:")


def test_e15_input_modified_in_place_after_forward() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    y = x * 1.0
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(_region(w), y, use_reentrant=True)
    h = handles[0]
    with torch.no_grad():
        y.add_(1.0)
    with ckpt_viz.record() as rec:
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
            out.sum().backward()
    kinds = _kinds(rec, h)
    assert "replay_started" not in kinds  # refused at ctx.saved_tensors, before the replay
    assert [e.reason for e in _released(rec, h)] == ["backward_exception"]
    error = _error_event(rec, info.value)
    assert error.where == "backward" and error.handle_id == h.handle_id


def test_e16_dw_with_autograd_grad_on_a_trigger_needs_allow_unused() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    backward_input(loss, None, [x], handles=[h])
    h.set_phase("dw")
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        torch.autograd.grad(loss, [h.backward_trigger])
    # The node ran before torch checked the result: DW released it and filled the captured param.
    assert h.released is True and h.release_reason == "dw_complete"
    assert w.grad is not None
