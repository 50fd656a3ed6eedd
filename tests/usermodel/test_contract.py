"""The model-file contract as users write it: keyword inputs, targets, stages that compose, handle labels.

Every mode's gradients are compared with the model run outside ckpt_viz; pipeline mode
with the micro-batches run one by one (bit for bit) and with the full batch (close).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_map

from ckpt_viz.errors import CkptVizError
from ckpt_viz.run.scenarios import MODES, run_scenario
from ckpt_viz.run.zoo import ModelSpec
from ckpt_viz.usermodel.load import ModelLoadError, load_model

MODEL = '''
import torch
from torch import nn


class Gate(nn.Module):
    """Stage 0: takes the batch and a keyword mask."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(6, 6) for _ in range(2))

    def forward(self, x, *, mask, scale=1.0):
        for block in self.blocks:
            x = torch.tanh(block(x)) * mask * scale
        return x


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(6, 6), nn.Linear(6, 3)])

    def forward(self, h):
        return self.blocks[1](torch.relu(self.blocks[0](h)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([Gate(), Head()])

    def forward(self, x, mask, scale=1.0):
        return self.stages[1](self.stages[0](x, mask=mask, scale=scale))


def loss(out, targets):
    return nn.functional.cross_entropy(out, targets["label"], reduction="sum") + (out * targets["weight"]).sum()


def _batch():
    x, mask = torch.randn(8, 6), (torch.rand(8, 6) > 0.2).float()
    return x, mask, {"label": torch.arange(8) % 3, "weight": torch.randn(8, 1)}


def as_inputs_dict():
    x, mask, targets = _batch()
    return {"model": Net(), "inputs": {"x": x, "mask": mask, "scale": 0.5}, "targets": targets, "loss": loss,
            "checkpoint": ["stages.0.blocks.0", "stages.0.blocks.1", "stages.1"],
            "stages": ["stages.0", "stages.1"]}


def as_args_and_kwargs():
    x, mask, targets = _batch()
    return {"model": Net(), "args": (x,), "kwargs": {"mask": mask, "scale": 0.5}, "targets": targets,
            "loss": loss, "checkpoint": ["stages.0.blocks.0", "stages.0.blocks.1", "stages.1"],
            "stages": ["stages.0", "stages.1"]}
'''


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("contract") / "kw_model.py"
    path.write_text(MODEL)
    return path


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _reference(spec: ModelSpec, microbatches: int = 1) -> dict[str, torch.Tensor]:
    """The model outside ckpt_viz, the batch cut into `microbatches` run one after another."""
    spec.model.zero_grad(set_to_none=True)
    for m in range(microbatches):
        rows = slice(m * 8 // microbatches, (m + 1) * 8 // microbatches)
        args, kwargs, targets = tree_map(lambda v, rows=rows: v[rows] if isinstance(v, torch.Tensor) else v,
                                         (spec.inputs, spec.kwargs, spec.targets))
        spec.loss(spec.model(*args, **kwargs), targets).backward()
    return _grads(spec.model)


@pytest.mark.parametrize("factory", ["as_inputs_dict", "as_args_and_kwargs"])
@pytest.mark.parametrize("mode", MODES)
def test_keyword_inputs_and_targets_in_every_mode(model_file: Path, factory: str, mode: str) -> None:
    spec = load_model(f"{model_file}:{factory}")
    assert (len(spec.inputs), sorted(spec.kwargs)) == ((0, ["mask", "scale", "x"]) if factory == "as_inputs_dict"
                                                       else (1, ["mask", "scale"]))
    if mode != "pipeline":
        want = _reference(spec)
        run_scenario(spec, mode)
        got = _grads(spec.model)
        assert all(torch.equal(got[n], want[n]) for n in want), mode
        return
    full, one_by_one = _reference(spec), _reference(spec, 4)
    trace = run_scenario(spec, "pipeline", microbatches=4, schedule="1F1B")
    got = _grads(spec.model)
    assert all(torch.equal(got[n], one_by_one[n]) for n in want_names(spec))  # NOTE [ Loss and gradients ], rule 3
    for n in full:
        torch.testing.assert_close(got[n], full[n])
    assert trace.meta["microbatches"] == 4 and len(trace.of_kind("handle_created")) == 4 * 3


def want_names(spec: ModelSpec) -> list[str]:
    return [n for n, _ in spec.model.named_parameters()]


# -- errors that name what the user wrote --


def _load_error(tmp_path: Path, source: str, factory: str = "make_model") -> str:
    path = tmp_path / "bad_model.py"
    path.write_text(MODEL + textwrap.dedent(source))
    with pytest.raises(ModelLoadError) as info:
        load_model(f"{path}:{factory}")
    message = str(info.value)
    assert message.startswith("ckpt_viz.load_model: ") and message.splitlines()[-1].startswith("Tip: ")
    return message


def test_a_misspelt_keyword_is_named_with_the_close_parameter(tmp_path: Path) -> None:
    message = _load_error(tmp_path, '''
        def make_model():
            x, mask, _ = _batch()
            return {"model": Net(), "inputs": {"x": x, "maks": mask}}
    ''')
    assert "inputs['maks'] is not a parameter of Net.forward." in message
    assert "did you mean 'mask'?" in message


def test_a_failing_forward_says_how_it_was_called(tmp_path: Path) -> None:
    message = _load_error(tmp_path, '''
        def make_model():
            x, mask, _ = _batch()
            return {"model": Net(), "args": x, "kwargs": {"mask": mask[:, :2]}}
    ''')
    assert "the trial forward of Net called as model(args, mask=kwargs['mask']) raised RuntimeError" in message


def test_a_batch_size_that_disagrees_is_named_by_key(tmp_path: Path) -> None:
    message = _load_error(tmp_path, '''
        def make_model():
            x, mask, targets = _batch()
            return {"model": Net(), "args": x, "kwargs": {"mask": mask[:4]}, "targets": targets, "loss": loss,
                    "stages": ["stages.0", "stages.1"]}
    ''')
    assert "kwargs['mask'] has 4 rows on dim 0, but args has 8" in message
    assert "micro-batches for 'stages'" in message


@pytest.mark.parametrize(("source", "expected"), [
    ('"targets": targets', "returned 'targets' but no 'loss'"),
    ('"targets": targets, "loss": lambda out: out.sum()', "loss is called as loss(output, targets), but 'loss' "
                                                         "takes (out)"),
    ('"loss": loss', "'loss' takes (out, targets), but with no 'targets' it is called as loss(output)"),
    ('"args": x', "returned both 'inputs' and 'args'"),
])
def test_targets_and_loss_must_agree(tmp_path: Path, source: str, expected: str) -> None:
    message = _load_error(tmp_path, f'''
        def make_model():
            x, mask, targets = _batch()
            return {{"model": Net(), "inputs": {{"x": x, "mask": mask}}, {source}}}
    ''')
    assert expected in message


STAGE_CASES = {
    "embedding first": ('''
        class Embedded(Net):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(10, 6)

            def forward(self, ids, mask):
                return self.stages[1](self.stages[0](self.embed(ids), mask=mask))
    ''', "Embedded", "torch.randint(0, 10, (8,))",
        "stages[0] 'stages.0' is not called with the model's inputs (an int64 tensor of shape (8,), a float32 tensor "
        "of shape (8, 6)) but with a float32 tensor of shape (8, 6), a float32 tensor of shape (8, 6): the model "
        "computes something before its first stage."),
    "something between": ('''
        class Between(Net):
            def forward(self, x, mask):
                return self.stages[1](2 * self.stages[0](x, mask=mask))
    ''', "Between", "x", "stages[1] 'stages.1' is not called with the output of stages[0] 'stages.0' alone (it got "
                         "a float32 tensor of shape (8, 6)): the model does something between them."),
    "head after": ('''
        class Headed(Net):
            def forward(self, x, mask):
                return self.stages[1](self.stages[0](x, mask=mask)).softmax(-1)
    ''', "Headed", "x", "the model's output (a float32 tensor of shape (8, 3)) is not the output of the last stage, "
                        "stages[1] 'stages.1' (a float32 tensor of shape (8, 3)): the model does something after it."),
    "out of order": ('''
        class Swapped(Net):
            def forward(self, x, mask):
                return self.stages[1](self.stages[0](x, mask=mask))
    ''', "Swapped", "x", "stages[0] 'stages.1' ran out of order (the forward ran the stages as stages.0, stages.1)"),
}


@pytest.mark.parametrize("case", sorted(STAGE_CASES))
def test_stages_that_do_not_compose_name_the_first_that_disagrees(tmp_path: Path, case: str) -> None:
    source, cls, first, expected = STAGE_CASES[case]
    stages = '["stages.1", "stages.0"]' if case == "out of order" else '["stages.0", "stages.1"]'
    message = _load_error(tmp_path, source + f'''
        def make_model():
            x, mask, _ = _batch()
            return {{"model": {cls}(), "inputs": ({first}, mask), "stages": {stages}}}
    ''')
    assert expected in message, message
    assert "Tip: list as 'stages' the submodules the model runs one after another" in message


def test_pipeline_without_stages_speaks_of_the_model_file(model_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "nostages.py"
    path.write_text(MODEL + "\n\ndef make_model():\n    x, mask, _ = _batch()\n"
                            "    return {'model': Net(), 'inputs': {'x': x, 'mask': mask}}\n")
    spec = load_model(f"{path}:make_model")
    with pytest.raises(CkptVizError, match=r"names no pipeline stages\.\nTip: return a dict with 'stages'"):
        run_scenario(spec, "pipeline")


# -- handle labels: qualified names, call index, call site --

SHARED = '''
import torch
from torch import nn


class Shared(nn.Module):
    """ALBERT-like: one layer applied three times, then a head."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleDict({"layer": nn.Linear(6, 6)})
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.encoder["layer"](x))  # LINE_SHARED
        return self.head(x)  # LINE_HEAD


def make_model():
    return {"model": Shared(), "inputs": torch.randn(4, 6), "checkpoint": ["encoder.layer", "head"]}
'''


@pytest.mark.parametrize("mode", ["nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant"])
def test_handles_carry_qualified_name_call_index_and_call_site(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "shared.py"
    path.write_text(SHARED)
    lines = {tag: i + 1 for i, line in enumerate(SHARED.splitlines()) for tag in ("LINE_SHARED", "LINE_HEAD")
             if tag in line}
    spec = load_model(f"{path}:make_model")
    created = run_scenario(spec, mode).of_kind("handle_created")
    assert [e.function for e in created] == ["encoder.layer", "encoder.layer#1", "encoder.layer#2", "head"]
    assert [e.site.rpartition(":")[2] for e in created] == [str(lines["LINE_SHARED"])] * 3 + [str(lines["LINE_HEAD"])]
    assert all(Path(e.site.rpartition(":")[0]).name == "shared.py" for e in created)
