"""Reentrant checkpoint gradients equal the same model without checkpointing (bit-exact, CPU).

Every test runs a reference forward/backward with no checkpoint, keeps its
gradients, resets them, and runs the checkpointed version on the same module with
the same seed. Gradients must be `torch.equal`: the replay runs exactly the ops
of the reference, so any difference is a routing bug, not rounding.

Split mode (spec D6, NOTE [ Split routing ]): after DX the activation gradients
are final and every parameter `.grad` is still None; after DW the parameter
gradients are final and each handle has replayed exactly once.
"""
from __future__ import annotations

import pytest
import torch

import ckpt_viz
from ckpt_viz.runtime import backward_input, backward_weight, checkpoint, reentrant_checkpoint_scope
from models import MODES, Stack, assert_grads_equal, grads, leaf, replays_per_handle, reset_grads

BATCH = 3


def _reference(model: Stack, x: torch.Tensor, g: torch.Tensor, seed: int = 0) -> tuple[list, list]:
    """Reference run without checkpointing: (activation grads, parameter grads); then reset."""
    params = list(model.parameters())
    x = x.detach().clone().requires_grad_(x.requires_grad)
    torch.manual_seed(seed)
    model(x, mode="none").backward(g)
    expected = grads([x]), grads(params)
    reset_grads(params)
    return expected


def _split_helpers(model: Stack, x: torch.Tensor, g: torch.Tensor, seed: int = 0) -> list:
    """Checkpointed forward in a scope, then DX and DW through the helpers; returns the handles."""
    params = list(model.parameters())
    torch.manual_seed(seed)
    with reentrant_checkpoint_scope(params) as handles:
        y = model(x, mode="reentrant")
    assert len(handles) == model.n_checkpointed
    (dx,) = backward_input(y, g, [x], handles=handles)
    assert all(p.grad is None for p in params), "DX must not touch parameter .grad"
    assert x.grad is None, "backward_input returns DX grads; it must not accumulate into .grad"
    backward_weight(y, g, params, handles=handles)
    assert x.grad is None, "DW must not write activation .grad"
    assert all(h.released and h.release_reason == "dw_complete" for h in handles)
    return [dx]


# 1. Ordinary backward -------------------------------------------------------------------------

@pytest.mark.parametrize("explicit", [False, True], ids=["closure", "explicit"])
def test_ordinary_backward_matches_reference(explicit: bool, recorder: ckpt_viz.Recording) -> None:
    model = Stack.mlp([4, 6, 5, 3], activation="gelu", explicit=[explicit] * 3, checkpointed=[True, False, True])
    x, g = leaf((BATCH, 4), seed=1), leaf((BATCH, 3), seed=2, requires_grad=False)
    want_x, want_p = _reference(model, x, g)

    y = model(x, mode="reentrant")
    y.backward(g)

    assert_grads_equal(grads([x]), want_x, ["x"])
    assert_grads_equal(grads(model.parameters()), want_p, [n for n, _ in model.named_parameters()])
    counts = replays_per_handle(recorder.trace)
    assert sorted(counts.values()) == [1, 1]
    assert [e.reason for e in recorder.trace.of_kind("released")] == ["ordinary_backward_complete"] * 2


def test_ordinary_backward_through_scalar_loss(mlp2: Stack) -> None:
    x = leaf((BATCH, 4), seed=1)
    ref = x.detach().clone().requires_grad_()
    mlp2(ref).pow(2).mean().backward()
    want_p = grads(mlp2.parameters())
    reset_grads(mlp2.parameters())

    mlp2(x, mode="reentrant").pow(2).mean().backward()

    assert_grads_equal(grads([x]), grads([ref]), ["x"])
    assert_grads_equal(grads(mlp2.parameters()), want_p)


# 2. Split DX then DW ----------------------------------------------------------------------------

@pytest.mark.parametrize("explicit", [False, True], ids=["closure", "explicit"])
def test_split_helpers_match_reference(explicit: bool) -> None:
    model = Stack.mlp([4, 6, 5, 3], activation="tanh", explicit=[explicit] * 3)
    x, g = leaf((BATCH, 4), seed=1), leaf((BATCH, 3), seed=2, requires_grad=False)
    want_x, want_p = _reference(model, x, g)

    got_x = _split_helpers(model, x, g)

    assert_grads_equal(got_x, want_x, ["dx"])
    assert_grads_equal(grads(model.parameters()), want_p, [n for n, _ in model.named_parameters()])


