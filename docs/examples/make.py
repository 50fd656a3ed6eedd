"""Regenerate the README's example traces: a 4-layer GPT-2 (transformers' GPT2Config, random init, no download),
one training step with memory recorded, once without checkpointing and once with every layer checkpointed
(ckpt_viz's non-reentrant checkpoint through HF's own mechanism, as `ckpt_viz.hf.enable(model)` sets it up).

    .venv/bin/python docs/examples/make.py

The same as `ckpt-viz record docs/examples/make.py:make_model --mode none` (and `--mode nonreentrant`): each run
samples memory at every layer's forward and backward, so the two timelines have the same points to compare.
Writes gpt2_no_checkpoint.json.gz and gpt2_checkpoint.json.gz here: open one as a saved trace in the app and the
other as its partner on the Compare page (docs/screenshots/07_compare.png).

Also zbv_2_ranks.json.gz: a real 2-rank gloo run of examples/pipelining_torchrun.py under torch's ZBVZeroBubble
(two steps, 4 micro-batches), recorded by `ckpt-viz record --distributed` and merged: the Schedule timeline's step
time and bubbles per rank and stage, and the Memory page's ranks (docs/screenshots/09_timeline.png).
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYERS, WIDTH, HEADS, VOCAB, BATCH, SEQ = 4, 128, 4, 256, 8, 64


def make_model() -> dict:
    """GPT-2 with 4 layers of width 128 (no dropout), one batch of token ids and its next-token targets."""
    import torch
    from torch import nn
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, n_positions=SEQ, vocab_size=VOCAB,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).train()  # HF checkpoints its layers only in training mode
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))

    def loss(output, labels):
        return nn.functional.cross_entropy(output.logits.flatten(0, 1), labels.flatten())

    return {"model": model, "inputs": {"input_ids": ids}, "targets": torch.roll(ids, -1, dims=1), "loss": loss}


def record_distributed() -> None:
    """The merged trace of a real 2-rank run (see the module docstring)."""
    import os
    import subprocess
    import sys
    import tempfile

    from ckpt_viz.cli.merge import merge_run

    root = HERE.parents[1]
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "ckpt_viz", "record", "--distributed", "--nproc-per-node", "2", "--out", out,
                   "--no-merge", "examples/pipelining_torchrun.py", "--schedule", "ZBVZeroBubble", "--steps", "2"]
        subprocess.run(command, cwd=root, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        (run,) = os.listdir(out)
        trace, _ = merge_run(os.path.join(out, run))
    path = HERE / "zbv_2_ranks.json.gz"
    trace.save(path)
    print(f"wrote {path}: {len(trace.events)} events, {len(trace.memory)} samples")


def main() -> None:
    import torch

    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.usermodel.load import load_model

    for mode, name in (("none", "gpt2_no_checkpoint"), ("nonreentrant", "gpt2_checkpoint")):
        torch.manual_seed(0)  # the same weights and batch in both runs
        spec = load_model(f"{__file__}:make_model")
        trace = run_scenario(spec, mode, memory=True)
        trace.meta["model"] = f"gpt2-{LAYERS}-layers"  # not this machine's path to the file
        path = HERE / f"{name}.json.gz"
        trace.save(path)
        print(f"wrote {path}: {len(trace.events)} events, {len(trace.memory)} samples")
    record_distributed()


if __name__ == "__main__":
    main()
