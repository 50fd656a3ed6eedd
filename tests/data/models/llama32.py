"""A 32-layer Hugging Face Llama (tiny layers, random init from a config: nothing is downloaded), as a model file.

The graph tests open it in the app: a deep model whose checkpoint regions must be in view at the graph's
default zoom. Its layers are checkpointed through HF's own mechanism (the model-file loader does that for an HF
model), one handle per layer, named model.layers.0 ... model.layers.31.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, BATCH, SEQ, LAYERS = 32, 2, 4, 32


def _loss(output, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output.logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def make_model() -> dict:
    config = LlamaConfig(num_hidden_layers=LAYERS, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=SEQ, bos_token_id=0,
                         eos_token_id=0, pad_token_id=None)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return {"model": LlamaForCausalLM(config).train(), "inputs": {"input_ids": ids},
            "targets": torch.roll(ids, -1, dims=1), "loss": _loss}
