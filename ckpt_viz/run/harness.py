"""What every mode's run shares: checkpoint a model's named submodules, mark memory, number handles from h0.

Used by the single-pass modes (`ckpt_viz.run.scenarios`) and the pipeline executor
(`ckpt_viz.run.pipeline`); imports neither. Imports torch and the runtime; never the UI.

NOTE [ Run-local session ids ]
  A split-nonreentrant run replays each checkpoint once for DX and DW by opening a
  recompute session. Session ids are process-wide keys (the session registry), so
  two runs at once (two app sessions run on two threads) that both used ("step", 0)
  joined one session and raised "Concurrent recompute sessions on the same checkpoint
  frame". Each run therefore makes its own `RunSession`: equal only to itself (hash
  and equality by identity), and shown in the trace by its local name ("step"), so
  the same run records the same trace every time, alone or beside others.
"""
from __future__ import annotations

import gc

import torch

from ckpt_viz import bus
from ckpt_viz.events import MemorySampled
from ckpt_viz.run.blocks import checkpointed  # how named blocks are checkpointed, and their labels
from ckpt_viz.runtime.reentrant_handle import restart_handle_ids

__all__ = ["RunSession", "checkpointed", "fresh_handle_ids", "grad_digest", "inputs_requiring_grad", "milestone"]


class RunSession:
    """A recompute session id unique to one run; see NOTE [ Run-local session ids ]."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:  # what the trace stores (the bus keeps repr() of a non-scalar id)
        return self.name


def fresh_handle_ids() -> None:
    """Number this run's handles from h0: if handles of an earlier run linger in reference cycles, collect them."""
    if not restart_handle_ids():
        gc.collect()  # costs ~0.1 s with torch loaded, so only when something is still alive
        restart_handle_ids()


def grad_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's name and `.grad` bytes: equal digests mean bit-equal gradients.

    Stored in the trace's meta (`grad_sha256`), so a saved trace (from the CLI, or a sandboxed
    child) can be checked against a reference run without the tensors.
    """
    import hashlib

    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        digest.update(name.encode())
        if p.grad is None:
            digest.update(b"-")
        else:
            digest.update(p.grad.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def milestone(enabled: bool, label: str) -> None:
    """A named memory sampling point (the loss, after DX, the end), when memory is recorded."""
    if enabled:
        bus.emit(MemorySampled, capture_site=False, at=label)


def inputs_requiring_grad(inputs: tuple) -> tuple:
    """Float tensor inputs become leaves that require grad, so DX has activations to target."""
    return tuple(t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                 for t in inputs)
