"""Every user-reachable error of the non-reentrant checkpoint, sessions and excluded regions (spec 4.3, 4.4).

Each error is reproduced for real and matched by its key phrase. Every message
also follows spec D7: it starts with the API name ("ckpt_viz.") and gives a Tip.
"""
from __future__ import annotations

import contextlib
import contextvars

import pytest
import torch

import ckpt_viz
from ckpt_viz.errors import CheckpointError, CheckpointUsageError, CkptVizError, ExcludedRegionError
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    checkpoint_exclude_wrapper,
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
)
from ckpt_viz.runtime.session import current_activation
from models import assert_grads_equal, grads, leaf, reset_grads

BATCH = 3


def _check_message(exc: BaseException) -> None:
    """Spec D7: the API name first and a closing Tip; and the error carries a code."""
    assert isinstance(exc, CkptVizError) and exc.code, repr(exc)
    message = str(exc)
    assert message.startswith("ckpt_viz."), message
    assert "Tip:" in message, message
    assert message.splitlines()[-1].startswith("Tip: "), message


def _w() -> torch.Tensor:
    return leaf((4, 5), seed=1)


def _x() -> torch.Tensor:
    return leaf((BATCH, 4), seed=2)


def _collect(function, *args, **flags) -> tuple:
    """Run one non-reentrant checkpoint in a collector; returns (frame, output)."""
    with recompute_handle_collector_ctx() as frames:
        y = checkpoint(function, *args, use_reentrant=False, **flags)
    (frame,) = frames
    return frame, y


def _tanh_region(w: torch.Tensor):
    def region(a: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a @ w)
    return region


class Flag:
    """A global switch flipped between the forward and the replay (non-determinism on purpose)."""

    def __init__(self) -> None:
        self.on = False

    @contextlib.contextmanager
    def flipped(self):
        self.on = True
        try:
            yield
        finally:
            self.on = False


# 1. Argument validation in checkpoint() (both kinds, spec D1) -------------------------------------

@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("flags, phrase", [
    ({"early_stop": 1}, "early_stop must be bool"),
    ({"early_stop": None}, "early_stop must be bool"),
    ({"preserve_rng_state": 1}, "preserve_rng_state must be bool"),
    ({"preserve_rng_state": "yes"}, "preserve_rng_state must be bool"),
    ({"context_fn": None}, "context_fn must be callable"),
    ({"context_fn": contextlib.nullcontext}, r"context_fn must return a \(forward_context, recompute_context\) tuple"),
    ({"context_fn": lambda: (contextlib.nullcontext(),)},
     r"context_fn must return a \(forward_context, recompute_context\) tuple"),
    ({"determinism_check": "all"}, r"determinism_check must be one of \['default', 'none'\]"),
    ({"debug": 1}, "debug must be bool"),
], ids=["early_stop=1", "early_stop=None", "rng=1", "rng=str", "context_fn=None", "context_fn=cm",
        "context_fn=1-tuple", "determinism", "debug"])
