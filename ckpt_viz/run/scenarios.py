"""Scenarios: run one model in one checkpoint mode and return its trace.

Owns the modes (`none`, `nonreentrant`, `reentrant`, `split-reentrant`,
`split-nonreentrant`, `pipeline`): the single-pass ones are run here, `pipeline` by
the executor in `ckpt_viz.run.pipeline`, and `run_scenario` dispatches through one
table (`_RUNNERS`). Imports run one way: scenarios -> pipeline -> harness, schedules.
Imports torch; never the UI.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ckpt_viz.errors import CkptVizError
from ckpt_viz.recording import record
from ckpt_viz.run.harness import (
    RunSession,
    checkpointed,
    fresh_handle_ids,
    grad_digest,
    inputs_requiring_grad,
    milestone,
)
from ckpt_viz.run.pipeline import run_pipeline
from ckpt_viz.run.rng import rng_guard
from ckpt_viz.run.zoo import ModelSpec
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    recompute_handle_collector_ctx,
    reentrant_checkpoint_scope,
)
from ckpt_viz.trace import Trace, run_meta
from ckpt_viz.vocabulary import RUN_MODES

__all__ = ["MODES", "checkpointed", "fresh_handle_ids", "run_scenario"]

MODES: tuple[str, ...] = RUN_MODES  # the one table: ckpt_viz.vocabulary (RunMode is its type)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise CkptVizError(f"ckpt_viz.run_scenario: unknown mode {mode!r}; expected one of "
                           f"{', '.join(repr(m) for m in MODES)}.\nTip: 'split-reentrant' shows DX/DW routing.")


def _run_single(spec: ModelSpec, mode: str, *, seed: int, memory: bool, graphs: bool, **_: Any) -> Trace:
    """One forward, loss and backward of the whole model (every mode but "pipeline")."""
    model = spec.model
    inputs = inputs_requiring_grad(spec.inputs)
    kwargs = dict(zip(spec.kwargs, inputs_requiring_grad(tuple(spec.kwargs.values()))))
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    torch.manual_seed(seed)
    fresh_handle_ids()
    with record(memory=memory, graphs=graphs, model=model, tensors=(inputs, kwargs, spec.targets)) as rec:
        if mode in ("none", "reentrant", "nonreentrant"):
            kind = None if mode == "none" else mode == "reentrant"
            with checkpointed(model, spec.checkpoint, use_reentrant=kind, markers=memory):
                loss = spec.loss_of(model(*inputs, **kwargs), spec.targets)
            milestone(memory, "loss")
            loss.backward()
        else:
            reentrant = mode == "split-reentrant"
            collect = reentrant_checkpoint_scope(lambda: params) if reentrant else recompute_handle_collector_ctx()
            with checkpointed(model, spec.checkpoint, use_reentrant=reentrant, markers=memory), collect as handles:
                loss = spec.loss_of(model(*inputs, **kwargs), spec.targets)
            milestone(memory, "loss")
            acts = [t for t in tree_flatten((inputs, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            session = None if reentrant else RunSession("step")  # See NOTE [ Run-local session ids ] in harness.py.
            backward_input(loss, None, acts, handles=handles, session_id=session)
            milestone(memory, "after DX")
            backward_weight(loss, None, params, handles=handles, session_id=session)
            del handles
        del loss
        milestone(memory, "end")
    rec.trace.meta.update(run_meta(model=spec.name, mode=mode, source=spec.source, description=spec.description,
                                   look_at=spec.look_at, checkpoint=list(spec.checkpoint), seed=seed,
                                   grad_sha256=grad_digest(model)))
    return rec.trace


def _run_pipeline(spec: ModelSpec, mode: str, *, seed: int, memory: bool, graphs: bool, microbatches: int,
                  schedule: str) -> Trace:
    return run_pipeline(spec, schedule=schedule, microbatches=microbatches, seed=seed, memory=memory, graphs=graphs)


_RUNNERS: dict[str, Callable[..., Trace]] = {mode: _run_single for mode in MODES if mode != "pipeline"}
_RUNNERS["pipeline"] = _run_pipeline


def run_scenario(spec: ModelSpec, mode: str, *, seed: int = 0, microbatches: int = 4,
                 schedule: str = "1F1B", memory: bool = False, graphs: bool = False) -> Trace:
    """Run `spec` once (forward, loss, backward) in `mode` and return the recorded trace.

    Args:
        spec: the model to run (see `ckpt_viz.run.zoo` and `ckpt_viz.usermodel.load`).
        mode: one of `MODES`.
        seed: the RNG seed for the run (dropout).
        microbatches, schedule: for `mode="pipeline"`.
        memory: sample memory by category after every event.
        graphs: snapshot the autograd graph before every backward pass.
    """
    _check_mode(mode)
    with rng_guard(spec.model):  # See NOTE [ One generator per process ] in rng.py.
        return _RUNNERS[mode](spec, mode, seed=seed, memory=memory, graphs=graphs, microbatches=microbatches,
                              schedule=schedule)
