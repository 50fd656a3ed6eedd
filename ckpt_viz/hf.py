"""Hugging Face models with activation checkpointing: ckpt_viz's runtime through HF's own mechanism, or torch's.

Tested with transformers 5.23.0 (`TESTED_TRANSFORMERS`; the range supported is the `hf` extra's
in pyproject.toml). `transformers` and torch are imported when `enable` runs, never at import.

NOTE [ HF paths ]
  1. torch's checkpoint, as HF sets it up: keep `model.gradient_checkpointing_enable()` (with
     `gradient_checkpointing_kwargs={"use_reentrant": ...}`; in transformers 5.x also
     `activation_checkpointing_enable`). Nothing else changes: `ckpt_viz.record()` observes it
     (NOTE [ Observing torch's checkpoint ] in ckpt_viz/runtime/torch_observer.py), one handle
     per checkpointed layer named `model.layers.3`. `enable(model, runtime="torch")` is that call.
  2. ckpt_viz's checkpoint through HF's mechanism (split DX/DW, sessions, prefire on an HF
     model): `enable(model, use_reentrant=...)`. It first makes HF's own public call (the layer
     flags, `every_n_layers`, the input-gradient hook; each layer then turns the KV cache off
     while it checkpoints, as HF always does), then hands every layer ckpt_viz's checkpoint as
     its checkpointing function, labelled with the layer's qualified name. transformers 5.x
     takes no function in its public call (`gradient_checkpointing_enable(
     gradient_checkpointing_func=...)` raises TypeError), so the function goes in through
     `model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=...)`, the call
     HF's public one makes itself; its signature is checked first, and a transformers without
     it gets an error that says so.
  3. `disable(model)` is HF's own `activation_checkpointing_disable()` (`gradient_checkpointing_disable()`
     before transformers 5): every layer back to running without checkpointing.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

from ckpt_viz.errors import CkptVizError

__all__ = ["TESTED_TRANSFORMERS", "disable", "enable"]

TESTED_TRANSFORMERS = ("5.23.0",)
_API = "ckpt_viz.hf.enable"


def _check_model(model: Any, api: str) -> None:
    from ckpt_viz.usermodel.hf import is_hf_model

    if not is_hf_model(model):
        raise CkptVizError(f"{api}: expected a transformers PreTrainedModel, got {type(model).__name__}.\n"
                           "Tip: pass the model from from_config / from_pretrained (e.g. LlamaForCausalLM), or "
                           "checkpoint a plain module with ckpt_viz.checkpoint.")
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise CkptVizError(f"{api}: {type(model).__name__} does not support gradient checkpointing (its "
                           "supports_gradient_checkpointing is False).\nTip: checkpoint its blocks with "
                           "ckpt_viz.checkpoint instead.")


def _hf_enable(model: Any, use_reentrant: bool, every_n_layers: int) -> None:
    """HF's own public call (NOTE [ HF paths ], rule 1)."""
    kwargs = {"use_reentrant": use_reentrant}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every_n_layers)
    elif every_n_layers != 1:
        raise CkptVizError(f"{_API}: every_n_layers={every_n_layers} needs transformers 5 (its "
                           "activation_checkpointing_enable); this one has only gradient_checkpointing_enable.\n"
                           "Tip: pass every_n_layers=1, or upgrade transformers.")
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _layer_function(model: Any, use_reentrant: bool) -> Callable[..., Any]:
    """ckpt_viz's checkpoint as HF calls its checkpointing function: `fn(partial(forward, layer, **kw), *args)`."""
    from ckpt_viz import bus
    from ckpt_viz.run.blocks import labelled
    from ckpt_viz.runtime import checkpoint
    from ckpt_viz.runtime.labels import label_of, module_of

    names = {id(m): n for n, m in model.named_modules() if n}  # relative to the model enabled

    def checkpoint_layer(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        layer = module_of(function)
        if layer is None:  # not a layer's forward: ckpt_viz's own naming
            return checkpoint(function, *args, use_reentrant=use_reentrant, **kwargs)
        label = (bus.name_of(layer) if bus.enabled else None) or names.get(id(layer)) or label_of(function)
        return checkpoint(labelled(function, label, layer), *args, use_reentrant=use_reentrant, **kwargs)

    checkpoint_layer.__qualname__ = checkpoint_layer.__name__ = f"ckpt_viz_checkpoint(use_reentrant={use_reentrant})"
    return checkpoint_layer


def enable(model: Any, *, use_reentrant: bool = False, runtime: Literal["ckpt_viz", "torch"] = "ckpt_viz",
           every_n_layers: int = 1) -> None:
    """Turn on gradient checkpointing of an HF model's layers, through HF's own mechanism (NOTE [ HF paths ]).

    Args:
        model: a transformers `PreTrainedModel` that supports gradient checkpointing.
        use_reentrant: the checkpoint kind (False: non-reentrant, HF's default).
        runtime: "ckpt_viz" (ckpt_viz's checkpoint: split backward, sessions, full events) or "torch"
            (torch's, exactly as `model.gradient_checkpointing_enable()` sets it up; `record()` observes it).
        every_n_layers: checkpoint every n-th layer only (transformers 5).

    Raises:
        CkptVizError: not an HF model, a model without checkpointing support, or a transformers whose
            internals NOTE [ HF paths ], rule 2 relies on are missing.

    Example:
        model = LlamaForCausalLM(config).train()
        ckpt_viz.hf.enable(model, use_reentrant=False)
        with ckpt_viz.record(model=model, memory=True) as rec:
            model(input_ids=ids, labels=ids).loss.backward()   # handles model.layers.0, model.layers.1, ...
    """
    _check_model(model, _API)
    if runtime not in ("ckpt_viz", "torch"):
        raise CkptVizError(f'{_API}: runtime must be "ckpt_viz" or "torch" (not {runtime!r}).\n'
                           'Tip: runtime="torch" keeps torch\'s checkpoint, which record() observes.')
    if not isinstance(use_reentrant, bool):
        raise CkptVizError(f"{_API}: use_reentrant must be True or False, got {use_reentrant!r}.\n"
                           "Tip: False is HF's default and torch's recommendation.")
    if not isinstance(every_n_layers, int) or isinstance(every_n_layers, bool) or every_n_layers < 1:
        raise CkptVizError(f"{_API}: every_n_layers must be a positive int, got {every_n_layers!r}.\n"
                           "Tip: 1 checkpoints every layer.")
    setter = getattr(model, "_set_gradient_checkpointing", None)
    parameters = inspect.signature(setter).parameters if setter is not None else {}
    if runtime == "ckpt_viz" and "gradient_checkpointing_func" not in parameters:
        import transformers

        raise CkptVizError(f"{_API}: this transformers ({transformers.__version__}) has no "
                           "_set_gradient_checkpointing(gradient_checkpointing_func=...) on "
                           f"{type(model).__name__}, through which ckpt_viz's checkpoint reaches HF's layers "
                           f"(tested with transformers {', '.join(TESTED_TRANSFORMERS)}).\n"
                           'Tip: pass runtime="torch": record() observes torch\'s checkpoint as HF sets it up.')
    _hf_enable(model, use_reentrant, every_n_layers)
    if runtime == "ckpt_viz":
        extra = {"every_n_layers": every_n_layers} if "every_n_layers" in parameters else {}
        setter(enable=True, gradient_checkpointing_func=_layer_function(model, use_reentrant), **extra)


def disable(model: Any) -> None:
    """Turn HF's gradient checkpointing off again (NOTE [ HF paths ], rule 3)."""
    _check_model(model, "ckpt_viz.hf.disable")
    if hasattr(model, "activation_checkpointing_disable"):  # transformers 5.x; the other name is deprecated there
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()
