"""Small reentrant setups shared by the failure-scenario tests (R1..R15) and the diagnosis tests."""
from __future__ import annotations

import torch

from ckpt_viz.runtime import checkpoint, recompute_handle_collector_ctx, reentrant_checkpoint_scope

E6 = "Cannot set phase on a released reentrant checkpoint"
E7 = "Cannot replay a released reentrant checkpoint"


def leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


def region(w: torch.Tensor):
    """A checkpointed function whose only parameter `w` is captured by closure."""
    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ w)
    return run


def ordinary(x: torch.Tensor, w: torch.Tensor):
    """An unscoped reentrant checkpoint; returns (handle, loss). The loss keeps the graph alive."""
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(region(w), x, use_reentrant=True)
    # out * out saves `out`, so the outer graph holds saved tensors besides the checkpoint node.
    return handles[0], (out * out).sum()


def split(x: torch.Tensor, w: torch.Tensor):
    """A split (scoped) reentrant checkpoint with a closure-only parameter; returns (handle, loss)."""
    with reentrant_checkpoint_scope([w]) as handles:
        out = checkpoint(region(w), x, use_reentrant=True)
    assert len(handles) == 1
    return handles[0], (out * out).sum()
