"""Replays that do not reproduce their forward: small models that show each kind, and their broken runs.

Owns the models (a decoder whose blocks append keys and values to a cache object they are
handed, a block with BatchNorm, a dropout block) as `ModelSpec` factories, and the broken
scenarios that record them in reentrant mode (registered in `ckpt_viz.run.broken.BROKEN`
when that module loads this one). What the runtime detects is NOTE [ Replay divergence
checks ] in `ckpt_viz.runtime.divergence`. Imports torch; never the UI.

NOTE [ The cached decoder ]
  1. `TinyDecoder(use_cache=True)` makes one `KVCache` per forward and hands it to every
     block, as Hugging Face models do with their `DynamicCache` when `use_cache` is on.
  2. A block appends its keys and values to the cache and attends to the first T cached
     positions (T: the sequence length; the mask covers the positions of this sequence).
  3. Under a reentrant checkpoint the forward runs without grad, so the cache keeps
     detached keys. The replay appends again and attends to those first T positions:
     the forward's keys. Its output is numerically identical, but the key and value
     projections get no gradient: the silent wrong result of HF GPT-2 with its cache on.
  4. `use_cache=False` gives the same model without the cache: its replays reproduce
     their forward, and every mode gives the unchecked model's gradients.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ckpt_viz.run.blocks import checkpointed
from ckpt_viz.run.zoo import ModelSpec

__all__ = ["KVCache", "TappedStack", "TinyDecoder", "batchnorm_spec", "decoder_spec", "dropout_block_spec",
           "run_reentrant", "tapped_spec"]


class KVCache:
    """The keys and values each layer appended, in order (a plain object, as HF's caches are)."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's keys and values for `layer` and return everything cached for it."""
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        old_k, old_v = self.keys[layer], self.values[layer]
        self.keys[layer] = k if old_k is None else torch.cat([old_k, k], dim=1)
        self.values[layer] = v if old_v is None else torch.cat([old_v, v], dim=1)
        return self.keys[layer], self.values[layer]


class CachedBlock(nn.Module):
    """Single-head causal attention and an MLP; keys and values go through the cache when one is given."""

    def __init__(self, width: int, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.norm = nn.LayerNorm(width)
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.o = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        length = x.shape[1]
        k, v = k[:, :length], v[:, :length]  # NOTE [ The cached decoder ], rule 2
        scores = q @ k.transpose(1, 2) / math.sqrt(x.shape[-1])
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        x = x + self.o(scores.masked_fill(mask, float("-inf")).softmax(-1) @ v)
        return x + self.mlp(x)


class TinyDecoder(nn.Module):
    """`blocks` cached blocks and a head; with `use_cache` one KVCache per forward goes to every block."""

    def __init__(self, width: int = 16, blocks: int = 2, use_cache: bool = True) -> None:
        super().__init__()
        self.use_cache = use_cache
        self.blocks = nn.ModuleList(CachedBlock(width, i) for i in range(blocks))
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = KVCache() if self.use_cache else None
        for block in self.blocks:
            x = block(x, cache)
        return self.head(x)


class NormBlock(nn.Module):
    """Linear, BatchNorm and ReLU with a residual: its running statistics change at every forward."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.bn = nn.BatchNorm1d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.bn(self.fc(x)))


class DropoutBlock(nn.Module):
    def __init__(self, width: int, p: float = 0.5) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.fc(x)))


class Taps:
    """A collector of activations (the model's feature taps), handed to every block."""

    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []


