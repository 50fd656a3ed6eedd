"""One session system for both checkpoint kinds (spec D3, NOTE [ Sessions ]).

`recompute_handle` prefires a non-reentrant frame or a reentrant handle; the
consumers that run later inside `recompute_session_ctx` reuse that replay instead
of replaying again. `clear_recompute_session` forgets a session: reentrant
handles are released (`session_cleared`), frames drop their recomputed tensors.
The session life shows up in the trace as session_bound / session_activated /
session_deactivated / session_cleared / prefired.
"""
from __future__ import annotations

import pytest
import torch

import ckpt_viz
from ckpt_viz.runtime import (
    ReentrantCheckpointHandle,
    backward_input,
    backward_weight,
    checkpoint,
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
    reentrant_checkpoint_scope,
)
from ckpt_viz.runtime.nonreentrant import NonReentrantFrame
from ckpt_viz.runtime.session import current_activation
from models import assert_grads_equal, grads, leaf, replays_per_handle, reset_grads

BATCH = 3


def _region(w: torch.Tensor):
    def region(a: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a @ w)
    return region


def _setup() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """(x, w1, w2, reference grads of [x, w1, w2]) for `_two_regions` without checkpointing."""
    x, w1, w2 = leaf((BATCH, 4), seed=1), leaf((4, 5), seed=2), leaf((5, 3), seed=3)
    _two_regions(x, w1, w2, kinds=(None, None)).sum().backward()
    want = grads([x, w1, w2])
    reset_grads([x, w1, w2])
    return x, w1, w2, want


def _two_regions(x, w1, w2, kinds: tuple) -> torch.Tensor:
    """Two regions in a row; each kind is None (no checkpoint), False (non-reentrant) or True (reentrant)."""
    h = x
    for w, kind in zip((w1, w2), kinds):
        h = _region(w)(h) if kind is None else checkpoint(_region(w), h, use_reentrant=kind)
    return h


# 1. Prefire, then the backward reuses it ----------------------------------------------------------

@pytest.mark.parametrize("use_reentrant", [False, True], ids=["frame", "reentrant"])
def test_prefire_then_backward_in_session_replays_once(use_reentrant: bool, recorder: ckpt_viz.Recording) -> None:
    x, w1, w2, want = _setup()
    with recompute_handle_collector_ctx() as handles:
        y = _two_regions(x, w1, w2, kinds=(use_reentrant, use_reentrant))
    kind = ReentrantCheckpointHandle if use_reentrant else NonReentrantFrame
    assert len(handles) == 2 and all(isinstance(h, kind) for h in handles)

    for handle in handles:
        recompute_handle(handle, "mb0")
    assert replays_per_handle(recorder.trace) == {h.handle_id: 1 for h in handles}
    assert [e.trigger for e in recorder.trace.of_kind("replay_started")] == ["prefire", "prefire"]
    if use_reentrant:
        assert all(h.replay_outputs is not None and not h.released for h in handles)

    with recompute_session_ctx("mb0", retain_on_unpack=False):
        y.sum().backward()

    assert replays_per_handle(recorder.trace) == {h.handle_id: 1 for h in handles}, "no second replay"
    assert_grads_equal(grads([x, w1, w2]), want, ["x", "w1", "w2"])
    clear_recompute_session("mb0")
    clear_recompute_session("mb0")  # safe twice


def test_prefire_of_frames_and_reentrant_handles_in_one_session(recorder: ckpt_viz.Recording) -> None:
    x, w1, w2, want = _setup()
    with recompute_handle_collector_ctx() as handles:
        y = _two_regions(x, w1, w2, kinds=(False, True))
    assert [h.mode for h in handles] == ["nonreentrant", "reentrant"]

    for handle in handles:
        recompute_handle(handle, 7)
    with recompute_session_ctx(7):
        y.sum().backward()
    clear_recompute_session(7)

    assert replays_per_handle(recorder.trace) == {h.handle_id: 1 for h in handles}
    assert_grads_equal(grads([x, w1, w2]), want, ["x", "w1", "w2"])
    (cleared,) = recorder.trace.of_kind("session_cleared")
    assert cleared.session_id == 7
    assert cleared.frames == (handles[0].handle_id,)
    assert cleared.handles == (handles[1].handle_id,)


