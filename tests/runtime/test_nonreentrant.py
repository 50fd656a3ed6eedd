"""Non-reentrant checkpoint gradients equal the same model without checkpointing (bit-exact, CPU).

Every test runs a reference forward/backward with no checkpoint and then the
checkpointed run on the same module and seed; gradients must be `torch.equal`,
because the recompute runs exactly the ops of the forward.

Replays are counted from the trace (`replay_started` per handle id). With a
session (spec D6, NOTE [ Holders and keys ], rule 5) a frame recomputes once per
micro-batch even though DX and DW are two autograd passes; without one, each pass
is its own graph task and recomputes again (the upstream behaviour).
"""
from __future__ import annotations

import threading

import pytest
import torch

import ckpt_viz
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
)
from ckpt_viz.runtime.nonreentrant import NonReentrantFrame
from ckpt_viz.runtime.session import current_activation
from models import Stack, assert_grads_equal, block_function, grads, leaf, replays_per_handle, reset_grads

BATCH = 3


def _forward(model: Stack, x: torch.Tensor, *, checkpointed: bool = True, **flags) -> torch.Tensor:
    """The model's forward; blocks whose spec says so run under the non-reentrant checkpoint."""
    for block in model.blocks:
        spec = block.spec
        if not checkpointed or not spec.checkpointed:
            x = block(x)
        elif spec.explicit:
            x = checkpoint(block_function, x, block.weight, block.bias, use_reentrant=False,
                           activation=spec.activation, dropout=spec.dropout, **flags)
        else:
            x = checkpoint(block, x, use_reentrant=False, **flags)
    return x


def _reference(model: Stack, x: torch.Tensor, g: torch.Tensor, seed: int = 0) -> tuple[list, list]:
    """(activation grads, parameter grads) without checkpointing; parameter grads are reset after."""
    params = list(model.parameters())
    ref_x = x.detach().clone().requires_grad_(x.requires_grad)
    torch.manual_seed(seed)
    _forward(model, ref_x, checkpointed=False).backward(g)
    expected = grads([ref_x]), grads(params)
    reset_grads(params)
    return expected


