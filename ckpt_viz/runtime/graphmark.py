"""Marks on autograd nodes, so that a graph snapshot can tell which region built them.

Owns `mark_new_nodes`: while recording, the non-reentrant checkpoint and excluded
regions label the backward nodes they created in `node.metadata`. Reading a label never
touches saved tensors, so snapshots cannot trigger a replay. Never the UI.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["EXCLUDE_KEY", "HANDLE_KEY", "mark_new_nodes"]

HANDLE_KEY = "ckpt_viz_handle"
EXCLUDE_KEY = "ckpt_viz_exclude"


def mark_new_nodes(outputs: Any, inputs: Iterable[Any], key: str, value: Any) -> int:
    """Label every node between `outputs` and `inputs` that has no label for `key` yet; return the count."""
    stop = {id(t.grad_fn) for t in tree_flatten(list(inputs))[0]
            if isinstance(t, torch.Tensor) and t.grad_fn is not None}
    stack = [t.grad_fn for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    marked = 0
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen or id(node) in stop:
            continue
        seen.add(id(node))
        if type(node).__name__ == "AccumulateGrad" or key in node.metadata:
            continue
        node.metadata[key] = value
        marked += 1
        stack.extend(n for n, _ in node.next_functions)
    return marked
