"""Excluded regions (spec 1.4, 1.6, D4; NOTE [ Excluded regions ]).

A region wrapped by `checkpoint_exclude_wrapper` runs exactly once per forward and
never in a checkpoint replay, in both checkpoint kinds, under ordinary backward,
split DX/DW and prefire. Gradients equal the same model run with no checkpoint
and no exclusion (bit-exact): the region holds parameters (LayerNorm, Linear) and
consumes randomness, and a dropout after it inside the checkpoint must see the
same RNG stream in the replay. Outside checkpoints the wrapper is transparent.

`save_output=False` (a region feeding straight into another excluded region)
must not keep its output: checked by the `exclude_saved` event and by a weak
reference to the output's storage.
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ckpt_viz
from ckpt_viz.errors import ExcludedRegionError
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    checkpoint_exclude_wrapper,
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
    reentrant_checkpoint_scope,
)
from models import assert_grads_equal, grads, leaf, replays_per_handle, reset_grads

BATCH = 3
MODES = ("nonreentrant", "reentrant")


class Region(nn.Module):
    """LayerNorm -> dropout -> Linear; counts its calls."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, width)
        generator = torch.Generator().manual_seed(30)
        with torch.no_grad():
            for p in self.parameters():  # non-trivial affine parameters for the LayerNorm too
                p.copy_(torch.randn(p.shape, generator=generator))
        self.calls = 0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.proj(F.dropout(self.norm(h), p=0.3, training=True))


class Model:
    """tanh(x @ w_in) -> region (maybe excluded) -> dropout -> sin -> @ w_out."""

    def __init__(self, *, twice: bool = False) -> None:
        self.w_in, self.w_out = leaf((4, 6), seed=1), leaf((6, 3), seed=2)
        self.region = Region()
        self.excluded = checkpoint_exclude_wrapper(self.region)
        self.twice = twice  # call the region twice per forward (FIFO cache)

    def params(self) -> list[torch.Tensor]:
        return [self.w_in, self.w_out, *self.region.parameters()]

    def body(self, x: torch.Tensor, exclude: bool) -> torch.Tensor:
        region = self.excluded if exclude else self.region
        h = region(torch.tanh(x @ self.w_in))
        if self.twice:
            h = region(torch.sin(h))
        h = F.dropout(h, p=0.5, training=True)  # a random op AFTER the region, inside the checkpoint
        return torch.sin(h) @ self.w_out

    def run(self, x: torch.Tensor, mode: str) -> torch.Tensor:
        if mode == "none":
            return self.body(x, exclude=False)
        return checkpoint(self.body, x, True, use_reentrant=mode == "reentrant")


def _names(model: Model) -> list[str]:
    return ["w_in", "w_out", *(n for n, _ in model.region.named_parameters())]


def _reference(model: Model, x: torch.Tensor, g: torch.Tensor) -> tuple[list, list]:
    """(x grad, parameter grads) with no checkpoint and no exclusion; resets grads and the call count."""
    ref_x = x.detach().clone().requires_grad_()
    torch.manual_seed(11)
    model.run(ref_x, "none").backward(g)
    expected = grads([ref_x]), grads(model.params())
    reset_grads(model.params())
    model.region.calls = 0
    return expected


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return leaf((BATCH, 4), seed=3), leaf((BATCH, 3), seed=4, requires_grad=False)


# 1. Ordinary backward -------------------------------------------------------------------------------

@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
@pytest.mark.parametrize("mode", MODES)
def test_ordinary_backward_runs_region_once(mode: str, twice: bool, recorder: ckpt_viz.Recording) -> None:
    model = Model(twice=twice)
    x, g = _inputs()
    want_x, want_p = _reference(model, x, g)
    per_forward = 2 if twice else 1

    torch.manual_seed(11)
    y = model.run(x, mode)
    assert model.region.calls == per_forward
    y.backward(g)

    assert model.region.calls == per_forward, "the replay must not run the excluded region"
    assert recorder.trace.count("replay_started") == 1
    assert recorder.trace.count("exclude_saved") == per_forward
    assert recorder.trace.count("exclude_reused") == per_forward
    assert [e.call_index for e in recorder.trace.of_kind("exclude_reused")] == list(range(per_forward))
    assert_grads_equal(grads([x]), want_x, ["x"])
    assert_grads_equal(grads(model.params()), want_p, _names(model))


@pytest.mark.parametrize("mode", MODES)
def test_region_consuming_randomness_needs_the_rng_restore(mode: str) -> None:
    """Control for the test above: the region's dropout really moves the RNG stream.

    Without the region's randomness, the dropout after it would draw a different mask.
    """
    model = Model()
    x, _g = _inputs()
    torch.manual_seed(11)
    with_region = model.body(x, exclude=False)
    torch.manual_seed(11)
    h = torch.tanh(x @ model.w_in)
    skipped = torch.sin(F.dropout(model.region.proj(model.region.norm(h)), p=0.5, training=True)) @ model.w_out
    assert not torch.equal(with_region, skipped)