@pytest.mark.parametrize("dx_call", ["backward", "grad"])
@pytest.mark.parametrize("explicit", [False, True], ids=["closure", "explicit"])
def test_split_raw_autograd_matches_reference(dx_call: str, explicit: bool) -> None:
    model = Stack.mlp([4, 6, 5, 3], activation="relu", explicit=[explicit, not explicit, explicit])
    params = list(model.parameters())
    x, g = leaf((BATCH, 4), seed=1), leaf((BATCH, 3), seed=2, requires_grad=False)
    want_x, want_p = _reference(model, x, g)

    with reentrant_checkpoint_scope(params) as handles:
        y = model(x, mode="reentrant")
    for h in handles:
        h.set_phase("dx")
    if dx_call == "backward":
        torch.autograd.backward(y, g, inputs=[x], retain_graph=True)
        got_x = grads([x])
    else:
        got_x = list(torch.autograd.grad(y, [x], g, retain_graph=True))
        assert x.grad is None
    assert all(p.grad is None for p in params), "DX must not touch parameter .grad"
    assert_grads_equal(got_x, want_x, ["dx"])

    for h in handles:
        h.set_phase("dw")
    torch.autograd.backward(y, g, inputs=(*params, *(h.backward_trigger for h in handles)))

    assert_grads_equal(grads(params), want_p, [n for n, _ in model.named_parameters()])
    assert_grads_equal(grads([x]), want_x if dx_call == "backward" else [None], ["x after DW"])
    assert all(h.backward_trigger.grad is None for h in handles), "the trigger never receives a gradient"
    assert all(h.released for h in handles)


# 3. Where parameters come from --------------------------------------------------------------------

def _mixed_region(x: torch.Tensor, w_explicit: torch.Tensor, free: torch.Tensor, *, captured: torch.Tensor
                  ) -> torch.Tensor:
    return torch.tanh(x @ captured) @ w_explicit * free


def _mixed_setup() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    captured = leaf((4, 5), seed=10)           # reaches the region by closure, in the scope
    w_explicit = leaf((5, 3), seed=11)         # passed as a checkpoint arg, in the scope
    free = leaf((3,), seed=12)                 # passed as a checkpoint arg, NOT in the scope
    x = leaf((BATCH, 4), seed=13)
    g = leaf((BATCH, 3), seed=14, requires_grad=False)
    return captured, w_explicit, free, x, g


def _mixed_forward(x, w_explicit, free, captured, mode: str) -> torch.Tensor:
    if mode == "none":
        return _mixed_region(x, w_explicit, free, captured=captured)
    return checkpoint(lambda a, w, f: _mixed_region(a, w, f, captured=captured), x, w_explicit, free,
                      use_reentrant=True)


def test_captured_explicit_and_free_tensors_ordinary() -> None:
    captured, w_explicit, free, x, g = _mixed_setup()
    everything = [x, captured, w_explicit, free]
    _mixed_forward(x, w_explicit, free, captured, "none").backward(g)
    want = grads(everything)
    reset_grads(everything)

    _mixed_forward(x, w_explicit, free, captured, "reentrant").backward(g)

    assert_grads_equal(grads(everything), want, ["x", "captured", "w_explicit", "free"])


def test_captured_explicit_and_free_tensors_split() -> None:
    captured, w_explicit, free, x, g = _mixed_setup()
    params = [captured, w_explicit]
    _mixed_forward(x, w_explicit, free, captured, "none").backward(g)
    want_x, want_free, want_p = grads([x]), grads([free]), grads(params)
    reset_grads([x, free, *params])

    with reentrant_checkpoint_scope(params) as handles:
        y = _mixed_forward(x, w_explicit, free, captured, "reentrant")
    assert handles[0].param_input_mask == (False, True, False)
    dx, dfree = backward_input(y, g, [x, free], handles=handles)
    # The trainable tensor outside the scope is an activation for the split: DX gives its gradient.
    assert_grads_equal([dx, dfree], [*want_x, *want_free], ["dx", "dfree"])
    assert all(p.grad is None for p in params)

    backward_weight(y, g, params, handles=handles)
    assert_grads_equal(grads(params), want_p, ["captured", "w_explicit"])
    assert free.grad is None and x.grad is None


