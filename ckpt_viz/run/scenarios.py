"""Scenarios: run one model in one checkpoint mode and return its trace.

Owns the modes (`none`, `nonreentrant`, `reentrant`, `split-reentrant`,
`split-nonreentrant`, `pipeline`) and how a model's submodules are checkpointed for
a run. Imports torch; never the UI.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import platform
from typing import Any, Callable, Iterator, Literal

import torch
from torch.utils._pytree import tree_flatten

from ckpt_viz import __name__ as _pkg
from ckpt_viz import bus
from ckpt_viz.errors import CkptVizError
from ckpt_viz.recording import record
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    recompute_handle_collector_ctx,
    reentrant_checkpoint_scope,
)
from ckpt_viz.trace import Trace
from ckpt_viz.run.zoo import ModelSpec

__all__ = ["MODES", "RunMode", "checkpointed", "fresh_handle_ids", "run_scenario"]

RunMode = Literal["none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant", "pipeline"]
MODES: tuple[str, ...] = ("none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant", "pipeline")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise CkptVizError(f"ckpt_viz.run_scenario: unknown mode {mode!r}; expected one of "
                           f"{', '.join(repr(m) for m in MODES)}.\nTip: 'split-reentrant' shows DX/DW routing.")


@contextlib.contextmanager
def checkpointed(model: torch.nn.Module, names: tuple[str, ...], *, use_reentrant: bool | None,
                 markers: bool = False) -> Iterator[None]:
    """Checkpoint the named submodules of `model` while the block runs (their forward is wrapped).

    Args:
        use_reentrant: True or False picks the checkpoint kind; None runs them unchanged
            (the "none" mode), which is still useful with `markers`.
        markers: emit a `memory_sampled` event after each submodule's forward and when
            the gradient of its output is computed, so every mode (even "none") has
            comparable points on its memory timeline.
    """
    patched: list[torch.nn.Module] = []
    try:
        for name in names:
            try:
                sub = model.get_submodule(name)
            except AttributeError:
                raise CkptVizError(
                    f"ckpt_viz.run_scenario: the model has no submodule {name!r} to checkpoint.\n"
                    f"Tip: use names from model.named_modules(), e.g. {[n for n, _ in model.named_modules()][1:4]}."
                ) from None
            original = sub.forward

            def forward(*args: Any, __original: Callable = original, __name: str = name, **kwargs: Any) -> Any:
                if use_reentrant is None:
                    out = __original(*args, **kwargs)
                else:
                    out = checkpoint(__original, *args, use_reentrant=use_reentrant, **kwargs)
                if markers:
                    _mark(out, __name)
                return out

            sub.forward = forward  # instance attribute shadows the class method
            patched.append(sub)
        yield
    finally:
        for sub in patched:
            del sub.forward


def _mark(out: Any, name: str) -> None:
    """Memory sampling points: after `name`'s forward, and when its output's gradient arrives."""
    bus.emit("memory_sampled", capture_site=False, data={"at": f"{name} forward"})
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            def on_grad(grad: torch.Tensor, _name: str = name) -> None:
                bus.emit("memory_sampled", capture_site=False, data={"at": f"{_name} backward"})

            t.register_hook(on_grad)
            break


def fresh_handle_ids() -> None:
    """Number this run's handles from h0: if handles of an earlier run linger in reference cycles, collect them."""
    from ckpt_viz.runtime.reentrant_handle import restart_handle_ids

    if not restart_handle_ids():
        gc.collect()  # costs ~0.1 s with torch loaded, so only when something is still alive


def _milestone(enabled: bool, label: str) -> None:
    if enabled:
        bus.emit("memory_sampled", capture_site=False, data={"at": label})


def _inputs_requiring_grad(inputs: tuple) -> tuple:
    """Float tensor inputs become leaves that require grad, so DX has activations to target."""
    return tuple(t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                 for t in inputs)


def _meta(spec: ModelSpec, mode: str) -> dict[str, Any]:
    return {"model": spec.name, "mode": mode, "source": spec.source, "description": spec.description,
            "checkpoint": list(spec.checkpoint),
            "versions": {"torch": torch.__version__, "python": platform.python_version(), "ckpt_viz": _version()}}


@functools.lru_cache(maxsize=1)
def _version() -> str:
    try:
        from importlib.metadata import version

        return version(_pkg)
    except Exception:  # not installed: running from a checkout
        return "0+unknown"


def run_scenario(spec: ModelSpec, mode: str, *, seed: int = 0, microbatches: int = 2,
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
    if mode == "pipeline":
        from ckpt_viz.run.pipeline import run_pipeline

        return run_pipeline(spec, schedule=schedule, microbatches=microbatches, seed=seed, memory=memory,
                            graphs=graphs)
    model = spec.model
    inputs = _inputs_requiring_grad(spec.inputs)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    torch.manual_seed(seed)
    fresh_handle_ids()
    with record(memory=memory, graphs=graphs, model=model, tensors=inputs) as rec:
        if mode in ("none", "reentrant", "nonreentrant"):
            kind = None if mode == "none" else mode == "reentrant"
            with checkpointed(model, spec.checkpoint, use_reentrant=kind, markers=memory):
                loss = spec.loss(model(*inputs))
            _milestone(memory, "loss")
            loss.backward()
        else:
            reentrant = mode == "split-reentrant"
            collect = reentrant_checkpoint_scope(lambda: params) if reentrant else recompute_handle_collector_ctx()
            with checkpointed(model, spec.checkpoint, use_reentrant=reentrant, markers=memory), collect as handles:
                loss = spec.loss(model(*inputs))
            _milestone(memory, "loss")
            acts = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            session = None if reentrant else ("step", 0)
            backward_input(loss, None, acts, handles=handles, session_id=session)
            _milestone(memory, "after DX")
            backward_weight(loss, None, params, handles=handles, session_id=session)
            del handles
        del loss
        _milestone(memory, "end")
    rec.trace.meta.update(_meta(spec, mode))
    return rec.trace
