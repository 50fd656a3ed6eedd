"""Your own Hugging Face training loop, recorded: the lines you add are marked `# ckpt_viz`.

The loop is what an engineer already has: a Llama (here tiny and randomly initialised, so
nothing is downloaded), HF's own `gradient_checkpointing_enable()`, AdamW. ckpt_viz observes
torch's checkpoint as HF set it up (nothing else changes, gradients included): one handle per
layer per step, named `model.layers.0`, ..., with its replay, its release and the memory.

    python examples/train_hf.py --out traces/          # then:
    ckpt-viz info traces/step-2.json                   # handles, replays, peak memory, problems
    streamlit run app                                  # open the trace in the app

Tested with transformers 5.23.0 (`ckpt_viz.hf.TESTED_TRANSFORMERS`).
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import ckpt_viz  # ckpt_viz


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("traces"), help="folder for one trace per step")
    parser.add_argument("--steps", type=int, default=3, help="training steps (default: 3)")
    parser.add_argument("--reentrant", action="store_true", help="use_reentrant=True (default: False, HF's)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renamed it activation_checkpointing_enable
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": args.reentrant})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, config.vocab_size, (2, 32))

    args.out.mkdir(parents=True, exist_ok=True)  # ckpt_viz
    saved = []  # ckpt_viz
    for step in range(args.steps):
        with ckpt_viz.record(model=model, memory=True) as rec:  # ckpt_viz
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        path = args.out / f"step-{step}.json"  # ckpt_viz
        rec.trace.save(path)  # ckpt_viz
        saved.append(path)  # ckpt_viz
        print(f"step {step}: loss {loss.item():.4f}, {rec.trace.count('handle_created')} handles, "  # ckpt_viz
              f"{len(rec.trace.memory)} memory samples -> {path}")  # ckpt_viz
    return saved


if __name__ == "__main__":
    main()