# 4. Several checkpoints in one scope; a first stage whose input needs no grad ------------------------

def test_several_checkpoints_in_one_scope(recorder: ckpt_viz.Recording) -> None:
    model = Stack.mlp([4, 5, 6, 5, 3], activation="sigmoid", checkpointed=[True, True, False, True],
                      explicit=[False, True, False, False])
    x, g = leaf((BATCH, 4), seed=1), leaf((BATCH, 3), seed=2, requires_grad=False)
    want_x, want_p = _reference(model, x, g)

    got_x = _split_helpers(model, x, g)

    assert_grads_equal(got_x, want_x, ["dx"])
    assert_grads_equal(grads(model.parameters()), want_p, [n for n, _ in model.named_parameters()])
    assert len(replays_per_handle(recorder.trace)) == 3


@pytest.mark.parametrize("explicit", [False, True], ids=["closure", "explicit"])
def test_first_stage_input_without_grad(explicit: bool, recorder: ckpt_viz.Recording) -> None:
    model = Stack.mlp([4, 5, 3], explicit=[explicit] * 2)
    params = list(model.parameters())
    x, g = leaf((BATCH, 4), seed=1, requires_grad=False), leaf((BATCH, 3), seed=2, requires_grad=False)
    _, want_p = _reference(model, x, g)

    with reentrant_checkpoint_scope(params) as handles:
        y = model(x, mode="reentrant")
    assert backward_input(y, g, [x], handles=handles) == (None,)
    assert recorder.trace.count("replay_started") == 0, "DX had nothing to differentiate, so nothing replays"
    assert all(p.grad is None for p in params)

    backward_weight(y, g, params, handles=handles)  # reaches every handle through its trigger

    assert_grads_equal(grads(params), want_p, [n for n, _ in model.named_parameters()])
    assert replays_per_handle(recorder.trace) == {h.handle_id: 1 for h in handles}
    assert all(h.release_reason == "dw_complete" for h in handles)


# 5. Dropout and autocast -----------------------------------------------------------------------------

@pytest.mark.parametrize("split", [False, True], ids=["ordinary", "split"])
def test_dropout_with_preserved_rng_state(split: bool) -> None:
    model = Stack.mlp([4, 8, 8, 3], dropout=0.5, checkpointed=[True, False, True], explicit=[False, False, True])
    x, g = leaf((BATCH, 4), seed=1), leaf((BATCH, 3), seed=2, requires_grad=False)
    want_x, want_p = _reference(model, x, g, seed=123)

    if split:
        got_x = _split_helpers(model, x, g, seed=123)
    else:
        torch.manual_seed(123)
        model(x, mode="reentrant").backward(g)
        got_x = grads([x])

    assert_grads_equal(got_x, want_x, ["dx"])
    assert_grads_equal(grads(model.parameters()), want_p, [n for n, _ in model.named_parameters()])


@pytest.mark.parametrize("mode", MODES)
def test_dropout_without_preserved_rng_state_differs(mode: str) -> None:
    """Control, for both kinds: the dropout equalities depend on the replay restoring the RNG state."""
    model = Stack.mlp([4, 8, 3], dropout=0.5)
    block = model.blocks[0]
    x, g = leaf((BATCH, 4), seed=1), leaf((BATCH, 8), seed=2, requires_grad=False)
    torch.manual_seed(123)
    block(x.detach().requires_grad_()).backward(g)
    want = grads(block.parameters())
    reset_grads(block.parameters())

    torch.manual_seed(123)
    checkpoint(block, x, use_reentrant=mode == "reentrant", preserve_rng_state=False).backward(g)

    assert not torch.equal(block.weight.grad, want[0])


