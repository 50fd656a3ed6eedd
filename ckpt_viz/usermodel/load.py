"""User-supplied models: `load_model("path/to/file.py:factory")` -> a checked `ModelSpec`.

Owns the model-file contract (the NOTE below) and its checks: the factory, what it
returns, the names it lists, and one trial forward. Reading the reference, importing
the module and `ModelLoadError` live in `ckpt_viz.usermodel.source`; this module re-exports
them, so `from ckpt_viz.usermodel.load import ModelLoadError, parse_ref` keeps working.
Imports torch only inside functions, so `ModelLoadError` and `parse_ref` stay
importable without it (the sandbox parent and the app use them before, or without,
importing torch). Never imports the UI. To run a model you do not trust, use
`ckpt_viz.usermodel.sandbox.record_in_subprocess`, which calls `load_model` in a child process.

NOTE [ Model file contract ]
  A reference is `path/to/file.py:factory` or `package.module:factory`; a bare
  `path/to/file.py` means factory `make_model`. The factory takes no arguments and
  returns either
    (model, inputs)                                 or
    {"model": ..., "inputs": ..., "targets": ..., "loss": ..., "checkpoint": [...], "stages": [...]}
  1. model: an nn.Module. inputs: one tensor, a tuple of positional arguments, or a dict
     of keyword arguments; or instead "args" (tensor or tuple) and/or "kwargs" (dict) for
     both at once. Keywords must name parameters of model.forward; a Hugging Face model
     takes its inputs by keyword (a second positional argument would land in its cache).
  2. loss (optional): a function of the model's output returning a one-element tensor;
     default: the sum of squares of every floating tensor in the output. With "targets"
     (a tensor or a pytree of them), the loss is called as loss(output, targets), and
     pipeline mode splits the targets into micro-batches with the inputs.
  3. checkpoint (optional): qualified names from model.named_modules(); default: the
     children of the first non-empty nn.ModuleList or nn.Sequential in named_modules()
     order (the model itself counts, so an nn.Sequential model checkpoints "0", "1", ...).
  4. stages (optional): qualified names of the stage modules, for mode "pipeline". The
     trial forward checks that they compose into the model (see NOTE [ Stages compose ]
     in ckpt_viz.usermodel.inputs) and that every batched tensor shares one batch size.
  5. Any other key is refused, so a typo ("checkpiont") is not silently ignored.
  6. The factory runs under a fixed seed (like the built-in models); then one trial
     forward and loss run (RNG and buffers restored afterwards) to check that the output
     holds a floating tensor.
  7. A file is imported under a fresh module name that is removed from sys.modules
     after loading; its folder is on sys.path while it loads, so it can import its
     neighbours. A package module is imported normally (and cached, as any import).
"""
from __future__ import annotations

import difflib
import inspect
import linecache
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ckpt_viz.errors import CkptVizError
from ckpt_viz.usermodel import hf
from ckpt_viz.usermodel.inputs import (
    StageCalls,
    check_hf_positional,
    check_keywords,
    check_loss_takes_targets,
    check_stages,
    feed,
)
from ckpt_viz.usermodel.source import (
    DEFAULT_FACTORY,
    ModelLoadError,
    ModelRef,
    model_error,
    open_module,
    parse_ref,
    user_code_error,
    user_frame,
)

if TYPE_CHECKING:
    from ckpt_viz.run.zoo import ModelSpec

__all__ = [
    "ALLOWED_KEYS",
    "DEFAULT_FACTORY",
    "ModelLoadError",
    "ModelRef",
    "default_checkpoint",
    "load_model",
    "parse_ref",
    "user_frame",
]

ALLOWED_KEYS: tuple[str, ...] = ("model", "inputs", "args", "kwargs", "targets", "loss", "checkpoint", "stages")


# -- the factory and what it returns --