# 2. Split DX/DW --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_split_helpers_run_region_once(mode: str, recorder: ckpt_viz.Recording) -> None:
    model = Model()
    params = model.params()
    x, g = _inputs()
    want_x, want_p = _reference(model, x, g)

    torch.manual_seed(11)
    if mode == "reentrant":
        with reentrant_checkpoint_scope(params) as handles:
            y = model.run(x, mode)
        session_id = None
    else:
        with recompute_handle_collector_ctx() as handles:
            y = model.run(x, mode)
        session_id = "mb0"
    assert len(handles) == 1

    (dx,) = backward_input(y, g, [x], handles=handles, session_id=session_id)
    assert all(p.grad is None for p in params), "DX must not touch parameter .grad (the region's included)"
    assert_grads_equal([dx], want_x, ["dx"])
    backward_weight(y, g, params, handles=handles, session_id=session_id)

    assert model.region.calls == 1
    assert replays_per_handle(recorder.trace) == {handles[0].handle_id: 1}
    assert recorder.trace.count("exclude_reused") == 1
    assert_grads_equal(grads(params), want_p, _names(model))
    assert x.grad is None


# 3. Prefire ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_prefire_then_backward_in_session_runs_region_once(mode: str, recorder: ckpt_viz.Recording) -> None:
    model = Model()
    x, g = _inputs()
    want_x, want_p = _reference(model, x, g)

    torch.manual_seed(11)
    with recompute_handle_collector_ctx() as handles:
        y = model.run(x, mode)
    (handle,) = handles
    recompute_handle(handle, "pf")
    assert model.region.calls == 1
    assert recorder.trace.count("exclude_reused") == 1, "the prefire replay reused the cached output"

    with recompute_session_ctx("pf"):
        y.backward(g)
    clear_recompute_session("pf")

    assert model.region.calls == 1
    assert replays_per_handle(recorder.trace) == {handle.handle_id: 1}
    assert_grads_equal(grads([x]), want_x, ["x"])
    assert_grads_equal(grads(model.params()), want_p, _names(model))


# 4. Transparent outside checkpoints --------------------------------------------------------------------

def test_transparent_outside_checkpoints(recorder: ckpt_viz.Recording) -> None:
    region = Region()
    wrapped = checkpoint_exclude_wrapper(region)
    h = leaf((BATCH, 6), seed=5)
    g = leaf((BATCH, 6), seed=6, requires_grad=False)
    params = list(region.parameters())

    torch.manual_seed(1)
    want_out = region(h)
    want_out.backward(g)
    want = grads([h, *params])
    reset_grads([h, *params])

    torch.manual_seed(1)
    out = wrapped(h)
    out.backward(g)

    assert region.calls == 2
    assert torch.equal(out.detach(), want_out.detach())
    assert_grads_equal(grads([h, *params]), want, ["h", "norm.weight", "norm.bias", "proj.weight", "proj.bias"])
    assert list(wrapped.parameters()) == params, "the wrapper exposes the module's parameters"
    # nothing of a checkpoint or an excluded region: only the user's two backward calls
    assert [e.kind for e in recorder.trace.events] == ["backward_called", "backward_called"]


def test_wraps_plain_functions() -> None:
    wrapped = checkpoint_exclude_wrapper(torch.tanh)
    h = leaf((2, 3), seed=7)
    assert torch.equal(wrapped(h), torch.tanh(h))


# 5. save_output=False chains -----------------------------------------------------------------------------

class Chain:
    """tanh(x @ w) -> A (save_output as given) -> B (t * 3 + 1, cached) -> sin.

    B's backward does not need its input, so nothing but A's cache entry could keep A's
    output alive. `a_saves_input` makes A save its input, which adds a replay boundary.
    """

    def __init__(self, save_output: bool, a_saves_input: bool = False) -> None:
        self.w = leaf((4, 4), seed=8)
        self.a_saves_input = a_saves_input
        self.A = checkpoint_exclude_wrapper(self._a, save_output=save_output)
        self.B = checkpoint_exclude_wrapper(lambda t: t * 3.0 + 1)
        self.storage_refs: list[weakref.ref] = []

    def _a(self, t: torch.Tensor) -> torch.Tensor:
        out = torch.sin(t) if self.a_saves_input else t * 2.0 - 0.5
        self.storage_refs.append(weakref.ref(out.untyped_storage()))
        return out

    def body(self, x: torch.Tensor, exclude: bool) -> torch.Tensor:
        h = torch.tanh(x @ self.w)
        h = self.B(self.A(h)) if exclude else self._a(h) * 3.0 + 1
        return torch.sin(h)


