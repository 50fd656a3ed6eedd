"""Property: for random small models, checkpointed gradients equal the reference bit for bit.

Hypothesis draws a chain of 1..4 blocks (widths 1..6; tanh/relu/gelu/sigmoid;
dropout p in {0, 0.3}), which blocks are checkpointed (at least one), whether
each checkpointed block's parameters are captured by closure or passed as
checkpoint arguments, a batch of 1..3, and for split mode whether the stage input
requires grad and whether a recompute session id is passed to the helpers.

For every checkpoint kind in `models.MODES` (add a kind there, not here):
1. ordinary backward: activation and parameter grads are `torch.equal` to the
   same model run without checkpointing;
2. split backward (`backward_input` then `backward_weight`): DX grads equal the
   reference and leave parameter `.grad` None; DW grads equal the reference;
   every handle replays exactly once.

CKPT_VIZ_PROPERTY_EXAMPLES sets the examples per test (default 200).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckpt_viz
from ckpt_viz.runtime import backward_input, backward_weight
from models import (
    ACTIVATIONS,
    MODES,
    BlockSpec,
    Stack,
    assert_grads_equal,
    grads,
    leaf,
    replays_per_handle,
    reset_grads,
    split_scope,
)

EXAMPLES = int(os.environ.get("CKPT_VIZ_PROPERTY_EXAMPLES", "200"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Case:
    specs: tuple[BlockSpec, ...]
    batch: int
    seed: int
    input_requires_grad: bool = True
    use_session: bool = False

    def build(self) -> tuple[Stack, torch.Tensor, torch.Tensor]:
        """The model, the stage input and the gradient arriving at the stage output."""
        model = Stack(self.specs, seed=self.seed)
        x = leaf((self.batch, self.specs[0].width_in), seed=self.seed + 1, requires_grad=self.input_requires_grad)
        g = leaf((self.batch, self.specs[-1].width_out), seed=self.seed + 2, requires_grad=False)
        return model, x, g


@st.composite
def cases(draw: st.DrawFn, *, split: bool) -> Case:
    depth = draw(st.integers(1, 4))
    widths = draw(st.lists(st.integers(1, 6), min_size=depth + 1, max_size=depth + 1))
    forced = draw(st.integers(0, depth - 1))  # at least one block is checkpointed
    specs = tuple(
        BlockSpec(
            widths[i], widths[i + 1],
            activation=draw(st.sampled_from(sorted(ACTIVATIONS))),
            dropout=draw(st.sampled_from([0.0, 0.3])),
            checkpointed=i == forced or draw(st.booleans()),
            explicit=draw(st.booleans()),
            excluded=draw(st.booleans()),
        )
        for i in range(depth)
    )
    return Case(specs=specs, batch=draw(st.integers(1, 3)), seed=draw(st.integers(0, 2**16)),
                input_requires_grad=draw(st.booleans()) if split else True,
                use_session=draw(st.booleans()) if split else False)


def _reference(model: Stack, x: torch.Tensor, g: torch.Tensor, seed: int) -> tuple[list, list]:
    params = list(model.parameters())
    ref_x = x.detach().clone().requires_grad_(x.requires_grad)
    torch.manual_seed(seed)
    model(ref_x, mode="none").backward(g)
    expected = grads([ref_x]), grads(params)
    reset_grads(params)
    return expected


@PROPERTY
@given(case=cases(split=False), mode=st.sampled_from(MODES))
def test_ordinary_backward_matches_reference(case: Case, mode: str) -> None:
    model, x, g = case.build()
    want_x, want_p = _reference(model, x, g, case.seed)

    torch.manual_seed(case.seed)
    model(x, mode=mode).backward(g)

    assert_grads_equal(grads([x]), want_x, ["x"])
    assert_grads_equal(grads(model.parameters()), want_p, [n for n, _ in model.named_parameters()])


@PROPERTY
@given(case=cases(split=True), mode=st.sampled_from(MODES))
def test_split_backward_matches_reference(case: Case, mode: str) -> None:
    model, x, g = case.build()
    params = list(model.parameters())
    want_x, want_p = _reference(model, x, g, case.seed)
    # A non-reentrant frame needs a session to serve DX and DW from one recompute (spec D6).
    session_id = ("property", case.seed) if case.use_session or mode != "reentrant" else None

    with ckpt_viz.record() as rec:
        torch.manual_seed(case.seed)
        with split_scope(mode, params) as handles:
            y = model(x, mode=mode)
        assert len(handles) == model.n_checkpointed
        dx = backward_input(y, g, [x], handles=handles, session_id=session_id)
        assert all(p.grad is None for p in params), "DX must not touch parameter .grad"
        assert_grads_equal(list(dx), want_x, ["dx"])
        backward_weight(y, g, params, handles=handles, session_id=session_id)

    assert_grads_equal(grads(params), want_p, [n for n, _ in model.named_parameters()])
    assert x.grad is None
    assert replays_per_handle(rec.trace) == {h.handle_id: 1 for h in handles}
