"""A Hugging Face training loop as the engineer has it, recorded: `gradient_checkpointing_enable()` as it comes.

Tiny Llama and GPT-2 (random init from configs; nothing is downloaded), AdamW, three steps, both checkpoint
kinds: the recorded loop's gradients and parameters are bit-identical to the unrecorded one's, and the trace
holds one handle per layer per step, named `model.layers.k` / `transformer.h.k`, each replayed and released,
with memory samples, at the loop's own line. Then ckpt_viz's runtime through HF's mechanism (`ckpt_viz.hf`).
Tested with transformers 5.23.0 (ckpt_viz.hf.TESTED_TRANSFORMERS).
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import ckpt_viz  # noqa: E402
import ckpt_viz.hf  # noqa: E402
from ckpt_viz.analysis.handles import observed_mode  # noqa: E402
from ckpt_viz.analysis.lifecycle import lifecycle  # noqa: E402
from ckpt_viz.cli.info import summarize  # noqa: E402
from ckpt_viz.errors import CkptVizError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
STEPS = 3


def llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config)


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)  # GPT-2 keeps its dropouts (0.1): the replays must draw the forward's masks again
    config = transformers.GPT2Config(vocab_size=64, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


MODELS = {"llama": (llama, "model.layers", 3), "gpt2": (gpt2, "transformer.h", 2)}


def _loop(model: torch.nn.Module, *, recorded: bool, steps: int = STEPS) -> tuple[dict, dict, list]:
    """The engineer's loop: AdamW, a few steps; recorded in one `ckpt_viz.record()` block, or not."""
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (2, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    recording = ckpt_viz.record(model=model, memory=True) if recorded else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HF's notes on the cache and the deprecated name
        with recording if recording is not None else _nothing():
            for _ in range(steps):
                loss = model(input_ids=ids, labels=ids).loss  # LOOP_LINE: every handle's site
                loss.backward()
                grads = {n: p.grad.clone() for n, p in model.named_parameters()}
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return grads, params, [recording.trace] if recording is not None else []


def _loop_site() -> str:
    """The site of the loop's `model(...)` line, as the bus writes it (relative to the working folder)."""
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.endswith("# LOOP_LINE: every handle's site"))
    rel = os.path.relpath(__file__)
    return f"{__file__ if rel.startswith('..') else rel}:{line}"


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    assert [n for n in want if not torch.equal(got[n], want[n])] == []


def _enable(model: torch.nn.Module, use_reentrant: bool) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers 5 calls the name deprecated; engineers still use it
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    return model


@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_loop_as_it_comes_is_recorded_layer_by_layer_and_bit_identical(name: str, use_reentrant: bool) -> None:
    make, prefix, layers = MODELS[name]
    want_grads, want_params, _ = _loop(_enable(make(), use_reentrant), recorded=False)
    grads, params, (trace,) = _loop(_enable(make(), use_reentrant), recorded=True)
    # 1. recording changes nothing: the last step's gradients and the parameters after 3 AdamW steps
    _equal(grads, want_grads)
    _equal(params, want_params)
    # 2. one handle per layer per step, torch's, named by the layer's qualified name
    created = trace.of_kind("handle_created")
    assert [e.label for e in created] == [f"{prefix}.{k}" for k in range(layers)] * STEPS
    mode = "reentrant" if use_reentrant else "nonreentrant"
    assert {(e.mode, e.runtime, e.via) for e in created} == {(mode, "torch", "transformers")}
    # 3. each replayed once and released after its backward; the lifecycle agrees
    life = lifecycle(trace)
    handles = [e.handle_id for e in created]
    assert life.handle_ids == handles and len(set(handles)) == layers * STEPS
    assert [life.replays(h) for h in handles] == [1] * len(handles)
    assert [life.reason_at(h, None) for h in handles] == ["ordinary_backward_complete"] * len(handles)
    assert trace.count("replay_started") == trace.count("replay_finished") == layers * STEPS
    # 4. memory sampled at the handles' events, and the site is the loop's line, not transformers'
    assert len(trace.memory) >= 2 * layers * STEPS
    assert {e.site for e in created} == {_loop_site()}
    # 5. info names the model and the mode it saw
    text = summarize(trace)
    assert text.splitlines()[0] == f"model {type(make()).__name__}  mode {mode} (torch)"
    assert f"handles: {layers * STEPS} ({mode} {layers * STEPS})" in text and "problems: none" in text


