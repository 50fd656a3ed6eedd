"""Hugging Face models through their own checkpointing: tiny GPT-2 and Llama (random init) in every mode.

Each mode's gradients are compared with the unchecked model run outside ckpt_viz, bit for
bit; pipeline mode (the models cut into stages by examples/hf_gpt2.py) with the
micro-batches run one by one. Needs the `transformers` extra.
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from ckpt_viz.errors import CkptVizError
from ckpt_viz.run import scenarios
from ckpt_viz.run.harness import grad_digest
from ckpt_viz.run.scenarios import MODES, run_scenario
from ckpt_viz.run.zoo import ModelSpec
from ckpt_viz.usermodel.load import ModelLoadError, load_model

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "examples" / "hf_gpt2.py"
SINGLE = [m for m in MODES if m != "pipeline"]
BLOCKS = {"make_model": ["transformer.h.0", "transformer.h.1"], "make_llama": ["model.layers.0", "model.layers.1"]}


@pytest.fixture(scope="module", params=sorted(BLOCKS))
def spec(request: pytest.FixtureRequest) -> ModelSpec:
    return load_model(f"{EXAMPLE}:{request.param}")


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _reference(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """The unchecked model, outside ckpt_viz: HF's checkpointing off, the cache off (as in training)."""
    spec.model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    spec.loss(spec.model(*spec.inputs, **spec.kwargs, use_cache=False), spec.targets).backward()
    return _grads(spec.model)


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    different = [n for n in want if not torch.equal(got[n], want[n])]
    assert not different, f"gradients differ in {different[:3]}"


@pytest.mark.parametrize("mode", SINGLE)
def test_every_mode_is_bit_exact_with_the_unchecked_model(spec: ModelSpec, mode: str) -> None:
    want = _reference(spec)
    trace = run_scenario(spec, mode)
    _assert_equal(_grads(spec.model), want)
    created = trace.of_kind("handle_created")
    # 1. No checkpoint in mode "none"; one handle per block otherwise, named by its qualified name.
    assert [e.function for e in created] == ([] if mode == "none" else BLOCKS[spec.extra["factory"]])
    # 2. The call site is the training step's forward line, not transformers' or torch's: here the step is
    #    ckpt_viz's built-in one, which stands for a user's step whoever calls it (NOTE [ The user's line ] in
    #    ckpt_viz/sites.py, rule 1; a user's own loop is test_observe_hf.py's).
    assert {e.site for e in created} <= {_forward_line(mode)}


def _forward_line(mode: str) -> str:
    """`ckpt_viz/run/scenarios.py:N`, N the line of the built-in step's `model(...)` call for `mode`."""
    lines = inspect.getsource(scenarios).splitlines()
    calls = [n for n, text in enumerate(lines, start=1) if "loss = spec.loss_of(model(" in text]
    assert len(calls) == 2, calls  # the unsplit modes' call, then the split modes'
    return f"ckpt_viz/run/scenarios.py:{calls[mode.startswith('split')]}"


def test_the_model_is_left_as_it_was(spec: ModelSpec) -> None:
    model = spec.model
    flags = {n: m.__dict__.get("gradient_checkpointing") for n, m in model.named_modules()}
    use_cache = model.config.use_cache
    run_scenario(spec, "split-nonreentrant")
    assert {n: m.__dict__.get("gradient_checkpointing") for n, m in model.named_modules()} == flags
    assert model.config.use_cache is use_cache is True
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


@pytest.mark.parametrize("factory", ["make_gpt2_stages", "make_llama_stages"])
def test_pipeline_stages_match_the_microbatches_run_one_by_one(factory: str) -> None:
    spec = load_model(f"{EXAMPLE}:{factory}")
    full = _reference_batches(spec, 1)
    one_by_one = _reference_batches(spec, 2)
    trace = run_scenario(spec, "pipeline", microbatches=2, schedule="ZB-H1")
    got = _grads(spec.model)
    _assert_equal(got, one_by_one)  # See NOTE [ Loss and gradients ], rule 3, in ckpt_viz/run/pipeline.py.
    for name in full:
        torch.testing.assert_close(got[name], full[name])
    names = [e.function for e in trace.of_kind("handle_created")]
    assert sorted(names) == ["stages.0.blocks.0"] * 2 + ["stages.1.blocks.0"] * 2


