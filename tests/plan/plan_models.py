"""Models the plan tests run: tiny Hugging Face GPT-2 and Llama (random init from configs; nothing downloads)."""
from __future__ import annotations

import torch
from torch import nn

from ckpt_viz.run.zoo import ModelSpec

VOCAB = 96


def lm_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy summed over the batch."""
    logits = output.logits if hasattr(output, "logits") else output
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def hf_spec(family: str, layers: int = 6, *, width: int = 64, batch: int = 4, seq: int = 32,
            seed: int = 0) -> ModelSpec:
    """An HF causal LM ("gpt2" or "llama") with `layers` layers, as a ModelSpec over its decoder layers."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if family == "gpt2":
            config = GPT2Config(n_layer=layers, n_embd=width, n_head=4, n_positions=seq, vocab_size=VOCAB,
                                bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
            model = GPT2LMHeadModel(config).train()
            names = tuple(f"transformer.h.{i}" for i in range(layers))
        else:
            config = LlamaConfig(num_hidden_layers=layers, hidden_size=width, intermediate_size=2 * width,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                 max_position_embeddings=seq, bos_token_id=0, eos_token_id=0, pad_token_id=None)
            model = LlamaForCausalLM(config).train()
            names = tuple(f"model.layers.{i}" for i in range(layers))
        ids = torch.randint(0, VOCAB, (batch, seq))
    return ModelSpec(f"hf-{family}", model, (), loss=lm_loss, checkpoint=names, kwargs={"input_ids": ids},
                     targets=torch.roll(ids, -1, dims=1), source="user")