class TappedBlock(nn.Module):
    """A block that appends its hidden activation to the taps object it is handed."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, taps: Taps) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        taps.items.append(h.detach())
        return x + h


class TappedStack(nn.Module):
    """Blocks that share one Taps object per forward, then a head."""

    def __init__(self, width: int, blocks: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TappedBlock(width) for _ in range(blocks))
        self.head = nn.Linear(width, width)
        self.taps = Taps()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.taps = Taps()
        for block in self.blocks:
            x = block(x, self.taps)
        return self.head(x)


def _stack(blocks: list[nn.Module], width: int) -> nn.Module:
    from ckpt_viz.run.zoo import Stack

    return Stack(blocks, width)


def decoder_spec(use_cache: bool = True, seed: int = 0, width: int = 16, length: int = 6) -> ModelSpec:
    """The decoder of NOTE [ The cached decoder ], its two blocks checkpointed."""
    torch.manual_seed(seed)
    name = "cached-decoder" if use_cache else "decoder"
    return ModelSpec(name=name, model=TinyDecoder(width, 2, use_cache), inputs=(torch.randn(2, length, width),),
                     checkpoint=("blocks.0", "blocks.1"), source="divergent",
                     description="A decoder whose blocks append keys and values to a cache object they are handed"
                     if use_cache else "The same decoder without its cache")


def batchnorm_spec(seed: int = 0, width: int = 16) -> ModelSpec:
    """Two Linear + BatchNorm blocks, both checkpointed: each replay updates the running statistics again."""
    torch.manual_seed(seed)
    model = _stack([NormBlock(width), NormBlock(width)], width)
    return ModelSpec(name="batchnorm", model=model, inputs=(torch.randn(8, width),),
                     checkpoint=("blocks.0", "blocks.1"), source="divergent",
                     description="Linear + BatchNorm blocks under checkpointing")


def dropout_block_spec(seed: int = 0, width: int = 16) -> ModelSpec:
    """Two dropout blocks (p=0.5), both checkpointed."""
    torch.manual_seed(seed)
    model = _stack([DropoutBlock(width), DropoutBlock(width)], width)
    return ModelSpec(name="dropout-blocks", model=model, inputs=(torch.randn(8, width),),
                     checkpoint=("blocks.0", "blocks.1"), source="divergent", description="Dropout blocks")


def tapped_spec(seed: int = 0, width: int = 16) -> ModelSpec:
    """Two blocks that append to a shared taps object, both checkpointed."""
    torch.manual_seed(seed)
    return ModelSpec(name="tapped", model=TappedStack(width), inputs=(torch.randn(8, width),),
                     checkpoint=("blocks.0", "blocks.1"), source="divergent",
                     description="Blocks that append their activations to an object they are handed")


def run_reentrant(spec: ModelSpec, **checkpoint_kwargs: object) -> None:
    """Forward, loss and backward with the spec's blocks under reentrant checkpoints (inside a recording)."""
    model = spec.model
    model.train()
    x = spec.inputs[0].clone().requires_grad_(True)
    if checkpoint_kwargs:
        from ckpt_viz.runtime import checkpoint

        def wrap(block: nn.Module) -> None:
            original = block.forward
            block.forward = lambda *a, **k: checkpoint(original, *a, use_reentrant=True, **checkpoint_kwargs, **k)

        subs = [model.get_submodule(name) for name in spec.checkpoint]
        for sub in subs:
            wrap(sub)
        try:
            loss = spec.loss_of(model(x))
        finally:
            for sub in subs:
                del sub.forward
    else:
        with checkpointed(model, spec.checkpoint, use_reentrant=True):
            loss = spec.loss_of(model(x))
    loss.backward()


# ---------------------------------------------------------------- broken runs (the lines a trace points at)

def _cache_in_replay(run: object) -> None:
    run_reentrant(decoder_spec(use_cache=True))  # every block is handed the live cache; each replay appends again


def _taps_appended_twice(run: object) -> None:
    run_reentrant(tapped_spec())  # each replay appends to the taps object again


def _dropout_without_rng_state(run: object) -> None:
    run_reentrant(dropout_block_spec(), preserve_rng_state=False)  # the replay draws another dropout mask


def _batchnorm_updated_twice(run: object) -> None:
    run_reentrant(batchnorm_spec())  # each replay updates the running statistics again


def _register() -> None:
    """Add the scenarios to `ckpt_viz.run.broken.BROKEN` (its NOTE [ Adding a broken scenario ], rule 2)."""
    from ckpt_viz.run.broken import BROKEN, BrokenScenario

    BROKEN.update({
        "cache-in-replay": BrokenScenario("A KV cache handed to checkpointed blocks", "replay_lost_gradient",
                                          _cache_in_replay, mode="reentrant"),
        "taps-appended-twice": BrokenScenario("Blocks append to an object they are handed", "replay_input_mutated",
                                              _taps_appended_twice, mode="reentrant"),
        "dropout-without-rng-state": BrokenScenario("Dropout without preserve_rng_state", "replay_outputs_differ",
                                                    _dropout_without_rng_state, mode="reentrant"),
        "batchnorm-updated-twice": BrokenScenario("BatchNorm statistics updated in the replay",
                                                  "replay_updated_buffers", _batchnorm_updated_twice,
                                                  mode="reentrant"),
    })


_register()
