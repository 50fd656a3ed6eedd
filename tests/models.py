"""Small, seeded model builders shared by the gradient-equality tests.

A `Stack` is a chain of `Block`s (linear -> activation -> optional dropout). Each
block says whether it is checkpointed and whether its parameters reach the
checkpointed function through the closure (the module itself is checkpointed) or
explicitly, as positional checkpoint arguments. `Stack.forward(x, mode=...)`
runs the very same ops for every mode, so a run with `mode="none"` is the exact
reference for a checkpointed run and their gradients compare with `torch.equal`.

Checkpoint kinds are strings from `MODES`; tests parametrise over it so that a
new kind (the non-reentrant checkpoint, excluded regions) only has to be added
here: `checkpoint_call` and `split_scope` are the two places that know a mode.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import ckpt_viz
from ckpt_viz.runtime import (
    checkpoint,
    checkpoint_exclude_wrapper,
    recompute_handle_collector_ctx,
    reentrant_checkpoint_scope,
)

__all__ = [
    "ACTIVATIONS",
    "MODES",
    "Block",
    "BlockSpec",
    "Stack",
    "assert_grads_equal",
    "block_function",
    "checkpoint_call",
    "grads",
    "leaf",
    "replays_per_handle",
    "reset_grads",
    "split_scope",
]

# Checkpoint kinds under test; excluded regions are a per-block option (BlockSpec.excluded).
MODES: tuple[str, ...] = ("reentrant", "nonreentrant")

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
}


def checkpoint_call(mode: str, function: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call `function` directly (`mode="none"`) or under the checkpoint kind `mode`."""
    if mode == "none":
        return function(*args, **kwargs)
    if mode not in MODES:
        raise ValueError(f"tests.models.checkpoint_call: unknown mode {mode!r}; expected 'none' or one of {MODES}")
    return checkpoint(function, *args, use_reentrant=mode == "reentrant", **kwargs)


@contextlib.contextmanager
def split_scope(mode: str, params: Sequence[torch.Tensor]) -> Iterator[list]:
    """Yield the list that collects the handles of a split-backward forward for `mode`."""
    if mode == "none":
        yield []
    elif mode == "reentrant":
        with reentrant_checkpoint_scope(params) as handles:
            yield handles
    elif mode == "nonreentrant":  # frames join the unified collector; the helpers need a session_id
        with recompute_handle_collector_ctx() as handles:
            yield handles
    else:
        raise ValueError(f"tests.models.split_scope: unknown mode {mode!r}; expected 'none' or one of {MODES}")


def block_function(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *,
                   activation: str = "tanh", dropout: float = 0.0, linear: Callable = F.linear) -> torch.Tensor:
    """linear -> activation -> dropout (always in training mode; skipped when p is 0)."""
    y = ACTIVATIONS[activation](linear(x, weight, bias))
    if dropout:
        y = F.dropout(y, p=dropout, training=True)
    return y


@dataclass(frozen=True)
class BlockSpec:
    """One block: its widths, activation, dropout and how it is checkpointed."""

    width_in: int
    width_out: int
    activation: str = "tanh"
    dropout: float = 0.0
    checkpointed: bool = True
    explicit: bool = False  # parameters passed as checkpoint args instead of captured by closure
    excluded: bool = False  # the linear runs as an excluded region (kept, never recomputed)


class Block(nn.Module):
    def __init__(self, spec: BlockSpec, generator: torch.Generator) -> None:
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.randn(spec.width_out, spec.width_in, generator=generator) / spec.width_in**0.5)
        self.bias = nn.Parameter(torch.randn(spec.width_out, generator=generator) * 0.1)
        # One wrapper per block: an excluded region is matched to its replay per wrapper, in call order.
        self.linear = checkpoint_exclude_wrapper(F.linear) if spec.excluded else F.linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return block_function(x, self.weight, self.bias, activation=self.spec.activation, dropout=self.spec.dropout,
                              linear=self.linear)

    def run(self, x: torch.Tensor, mode: str) -> torch.Tensor:
        """This block's forward under `mode`, following its spec."""
        if mode == "none" or not self.spec.checkpointed:
            return self(x)
        if self.spec.explicit:
            return checkpoint_call(mode, block_function, x, self.weight, self.bias,
                                   activation=self.spec.activation, dropout=self.spec.dropout, linear=self.linear)
        return checkpoint_call(mode, self, x)


class Stack(nn.Module):
    """A chain of blocks; `forward(x, mode)` checkpoints the blocks whose spec says so."""

    def __init__(self, specs: Iterable[BlockSpec], seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.blocks = nn.ModuleList(Block(spec, generator) for spec in specs)

    @classmethod
    def mlp(cls, widths: Sequence[int], *, activation: str = "tanh", dropout: float = 0.0,
            checkpointed: Sequence[bool] | None = None, explicit: Sequence[bool] | None = None,
            seed: int = 0) -> Stack:
        """Blocks widths[0] -> widths[1] -> ...; by default every block is checkpointed by closure."""
        n = len(widths) - 1
        checkpointed = [True] * n if checkpointed is None else list(checkpointed)
        explicit = [False] * n if explicit is None else list(explicit)
        return cls((BlockSpec(widths[i], widths[i + 1], activation, dropout, checkpointed[i], explicit[i])
                    for i in range(n)), seed=seed)

    @property
    def n_checkpointed(self) -> int:
        return sum(block.spec.checkpointed for block in self.blocks)

    def forward(self, x: torch.Tensor, mode: str = "none") -> torch.Tensor:
        for block in self.blocks:
            x = block.run(x, mode)
        return x


def leaf(shape: Sequence[int], *, seed: int, requires_grad: bool = True) -> torch.Tensor:
    """A fresh seeded leaf tensor (its own generator, so the global RNG is untouched)."""
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return t.requires_grad_(requires_grad)


def grads(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor | None]:
    """Clones of each tensor's `.grad` (None stays None)."""
    return [None if t.grad is None else t.grad.detach().clone() for t in tensors]


def reset_grads(tensors: Iterable[torch.Tensor]) -> None:
    for t in tensors:
        t.grad = None


def assert_grads_equal(actual: Sequence[torch.Tensor | None], expected: Sequence[torch.Tensor | None],
                       names: Sequence[str] | None = None) -> None:
    """Bit-exact equality, entry by entry; None must match None."""
    assert len(actual) == len(expected), f"{len(actual)} gradients, expected {len(expected)}"
    names = list(names) if names is not None else [f"#{i}" for i in range(len(actual))]
    for name, got, want in zip(names, actual, expected):
        if want is None:
            assert got is None, f"gradient {name}: expected None, got {got}"
            continue
        assert got is not None, f"gradient {name}: expected a tensor, got None"
        assert got.dtype == want.dtype and got.shape == want.shape, (
            f"gradient {name}: {got.dtype}{tuple(got.shape)} vs expected {want.dtype}{tuple(want.shape)}")
        assert torch.equal(got, want), f"gradient {name} differs:\n got {got}\nwant {want}"


def replays_per_handle(trace: ckpt_viz.Trace) -> dict[int, int]:
    """handle_id -> number of `replay_started` events in `trace`."""
    counts: dict[int, int] = {}
    for event in trace.of_kind("replay_started"):
        counts[event.handle_id] = counts.get(event.handle_id, 0) + 1
    return counts
