"""A stock Hugging Face GPT-2 with its KV cache on, checkpointed block by block (reentrant): a silent wrong result.

The model hands its live `DynamicCache` to every block; each replay appends to it again and
attends to the keys the forward stored there. The gradients are wrong (not a crash), and the
recording must say why. Through the model's own checkpointing (which turns the cache off) the
same model gives no finding. Random init from a tiny config: nothing is downloaded.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from ckpt_viz import diagnose
from ckpt_viz.recording import record
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.runtime import checkpoint
from ckpt_viz.usermodel.load import load_model

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "hf_gpt2.py"


def _gpt2() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=16, vocab_size=32, attn_pdrop=0.0,
                                     resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).train()


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def test_gpt2_with_its_cache_on_checkpointed_block_by_block_gets_a_finding() -> None:
    from transformers import DynamicCache

    model = _gpt2()
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    model(ids, labels=ids, use_cache=False).loss.backward()
    want = _grads(model)
    for block in model.transformer.h:  # every block's forward under a reentrant checkpoint; the cache stays on
        block.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=True, **k))(block.forward)
    with record(model=model) as rec:
        out = model(ids, labels=ids)
        assert isinstance(out.past_key_values, DynamicCache)  # the cache really was on
        out.loss.backward()
    got = _grads(model)
    # The silent wrong result is real: the gradients differ from the unchecked model's.
    assert max((got[n] - want[n]).abs().max().item() for n in want) > 1e-3
    findings = diagnose(rec.trace)
    created = [e.handle_id for e in rec.trace.of_kind("handle_created")]  # one per block
    assert len(created) == 2
    assert {(f.code, f.handle_id) for f in findings} >= {("replay_input_mutated", h) for h in created}
    first = next(f for f in findings if f.code == "replay_input_mutated")
    assert "past_key_values" in first.explanation and "use_cache=False" in first.fix


def test_gpt2_through_its_own_checkpointing_has_no_divergence() -> None:
    spec = load_model(f"{EXAMPLE}:make_model")
    trace = run_scenario(spec, "reentrant")
    assert trace.of_kind("replay_started") and not trace.of_kind("replay_diverged")
