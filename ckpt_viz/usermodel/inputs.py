"""What a model file feeds its model: inputs (positional and keyword), targets, and stages that compose.

Owns the checks of NOTE [ Model file contract ] rules 1, 2 and 4 (in
`ckpt_viz.usermodel.load`): how "inputs" / "args" / "kwargs" become the positional and
keyword arguments of `model(...)`, that the loss takes the targets, and, from hooks on
one trial forward, that the listed stages compose into the model. Every error names
the key the user wrote (`inputs['attention_mask']`, `stages[1]`). Imports torch only
inside functions; never the UI.

NOTE [ Stages compose ]
  During the trial forward, a hook records each stage's call. The stages compose into
  the model when, in the order listed:
    1. each stage runs exactly once, after the one before it;
    2. stage 0 is called with the model's own inputs (the same tensors, keywords included);
    3. every later stage is called with one positional tensor, the previous stage's
       output, and no keywords (the pipeline hands a stage only that);
    4. the model returns the last stage's output unchanged.
  The first stage that breaks a rule is named, with what it got instead.
"""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Feed", "StageCalls", "check_hf_positional", "check_loss_takes_targets", "check_stages", "feed"]


@dataclass(slots=True)
class Feed:
    """The positional and keyword arguments of `model(...)`, the targets, and the user's names for them."""

    args: tuple
    kwargs: dict[str, Any]
    targets: Any = None
    roots: dict[str, str] = field(default_factory=lambda: {"args": "inputs", "kwargs": "inputs"})
    single: bool = False  # "inputs" was one tensor, not a tuple

    def name(self, part: str, index: int | str | None = None) -> str:
        """The user's spelling of one argument: inputs, inputs[1], inputs['mask'], kwargs['mask']."""
        root = self.roots[part]
        if index is None or (part == "args" and self.single):
            return root
        return f"{root}[{index!r}]"


