"""Put a plan on a model: checkpoint the chosen blocks with ckpt_viz's runtime or torch's.

Owns `apply` (and the `Applied` handle that takes it off again) and `policy_of` (a Policy
from whatever plan object the user holds). Imports torch. The code to paste for the same
plan is `ckpt_viz.plan.snippets.code` (torch-free).

NOTE [ Applying a plan ]
  1. A block is checkpointed by shadowing its `forward` with an instance attribute that calls
     the checkpoint on the original forward (ckpt_viz: `checkpoint(labelled(forward, name))`, so
     handles carry the block's name; torch: `torch.utils.checkpoint.checkpoint(forward, ...)`).
     The module object, its parameters, hooks and state dict are unchanged.
  2. Hugging Face models: the config's `use_cache` is False while the plan is on (HF turns its
     cache off under checkpointing; a checkpointed layer must not replay into a live cache), and a
     chosen layer's own `gradient_checkpointing` flag is off (else it would be checkpointed twice).
  3. Excluded regions (ckpt_viz only) replace the named submodule in its parent by
     `checkpoint_exclude_wrapper(submodule)`; kept ops (`save_ops`) become a selective
     checkpoint policy, `context_fn=functools.partial(create_selective_checkpoint_contexts,
     policy)`, which needs a non-reentrant checkpoint.
  4. `Applied.remove()` (or leaving its `with` block) puts everything back as it was.
  5. torch's reentrant checkpoint of a block none of whose inputs requires grad returns None for
     its parameters' gradients (with a warning only); such a call raises instead.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ckpt_viz.errors import CkptVizError
from ckpt_viz.plan.schema import Policy, Prediction, Recommendation

__all__ = ["Applied", "apply", "policy_of", "selective_policy"]

_API = "ckpt_viz.plan.apply"
RUNTIMES = ("ckpt_viz", "torch")


def policy_of(plan: Any, api: str = _API) -> Policy:
    """The `Policy` of a Policy, a Prediction, a Recommendation or a CurvePoint-like object."""
    if isinstance(plan, Policy):
        return plan
    if isinstance(plan, Prediction):
        return plan.policy
    if isinstance(plan, Recommendation):
        if plan.prediction is None:
            raise CkptVizError(f"{api}: the recommendation has no policy: none meets the budget of "
                               f"{plan.budget:,} bytes (the lowest reachable peak is {plan.floor:,}).\n"
                               "Tip: raise the budget, or pick a point of recommendation.curve.")
        return plan.prediction.policy
    raise CkptVizError(f"{api}: expected a Policy, Prediction or Recommendation, got {type(plan).__name__}.\n"
                       "Tip: pass ckpt_viz.plan.recommend(...) or Policy(blocks=frozenset({...})).")


def selective_policy(save_ops: frozenset[str]) -> Callable[..., Any]:
    """torch's selective checkpoint policy keeping the outputs of the ATen ops named in `save_ops`."""
    from torch.utils.checkpoint import CheckpointPolicy

    names = frozenset(save_ops)

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        packet = getattr(op, "overloadpacket", op)
        name = getattr(packet, "__name__", str(packet)).removeprefix("aten.")
        return CheckpointPolicy.MUST_SAVE if name in names else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


class Applied:
    """A plan put on a model; `remove()` (or the end of its `with` block) takes it off (NOTE rule 4)."""

    def __init__(self, model: torch.nn.Module, policy: Policy, runtime: str) -> None:
        self.model = model
        self.policy = policy
        self.runtime = runtime
        self._undo: list[Callable[[], None]] = []

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> Applied:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _module_names(policy: Policy) -> list[str]:
    names = []
    for name in sorted(policy.blocks):
        base = name.split("#", 1)[0]  # a block called more than once is checkpointed at every call
        if base not in names:
            names.append(base)
    return names