@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_ckpt_viz_hf_enable_runs_ckpt_vizs_checkpoint_through_hfs_mechanism(name: str, use_reentrant: bool) -> None:
    make, prefix, layers = MODELS[name]
    want_grads, want_params, _ = _loop(_enable(make(), use_reentrant), recorded=False, steps=2)
    model = make()
    ckpt_viz.hf.enable(model, use_reentrant=use_reentrant)
    grads, params, (trace,) = _loop(model, recorded=True, steps=2)
    _equal(grads, want_grads)  # ckpt_viz's checkpoint gives torch's gradients, bit for bit
    _equal(params, want_params)
    created = trace.of_kind("handle_created")
    assert [e.label for e in created] == [f"{prefix}.{k}" for k in range(layers)] * 2
    mode = "reentrant" if use_reentrant else "nonreentrant"
    assert {(e.mode, e.runtime) for e in created} == {(mode, "ckpt_viz")}  # ckpt_viz's own handles
    assert observed_mode(trace) == f"{mode} (ckpt_viz)"  # the mode info states
    # HF's cache handling is kept: the layers run with the cache off under checkpointing
    assert all(m.gradient_checkpointing for m in model.modules()
               if isinstance(m, transformers.modeling_layers.GradientCheckpointingLayer))
    ckpt_viz.hf.disable(model)
    with ckpt_viz.record(model=model) as rec:
        model(input_ids=torch.randint(0, 64, (2, 8)), labels=torch.randint(0, 64, (2, 8))).loss.backward()
    assert rec.trace.count("handle_created") == 0 and observed_mode(rec.trace) == "none"


def test_hf_enable_torch_runtime_and_every_n_layers() -> None:
    model = llama()
    ckpt_viz.hf.enable(model, runtime="torch", every_n_layers=2)
    _, _, (trace,) = _loop(model, recorded=True, steps=1)
    assert [e.label for e in trace.of_kind("handle_created")] == ["model.layers.0", "model.layers.2"]
    assert observed_mode(trace) == "nonreentrant (torch)"  # HF's default kind


@pytest.mark.parametrize(("call", "message"), [
    (lambda: ckpt_viz.hf.enable(torch.nn.Linear(2, 2)), r"ckpt_viz.hf.enable: expected a transformers "
                                                        r"PreTrainedModel, got Linear\.\nTip: "),
    (lambda: ckpt_viz.hf.enable(llama(), runtime="jax"), r'runtime must be "ckpt_viz" or "torch" \(not \'jax\'\)'),
    (lambda: ckpt_viz.hf.enable(llama(), use_reentrant=1), r"use_reentrant must be True or False, got 1"),
    (lambda: ckpt_viz.hf.enable(llama(), every_n_layers=0), r"every_n_layers must be a positive int, got 0"),
])
def test_hf_enable_refuses_bad_input_clearly(call: Callable[[], None], message: str) -> None:
    with pytest.raises(CkptVizError, match=message) as info:
        call()
    assert str(info.value).splitlines()[-1].startswith("Tip: ")


def test_the_tested_transformers_version_is_the_one_installed() -> None:
    assert transformers.__version__ in ckpt_viz.hf.TESTED_TRANSFORMERS
    pinned = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("transformers==")]
    assert pinned == [f"transformers=={v}" for v in ckpt_viz.hf.TESTED_TRANSFORMERS]


@pytest.mark.slow  # a sandboxed child that imports torch and transformers
def test_a_sandboxed_hf_model_with_no_user_line_on_the_stack_names_the_models_line() -> None:
    from ckpt_viz.usermodel.sandbox import record_in_subprocess

    trace = record_in_subprocess(f"{ROOT / 'examples' / 'hf_gpt2.py'}:make_model", "nonreentrant", timeout_s=240,
                                 extra={"memory": False, "graphs": False})
    created = trace.of_kind("handle_created")
    assert [e.label for e in created] == ["transformer.h.0", "transformer.h.1"]
    # NOTE [ The user's line ] in ckpt_viz/sites.py, rule 1: a model file's run steps in ckpt_viz's built-in
    # training step, which counts as the user's line (the same line whoever runs it: the app, a test, the CLI)
    assert {Path(e.site.rpartition(":")[0]).name for e in created} == {"scenarios.py"}