def _describe(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def feed(fields: dict[str, Any], fail: Callable[[str, str], Exception]) -> Feed:
    """Read "inputs" (tensor, tuple or dict) or "args" / "kwargs" into a `Feed`."""
    import torch

    def positional(value: Any, key: str) -> tuple[tuple, bool]:
        if isinstance(value, torch.Tensor):
            return (value,), True
        if isinstance(value, tuple):
            return value, False
        if isinstance(value, list):
            raise fail(f"{key!r} is a list; a list is ambiguous (one list argument, or several arguments).",
                       "return a tuple of the positional arguments: (x,) or (x, mask); for one list "
                       "argument, ([t1, t2],).")
        raise fail(f"{key!r} is {_describe(value)}; expected a tensor, a tuple of positional arguments"
                   + (" or a dict of keyword arguments." if key == "inputs" else "."),
                   "return e.g. torch.randn(8, 16), (x, mask) or {'input_ids': ids, 'attention_mask': mask}.")

    def keywords(value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise fail(f"{key!r} is {_describe(value)}; expected a dict of keyword arguments.",
                       f"return e.g. '{key}': {{'attention_mask': mask}}.")
        bad = [k for k in value if not (isinstance(k, str) and k.isidentifier())]
        if bad:
            raise fail(f"{key!r} has the key(s) {', '.join(repr(k) for k in bad)}, which cannot be keyword "
                       "argument names.", "use the names of the forward's parameters as strings, e.g. 'input_ids'.")
        return dict(value)

    targets = fields.get("targets")
    if "inputs" in fields:
        both = [k for k in ("args", "kwargs") if k in fields]
        if both:
            raise fail(f"the factory returned both 'inputs' and {' and '.join(repr(k) for k in both)}.",
                       "give either 'inputs' (a tensor, tuple or dict) or 'args' and/or 'kwargs', not both.")
        value = fields["inputs"]
        if isinstance(value, dict):
            return Feed((), keywords(value, "inputs"), targets)
        args, single = positional(value, "inputs")
        return Feed(args, {}, targets, single=single)
    args, single = positional(fields["args"], "args") if "args" in fields else ((), False)
    kwargs = keywords(fields["kwargs"], "kwargs") if "kwargs" in fields else {}
    return Feed(args, kwargs, targets, roots={"args": "args", "kwargs": "kwargs"}, single=single)


def check_keywords(model: Any, data: Feed, fail: Callable[[str, str], Exception], *, hf: bool = False) -> None:
    """Every keyword names a parameter of `model.forward` (unless it takes **kwargs).

    A Hugging Face forward takes **kwargs, but only the keys HF documents for them
    (`TransformersKwargs`), so its keywords are checked too.
    """
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return
    known = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        if not hf:
            return
        from transformers.utils import TransformersKwargs

        known += [k for k in TransformersKwargs.__annotations__ if k not in known]
    for key in data.kwargs:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=2)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else \
                f"its parameters are {', '.join(known[:8])}."
            raise fail(f"{data.name('kwargs', key)} is not a parameter of {type(model).__name__}.forward.",
                       f"rename the key; {hint}")


def check_hf_positional(model: Any, data: Feed, fail: Callable[[str, str], Exception]) -> None:
    """A Hugging Face model takes its inputs by keyword: a second positional argument lands in a cache parameter."""
    if len(data.args) < 2:
        return
    params = [n for n, p in inspect.signature(model.forward).parameters.items()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    landed = ", ".join(f"{data.name('args', i)} -> {n!r}" for i, n in enumerate(params[:len(data.args)]))
    raise fail(f"{type(model).__name__} is a Hugging Face model called with {len(data.args)} positional "
               f"arguments, which land in forward's parameters by position ({landed}).",
               "pass them by name: 'inputs': {'input_ids': ids, 'attention_mask': mask}.")


def check_loss_takes_targets(loss: Callable, has_targets: bool, fail: Callable[[str, str], Exception]) -> None:
    """With targets the loss is called as loss(output, targets); without, as loss(output)."""
    try:
        signature = inspect.signature(loss)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, None) if has_targets else signature.bind(None)
    except TypeError:
        if has_targets:
            raise fail("the factory returned 'targets', so the loss is called as loss(output, targets), "
                       f"but 'loss' takes {signature}.",
                       "write the loss as e.g. lambda out, y: torch.nn.functional.cross_entropy(out, y).") from None
        raise fail(f"'loss' takes {signature}, but with no 'targets' it is called as loss(output).",
                   "return the targets as 'targets' (split per micro-batch in pipeline mode), or give the "
                   "loss one parameter.") from None


class StageCalls:
    """Hooks on the stage modules that record each call during one forward (NOTE [ Stages compose ])."""

    def __init__(self, model: Any, names: tuple[str, ...]) -> None:
        self.names = names
        self.calls: list[tuple[int, tuple, dict, Any]] = []
        self._hooks = []
        for index, name in enumerate(names):
            def hook(module: Any, args: tuple, kwargs: dict, output: Any, _index: int = index) -> None:
                self.calls.append((_index, args, kwargs, output))

            self._hooks.append(model.get_submodule(name).register_forward_hook(hook, with_kwargs=True))

    def remove(self) -> None:
        for handle in self._hooks:
            handle.remove()


def _same(a: Any, b: Any) -> bool:
    import torch

    if a is b:
        return True
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
        and a.dtype == b.dtype and torch.equal(a, b)


def check_stages(calls: StageCalls, data: Feed, output: Any, fail: Callable[[str, str], Exception]) -> None:
    """See NOTE [ Stages compose ]; raise naming the first stage that disagrees."""
    import torch
    from torch.utils._pytree import tree_flatten

    names = calls.names
    label = [f"stages[{i}] {n!r}" for i, n in enumerate(names)]
    ran = [index for index, *_ in calls.calls]
    tip = ("list as 'stages' the submodules the model runs one after another, input to output, e.g. "
           "'stages': ['blocks.0', 'blocks.1'] for a forward that is blocks.1(blocks.0(x)); a model that does "
           "more (an embedding first, a head last) can wrap those steps in stage modules of its own.")
    for i in range(len(names)):
        count = ran.count(i)
        if count != 1:
            raise fail(f"{label[i]} ran {count} times in the trial forward; each stage must run once.", tip)
    if ran != sorted(ran):
        first = next(i for i, (a, b) in enumerate(zip(ran, sorted(ran))) if a != b)
        raise fail(f"{label[sorted(ran)[first]]} ran out of order (the forward ran the stages as "
                   f"{', '.join(names[i] for i in ran)}).", tip)
    by_stage = sorted(calls.calls, key=lambda c: c[0])
    _, args, kwargs, _ = by_stage[0]
    mine, theirs = tree_flatten((args, kwargs))[0], tree_flatten((data.args, data.kwargs))[0]
    if len(mine) != len(theirs) or not all(a is b for a, b in zip(mine, theirs)):
        got = ", ".join(_describe(a) for a in mine) or "nothing"
        raise fail(f"{label[0]} is not called with the model's inputs ({', '.join(_describe(a) for a in theirs)}) "
                   f"but with {got}: the model computes something before its first stage.", tip)
    for i in range(1, len(names)):
        previous, (_, args, kwargs, _) = by_stage[i - 1][3], by_stage[i]
        if not isinstance(previous, torch.Tensor):
            raise fail(f"{label[i - 1]} returns {_describe(previous)}; a stage before the last must return one "
                       "tensor (the pipeline hands it to the next stage).", tip)
        if kwargs or len(args) != 1 or not _same(args[0], previous):
            got = ", ".join([_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()])
            raise fail(f"{label[i]} is not called with the output of {label[i - 1]} alone (it got {got or 'nothing'}): "
                       "the model does something between them.", tip)
    last = by_stage[-1][3]
    if not (_same(output, last) or output is last):
        raise fail(f"the model's output ({_describe(output)}) is not the output of the last stage, {label[-1]} "
                   f"({_describe(last)}): the model does something after it.", tip)
