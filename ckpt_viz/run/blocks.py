"""Checkpointing a model's named blocks for one run: `checkpointed(model, names, ...)`.

Owns how a scenario turns "checkpoint these submodules" into checkpoint calls, and
what each handle is called: the block's qualified name from `model.named_modules()`
(`transformer.h.2`), with the call index when one module runs more than once in a
forward (a shared layer: `layer`, `layer#1`, `layer#2`). Hugging Face layers go
through their own mechanism (`ckpt_viz.usermodel.hf`). Frames of this module are
skipped when the bus looks for the user's call site, so a handle's site is the
line that called the block. Imports torch; never the UI.

NOTE [ Two routes ]
  1. A plain module: its `forward` is shadowed by an instance attribute that calls
     `checkpoint(<labelled forward>, *args, **kwargs)`.
  2. A `transformers` GradientCheckpointingLayer: HF's own gradient checkpointing is
     turned on for the model (which is how HF turns the KV cache off), with ckpt_viz's
     checkpoint as the checkpointing function of each named layer. Wrapping such a
     layer's `forward` instead would checkpoint HF's live cache with it and give
     wrong gradients in the reentrant kinds.
  3. Both routes restore the model as it was when the block exits.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ckpt_viz import bus
from ckpt_viz.errors import CkptVizError
from ckpt_viz.events import MemorySampled
from ckpt_viz.runtime import checkpoint

__all__ = ["checkpointed", "labelled"]

bus.skip_frames_in(__file__)


def labelled(function: Callable, label: str, owner: torch.nn.Module) -> Callable:
    """`function` under the name `label` (what `handle_created` reports), still owned by `owner`."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    call.__qualname__ = call.__name__ = label
    call.__self__ = owner  # the reentrant replay finds the block's own parameters through it
    return call


class _Calls:
    """Call index per block within one `checkpointed` block: the label of each call."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def label(self, name: str) -> str:
        count = self.counts.get(name, 0)
        self.counts[name] = count + 1
        return name if count == 0 else f"{name}#{count}"


def _mark(out: Any, name: str) -> None:
    """Memory sampling points: after `name`'s forward, and when its output's gradient arrives."""
    bus.emit(MemorySampled, capture_site=False, at=f"{name} forward")
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            def on_grad(grad: torch.Tensor, _name: str = name) -> None:
                bus.emit(MemorySampled, capture_site=False, at=f"{_name} backward")

            t.register_hook(on_grad)
            break


def _submodule(model: torch.nn.Module, name: str) -> torch.nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise CkptVizError(
            f"ckpt_viz.run_scenario: the model has no submodule {name!r} to checkpoint.\n"
            f"Tip: use names from model.named_modules(), e.g. {[n for n, _ in model.named_modules()][1:4]}."
        ) from None


@contextlib.contextmanager
def checkpointed(model: torch.nn.Module, names: tuple[str, ...], *, use_reentrant: bool | None,
                 markers: bool = False) -> Iterator[None]:
    """Checkpoint the named submodules of `model` while the block runs. See NOTE [ Two routes ].

    Args:
        use_reentrant: True or False picks the checkpoint kind; None runs them unchanged
            (the "none" mode), which is still useful with `markers`.
        markers: emit a `memory_sampled` event after each submodule's forward and when
            the gradient of its output is computed, so every mode (even "none") has
            comparable points on its memory timeline.
    """
    from ckpt_viz.usermodel import hf

    calls = _Calls()
    subs = {name: _submodule(model, name) for name in names}
    hf_layers = {name: sub for name, sub in subs.items() if hf.is_hf_layer(sub)}
    patched: list[torch.nn.Module] = []

    def hf_function(name: str, sub: torch.nn.Module) -> Callable:
        def run(function: Callable, *args: Any) -> Any:  # HF calls it as checkpoint(partial(forward, ...), *args)
            return checkpoint(labelled(function, calls.label(name), sub), *args, use_reentrant=use_reentrant)

        return run

    with contextlib.ExitStack() as stack:
        if hf_layers:
            stack.enter_context(hf.own_checkpointing(model, hf_layers, None if use_reentrant is None else hf_function))
        try:
            for name, sub in subs.items():
                if name in hf_layers and not markers:
                    continue
                original = sub.forward

                def forward(*args: Any, __original: Callable = original, __name: str = name,
                            __sub: torch.nn.Module = sub, __hf: bool = name in hf_layers, **kwargs: Any) -> Any:
                    if use_reentrant is None or __hf:
                        out = __original(*args, **kwargs)
                    else:
                        out = checkpoint(labelled(__original, calls.label(__name), __sub), *args,
                                         use_reentrant=use_reentrant, **kwargs)
                    if markers:
                        _mark(out, __name)
                    return out

                sub.forward = forward  # instance attribute shadows the class method
                patched.append(sub)
            yield
        finally:
            for sub in patched:
                del sub.forward