def _def_line(obj: Any) -> int | None:
    code = getattr(obj, "__code__", None) or getattr(getattr(obj, "__call__", None), "__code__", None)  # noqa: B004
    if code is not None:
        return code.co_firstlineno
    try:
        return inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return None


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} item{'s' if len(value) != 1 else ''}"
    if value is None:
        return "None"
    name = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


@dataclass(slots=True)
class _Site:
    """Where the factory lives, for error messages."""

    file: str | None
    factory: str
    line: int | None

    def fail(self, what: str, tip: str) -> ModelLoadError:
        code = linecache.getline(self.file, self.line).strip() if self.file and self.line else ""
        return model_error(what, tip, file=self.file, line=self.line, code=code)


def _get_factory(module: ModuleType, name: str, user_file: str | None) -> Callable[[], Any]:
    where = Path(user_file).name if user_file else module.__name__
    factory = getattr(module, name, None)
    if factory is None:
        functions = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
                     and v.__module__ == module.__name__]
        hint = f"; its functions are {', '.join(functions)}" if functions else ""
        raise model_error(f"{where} has no factory {name!r}{hint}.",
                          f"define `def {name}():` returning (model, inputs), or put the right name after the ':'.",
                          file=user_file)
    site = _Site(user_file, name, _def_line(factory))
    if not callable(factory):
        raise site.fail(f"{name!r} in {where} is {_describe(factory)}, not a function.",
                        f"make {name} a function that takes no arguments and returns (model, inputs) or a dict.")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: just call it
        return factory
    try:
        signature.bind()
    except TypeError:
        required = [p.name for p in signature.parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        raise site.fail(f"the factory {name}() needs the argument(s) {', '.join(required)}; it is called with none.",
                        "give those parameters defaults, or wrap it: `def make_model(): return build(width=16)`."
                        ) from None
    return factory


def _unpack(result: Any, site: _Site) -> dict[str, Any]:
    """The factory's return value as a dict with at least "model" and "inputs"."""
    shape_tip = 'end the factory with `return model, inputs` or `return {"model": model, "inputs": inputs}`.'
    if isinstance(result, dict):
        unknown = [k for k in result if k not in ALLOWED_KEYS]
        if unknown:
            raise site.fail(f"the factory {site.factory}() returned a dict with unknown key(s) "
                            f"{', '.join(repr(k) for k in unknown)}; allowed keys: "
                            f"{', '.join(repr(k) for k in ALLOWED_KEYS)}.",
                            "rename or remove them ('model' and 'inputs' are required, the rest optional).")
        missing = [k for k in ("model", "inputs") if k not in result
                   and not (k == "inputs" and ("args" in result or "kwargs" in result))]
        if missing:
            raise site.fail(f"the factory {site.factory}() returned a dict without the required key(s) "
                            f"{', '.join(repr(k) for k in missing)}.", shape_tip)
        return dict(result)
    if isinstance(result, tuple) and len(result) == 2:
        return {"model": result[0], "inputs": result[1]}
    raise site.fail(f"the factory {site.factory}() returned {_describe(result)}; expected a tuple "
                    "(model, inputs) or a dict with the keys 'model' and 'inputs'.", shape_tip)


def _names(value: Any, key: str, model: Any, site: _Site) -> tuple[str, ...]:
    """Validate a list of submodule names (`checkpoint` or `stages`) against model.named_modules()."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise site.fail(f"{key!r} must be a list of submodule names, got {value!r}.",
                        f"write e.g. '{key}': ['blocks.0', 'blocks.1'] (a list, even for one name).")
    known = [n for n, _ in model.named_modules()]
    for name in value:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else \
                f"valid names include {', '.join(repr(n) for n in known[1:6])}."
            raise site.fail(f"{key!r} names {name!r}, which is not a submodule of the model "
                            f"({type(model).__name__}).", f"use names from model.named_modules(); {hint}")
    duplicates = sorted({n for n in value if value.count(n) > 1})
    if duplicates:
        raise site.fail(f"{key!r} lists {', '.join(repr(d) for d in duplicates)} more than once.",
                        "name each submodule once.")
    return tuple(value)


def default_checkpoint(model: Any) -> tuple[str, ...]:
    """The children of the first non-empty nn.ModuleList or nn.Sequential in named_modules() order."""
    from torch import nn

    for prefix, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 0:
            return tuple(f"{prefix}.{child}" if prefix else child for child, _ in module.named_children())
    return ()


def _validate(fields: dict[str, Any], site: _Site) -> dict[str, Any]:
    from torch import nn

    from ckpt_viz.run.zoo import sum_of_squares

    model = fields["model"]
    if not isinstance(model, nn.Module):
        tip = (f"return an instance, {model.__name__}(...), not the class." if isinstance(model, type)
               and issubclass(model, nn.Module) else "return your torch.nn.Module as 'model'.")
        raise site.fail(f"'model' is {_describe(model)}, not a torch.nn.Module.", tip)
    data = feed(fields, site.fail)
    check_keywords(model, data, site.fail, hf=hf.is_hf_model(model))
    if hf.is_hf_model(model):
        check_hf_positional(model, data, site.fail)
    if data.targets is not None and "loss" not in fields:
        raise site.fail("the factory returned 'targets' but no 'loss' to compare the output with them.",
                        "add 'loss': a function (output, targets) -> scalar, e.g. lambda out, y: "
                        "torch.nn.functional.cross_entropy(out, y).")
    loss = fields.get("loss", sum_of_squares)
    if not callable(loss):
        raise site.fail(f"'loss' is {_describe(loss)}, not a function.",
                        "pass a function of the model's output returning a scalar, e.g. lambda y: y.pow(2).mean().")
    check_loss_takes_targets(loss, data.targets is not None, site.fail)
    if fields.get("checkpoint") is not None:
        checkpoint = _names(fields["checkpoint"], "checkpoint", model, site)
    else:
        checkpoint = default_checkpoint(model)
        if not checkpoint:
            children = [n for n, _ in model.named_children()]
            example = f" e.g. {children[:3]}" if children else ""
            raise site.fail(f"found no nn.ModuleList or nn.Sequential in {type(model).__name__} to checkpoint "
                            "by default.",
                            f"return a dict with 'checkpoint': [names of the submodules to checkpoint],{example}.")
    stages = _names(fields["stages"], "stages", model, site) if fields.get("stages") is not None else ()
    if stages:
        from ckpt_viz.run.batch import batch_rows

        try:
            batch_rows(data.args, data.kwargs, data.targets, api="pipeline", roots=data.roots, single=data.single)
        except CkptVizError as exc:
            what, _, tip = str(exc).partition("\nTip: ")
            raise site.fail(what.removeprefix("pipeline: ") + " (needed to split it into micro-batches for 'stages')",
                            tip) from None
    hf_layers = [n for n in checkpoint if hf.is_hf_layer(model.get_submodule(n))]
    if hf_layers and not model.training:
        raise site.fail(f"'model' ({type(model).__name__}) is in eval mode, and Hugging Face checkpoints its layers "
                        f"({hf_layers[0]!r}, ...) only in training mode.",
                        "call model.train() before returning it; set the config's dropout probabilities to 0 "
                        "for gradients without dropout noise.")
    return {"model": model, "data": data, "loss": loss, "checkpoint": checkpoint, "stages": stages}


def _trial_forward(fields: dict[str, Any], user_file: str | None) -> None:
    """One forward and loss, to fail early and at the right line (buffers restored afterwards)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    model, loss_fn, data = fields["model"], fields["loss"], fields["data"]
    name = type(model).__name__
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    stage_calls = StageCalls(model, fields["stages"]) if fields["stages"] else None
    # A copy of the inputs (requires_grad kept), so that a forward that changes them in place
    # leaves the recorded run the factory's inputs unchanged.
    args, kwargs, targets = tree_map(lambda v: v.detach().clone().requires_grad_(v.requires_grad)
                                     if isinstance(v, torch.Tensor) else v, (data.args, data.kwargs, data.targets))
    try:
        try:
            output = model(*args, **kwargs)
        except (Exception, SystemExit) as exc:
            called = "" if not data.kwargs else " called as model(" + ", ".join(
                [data.name("args", i) for i in range(len(data.args))]
                + [f"{k}={data.name('kwargs', k)}" for k in data.kwargs]) + ")"
            raise user_code_error(
                f"the trial forward of {name}{called}", exc, user_file,
                "the model failed on the inputs the factory returned; fix that line or the inputs.") from exc
        forward = _Site(user_file, "forward", None)
        code = getattr(type(model).forward, "__code__", None)
        if code is not None:
            forward = _Site(code.co_filename, "forward", code.co_firstlineno)
        leaves = tree_flatten(output)[0]
        if not any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in leaves):
            raise forward.fail(f"{name}.forward returned {_describe(output)}, with no floating-point tensor in it.",
                               "return the activations (a float tensor, or a tuple, list or dict holding one): "
                               "checkpointing needs an output to differentiate.")
        if stage_calls is not None:
            check_stages(stage_calls, replace(data, args=args, kwargs=kwargs), output,
                         _Site(user_file, "stages", None).fail)
        try:
            loss = loss_fn(output) if data.targets is None else loss_fn(output, targets)
        except (Exception, SystemExit) as exc:
            raise user_code_error("the loss function", exc, user_file,
                                  "the loss is called with the model's output; fix that line.") from exc
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()):
            what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else _describe(loss)
            line = _def_line(loss_fn)
            file = getattr(getattr(loss_fn, "__code__", None), "co_filename", user_file)
            raise _Site(file, "loss", line).fail(
                f"the loss returned {what}; expected a floating-point tensor with one element.",
                "reduce it, e.g. .sum() or .mean().")
    finally:
        if stage_calls is not None:
            stage_calls.remove()
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def load_model(ref: str, *, seed: int = 0) -> ModelSpec:
    """Load and check a user model. See NOTE [ Model file contract ].

    Runs the user's code in this process: for a file you do not trust, use
    `ckpt_viz.usermodel.sandbox.record_in_subprocess` instead.

    Args:
        ref: "path/to/file.py:factory", "package.module:factory", or "path/to/file.py"
            (factory `make_model`).
        seed: the torch seed the factory and the trial forward run under (the caller's RNG
            state is restored afterwards).

    Returns:
        A `ModelSpec` named `ref`, with source "user".

    Raises:
        ModelLoadError: anything wrong, with the file and line at fault and a tip.
    """
    import torch

    from ckpt_viz.run.zoo import ModelSpec

    parsed = parse_ref(ref)
    with open_module(parsed) as (module, user_file):
        factory = _get_factory(module, parsed.factory, user_file)
        site = _Site(user_file, parsed.factory, _def_line(factory))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            try:
                result = factory()
            except (Exception, SystemExit) as exc:
                raise user_code_error(
                    f"the factory {parsed.factory}()", exc, user_file,
                    "fix the error at that line; the factory is called once, with no arguments.") from exc
            fields = _validate(_unpack(result, site), site)
            _trial_forward(fields, user_file)
    doc = (inspect.getdoc(factory) or "").strip().splitlines()
    data = fields["data"]
    return ModelSpec(ref.strip(), fields["model"], data.args, fields["loss"], fields["checkpoint"],
                     fields["stages"], description=doc[0] if doc else "", source="user",
                     extra={"ref": ref.strip(), "file": user_file, "factory": parsed.factory,
                            "input_keys": data.roots, "single_input": data.single},
                     kwargs=data.kwargs, targets=data.targets)
