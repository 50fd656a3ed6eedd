"""The code to paste for a plan: module names and the policy function, for ckpt_viz's runtime and torch's.

Owns `code`. Torch-free: it writes text. What it writes does what `ckpt_viz.plan.apply` does
(NOTE [ Applying a plan ] in ckpt_viz/plan/wrap.py), in the user's own file, without ckpt_viz
for the torch version.
"""
from __future__ import annotations

from ckpt_viz.errors import CkptVizError
from ckpt_viz.plan.schema import Policy

__all__ = ["code"]

_API = "ckpt_viz.plan.code"


def _names(policy: Policy) -> list[str]:
    out: list[str] = []
    for name in sorted(policy.blocks, key=_natural):
        base = name.split("#", 1)[0]
        if base not in out:
            out.append(base)
    return out


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    import re

    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name))


def _list(names: list[str], indent: str = "    ") -> str:
    if not names:
        return "[]"
    return "[\n" + "".join(f"{indent}{name!r},\n" for name in names) + "]"


def code(policy: Policy, *, runtime: str = "torch", model: str = "model", comment: str = "") -> str:
    """Python that checkpoints `policy`'s blocks of the model in variable `model`, to paste before training.

    Args:
        policy: the plan (its blocks, kind, excluded regions, kept ops).
        runtime: "torch" (`torch.utils.checkpoint`, no ckpt_viz needed) or "ckpt_viz".
        model: the name of the model's variable in the user's code.
        comment: a line to put on top (e.g. the plan's words).
    """
    if runtime not in ("torch", "ckpt_viz"):
        raise CkptVizError(f"{_API}: runtime must be 'torch' or 'ckpt_viz', got {runtime!r}.\n"
                           "Tip: 'torch' writes code that needs only torch.")
    if not model.isidentifier():
        raise CkptVizError(f"{_API}: model must be a Python variable name, got {model!r}.\nTip: e.g. model='net'.")
    if policy.kind not in ("nonreentrant", "reentrant"):
        raise CkptVizError(f"{_API}: kind {policy.kind!r} splits the backward into DX and DW, which a training "
                           "loop calls itself.\nTip: write code for kind 'nonreentrant' or 'reentrant'.")
    if runtime == "torch" and policy.exclude:
        raise CkptVizError(f"{_API}: excluded regions are ckpt_viz's; torch's checkpoint has none.\n"
                           "Tip: runtime='ckpt_viz', or keep those ops with save_ops instead.")
    reentrant = policy.kind == "reentrant"
    lines: list[str] = []
    if comment:
        lines += [f"# {line}" for line in comment.splitlines()]
    lines.append("import functools")
    lines.append("")
    if runtime == "torch":
        fn = "checkpoint"
        if policy.save_ops:
            lines.append("from torch.utils.checkpoint import CheckpointPolicy, checkpoint, "
                         "create_selective_checkpoint_contexts")
        else:
            lines.append("from torch.utils.checkpoint import checkpoint")
    else:
        fn = "ckpt_viz.checkpoint"
        lines.append("import ckpt_viz")
        if policy.save_ops:
            lines.append("from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts")
    lines.append("")
    lines.append(f"CHECKPOINT = {_list(_names(policy))}")
    extra = f"use_reentrant={reentrant}"
    if policy.save_ops:
        lines.append(f"KEEP_OPS = {set(sorted(policy.save_ops))!r}  # ATen ops whose outputs are kept, not recomputed")
        lines += ["", "",
                  "def keep_policy(ctx, op, *args, **kwargs):",
                  "    name = op.overloadpacket.__name__",
                  "    return CheckpointPolicy.MUST_SAVE if name in KEEP_OPS else CheckpointPolicy.PREFER_RECOMPUTE",
                  "", ""]
        extra += ", context_fn=functools.partial(create_selective_checkpoint_contexts, keep_policy)"
    if policy.exclude:
        lines.append(f"EXCLUDE = {_list(sorted(policy.exclude, key=_natural))}  # kept from the forward, never "
                     "recomputed")
        lines += ["for name in EXCLUDE:",
                  "    parent, _, child = name.rpartition('.')",
                  f"    owner = {model}.get_submodule(parent) if parent else {model}",
                  "    setattr(owner, child, ckpt_viz.checkpoint_exclude_wrapper(getattr(owner, child)))"]
    lines += ["for name in CHECKPOINT:",
              f"    block = {model}.get_submodule(name)",
              f"    block.forward = functools.partial({fn}, block.forward, {extra})",
              f"if getattr(getattr({model}, 'config', None), 'use_cache', None):",
              f"    {model}.config.use_cache = False  # Hugging Face: no KV cache while layers are checkpointed"]
    return "\n".join(lines) + "\n"
