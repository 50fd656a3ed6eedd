"""While torch.compile traces, the non-reentrant checkpoint is PyTorch's own (spec 1.2 step 5)."""
from __future__ import annotations

import pytest
import torch

import ckpt_viz
from ckpt_viz.runtime import checkpoint


def _model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4)), torch.randn(3, 4)


def test_nonreentrant_checkpoint_delegates_to_torch_when_compiling() -> None:
    model, x0 = _model()
    x = x0.clone().requires_grad_()
    model(x).sum().backward()
    want = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    compiled = torch.compile(lambda t: checkpoint(model, t, use_reentrant=False).sum(), backend="eager")
    x = x0.clone().requires_grad_()
    with ckpt_viz.record() as rec:
        compiled(x).backward()
    got = [x.grad] + [p.grad for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # our runtime stepped aside: torch's checkpoint ran, and the recording saw it as torch's handle
    # (NOTE [ Observing torch's checkpoint ] in ckpt_viz/runtime/torch_observer.py)
    created = rec.trace.of_kind("handle_created")
    assert [(e.mode, e.runtime) for e in created] == [("nonreentrant", "torch")]


def test_reentrant_checkpoint_is_refused_when_compiling() -> None:
    model, x0 = _model()
    compiled = torch.compile(lambda t: checkpoint(model, t, use_reentrant=True), backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="compile mode does not support: use_reentrant=True"):
        compiled(x0.clone().requires_grad_())