def test_prefire_inside_a_retaining_session_then_dx_and_dw(recorder: ckpt_viz.Recording) -> None:
    """retain_on_unpack=True keeps the recomputed tensors for a second pass over the same frame."""
    x, w1, w2, want = _setup()
    with recompute_handle_collector_ctx() as frames:
        y = _two_regions(x, w1, w2, kinds=(False, False))

    with recompute_session_ctx("mb", retain_on_unpack=True):
        for frame in frames:
            recompute_handle(frame, "mb")  # the "in_session" path
        (dx,) = torch.autograd.grad(y.sum(), [x], retain_graph=True)
        assert w1.grad is None and w2.grad is None
        torch.autograd.backward(y.sum(), inputs=[w1, w2])
    clear_recompute_session("mb")

    assert [e.path for e in recorder.trace.of_kind("prefired")] == ["in_session", "in_session"]
    assert replays_per_handle(recorder.trace) == {f.handle_id: 1 for f in frames}
    assert_grads_equal([dx, w1.grad, w2.grad], want, ["dx", "w1", "w2"])
    unpacks = recorder.trace.of_kind("tensor_unpacked")
    assert unpacks and all(e.retain and not e.consumed for e in unpacks)


def test_split_reentrant_handles_prefired_then_helpers(recorder: ckpt_viz.Recording) -> None:
    x, w1, w2, want = _setup()
    with reentrant_checkpoint_scope([w1, w2]) as handles:
        y = _two_regions(x, w1, w2, kinds=(True, True))
    for handle in handles:
        recompute_handle(handle, "s")
    g = torch.ones(BATCH, 3)
    (dx,) = backward_input(y, g, [x], handles=handles, session_id="s")
    backward_weight(y, g, [w1, w2], handles=handles, session_id="s")

    assert replays_per_handle(recorder.trace) == {h.handle_id: 1 for h in handles}
    assert_grads_equal([dx, w1.grad, w2.grad], want, ["dx", "w1", "w2"])
    assert [h.release_reason for h in handles] == ["dw_complete", "dw_complete"]


# 2. Clearing -------------------------------------------------------------------------------------------

def test_clear_releases_reentrant_handles_with_reason_session_cleared(recorder: ckpt_viz.Recording) -> None:
    x, w1, w2, _ = _setup()
    with recompute_handle_collector_ctx() as handles:
        y = _two_regions(x, w1, w2, kinds=(True, True))
    for handle in handles:
        recompute_handle(handle, "gone")
    assert not any(h.released for h in handles)

    clear_recompute_session("gone")
    assert all(h.released and h.release_reason == "session_cleared" for h in handles)
    assert all(h.replay_outputs is None for h in handles)
    released = recorder.trace.of_kind("released")
    # The registry is a weak set: the release order is not specified.
    assert sorted((e.handle_id, e.reason) for e in released) == \
        sorted((h.handle_id, "session_cleared") for h in handles)

    clear_recompute_session("gone")  # safe twice: nothing more is released
    assert recorder.trace.count("released") == 2
    assert recorder.trace.count("session_cleared") == 2
    del y


def test_clear_drops_the_frames_recomputed_tensors(recorder: ckpt_viz.Recording) -> None:
    x, w1, w2, want = _setup()
    with recompute_handle_collector_ctx() as frames:
        y = _two_regions(x, w1, w2, kinds=(False, False))
    for frame in frames:
        recompute_handle(frame, "s")
    assert all("s" in f.recomputed and len(f.recomputed["s"]) > 0 for f in frames)

    clear_recompute_session("s")
    assert all("s" not in f.recomputed for f in frames)
    y.sum().backward()  # outside any session: each frame recomputes again, under the graph task

    assert replays_per_handle(recorder.trace) == {f.handle_id: 2 for f in frames}
    assert_grads_equal(grads([x, w1, w2]), want, ["x", "w1", "w2"])


def test_a_frame_not_registered_in_the_session_is_unaffected(recorder: ckpt_viz.Recording) -> None:
    """NOTE [ Sessions ], rule 3: activation binds only the members registered under its id."""
    x, w1, w2, want = _setup()
    with recompute_handle_collector_ctx() as frames:
        y = _two_regions(x, w1, w2, kinds=(False, False))
    recompute_handle(frames[1], "s")  # only the second frame joins "s"

    with recompute_session_ctx("s"):
        assert frames[0].active_session is None
        assert frames[1].active_session is current_activation()
        y.sum().backward()
    clear_recompute_session("s")

    assert frames[1].active_session is None, "leaving the session unbinds its frames"
    sources = {e.handle_id: e.key_source for e in recorder.trace.of_kind("tensor_unpacked")}
    assert sources == {frames[0].handle_id: "graph_task", frames[1].handle_id: "session"}
    assert replays_per_handle(recorder.trace) == {f.handle_id: 1 for f in frames}
    assert_grads_equal(grads([x, w1, w2]), want, ["x", "w1", "w2"])


