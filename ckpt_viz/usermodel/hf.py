"""Hugging Face models, checkpointed through their own mechanism with ckpt_viz's checkpoint.

Owns the `transformers` route: recognising HF layers and models, turning HF's own
gradient checkpointing on for a run (which is also how HF turns the KV cache off) and
restoring the model afterwards. `transformers` is never imported here unless the
user's code already imported it: a model that is not an HF model costs one
`sys.modules` lookup. Never imports the UI.

NOTE [ HF checkpointing ]
  1. HF layers (`GradientCheckpointingLayer`) checkpoint themselves when their
     `gradient_checkpointing` flag is set and the model is in training mode: they call
     `self._gradient_checkpointing_func(partial(forward, self, **kwargs), *args)` with
     `use_cache=False` and `past_key_values=None`, and the models pass no cache to
     their layers while the flag is on.
  2. `own_checkpointing` sets the flags with the model's `_set_gradient_checkpointing`
     (the call `activation_checkpointing_enable` makes, without its input-grad hook),
     then gives each named layer its own function (ckpt_viz's checkpoint, labelled
     with the layer's name) and turns the flag off on every other layer.
  3. The config's `use_cache` is False during the run in every mode, "none" included: with
     dropout, a forward that fills the cache differs from one that does not (HF itself
     turns the cache off under checkpointing), so the baseline must run without it too.
  4. A layer's flag and function and the config's `use_cache` are put back as they were
     when the block exits, so a model the user had configured is left unchanged.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ckpt_viz.errors import CkptVizError

__all__ = ["is_hf_layer", "is_hf_model", "own_checkpointing"]

_API = "ckpt_viz.run_scenario"
_MISSING = object()


def _transformers_class(name: str) -> type | None:
    if "transformers" not in sys.modules:  # the user's code never imported it: not an HF model
        return None
    if name == "GradientCheckpointingLayer":
        try:
            from transformers.modeling_layers import GradientCheckpointingLayer
        except ImportError:  # transformers before 4.52: no layer checkpoints itself this way
            return None
        return GradientCheckpointingLayer
    from transformers import PreTrainedModel

    return PreTrainedModel


def is_hf_layer(module: Any) -> bool:
    """Whether `module` is a `transformers` layer that checkpoints itself (NOTE [ HF checkpointing ], rule 1)."""
    cls = _transformers_class("GradientCheckpointingLayer")
    return cls is not None and isinstance(module, cls)


def is_hf_model(module: Any) -> bool:
    """Whether `module` is a `transformers` PreTrainedModel."""
    cls = _transformers_class("PreTrainedModel")
    return cls is not None and isinstance(module, cls)


def _hf_models(model: Any) -> list[Any]:
    """The outermost PreTrainedModels in `model` (the model itself when it is one)."""
    found: list[Any] = []
    inside: set[int] = set()
    for module in model.modules():  # parents come before their children
        if id(module) not in inside and is_hf_model(module):
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return found


@functools.lru_cache(maxsize=1)
def _skip_hf_frames() -> None:
    """A handle's call site is the model's line that called the layer, not HF's checkpointing wrapper."""
    from transformers import modeling_layers

    from ckpt_viz import bus

    bus.skip_frames_in(modeling_layers.__file__)


@contextlib.contextmanager
def own_checkpointing(model: Any, layers: dict[str, Any],
                      make_function: Callable[[str, Any], Callable] | None) -> Iterator[None]:
    """Checkpoint `layers` (name -> HF layer) through HF's own mechanism while the block runs.

    Args:
        model: the model holding the layers (an HF model, or the user's module around one).
        layers: the HF layers to checkpoint, by qualified name.
        make_function: (name, layer) -> the layer's checkpointing function, called as
            `fn(partial(forward, layer, **kwargs), *args)`; None turns HF's checkpointing
            off for the run (the "none" mode's baseline).

    Raises:
        CkptVizError: a layer is in eval mode (HF checkpoints only in training mode).
    """
    _skip_hf_frames()
    if make_function is not None:
        for name, layer in layers.items():
            if not layer.training:
                raise CkptVizError(
                    f"{_API}: the Hugging Face layer {name!r} ({type(layer).__name__}) is in eval mode, and HF "
                    "checkpoints its layers only in training mode.\nTip: call model.train() in the factory; "
                    "for gradients without dropout noise, set the config's dropout probabilities to 0.")
    saved = [(m, m.__dict__.get("gradient_checkpointing", _MISSING), m.__dict__.get("_gradient_checkpointing_func",
                                                                                    _MISSING))
             for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    configs = [(c, c.use_cache) for c in {id(h.config): h.config for h in _hf_models(model)}.values()
               if getattr(c, "use_cache", None) is not None]
    try:
        for config, _ in configs:  # the cache off in every mode, so "none" is the baseline the others match
            config.use_cache = False
        if make_function is not None:
            for hf_model in _hf_models(model):
                setter = hf_model._set_gradient_checkpointing
                if "gradient_checkpointing_func" not in inspect.signature(setter).parameters:
                    continue  # an old-format model of its own: the layers' flags below are what it reads
                function = make_function(type(hf_model).__name__, hf_model)
                setter(enable=True, gradient_checkpointing_func=function)
        named = {id(layer) for layer in layers.values()}
        for m, _, _ in saved:
            if is_hf_layer(m) and (make_function is None or id(m) not in named):
                m.gradient_checkpointing = False
        if make_function is not None:
            for name, layer in layers.items():
                layer.gradient_checkpointing = True
                layer._gradient_checkpointing_func = make_function(name, layer)
        yield
    finally:
        for config, value in configs:
            config.use_cache = value
        for m, flag, function in saved:
            for attr, value in (("gradient_checkpointing", flag), ("_gradient_checkpointing_func", function)):
                if value is _MISSING:
                    m.__dict__.pop(attr, None)
                else:
                    setattr(m, attr, value)
