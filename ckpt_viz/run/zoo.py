"""Built-in models: small, seeded, and each showing one thing about checkpointing.

Owns the model zoo and the `ModelSpec` every scenario runs (built-in or user-supplied).
Imports torch; never the UI.

Each factory returns a `ModelSpec`: the model, its inputs, a loss, the names of the
submodules to checkpoint, and (for the pipeline model) how it splits into stages.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ckpt_viz.run.rng import RNG
from ckpt_viz.runtime import checkpoint_exclude_wrapper
from ckpt_viz.runtime.exclude import CheckpointExcludeWrapper

__all__ = ["BUILTIN_MODELS", "DEFAULT_MODEL", "ModelSpec", "build_builtin"]


def sum_of_squares(output: Any) -> torch.Tensor:
    """Default loss: the sum of squares of every floating tensor in the output."""
    from torch.utils._pytree import tree_flatten

    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum((t.float() ** 2).sum() for t in tensors)


@dataclass
class ModelSpec:
    """What a scenario needs to run a model.

    Attributes:
        name: shown in the app and stored in the trace's meta.
        model: the module.
        inputs: positional arguments of `model(...)`.
        loss: a function of the model's output returning a scalar; `loss(output, targets)`
            when `targets` is not None.
        checkpoint: qualified names of the submodules to checkpoint.
        stages: for pipeline scenarios, the qualified names of the stage modules in order.
        description: one line for people.
        look_at: one line for people: where to look and what to compare; never a fact about a run (the pages
            state those from the run's analysis, `ckpt_viz.analysis.claims`).
        kwargs: keyword arguments of `model(...)`.
        targets: what the loss compares the output with (a tensor or a pytree of them), or
            None; the pipeline splits it into micro-batches with the inputs.
    """

    name: str
    model: nn.Module
    inputs: tuple
    loss: Callable[[Any], torch.Tensor] = sum_of_squares
    checkpoint: tuple[str, ...] = ()
    stages: tuple[str, ...] = ()
    description: str = ""
    look_at: str = ""
    source: str = "builtin"
    extra: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    targets: Any = None

    def loss_of(self, output: Any, targets: Any = None) -> torch.Tensor:
        """The loss of `output`: `loss(output)`, or `loss(output, targets)` when there are targets."""
        return self.loss(output) if targets is None else self.loss(output, targets)


class MLPBlock(nn.Module):
    def __init__(self, width: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.fc2(torch.tanh(self.fc1(x))))


class Stack(nn.Module):
    """`blocks` applied in order, then a head."""

    def __init__(self, blocks: list[nn.Module], width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class TransformerBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True, dropout=0.0)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ClosureBlock(nn.Module):
    """Its parameters live outside the function it checkpoints: the function captures them in a closure."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width ** 0.5)
        self.bias = nn.Parameter(torch.zeros(width))
        weight, bias = self.weight, self.bias

        def body(x: torch.Tensor) -> torch.Tensor:
            return x + torch.sin(x @ weight.t() + bias)

        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class ExcludedNormBlock(nn.Module):
    """A wide MLP whose closing LayerNorm is an excluded region: kept from the forward, never recomputed."""

    def __init__(self, width: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or 4 * width
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.norm = checkpoint_exclude_wrapper(nn.LayerNorm(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.fc2(torch.relu(self.fc1(x))))


class PipelineModel(nn.Module):
    """Stages, each a stack of MLP blocks; `stages` are the pipeline's units."""

    def __init__(self, width: int, n_stages: int, blocks_per_stage: int) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            nn.Sequential(*(MLPBlock(width, 2 * width) for _ in range(blocks_per_stage))) for _ in range(n_stages)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


# NOTE [ Sizes: activations dominate ]
#   A model teaches checkpointing only if its activations outweigh its parameters and
#   gradients: then mode "none" keeps every block's activations until backward and has
#   the highest peak, while a checkpointed run keeps each block's input and recomputes
#   one block at a time. So batches (and sequences) are large and widths small: memory
#   recording sends every op through Python, so the cost of a run is the number of ops,
#   not their size, and these runs stay well under a second. tests/lessons checks that
#   every model's checkpointed modes peak below "none", but the pipeline model's: it
#   teaches schedules, and its micro-batches are small, so with memory read at every
#   module boundary and high-water mark its working tensors ("other") outweigh the
#   activations a checkpoint saves (checkpointed 48-50 KB against 40 KB with none).
#   The split modes peak above the others: DX replays every checkpoint and keeps each
#   replay's saved activations for DW, so at the peak all blocks' activations are live
#   at once (SPLIT_COST, in ckpt_viz.lessons.glossary, says it for people).



def _mlp() -> ModelSpec:
    model = Stack([MLPBlock(32, 128) for _ in range(4)], 32)
    return ModelSpec("mlp", model, (torch.randn(384, 32),), checkpoint=tuple(f"blocks.{i}" for i in range(4)),
                     description="4 residual MLP blocks, each checkpointed",
                     look_at="Memory: compare the peak with mode 'none' (Compare modes), and see how many "
                             "replays the backward holds at once in each mode")


def _transformer() -> ModelSpec:
    model = Stack([TransformerBlock(32, 4) for _ in range(3)], 32)
    return ModelSpec("transformer", model, (torch.randn(4, 64, 32),),
                     checkpoint=tuple(f"blocks.{i}" for i in range(3)),
                     description="3 pre-norm transformer blocks (attention + MLP), each checkpointed",
                     look_at="Memory: which categories fill the peak, in mode 'none' and in the checkpointed "
                             "modes (Compare modes)")


def _dropout() -> ModelSpec:
    model = Stack([MLPBlock(32, 128, dropout=0.25) for _ in range(3)], 32)
    return ModelSpec("dropout", model, (torch.randn(512, 32),), checkpoint=tuple(f"blocks.{i}" for i in range(3)),
                     description="3 MLP blocks with dropout: the replay must reuse the forward's RNG state",
                     look_at="Debugger: a replay that drew another dropout mask than its forward would be "
                             "found there as a divergence")


def _closure() -> ModelSpec:
    model = Stack([ClosureBlock(32) for _ in range(3)], 32)
    return ModelSpec("closure", model, (torch.randn(512, 32),), checkpoint=tuple(f"blocks.{i}" for i in range(3)),
                     description="3 blocks whose checkpointed function captures its parameters in a closure "
                                 "(DW reaches them only through the backward trigger)",
                     look_at="Routing (split-reentrant): how DW reaches the captured weights, through the "
                             "backward trigger or the block's inputs")


def _excluded() -> ModelSpec:
    model = Stack([ExcludedNormBlock(32) for _ in range(3)], 32)
    return ModelSpec("excluded", model, (torch.randn(512, 32),), checkpoint=tuple(f"blocks.{i}" for i in range(3)),
                     description="3 blocks with an excluded LayerNorm: its output is kept, never recomputed",
                     look_at="Memory: the 'excluded outputs' band (the LayerNorm outputs kept from the forward), "
                             "and the graph's excluded regions")


def _pipeline() -> ModelSpec:
    model = PipelineModel(8, n_stages=2, blocks_per_stage=2)
    return ModelSpec("pipeline", model, (torch.randn(64, 8),),
                     checkpoint=tuple(f"stages.{s}.{b}" for s in range(2) for b in range(2)),
                     stages=("stages.0", "stages.1"),
                     description="2 pipeline stages of 2 checkpointed MLP blocks each",
                     look_at="Lanes and memory per stage (mode 'pipeline'): compare schedules GPipe, 1F1B and "
                             "ZB-H1 by how long each stage holds its handles")


BUILTIN_MODELS: dict[str, Callable[[], ModelSpec]] = {
    "mlp": _mlp,
    "transformer": _transformer,
    "dropout": _dropout,
    "closure": _closure,
    "excluded": _excluded,
    "pipeline": _pipeline,
}
DEFAULT_MODEL = "mlp"


def build_builtin(name: str, seed: int = 0) -> ModelSpec:
    """Build a built-in model with a fixed seed."""
    if name not in BUILTIN_MODELS:
        from ckpt_viz.errors import CkptVizError

        raise CkptVizError(f"ckpt_viz.run.zoo: unknown built-in model {name!r}; expected one of "
                           f"{', '.join(sorted(BUILTIN_MODELS))}.\nTip: or pass path/to/file.py:factory.")
    with RNG.alone(), torch.random.fork_rng():  # See NOTE [ One generator per process ] in rng.py.
        torch.manual_seed(seed)
        spec = BUILTIN_MODELS[name]()
    _number_excluded_regions(spec.model)
    return spec


def _number_excluded_regions(model: nn.Module) -> None:
    """Number the model's excluded regions 0, 1, ... in module order, so every build of a model has the same ids.

    Wrappers take ids from a process-wide counter when built; a trace names them
    (`wrapper_id`, the graph's `exclude`), so a model built twice would record two traces
    that differ. The ids key caches inside one checkpoint, so unique within the model suffices.
    """
    wrappers = [m for m in model.modules() if isinstance(m, CheckpointExcludeWrapper)]
    for number, wrapper in enumerate(wrappers):
        wrapper.exclude_id = number