# 3. Events ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_reentrant", [False, True], ids=["frame", "reentrant"])
def test_session_life_events(use_reentrant: bool, recorder: ckpt_viz.Recording) -> None:
    x, w1, _, _ = _setup()
    with recompute_handle_collector_ctx() as handles:
        y = checkpoint(_region(w1), x, use_reentrant=use_reentrant)
    (handle,) = handles
    hid, mode = handle.handle_id, ("reentrant" if use_reentrant else "nonreentrant")
    start = len(recorder.trace.events)

    recompute_handle(handle, "sid")
    with recompute_session_ctx("sid"):
        y.sum().backward()
    clear_recompute_session("sid")

    session_kinds = {"prefired", "session_bound", "session_activated", "session_deactivated", "session_cleared",
                     "replay_started"}
    seen = [(e.kind, e.session_id) for e in recorder.trace.events[start:] if e.kind in session_kinds]
    assert seen == [
        ("prefired", "sid"),
        ("session_bound", "sid"),
        ("session_activated", "sid"),      # the temporary retaining session of the prefire
        ("replay_started", "sid"),
        ("session_deactivated", "sid"),
        ("session_activated", "sid"),      # the consumer's session
        ("session_deactivated", "sid"),
        ("session_cleared", "sid"),
    ]
    prefired, bound = recorder.trace.of_kind("prefired")[0], recorder.trace.of_kind("session_bound")[0]
    assert (prefired.handle_id, prefired.mode, prefired.path) == (hid, mode, "temporary_session")
    assert (bound.handle_id, bound.mode) == (hid, mode)
    activated = recorder.trace.of_kind("session_activated")
    assert [e.retain_on_unpack for e in activated] == [True, False]
    assert [e.handles for e in activated] == [(hid,), (hid,)]
    deactivated = recorder.trace.of_kind("session_deactivated")
    assert [e.handles for e in deactivated] == [(hid,), (hid,)]
    (cleared,) = recorder.trace.of_kind("session_cleared")
    assert (cleared.handles, cleared.frames) == (((hid,), ()) if use_reentrant else ((), (hid,)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_tensor_packed_carries_shape_dtype_and_nbytes(dtype: torch.dtype, recorder: ckpt_viz.Recording) -> None:
    x = torch.randn(2, 5, dtype=dtype, requires_grad=True)
    with recompute_handle_collector_ctx() as frames:
        y = checkpoint(torch.sin, x, use_reentrant=False)  # sin saves exactly its input
    (frame,) = frames
    (packed,) = recorder.trace.of_kind("tensor_packed")
    assert packed.handle_id == frame.handle_id and packed.mode == "nonreentrant"
    assert packed.index == 0
    assert packed.shape == (2, 5)
    assert packed.dtype == str(dtype).removeprefix("torch.")
    assert packed.nbytes == 10 * x.element_size()
    assert packed.is_parameter is False

    y.sum().backward()
    (unpacked,) = recorder.trace.of_kind("tensor_unpacked")
    assert (unpacked.handle_id, unpacked.index, unpacked.shape) == (frame.handle_id, 0, (2, 5))
    assert unpacked.nbytes == packed.nbytes
    assert torch.equal(x.grad, torch.cos(x.detach()))


def test_tensor_packed_marks_parameters(recorder: ckpt_viz.Recording) -> None:
    scale = torch.nn.Parameter(torch.randn(4))
    x = torch.randn(BATCH, 4, requires_grad=True)
    checkpoint(lambda a: a * scale, x, use_reentrant=False)  # mul saves both operands as they are
    packed = recorder.trace.of_kind("tensor_packed")
    assert sorted((tuple(e.shape), e.is_parameter) for e in packed) == [
        ((BATCH, 4), False), ((4,), True)]
    assert sum(e.nbytes for e in packed) == (4 + BATCH * 4) * 4