def _reference_batches(spec: ModelSpec, microbatches: int) -> dict[str, torch.Tensor]:
    spec.model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    (ids,), labels = spec.inputs, spec.targets
    for x, y in zip(ids.chunk(microbatches), labels.chunk(microbatches)):
        spec.loss(spec.model(x), y).backward()
    return _grads(spec.model)


def _write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "hf_model.py"
    path.write_text(f"import sys\nsys.path.insert(0, {str(EXAMPLE.parent)!r})\nimport torch\nimport hf_gpt2\n\n"
                    f"def make_model():\n{body}\n")
    return f"{path}:make_model"


def test_eval_mode_is_refused_at_load(tmp_path: Path) -> None:
    ref = _write(tmp_path, "    ids = torch.randint(0, 64, (2, 8))\n"
                           "    return {'model': hf_gpt2.gpt2().eval(), 'inputs': {'input_ids': ids}}")
    with pytest.raises(ModelLoadError, match=r"'model' \(GPT2LMHeadModel\) is in eval mode") as info:
        load_model(ref)
    assert str(info.value).splitlines()[-1].startswith("Tip: call model.train()")


def test_positional_inputs_to_an_hf_model_are_refused_naming_the_parameters(tmp_path: Path) -> None:
    ref = _write(tmp_path, "    ids = torch.randint(0, 64, (2, 8))\n"
                           "    return {'model': hf_gpt2.gpt2(), 'inputs': (ids, torch.ones_like(ids))}")
    with pytest.raises(ModelLoadError, match=r"inputs\[1\] -> 'past_key_values'") as info:
        load_model(ref)
    assert "'inputs': {'input_ids': ids, 'attention_mask': mask}" in str(info.value)


def test_a_misspelt_keyword_is_named(tmp_path: Path) -> None:
    ref = _write(tmp_path, "    ids = torch.randint(0, 64, (2, 8))\n"
                           "    return {'model': hf_gpt2.gpt2(), 'inputs': {'input_ids': ids, 'atention_mask': ids}}")
    with pytest.raises(ModelLoadError, match=r"inputs\['atention_mask'\] is not a parameter of "
                                             r"GPT2LMHeadModel\.forward") as info:
        load_model(ref)
    assert "did you mean 'attention_mask'" in str(info.value)


def test_an_hf_layer_in_eval_mode_is_refused_at_run_time() -> None:
    spec = load_model(f"{EXAMPLE}:make_llama")
    spec.model.eval()
    with pytest.raises(CkptVizError, match=r"layer 'model\.layers\.0' \(LlamaDecoderLayer\) is in eval mode"):
        run_scenario(spec, "reentrant")


@pytest.mark.slow  # two subprocesses, one importing transformers in the sandboxed child
def test_cli_record_split_reentrant_matches_and_info_names_the_blocks(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "ckpt_viz"]
    record = subprocess.run([*cli, "record", f"{EXAMPLE}:make_model", "--mode", "split-reentrant", "-o", str(out),
                             "--no-memory", "--no-graphs"], capture_output=True, text=True, timeout=240, env=env)
    assert record.returncode == 0, record.stderr[-2000:]
    info = subprocess.run([*cli, "info", str(out)], capture_output=True, text=True, timeout=120, env=env)
    assert info.returncode == 0, info.stderr[-2000:]
    assert "regions: h0 transformer.h.0, h1 transformer.h.1\n" in info.stdout
    assert "problems: none" in info.stdout
    # The sandboxed child's gradients are bit-equal to the unchecked model's, built here with the same seed.
    spec = load_model(f"{EXAMPLE}:make_model")
    _reference(spec)
    assert json.loads(out.read_text())["meta"]["grad_sha256"] == grad_digest(spec.model)


@pytest.mark.parametrize("mode", ["reentrant", "split-nonreentrant"])
def test_albert_shared_layer_handles_are_told_apart_by_call_index(mode: str) -> None:
    from transformers import AlbertConfig, AlbertModel

    torch.manual_seed(0)
    config = AlbertConfig(vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=16)
    model, layer = AlbertModel(config).train(), "encoder.albert_layer_groups.0.albert_layers.0"
    spec = ModelSpec("albert", model, (), lambda out: out.last_hidden_state.pow(2).sum(), (layer,),
                     kwargs={"input_ids": torch.randint(0, 64, (2, 8))})
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    spec.loss(model(**spec.kwargs)).backward()
    want = _grads(model)
    trace = run_scenario(spec, mode)
    _assert_equal(_grads(model), want)
    assert [e.function for e in trace.of_kind("handle_created")] == [layer, f"{layer}#1", f"{layer}#2"]