@pytest.mark.parametrize("split", [False, True], ids=["ordinary", "split"])
def test_cpu_autocast_bfloat16(split: bool) -> None:
    model = Stack.mlp([4, 6, 5, 3], activation="gelu", checkpointed=[True, False, True], explicit=[True, False, False])
    params = list(model.parameters())
    x = leaf((BATCH, 4), seed=1)
    g = leaf((BATCH, 3), seed=2, requires_grad=False).to(torch.bfloat16)
    ref_x = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref = model(ref_x)
    assert y_ref.dtype == torch.bfloat16
    y_ref.backward(g)
    want_x, want_p = grads([ref_x]), grads(params)
    reset_grads(params)

    if split:
        with reentrant_checkpoint_scope(params) as handles, torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x, mode="reentrant")
        got_x = list(backward_input(y, g, [x], handles=handles))
        assert all(p.grad is None for p in params)
        backward_weight(y, g, params, handles=handles)
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x, mode="reentrant")
        y.backward(g)
        got_x = grads([x])

    assert torch.equal(y.detach(), y_ref.detach())
    assert_grads_equal(got_x, want_x, ["dx"])
    assert_grads_equal(grads(params), want_p, [n for n, _ in model.named_parameters()])


# 6. Structured inputs and outputs -------------------------------------------------------------------

def _structured(inputs: dict, *, scale: float, tag: str, weight: torch.Tensor) -> dict:
    a, (b, offset) = inputs["a"], inputs["pair"]
    h = torch.tanh(a @ weight + offset) * scale
    return {"h": h, "idx": h.argmax(dim=-1), "tag": tag, "aux": [b * h.sum(dim=-1, keepdim=True), 7]}


@pytest.mark.parametrize("split", [False, True], ids=["ordinary", "split"])
def test_dicts_kwargs_non_tensor_leaves_and_integer_outputs(split: bool) -> None:
    weight, bias_free = leaf((4, 3), seed=20), leaf((BATCH, 1), seed=21)
    a = leaf((BATCH, 4), seed=22)
    gh, gaux = leaf((BATCH, 3), seed=23, requires_grad=False), leaf((BATCH, 1), seed=24, requires_grad=False)
    everything = [a, bias_free, weight]

    def run(mode: str) -> dict:
        inputs = {"a": a, "pair": (bias_free, 0.25)}
        if mode == "none":
            return _structured(inputs, scale=2.0, tag="t", weight=weight)
        return checkpoint(_structured, inputs, use_reentrant=True, scale=2.0, tag="t", weight=weight)

    ref = run("none")
    torch.autograd.backward([ref["h"], ref["aux"][0]], [gh, gaux])
    want = grads(everything)
    reset_grads(everything)

    if split:
        with reentrant_checkpoint_scope([weight]) as handles:
            out = run("reentrant")
        da, db = backward_input([out["h"], out["aux"][0]], [gh, gaux], [a, bias_free], handles=handles)
        assert weight.grad is None
        backward_weight([out["h"], out["aux"][0]], [gh, gaux], [weight], handles=handles)
        got = [da, db, weight.grad]
    else:
        out = run("reentrant")
        torch.autograd.backward([out["h"], out["aux"][0]], [gh, gaux])
        got = grads(everything)

    assert set(out) == {"h", "idx", "tag", "aux"}
    assert out["tag"] == "t" and out["aux"][1] == 7
    assert out["idx"].dtype == torch.int64 and not out["idx"].requires_grad
    assert torch.equal(out["idx"], ref["idx"]) and torch.equal(out["h"].detach(), ref["h"].detach())
    assert_grads_equal(got, want, ["a", "bias_free", "weight"])


# 7. Pipeline-like: two stages, each split -------------------------------------------------------------