@pytest.mark.parametrize("a_saves_input", [False, True], ids=["plain", "boundary"])
@pytest.mark.parametrize("save_output", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_chain_gradients(mode: str, save_output: bool, a_saves_input: bool) -> None:
    chain = Chain(save_output, a_saves_input)
    x = leaf((BATCH, 4), seed=9)
    chain.body(x, exclude=False).sum().backward()
    want = grads([x, chain.w])
    reset_grads([x, chain.w])

    checkpoint(chain.body, x, True, use_reentrant=mode == "reentrant").sum().backward()

    assert_grads_equal(grads([x, chain.w]), want, ["x", "w"])
    assert len(chain.storage_refs) == 2, "A ran once in the reference and once in the checkpointed forward"


@pytest.mark.parametrize("mode", MODES)
def test_chain_exclude_saved_reports_no_cached_bytes(mode: str) -> None:
    cached = {}
    for save_output in (False, True):
        chain = Chain(save_output)
        x = leaf((BATCH, 4), seed=9)
        with ckpt_viz.record() as rec:
            checkpoint(chain.body, x, True, use_reentrant=mode == "reentrant")
        a_event, b_event = rec.trace.of_kind("exclude_saved")
        assert (a_event.save_output, b_event.save_output) == (save_output, True)
        assert b_event.cached_nbytes == BATCH * 4 * 4
        cached[save_output] = a_event.cached_nbytes
    assert cached == {False: 0, True: BATCH * 4 * 4}


def _chain_output_alive(mode: str, save_output: bool, a_saves_input: bool) -> bool:
    chain = Chain(save_output, a_saves_input)
    x = leaf((BATCH, 4), seed=9)
    y = checkpoint(chain.body, x, True, use_reentrant=mode == "reentrant")
    gc.collect()
    (ref,) = chain.storage_refs
    alive = ref() is not None
    y.sum().backward()  # the graph is still usable either way
    assert x.grad is not None and chain.w.grad is not None
    return alive


@pytest.mark.parametrize("a_saves_input", [False, True], ids=["plain", "boundary"])
def test_chain_elided_output_is_freed_nonreentrant(a_saves_input: bool) -> None:
    assert _chain_output_alive("nonreentrant", save_output=True, a_saves_input=a_saves_input) is True
    assert _chain_output_alive("nonreentrant", save_output=False, a_saves_input=a_saves_input) is False


def test_chain_cached_output_is_kept_reentrant() -> None:
    assert _chain_output_alive("reentrant", save_output=True, a_saves_input=False) is True


@pytest.mark.parametrize("a_saves_input", [False, True], ids=["plain", "boundary"])
def test_chain_elided_output_is_freed_reentrant(a_saves_input: bool) -> None:
    assert _chain_output_alive("reentrant", save_output=False, a_saves_input=a_saves_input) is False


# ------------------------------------------------------------------ errors: ExcludedRegionError with a code

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("change, code, phrase", [
    ("extra_call", "exclude_cache_empty", r"(No cached forward output|unmatched checkpoint exclusion wrapper call)"),
    ("non_tensor", "exclude_input_changed", r"(did not reproduce a tensor input|Tensor input count changed)"),
], ids=["extra-call", "non-tensor-input"])
def test_replay_that_differs_from_the_forward_raises_a_coded_error(mode: str, change: str, code: str,
                                                                    phrase: str) -> None:
    """The replay calls the region once more, or with a non-tensor input: an ExcludedRegionError with its code."""
    w, x = leaf((4, 4), seed=1), leaf((BATCH, 4), seed=2)
    excluded = checkpoint_exclude_wrapper(torch.sin)  # sin saves its input: the replay must provide it
    replaying = [False]

    def body(a: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(a @ w)
        if replaying[0] and change == "non_tensor":
            return torch.cos(excluded(1.0))
        out = excluded(h)
        if replaying[0] and change == "extra_call":
            out = excluded(out)
        return torch.cos(out)

    with ckpt_viz.record() as rec:
        y = checkpoint(body, x, use_reentrant=mode == "reentrant")
        replaying[0] = True
        with pytest.raises(ExcludedRegionError, match=phrase) as info:
            y.sum().backward()
    exc = info.value
    assert isinstance(exc, RuntimeError) and exc.code == code
    message = str(exc)
    assert message.startswith("ckpt_viz.checkpoint_exclude_wrapper: ")
    assert message.splitlines()[-1].startswith("Tip: ")
    assert [e.code for e in rec.trace.of_kind("error")] == [code]