def apply(model: torch.nn.Module, plan: Any, *, runtime: str = "ckpt_viz") -> Applied:
    """Checkpoint `plan`'s blocks of `model` (NOTE [ Applying a plan ]); returns a handle to take it off.

    Args:
        model: the model the plan was made for (block names from `model.named_modules()`).
        plan: a Policy, or a Prediction / Recommendation holding one.
        runtime: "ckpt_viz" (ours: `ckpt_viz.checkpoint`, excluded regions) or "torch"
            (`torch.utils.checkpoint.checkpoint`).

    Example:
        with ckpt_viz.plan.apply(model, ckpt_viz.plan.recommend(profile, budget)):
            train_step()
    """
    policy = policy_of(plan)
    if runtime not in RUNTIMES:
        raise CkptVizError(f"{_API}: runtime must be one of {', '.join(repr(r) for r in RUNTIMES)}, got "
                           f"{runtime!r}.\nTip: 'torch' uses torch.utils.checkpoint.checkpoint.")
    if policy.kind not in ("nonreentrant", "reentrant"):
        raise CkptVizError(f"{_API}: kind {policy.kind!r} splits the backward into DX and DW, which your loop "
                           "calls itself (ckpt_viz.backward_input / backward_weight), so a model alone cannot "
                           "take it.\nTip: apply the plan with kind 'nonreentrant' or 'reentrant', or run split "
                           "kinds through ckpt_viz.run.scenarios.run_scenario / ckpt_viz.pipelining.")
    if policy.exclude and runtime == "torch":
        raise CkptVizError(f"{_API}: excluded regions ({', '.join(sorted(policy.exclude))}) are ckpt_viz's; torch's "
                           "checkpoint has none.\nTip: use runtime='ckpt_viz', or keep those ops with save_ops "
                           "(torch's selective checkpointing).")
    if policy.save_ops and policy.kind != "nonreentrant":
        raise CkptVizError(f"{_API}: kept ops (save_ops) need a non-reentrant checkpoint (torch's selective "
                           f"checkpointing), got kind {policy.kind!r}.\nTip: plan with kind='nonreentrant'.")
    applied = Applied(model, policy, runtime)
    try:
        _apply(model, policy, runtime, applied)
    except BaseException:
        applied.remove()
        raise
    return applied


def _apply(model: torch.nn.Module, policy: Policy, runtime: str, applied: Applied) -> None:
    from ckpt_viz.usermodel import hf

    extra: dict[str, Any] = {}
    if policy.save_ops:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        extra["context_fn"] = functools.partial(create_selective_checkpoint_contexts,
                                                selective_policy(policy.save_ops))
    reentrant = policy.kind == "reentrant"
    for name in _module_names(policy):
        module = _submodule(model, name)
        if "forward" in vars(module):
            raise CkptVizError(f"{_API}: {name!r} already has its forward replaced (a plan applied twice, or "
                               "another wrapper).\nTip: remove the earlier plan first (Applied.remove()).")
        original = module.forward
        if runtime == "torch":
            from torch.utils.checkpoint import checkpoint as torch_checkpoint

            forward = functools.partial(torch_checkpoint, original, use_reentrant=reentrant, **extra)
            if reentrant:
                forward = _guarded(forward, name, module)
        else:
            from ckpt_viz.run.blocks import labelled
            from ckpt_viz.runtime import checkpoint

            forward = functools.partial(checkpoint, labelled(original, name, module), use_reentrant=reentrant,
                                        **extra)
        module.forward = forward  # See NOTE rule 1.
        applied._undo.append(functools.partial(_restore_forward, module))
        if getattr(module, "gradient_checkpointing", False) is True:  # HF's own checkpoint would run it twice
            module.gradient_checkpointing = False
            applied._undo.append(functools.partial(setattr, module, "gradient_checkpointing", True))
    for name in sorted(policy.exclude):
        _exclude(model, name, applied)
    for config in {id(m.config): m.config for m in model.modules() if hf.is_hf_model(m)}.values():
        if getattr(config, "use_cache", None):  # See NOTE rule 2.
            config.use_cache = False
            applied._undo.append(functools.partial(setattr, config, "use_cache", True))


def _guarded(forward: Callable, name: str, module: torch.nn.Module) -> Callable:
    """torch's reentrant checkpoint, refusing a call whose inputs need no grad (NOTE rule 5)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters()) and not any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in (*args, *kwargs.values())):
            raise CkptVizError(f"{_API}: torch's reentrant checkpoint of {name!r} would leave its parameters "
                               "without gradients: none of its inputs requires grad (torch warns \"None of the "
                               "inputs have requires_grad=True\" and returns None gradients).\nTip: plan "
                               f"{name!r} with kind='nonreentrant', or apply with runtime='ckpt_viz'.")
        return forward(*args, **kwargs)

    return call


def _restore_forward(module: torch.nn.Module) -> None:
    vars(module).pop("forward", None)


def _submodule(model: torch.nn.Module, name: str) -> torch.nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise CkptVizError(f"{_API}: the model has no submodule {name!r}.\nTip: the plan was made for another "
                           f"model; its blocks are names from model.named_modules(), e.g. "
                           f"{[n for n, _ in model.named_modules()][1:4]}.") from None


def _exclude(model: torch.nn.Module, name: str, applied: Applied) -> None:
    from ckpt_viz.runtime import checkpoint_exclude_wrapper
    from ckpt_viz.runtime.exclude import CheckpointExcludeWrapper

    module = _submodule(model, name)
    if isinstance(module, CheckpointExcludeWrapper):
        return  # the model's own excluded region
    parent_name, _, child = name.rpartition(".")
    parent = _submodule(model, parent_name) if parent_name else model
    wrapper = checkpoint_exclude_wrapper(module)
    setattr(parent, child, wrapper)
    applied._undo.append(functools.partial(setattr, parent, child, module))