def _names(model: Stack) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def _setup(widths, seed_x: int = 1, seed_g: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    return leaf((BATCH, widths[0]), seed=seed_x), leaf((BATCH, widths[-1]), seed=seed_g, requires_grad=False)


# 1. Ordinary backward ----------------------------------------------------------------------------

@pytest.mark.parametrize("explicit", [False, True], ids=["closure", "explicit"])
def test_ordinary_backward_matches_reference(explicit: bool, recorder: ckpt_viz.Recording) -> None:
    widths = [4, 6, 5, 3]
    model = Stack.mlp(widths, activation="gelu", checkpointed=[True, False, True], explicit=[explicit] * 3)
    x, g = _setup(widths)
    want_x, want_p = _reference(model, x, g)

    with recompute_handle_collector_ctx() as frames:
        y = _forward(model, x)
    y.backward(g)

    assert len(frames) == 2 and all(isinstance(f, NonReentrantFrame) for f in frames)
    assert_grads_equal(grads([x]), want_x, ["x"])
    assert_grads_equal(grads(model.parameters()), want_p, _names(model))
    assert replays_per_handle(recorder.trace) == {f.handle_id: 1 for f in frames}
    assert {e.trigger for e in recorder.trace.of_kind("replay_started")} == {"backward"}


def test_output_equals_unchecked_forward() -> None:
    model = Stack.mlp([4, 5, 3], activation="sigmoid")
    x = leaf((BATCH, 4), seed=1)
    assert torch.equal(_forward(model, x).detach(), _forward(model, x, checkpointed=False).detach())


# 2. Split DX/DW through a session: one replay per region per micro-batch ---------------------------

@pytest.mark.parametrize("explicit", [False, True], ids=["closure", "explicit"])
def test_split_helpers_with_session_replay_each_frame_once(explicit: bool, recorder: ckpt_viz.Recording) -> None:
    # Several frames (four checkpointed blocks) share the one session of the micro-batch.
    widths = [4, 6, 5, 6, 3]
    model = Stack.mlp(widths, activation="tanh", explicit=[explicit, not explicit, explicit, explicit])
    params = list(model.parameters())
    x, g = _setup(widths)
    want_x, want_p = _reference(model, x, g)

    with recompute_handle_collector_ctx() as frames:
        y = _forward(model, x)
    assert len(frames) == 4

    (dx,) = backward_input(y, g, [x], handles=frames, session_id=("stage0", 0))
    assert all(p.grad is None for p in params), "DX must not touch parameter .grad"
    assert x.grad is None, "backward_input returns the DX grads; it does not accumulate them"
    assert_grads_equal([dx], want_x, ["dx"])
    assert replays_per_handle(recorder.trace) == {f.handle_id: 1 for f in frames}, "DX recomputes each frame once"

    backward_weight(y, g, params, handles=frames, session_id=("stage0", 0))

    assert_grads_equal(grads(params), want_p, _names(model))
    assert x.grad is None
    assert replays_per_handle(recorder.trace) == {f.handle_id: 1 for f in frames}, "DW reuses the DX recompute"
    unpacks = recorder.trace.of_kind("tensor_unpacked")
    assert unpacks and {e.key_source for e in unpacks} == {"session"}
    # Events carry JSON-ready session ids: a tuple id appears as its repr.
    assert [e.session_id for e in recorder.trace.of_kind("session_cleared")] == [repr(("stage0", 0))]


def test_split_helpers_without_session_recompute_per_pass(recorder: ckpt_viz.Recording) -> None:
    """Upstream behaviour: DX and DW are two graph tasks, so each frame recomputes twice."""
    widths = [4, 6, 5, 3]
    model = Stack.mlp(widths, activation="relu", explicit=[False, True, False])
    params = list(model.parameters())
    x, g = _setup(widths)
    want_x, want_p = _reference(model, x, g)

    with recompute_handle_collector_ctx() as frames:
        y = _forward(model, x)
    (dx,) = backward_input(y, g, [x], handles=frames)
    after_dx = replays_per_handle(recorder.trace)
    backward_weight(y, g, params, handles=frames)

    assert after_dx == {f.handle_id: 1 for f in frames}
    assert replays_per_handle(recorder.trace) == {f.handle_id: 2 for f in frames}
    assert {e.key_source for e in recorder.trace.of_kind("tensor_unpacked")} == {"graph_task"}
    assert_grads_equal([dx], want_x, ["dx"])
    assert_grads_equal(grads(params), want_p, _names(model))


def test_first_stage_input_without_grad_with_session(recorder: ckpt_viz.Recording) -> None:
    widths = [4, 5, 3]
    model = Stack.mlp(widths)
    params = list(model.parameters())
    x = leaf((BATCH, 4), seed=1, requires_grad=False)
    g = leaf((BATCH, 3), seed=2, requires_grad=False)
    _, want_p = _reference(model, x, g)

    with recompute_handle_collector_ctx() as frames:
        y = _forward(model, x)
    assert backward_input(y, g, [x], handles=frames, session_id="mb") == (None,)
    assert recorder.trace.count("replay_started") == 0, "DX had nothing to differentiate"
    backward_weight(y, g, params, handles=frames, session_id="mb")

    assert_grads_equal(grads(params), want_p, _names(model))
    assert replays_per_handle(recorder.trace) == {f.handle_id: 1 for f in frames}


# 3. Repeated iterations with fresh sessions --------------------------------------------------------

@pytest.mark.parametrize("session_ids", ["fresh", "reused"])
def test_repeated_iterations_accumulate_and_replay_once(session_ids: str, recorder: ckpt_viz.Recording) -> None:
    widths = [4, 6, 5, 3]
    model = Stack.mlp(widths, dropout=0.25, checkpointed=[True, True, False], explicit=[True, False, False])
    params = list(model.parameters())
    batches = [_setup(widths, seed_x=10 + it, seed_g=20 + it) for it in range(4)]

    want_x = []
    for it, (x, g) in enumerate(batches):
        ref_x = x.detach().clone().requires_grad_()
        torch.manual_seed(it)
        _forward(model, ref_x, checkpointed=False).backward(g)
        want_x.append(ref_x.grad)
    want_p = grads(params)
    reset_grads(params)

    all_frames = []
    for it, (x, g) in enumerate(batches):
        sid = ("mb", it) if session_ids == "fresh" else "the-only-id"
        torch.manual_seed(it)
        with recompute_handle_collector_ctx() as frames:
            y = _forward(model, x)
        (dx,) = backward_input(y, g, [x], handles=frames, session_id=sid)
        backward_weight(y, g, params, handles=frames, session_id=sid)
        assert_grads_equal([dx], [want_x[it]], [f"dx[{it}]"])
        all_frames += frames

    assert_grads_equal(grads(params), want_p, _names(model))
    assert len({f.handle_id for f in all_frames}) == 8
    assert replays_per_handle(recorder.trace) == {f.handle_id: 1 for f in all_frames}
    assert recorder.trace.count("session_cleared") == 4


# 4. Prefire, then backward on a thread that cannot see the session ContextVar ------------------------

def test_backward_on_another_thread_reuses_the_prefire(recorder: ckpt_viz.Recording) -> None:
    widths = [4, 6, 5, 3]
    model = Stack.mlp(widths, activation="gelu", explicit=[False, True, False])
    params = list(model.parameters())
    x, g = _setup(widths)
    want_x, want_p = _reference(model, x, g)

    with recompute_handle_collector_ctx() as frames:
        y = _forward(model, x)
    for frame in frames:
        recompute_handle(frame, "mb0")
    assert replays_per_handle(recorder.trace) == {f.handle_id: 1 for f in frames}
    assert {e.trigger for e in recorder.trace.of_kind("replay_started")} == {"prefire"}

    seen: dict[str, object] = {}

    def worker() -> None:
        seen["activation"] = current_activation()
        try:
            with recorder.attach():  # a thread is in a recording only when handed it (bus NOTE [ Recording scopes ])
                y.backward(g)
        except BaseException as exc:  # re-raised on the test thread below
            seen["error"] = exc

    with recompute_session_ctx("mb0", retain_on_unpack=False):
        assert current_activation() is not None
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    clear_recompute_session("mb0")

    assert "error" not in seen, seen.get("error")
    assert seen["activation"] is None, "the worker thread must not see the caller's ContextVar"
    unpacks = recorder.trace.of_kind("tensor_unpacked")
    assert unpacks and {e.thread_id for e in unpacks} != {threading.get_ident()}
    assert {e.key_source for e in unpacks} == {"session"}
    assert replays_per_handle(recorder.trace) == {f.handle_id: 1 for f in frames}, "no second replay"
    assert_grads_equal(grads([x]), want_x, ["x"])
    assert_grads_equal(grads(params), want_p, _names(model))


# 5. Early stop ------------------------------------------------------------------------------------

@pytest.mark.parametrize("early_stop", [True, False])
def test_early_stop_skips_the_tail_of_the_function(early_stop: bool, recorder: ckpt_viz.Recording) -> None:
    w = leaf((4, 5), seed=3)
    x = leaf((BATCH, 4), seed=4)
    tail_runs = []

    def region(a: torch.Tensor) -> torch.Tensor:
        out = torch.tanh(a @ w)   # the last op that saves a tensor
        tail_runs.append(1)       # a side effect after the last saved tensor
        return out

    region(x).sum().backward()
    want = grads([x, w])
    reset_grads([x, w])
    tail_runs.clear()

    checkpoint(region, x, use_reentrant=False, early_stop=early_stop).sum().backward()

    assert len(tail_runs) == (1 if early_stop else 2)
    assert recorder.trace.count("replay_started") == 1
    assert recorder.trace.count("early_stopped") == (1 if early_stop else 0)
    (finished,) = recorder.trace.of_kind("replay_finished")
    assert finished.early_stopped is early_stop
    assert_grads_equal(grads([x, w]), want, ["x", "w"])


# 6. Dropout: the recompute restores the RNG state --------------------------------------------------

@pytest.mark.parametrize("split", [False, True], ids=["ordinary", "split"])
def test_dropout_bit_exact(split: bool) -> None:
    widths = [4, 8, 8, 3]
    model = Stack.mlp(widths, dropout=0.5, checkpointed=[True, False, True], explicit=[False, False, True])
    params = list(model.parameters())
    x, g = _setup(widths)
    want_x, want_p = _reference(model, x, g, seed=123)

    torch.manual_seed(123)
    with recompute_handle_collector_ctx() as frames:
        y = _forward(model, x)
    if split:
        got_x = list(backward_input(y, g, [x], handles=frames, session_id="drop"))
        backward_weight(y, g, params, handles=frames, session_id="drop")
    else:
        y.backward(g)
        got_x = grads([x])

    assert_grads_equal(got_x, want_x, ["dx"])
    assert_grads_equal(grads(params), want_p, _names(model))


# 7. torch.autograd.grad inside the checkpointed function ------------------------------------------

@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("create_graph", [False, True])
def test_grad_inside_forward(create_graph: bool, early_stop: bool, recorder: ckpt_viz.Recording) -> None:
    w = leaf((4, 4), seed=5)
    x = leaf((BATCH, 4), seed=6)

    def region(a: torch.Tensor) -> torch.Tensor:
        inner = torch.sin(a @ w)
        (da,) = torch.autograd.grad(inner.sum(), a, create_graph=create_graph)
        return torch.tanh(a) * da

    region(x).sum().backward()
    want = grads([x, w])
    reset_grads([x, w])
    if not create_graph:
        assert want[1] is None, "without create_graph the inner gradient is a constant"

    with recompute_handle_collector_ctx() as frames:
        y = checkpoint(region, x, use_reentrant=False, early_stop=early_stop)
    y.sum().backward()

    assert_grads_equal(grads([x, w]), want, ["x", "w"])
    # The inner autograd.grad is its own graph task: it recomputes once during the forward,
    # and the real backward recomputes once more.
    assert replays_per_handle(recorder.trace) == {frames[0].handle_id: 2}


# 8. Nested checkpoints ------------------------------------------------------------------------------

@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_checkpoints(early_stop: bool, recorder: ckpt_viz.Recording) -> None:
    w1, w2 = leaf((4, 5), seed=7), leaf((5, 3), seed=8)
    x = leaf((BATCH, 4), seed=9)
    g = leaf((BATCH, 3), seed=10, requires_grad=False)

    def inner(h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(h @ w1)

    def outer(a: torch.Tensor, nested: bool) -> torch.Tensor:
        h = torch.sin(a)
        h = checkpoint(inner, h, use_reentrant=False, early_stop=early_stop) if nested else inner(h)
        return torch.cos(h) @ w2

    outer(x, False).backward(g)
    want = grads([x, w1, w2])
    reset_grads([x, w1, w2])

    with recompute_handle_collector_ctx() as frames:
        y = checkpoint(outer, x, True, use_reentrant=False, early_stop=early_stop)
    assert len(frames) == 2, "the outer frame and the inner frame of the original forward"
    y.backward(g)

    assert_grads_equal(grads([x, w1, w2]), want, ["x", "w1", "w2"])
    counts = replays_per_handle(recorder.trace)
    assert counts == {frames[0].handle_id: 1, frames[1].handle_id: 1}