def test_two_stage_pipeline(recorder: ckpt_viz.Recording) -> None:
    stage0 = Stack.mlp([4, 6, 5], activation="tanh", explicit=[False, True], seed=1)
    stage1 = Stack.mlp([5, 6, 3], activation="gelu", checkpointed=[True, True], explicit=[True, False], seed=2)
    p0, p1 = list(stage0.parameters()), list(stage1.parameters())
    x, g = leaf((BATCH, 4), seed=1), leaf((BATCH, 3), seed=2, requires_grad=False)

    ref_x = x.detach().clone().requires_grad_()
    mid = stage0(ref_x)
    mid.retain_grad()
    stage1(mid).backward(g)
    want_x, want_mid, want_p0, want_p1 = grads([ref_x]), grads([mid]), grads(p0), grads(p1)
    reset_grads(p0 + p1)

    with reentrant_checkpoint_scope(p0) as h0:
        y0 = stage0(x, mode="reentrant")
    x1 = y0.detach().requires_grad_()          # "send" to the next stage
    with reentrant_checkpoint_scope(p1) as h1:
        y1 = stage1(x1, mode="reentrant")

    (dx1,) = backward_input(y1, g, [x1], handles=h1)       # stage1 DX -> grad for stage0's output
    assert_grads_equal([dx1], want_mid, ["stage0 output"])
    (dx0,) = backward_input(y0, dx1, [x], handles=h0)      # stage0 DX
    assert_grads_equal([dx0], want_x, ["x"])
    assert all(p.grad is None for p in p0 + p1)

    backward_weight(y1, g, p1, handles=h1)
    assert all(p.grad is None for p in p0)
    backward_weight(y0, dx1, p0, handles=h0)

    assert_grads_equal(grads(p0), want_p0, ["stage0." + n for n, _ in stage0.named_parameters()])
    assert_grads_equal(grads(p1), want_p1, ["stage1." + n for n, _ in stage1.named_parameters()])
    assert replays_per_handle(recorder.trace) == {h.handle_id: 1 for h in h0 + h1}


# 8. Exactly one replay per handle per micro-batch --------------------------------------------------------

def test_split_helpers_replay_each_handle_once(recorder: ckpt_viz.Recording) -> None:
    model = Stack.mlp([4, 5, 5, 5, 3], explicit=[False, True, False, True])
    x, g = leaf((BATCH, 4), seed=1), leaf((BATCH, 3), seed=2, requires_grad=False)
    with reentrant_checkpoint_scope(list(model.parameters())) as handles:
        y = model(x, mode="reentrant")
    backward_input(y, g, [x], handles=handles)
    dx_counts = replays_per_handle(recorder.trace)
    backward_weight(y, g, list(model.parameters()), handles=handles)

    ids = [h.handle_id for h in handles]
    assert len(set(ids)) == 4
    assert dx_counts == {i: 1 for i in ids}, "DX replays every handle once"
    assert replays_per_handle(recorder.trace) == {i: 1 for i in ids}, "DW reuses the DX replay"


def test_three_microbatches_replay_once_each_and_accumulate(recorder: ckpt_viz.Recording) -> None:
    model = Stack.mlp([4, 6, 5, 3], dropout=0.3, explicit=[True, False, False], checkpointed=[True, True, False])
    params = list(model.parameters())
    batches = [(leaf((BATCH, 4), seed=10 + mb), leaf((BATCH, 3), seed=20 + mb, requires_grad=False))
               for mb in range(3)]

    want_x = []
    for mb, (x, g) in enumerate(batches):
        ref_x = x.detach().clone().requires_grad_()
        torch.manual_seed(mb)
        model(ref_x).backward(g)
        want_x.append(ref_x.grad)
    want_p = grads(params)
    reset_grads(params)

    all_handles = []
    for mb, (x, g) in enumerate(batches):
        torch.manual_seed(mb)
        with ckpt_viz.tag(microbatch=mb), reentrant_checkpoint_scope(params) as handles:
            y = model(x, mode="reentrant")
            (dx,) = backward_input(y, g, [x], handles=handles)
            if mb == 0:
                assert all(p.grad is None for p in params)
            backward_weight(y, g, params, handles=handles)
        assert_grads_equal([dx], [want_x[mb]], [f"dx[{mb}]"])
        all_handles += handles

    assert_grads_equal(grads(params), want_p, [n for n, _ in model.named_parameters()])
    assert len({h.handle_id for h in all_handles}) == 6
    assert replays_per_handle(recorder.trace) == {h.handle_id: 1 for h in all_handles}
    for mb in range(3):
        started = [e for e in recorder.trace.of_kind("replay_started") if e.tags.get("microbatch") == mb]
        assert len(started) == 2
