"""Hugging Face models in ckpt_viz: tiny GPT-2 and Llama, randomly initialised from a config (no download).

Needs the `transformers` extra: `pip install -c constraints.txt -e ".[hf]"`. Run it as it is:

    python examples/hf_gpt2.py                 # records GPT-2 in split-reentrant mode and prints a summary

or record any factory here from the command line, and look at the trace:

    ckpt-viz record examples/hf_gpt2.py:make_model --mode split-reentrant -o t.json
    ckpt-viz info t.json                       # the handles are named transformer.h.0, transformer.h.1
    ckpt-viz record examples/hf_gpt2.py:make_llama --mode reentrant -o llama.json
    ckpt-viz record examples/hf_gpt2.py:make_gpt2_stages --mode pipeline -o pipe.json

An HF model is checkpointed through HF's own mechanism (its layers call ckpt_viz's
checkpoint, with the KV cache off as HF does it), so the gradients equal the
unchecked model's in every mode. The factories show the model-file contract with
keyword inputs and targets: "inputs" is a dict of keyword arguments of model(...), and
the loss is called as loss(output, targets).
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB, BATCH, SEQ = 64, 4, 8


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token labels (the ids shifted left; the last position predicts token 0)."""
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return ids, torch.roll(ids, -1, dims=1)


def lm_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, summed over the batch (so pipeline micro-batches add up to the full batch)."""
    logits = output.logits if hasattr(output, "logits") else output
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def gpt2(layers: int = 2, *, tied: bool = True, dropout: float = 0.1) -> GPT2LMHeadModel:
    config = GPT2Config(n_layer=layers, n_embd=32, n_head=2, n_positions=SEQ, vocab_size=VOCAB,
                        bos_token_id=0, eos_token_id=0, tie_word_embeddings=tied,
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return GPT2LMHeadModel(config).train()  # HF checkpoints its layers only in training mode


def llama(layers: int = 2) -> LlamaForCausalLM:
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
                         bos_token_id=0, eos_token_id=0, pad_token_id=None)
    return LlamaForCausalLM(config).train()


def make_model() -> dict:
    """GPT-2, 2 layers of width 32 (random init), with keyword inputs and next-token targets."""
    ids, labels = _batch()
    return {"model": gpt2(), "inputs": {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
            "targets": labels, "loss": lm_loss}  # checkpoint defaults to the blocks: transformer.h.0, .1


def make_llama() -> dict:
    """Llama, 2 layers of width 32 (random init), with keyword inputs and next-token targets."""
    ids, labels = _batch()
    return {"model": llama(), "inputs": {"input_ids": ids}, "targets": labels, "loss": lm_loss}


class DecoderStage(nn.Module):
    """A run of decoder layers taken from an HF model, with the embedding before or the head after them."""

    def __init__(self, layers: list[nn.Module], *, embed: nn.Module | None = None, positions: nn.Module | None = None,
                 rotary: nn.Module | None = None, norm: nn.Module | None = None, head: nn.Module | None = None) -> None:
        super().__init__()
        self.embed, self.positions, self.rotary, self.norm, self.head = embed, positions, rotary, norm, head
        self.blocks = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        if self.embed is not None:
            x = self.embed(x) + (self.positions(position_ids) if self.positions is not None else 0)
        extra = {"position_embeddings": self.rotary(x, position_ids)} if self.rotary is not None else {}
        for block in self.blocks:
            out = block(x, **extra)  # no mask: causal attention, as the full model's for unpadded ids
            x = out[0] if isinstance(out, tuple) else out
        if self.norm is not None:
            x = self.norm(x)
        return self.head(x) if self.head is not None else x


class Stages(nn.Module):
    """The model as pipeline stages, one after another: model(ids) = stages.1(stages.0(ids))."""

    def __init__(self, stages: list[nn.Module]) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            ids = stage(ids)
        return ids


def make_gpt2_stages() -> dict:
    """GPT-2 (2 layers) cut into 2 pipeline stages: embedding + block 0, then block 1 + head."""
    # Untied, so each stage owns its weights; no dropout, as micro-batches draw other masks than the full batch.
    lm, (ids, labels) = gpt2(tied=False, dropout=0.0), _batch()
    t = lm.transformer
    stages = [DecoderStage([t.h[0]], embed=t.wte, positions=t.wpe),
              DecoderStage([t.h[1]], norm=t.ln_f, head=lm.lm_head)]
    return {"model": Stages(stages), "inputs": ids, "targets": labels, "loss": lm_loss,
            "stages": ["stages.0", "stages.1"], "checkpoint": ["stages.0.blocks.0", "stages.1.blocks.0"]}


def make_llama_stages() -> dict:
    """Llama (2 layers) cut into 2 pipeline stages: embedding + layer 0, then layer 1 + head."""
    lm, (ids, labels) = llama(), _batch()
    m = lm.model
    stages = [DecoderStage([m.layers[0]], embed=m.embed_tokens, rotary=m.rotary_emb),
              DecoderStage([m.layers[1]], rotary=m.rotary_emb, norm=m.norm, head=lm.lm_head)]
    return {"model": Stages(stages), "inputs": ids, "targets": labels, "loss": lm_loss,
            "stages": ["stages.0", "stages.1"], "checkpoint": ["stages.0.blocks.0", "stages.1.blocks.0"]}


if __name__ == "__main__":
    from ckpt_viz.cli.info import summarize
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.usermodel.load import load_model

    spec = load_model(f"{__file__}:make_model")
    print(summarize(run_scenario(spec, "split-reentrant")))