def test_bad_arguments(flags: dict, phrase: str, use_reentrant: bool) -> None:
    calls = []
    x = _x()

    def region(a: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return a.sin()

    with recompute_handle_collector_ctx() as handles, pytest.raises(CheckpointUsageError, match=phrase) as info:
        checkpoint(region, x, use_reentrant=use_reentrant, **flags)
    assert isinstance(info.value, ValueError)
    _check_message(info.value)
    assert calls == [] and handles == [], "a rejected call runs nothing and collects nothing"


@pytest.mark.parametrize("value", [1, 0, "False"])  # None is the default: a warning, then True (test_dropin.py)
def test_use_reentrant_must_be_bool(value: object) -> None:
    with pytest.raises(CheckpointUsageError, match="use_reentrant must be bool") as info:
        checkpoint(torch.sin, _x(), use_reentrant=value)
    _check_message(info.value)
    assert repr(value) in str(info.value)


def test_bad_argument_emits_an_error_event(recorder: ckpt_viz.Recording) -> None:
    with pytest.raises(CheckpointUsageError):
        checkpoint(torch.sin, _x(), use_reentrant=False, early_stop="yes")
    (error,) = recorder.trace.of_kind("error")
    assert "early_stop must be bool" in error.message


# 2. Forward inside a session -------------------------------------------------------------------------

def test_forward_inside_a_session_is_rejected(recorder: ckpt_viz.Recording) -> None:
    calls = []

    def region(a: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return a.sin()

    with recompute_handle_collector_ctx() as frames, recompute_session_ctx("open"):
        with pytest.raises(CheckpointError, match="Nested checkpoint is not supported during scheduled "
                                                  "recomputation") as info:
            checkpoint(region, _x(), use_reentrant=False)
    _check_message(info.value)
    assert calls == [] and frames == []
    assert recorder.trace.count("handle_created") == 0


# 3. The recompute does not match the forward -----------------------------------------------------------

def test_recompute_saves_more_tensors() -> None:
    flag, w, x = Flag(), _w(), _x()

    def region(a: torch.Tensor) -> torch.Tensor:
        h = torch.sin(a)
        if flag.on:
            h = torch.cos(h)      # one more saved tensor in the replay
        return h @ w

    y = checkpoint(region, x, use_reentrant=False, early_stop=False)
    with flag.flipped(), pytest.raises(CheckpointError, match="tried to save more tensors during recomputation") \
            as info:
        y.sum().backward()
    _check_message(info.value)


def test_recompute_saves_fewer_tensors() -> None:
    flag, w, x = Flag(), _w(), _x()

    def region(a: torch.Tensor) -> torch.Tensor:
        h = torch.sin(a)
        if not flag.on:
            h = torch.cos(h)      # one saved tensor fewer in the replay
        return h @ w

    y = checkpoint(region, x, use_reentrant=False)
    with flag.flipped(), pytest.raises(CheckpointError, match="saved a different number of tensors") as info:
        y.sum().backward()
    _check_message(info.value)
    assert "Forward saved 4 tensors, but recomputation saved 3 tensors" in str(info.value)


def _shape_changing(flag: Flag):
    def region(a: torch.Tensor) -> torch.Tensor:
        # mul saves its other operand; the replay saves a broadcastable one of another shape.
        scale = torch.full((4,), 2.0) if flag.on else torch.full((BATCH, 4), 2.0)
        return a * scale
    return region


def test_recompute_with_different_metadata() -> None:
    flag, x = Flag(), _x()
    y = checkpoint(_shape_changing(flag), x, use_reentrant=False)
    with flag.flipped(), pytest.raises(CheckpointError, match="different tensor metadata during recomputation") \
            as info:
        y.sum().backward()
    _check_message(info.value)
    assert "tensor 0: forward=((3, 4)" in str(info.value) and "recompute=((4,)" in str(info.value)


def test_determinism_check_none_skips_the_metadata_check() -> None:
    flag, x = Flag(), _x()
    y = checkpoint(_shape_changing(flag), x, use_reentrant=False, determinism_check="none")
    with flag.flipped():
        y.sum().backward()
    assert torch.equal(x.grad, torch.full((BATCH, 4), 2.0))


# 4. Sessions -------------------------------------------------------------------------------------------

def test_unpacked_twice_in_a_non_retaining_session() -> None:
    w, x = _w(), _x()
    frame, y = _collect(_tanh_region(w), x)
    recompute_handle(frame, "once")
    with recompute_session_ctx("once", retain_on_unpack=False):
        torch.autograd.grad(y.sum(), [x], retain_graph=True)      # DX consumes the recomputed tensors
        with pytest.raises(CheckpointError, match="unpacked more than once in the same recompute session") as info:
            torch.autograd.backward(y.sum(), inputs=[w])          # DW needs one of them again
    clear_recompute_session("once")
    _check_message(info.value)


@pytest.mark.parametrize("active_id, retain", [("other", True), ("other", False), ("mine", False)],
                         ids=["other-id", "other-id-no-retain", "same-id-no-retain"])
def test_prefire_inside_another_session(active_id: str, retain: bool) -> None:
    frame, _ = _collect(_tanh_region(_w()), _x())
    with recompute_session_ctx(active_id, retain_on_unpack=retain):
        with pytest.raises(CheckpointError, match="recompute_handle cannot enter another active recompute "
                                                  "session") as info:
            recompute_handle(frame, "mine")
    _check_message(info.value)
    assert frame.replay_count == 0


def test_prefire_inside_the_same_retaining_session_is_allowed() -> None:
    frame, _ = _collect(_tanh_region(_w()), _x())
    with recompute_session_ctx("mine", retain_on_unpack=True):
        recompute_handle(frame, "mine")
    clear_recompute_session("mine")
    assert frame.replay_count == 1


def test_nested_session_contexts() -> None:
    with recompute_session_ctx("outer") as outer_id:
        outer = current_activation()
        with pytest.raises(CheckpointError, match="Nested recompute session contexts are not supported") as info:
            with recompute_session_ctx("inner"):
                pass
        assert current_activation() is outer, "the failed nested entry leaves the outer session intact"
    assert outer_id == "outer" and current_activation() is None
    _check_message(info.value)


def test_concurrent_sessions_on_one_frame() -> None:
    frame, _ = _collect(_tanh_region(_w()), _x())
    recompute_handle(frame, "A")
    recompute_handle(frame, "B")  # the frame is registered under two ids
    errors = []

    def other_context() -> None:  # another thread or task: it does not see session "A"
        assert current_activation() is None
        try:
            with recompute_session_ctx("B"):
                pass
        except CheckpointError as exc:
            errors.append(exc)
        assert current_activation() is None, "a failed activation resets the ContextVar"

    with recompute_session_ctx("A"):
        contextvars.Context().run(other_context)
        assert frame.active_session is current_activation()
    clear_recompute_session("A")
    clear_recompute_session("B")

    (exc,) = errors
    assert "Concurrent recompute sessions on the same checkpoint frame" in str(exc)
    _check_message(exc)


@pytest.mark.parametrize("handle", [object(), torch.zeros(1), None], ids=["object", "tensor", "None"])
def test_prefire_needs_a_collected_handle(handle: object) -> None:
    with pytest.raises(CheckpointUsageError, match=r"handle must be produced by recompute_handle_collector_ctx") \
            as info:
        recompute_handle(handle, "s")
    _check_message(info.value)


def _session_apis(frame) -> dict:
    def ctx(sid):
        with recompute_session_ctx(sid):
            pass
    return {"recompute_session_ctx": ctx, "recompute_handle": lambda sid: recompute_handle(frame, sid),
            "clear_recompute_session": clear_recompute_session}


@pytest.mark.parametrize("api", ["recompute_session_ctx", "recompute_handle", "clear_recompute_session"])
def test_session_id_must_not_be_none(api: str) -> None:
    frame, _ = _collect(_tanh_region(_w()), _x())
    with pytest.raises(CheckpointUsageError, match="session_id must not be None") as info:
        _session_apis(frame)[api](None)
    _check_message(info.value)
    assert str(info.value).startswith(f"ckpt_viz.{api}")


@pytest.mark.parametrize("api", ["recompute_session_ctx", "recompute_handle", "clear_recompute_session"])
def test_session_id_must_be_hashable(api: str) -> None:
    frame, _ = _collect(_tanh_region(_w()), _x())
    with pytest.raises(CheckpointUsageError, match="session_id must be hashable") as info:
        _session_apis(frame)[api]([1, 2])
    _check_message(info.value)
    assert frame.replay_count == 0


@pytest.mark.parametrize("value", [1, None, "yes"])
def test_retain_on_unpack_must_be_bool(value: object) -> None:
    with pytest.raises(CheckpointUsageError, match="retain_on_unpack must be bool") as info:
        with recompute_session_ctx("s", retain_on_unpack=value):
            pass
    _check_message(info.value)
    assert current_activation() is None


class _FailingReplay:
    """A region whose replay raises after saving its first tensor (a prefire that fails part-way)."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w = w
        self.fail = False

    def __call__(self, a: torch.Tensor) -> torch.Tensor:
        h = torch.sin(a)                  # saved tensor 0 gets its recomputed handle
        if self.fail:
            raise RuntimeError("replay failed part-way")
        return h @ self.w                 # saved tensors 1 and 2


def test_retry_after_a_partial_prefire_without_clearing() -> None:
    w, x = _w(), _x()
    region = _FailingReplay(w)
    frame, _ = _collect(region, x)
    region.fail = True
    with pytest.raises(RuntimeError, match="replay failed part-way"):
        recompute_handle(frame, "retry")
    region.fail = False
    try:
        with pytest.raises(CheckpointError, match="A recomputed tensor handle already exists for this session") \
                as info:
            recompute_handle(frame, "retry")
        _check_message(info.value)
    finally:
        clear_recompute_session("retry")


def test_clearing_allows_the_retry_after_a_partial_prefire(recorder: ckpt_viz.Recording) -> None:
    w, x = _w(), _x()
    region = _FailingReplay(w)
    region(x).sum().backward()
    want = grads([x, w])
    reset_grads([x, w])

    frame, y = _collect(region, x)
    region.fail = True
    with pytest.raises(RuntimeError, match="replay failed part-way"):
        recompute_handle(frame, "retry")
    assert recorder.trace.count("replay_failed") == 1
    region.fail = False
    clear_recompute_session("retry")
    recompute_handle(frame, "retry")
    with recompute_session_ctx("retry"):
        y.sum().backward()
    clear_recompute_session("retry")

    assert frame.replay_count == 2, "the failed prefire and the retry; the backward reused the retry"
    assert_grads_equal(grads([x, w]), want, ["x", "w"])


def test_internal_input_saver_must_not_be_backwarded() -> None:
    frame, _ = _collect(_tanh_region(_w()), _x())
    with pytest.raises(CheckpointError, match="must not be backwarded directly") as info:
        torch.autograd.backward(frame.input_saver, torch.empty(0))
    _check_message(info.value)


# 5. Excluded regions -------------------------------------------------------------------------------------

@pytest.mark.parametrize("module", [3, None, "LayerNorm"])
def test_exclude_needs_a_module_or_callable(module: object) -> None:
    with pytest.raises(CheckpointUsageError, match="module must be a PyTorch Module or callable") as info:
        checkpoint_exclude_wrapper(module)
    _check_message(info.value)


@pytest.mark.parametrize("value", [1, None, "True"])
def test_exclude_save_output_must_be_bool(value: object) -> None:
    with pytest.raises(CheckpointUsageError, match="save_output must be a bool") as info:
        checkpoint_exclude_wrapper(torch.tanh, save_output=value)
    _check_message(info.value)


def test_exclude_without_session_dx_then_dw_has_no_cached_output() -> None:
    """Without a session DX and DW each recompute; the second replay finds the cache empty."""
    w, x = _w(), _x()
    calls = []

    def norm(h: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return torch.nn.functional.layer_norm(h, (5,))

    excluded = checkpoint_exclude_wrapper(norm)

    def region(a: torch.Tensor) -> torch.Tensor:
        return torch.sin(excluded(torch.tanh(a @ w)))

    with recompute_handle_collector_ctx() as frames:
        y = checkpoint(region, x, use_reentrant=False)
    g = torch.ones(BATCH, 5)
    backward_input(y, g, [x], handles=frames)
    with pytest.raises(ExcludedRegionError, match="No cached forward output is available for this checkpoint "
                                                  "exclusion wrapper") as info:
        backward_weight(y, g, [w], handles=frames)
    _check_message(info.value)
    assert info.value.code == "exclude_cache_empty" and isinstance(info.value, RuntimeError)
    assert calls == [1], "the region still ran once only"


def test_exclude_replay_does_not_reproduce_a_tensor_input() -> None:
    flag, w, x = Flag(), _w(), _x()
    excluded = checkpoint_exclude_wrapper(torch.sin)  # sin saves its input: the replay must provide it

    def region(a: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(a @ w)
        return torch.cos(excluded(1.0 if flag.on else h))

    y = checkpoint(region, x, use_reentrant=False)
    phrase = "Checkpoint replay did not reproduce a tensor input required by a checkpoint-excluded region"
    with flag.flipped(), pytest.raises(ExcludedRegionError, match=phrase) as info:
        y.sum().backward()
    _check_message(info.value)
    assert info.value.code == "exclude_input_changed"
