"""A model's batch: its positional and keyword inputs and its targets, split into micro-batches.

Owns `split_batch` (what the pipeline's stage 0 and loss get per micro-batch) and
`batch_rows` (the batch size every batched tensor must share), with errors that name
each tensor by the key the user wrote in the factory (`inputs['attention_mask']`,
`targets`). Imports torch; never the UI.

NOTE [ Splitting a batch ]
  1. Every tensor leaf with at least one dimension, in the inputs (positional and
     keyword) and the targets, is batched on dim 0, and they must all have the same
     size there: the batch size B.
  2. Everything else (0-dim tensors, Python values) goes whole to every micro-batch.
  3. Micro-batch m takes rows [m * B/M, (m + 1) * B/M) of every batched leaf, as its own
     copy (as a data loader would give it), so memory is per micro-batch.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import keystr, tree_flatten_with_path, tree_unflatten

from ckpt_viz.errors import CkptVizError

__all__ = ["batch_rows", "leaf_names", "split_batch"]


def leaf_names(roots: dict[str, str] | None = None) -> dict[str, str]:
    """How the user named the three parts: {"args": ..., "kwargs": ..., "targets": ...}."""
    return {"args": "inputs", "kwargs": "inputs", "targets": "targets", **(roots or {})}


def _name(path: tuple, roots: dict[str, str], single: bool) -> str:
    part, rest = path[0].key, path[1:]
    if part == "args" and single:
        rest = rest[1:]  # the user passed one tensor, not a tuple
    return roots[part] + keystr(rest)


def batch_rows(args: tuple, kwargs: dict[str, Any], targets: Any = None, *, api: str,
               roots: dict[str, str] | None = None, single: bool = False) -> int:
    """The batch size B shared by every batched tensor (NOTE [ Splitting a batch ], rule 1).

    Raises:
        CkptVizError: no batched tensor, or two that disagree on dim 0 (both named).
    """
    names = leaf_names(roots)
    leaves, _ = tree_flatten_with_path({"args": args, "kwargs": kwargs, "targets": targets})
    rows: list[tuple[str, int]] = [(_name(path, names, single), leaf.shape[0]) for path, leaf in leaves
                                   if isinstance(leaf, torch.Tensor) and leaf.dim() > 0]
    if not rows:
        raise CkptVizError(f"{api}: the inputs hold no tensor with a batch dimension to split into micro-batches.\n"
                           "Tip: pass the batch as a tensor whose dim 0 is the batch, e.g. torch.randn(8, 16).")
    first, size = rows[0]
    for name, n in rows[1:]:
        if n != size:
            raise CkptVizError(f"{api}: {name} has {n} rows on dim 0, but {first} has {size}; every batched tensor "
                               "must have the batch on dim 0.\n"
                               f"Tip: give {name} the batch size {size} on dim 0, or pass it as a 0-dim tensor or a "
                               "Python value if it is the same for every example.")
    return size


def split_batch(args: tuple, kwargs: dict[str, Any], targets: Any, microbatches: int, *, api: str,
                roots: dict[str, str] | None = None, single: bool = False) -> list[tuple[tuple, dict, Any]]:
    """(args, kwargs, targets) of each micro-batch; see NOTE [ Splitting a batch ].

    Raises:
        CkptVizError: the batch sizes disagree, or `microbatches` does not divide the batch.
    """
    size = batch_rows(args, kwargs, targets, api=api, roots=roots, single=single)
    if size % microbatches:
        raise CkptVizError(f"{api}: cannot split a batch of {size} into {microbatches} equal micro-batches.\n"
                           f"Tip: pick microbatches dividing {size}, "
                           f"e.g. {', '.join(str(d) for d in range(1, size + 1) if size % d == 0)}.")
    step = size // microbatches
    leaves, spec = tree_flatten_with_path({"args": args, "kwargs": kwargs, "targets": targets})
    out = []
    for m in range(microbatches):
        parts = [leaf[m * step:(m + 1) * step].detach().clone() if isinstance(leaf, torch.Tensor) and leaf.dim() > 0
                 else leaf for _, leaf in leaves]
        tree = tree_unflatten(parts, spec)
        out.append((tuple(tree["args"]), dict(tree["kwargs"]), tree["targets"]))
    return out
