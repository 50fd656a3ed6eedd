"""`load_model`: the model-file contract, and an error at the right file and line for each way it breaks."""
from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import sum_of_squares
from ckpt_viz.usermodel.load import ModelLoadError, default_checkpoint, load_model, parse_ref

ROOT = Path(__file__).resolve().parent.parent.parent
BAD = ROOT / "tests" / "data" / "bad_models"
EXAMPLE = ROOT / "examples" / "user_model.py"


def _error(ref: str) -> ModelLoadError:
    """Load `ref`, expect a ModelLoadError, and check the message shape every such error shares."""
    with pytest.raises(ModelLoadError) as info:
        load_model(ref)
    message = str(info.value)
    assert message.startswith("ckpt_viz.load_model: ")
    assert message.splitlines()[-1].startswith("Tip: ")
    return info.value


def _bad(name: str) -> ModelLoadError:
    err = _error(f"{BAD / name}:make_model")
    assert name in str(err)
    assert err.file == str(BAD / name)
    return err


def _write(tmp_path: Path, source: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


# -- errors, one fixture file each --


def test_syntax_error_names_file_and_line() -> None:
    err = _bad("syntax_error.py")
    assert err.line == 6
    assert "syntax_error.py has a syntax error at line 6" in str(err)
    assert 'syntax_error.py", line 6\n    model = torch.nn.Linear(2 2)\n' in str(err)
    assert "SyntaxError" in err.traceback


def test_missing_factory_lists_the_functions_there() -> None:
    err = _bad("no_factory.py")
    assert "has no factory 'make_model'; its functions are build." in str(err)
    assert err.line is None


def test_factory_exception_points_at_the_raise() -> None:
    err = _bad("factory_raises.py")
    assert err.line == 7
    assert "the factory make_model() raised KeyError: 'huge' (line 7 of factory_raises.py, in _width)" in str(err)
    assert 'return sizes["huge"]' in str(err)
    assert err.traceback.splitlines()[-1] == "KeyError: 'huge'"
    assert isinstance(err.__cause__, KeyError)


def test_wrong_return_type() -> None:
    err = _bad("wrong_return.py")
    assert err.line == 5  # the factory's def line
    assert "returned a torch.nn.modules.linear.Linear; expected a tuple (model, inputs)" in str(err)


def test_unknown_dict_key_lists_the_allowed_ones() -> None:
    err = _bad("unknown_key.py")
    assert "unknown key(s) 'checkpiont'; allowed keys: 'model', 'inputs', 'args', 'kwargs', 'targets', 'loss', " \
           "'checkpoint', 'stages'." in str(err)


def test_no_tensor_output() -> None:
    err = _bad("no_tensor_output.py")
    assert err.line == 11  # Scalar.forward's def line
    assert "Scalar.forward returned a float, with no floating-point tensor in it." in str(err)


def test_forward_exception_points_at_the_forward_line() -> None:
    err = _bad("forward_raises.py")
    assert err.line == 14
    assert "the trial forward of Broken raised ValueError: block 1 expects width 4, got 3 " \
           "(line 14 of forward_raises.py, in forward)" in str(err)
    assert "forward_raises.py" in err.traceback


def test_unknown_checkpoint_name_suggests_the_close_one() -> None:
    err = _bad("bad_checkpoint_name.py")
    assert "'checkpoint' names 'block.0', which is not a submodule of the model" in str(err)
    assert "did you mean 'blocks.0'" in str(err)


def test_no_container_and_no_checkpoint_key_asks_for_checkpoint() -> None:
    err = _bad("no_container.py")
    assert "found no nn.ModuleList or nn.Sequential in TwoLayers" in str(err)
    assert "'checkpoint': [names of the submodules to checkpoint], e.g. ['fc1', 'fc2']" in str(err)


# -- errors in the reference and in the dict's values --


@pytest.mark.parametrize(("ref", "expected"), [
    ("", "expected a model reference string"),
    ("some.module", "it names no factory"),
    ("not a module:make", "is neither a .py file nor a module name"),
    ("missing_dir/nope.py:make_model", "'missing_dir/nope.py' does not exist"),
    ("ckpt_viz_no_such_pkg_1234.models:make", "no module named 'ckpt_viz_no_such_pkg_1234'"),
])
def test_bad_reference(ref: str, expected: str) -> None:
    assert expected in str(_error(ref))


@pytest.mark.parametrize(("body", "expected"), [
    ("return {'model': nn.Sequential(nn.Linear(2, 2)), 'inputs': [torch.randn(1, 2)]}", "'inputs' is a list"),
    ("return nn.Sequential, torch.randn(1, 2)", "return an instance, Sequential(...), not the class"),
    ("return {'model': nn.Sequential(nn.Linear(2, 2))}", "without the required key(s) 'inputs'"),
    ("return {'model': nn.Sequential(nn.Linear(2, 2)), 'inputs': torch.randn(1, 2), 'loss': 3}",
     "'loss' is an int, not a function"),
    ("return {'model': nn.Sequential(nn.Linear(2, 2)), 'inputs': torch.randn(3, 2), 'loss': lambda y: y}",
     "the loss returned a tensor of shape (3, 2)"),
    ("return {'model': nn.Sequential(nn.Linear(2, 2)), 'inputs': torch.randn(1, 2), 'checkpoint': '0'}",
     "'checkpoint' must be a list of submodule names, got '0'"),
    ("return {'model': nn.Sequential(nn.Linear(2, 2)), 'inputs': torch.randn(1, 2), 'stages': ['0', '0']}",
     "'stages' lists '0' more than once"),
])
def test_bad_dict_values(tmp_path: Path, body: str, expected: str) -> None:
    path = _write(tmp_path, f"""\
        import torch
        from torch import nn


        def make_model():
            {body}
        """)
    err = _error(f"{path}:make_model")
    assert expected in str(err)
    assert err.file == str(path)


def test_factory_with_required_argument(tmp_path: Path) -> None:
    path = _write(tmp_path, "def build(width):\n    pass\n")
    err = _error(f"{path}:build")
    assert "the factory build() needs the argument(s) width" in str(err)
    assert err.line == 1


# -- success --


def test_tuple_form_bare_path_seeded_and_default_checkpoint(tmp_path: Path) -> None:
    path = _write(tmp_path, """\
        import torch
        from torch import nn


        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(4, 4)
                self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

            def forward(self, x):
                x = self.proj(x)
                for layer in self.layers:
                    x = torch.tanh(layer(x))
                return x


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = Encoder()
                self.head = nn.Sequential(nn.Linear(4, 2), nn.Tanh())

            def forward(self, x, scale):
                return self.head(self.encoder(x)) * scale


        def make_model():
            x = torch.randn(5, 4)
            return Net(), (x, 2.0)
        """)
    modules_before, path_before = set(sys.modules), list(sys.path)
    rng_before = torch.get_rng_state()
    spec = load_model(str(path))  # no ":factory": make_model
    assert spec.name == str(path) and spec.source == "user" and spec.extra["factory"] == "make_model"
    # The first ModuleList/Sequential in named_modules order is encoder.layers, not head.
    assert spec.checkpoint == ("encoder.layers.0", "encoder.layers.1", "encoder.layers.2")
    assert spec.stages == ()
    assert spec.loss is sum_of_squares
    # The caller's RNG, sys.modules and sys.path are as they were.
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert not {m for m in set(sys.modules) - modules_before if m.startswith("_ckpt_viz_user_model_")}
    assert sys.path == path_before
    # The factory ran under seed 0: x is the first draw after manual_seed(0).
    torch.manual_seed(0)
    assert torch.equal(spec.inputs[0], torch.randn(5, 4))
    assert spec.inputs[1] == 2.0


def test_default_checkpoint_of_a_sequential_model_is_its_children() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.ModuleList([nn.Linear(2, 2)]))
    assert default_checkpoint(model) == ("0", "1", "2")
    empty_first = nn.Module()
    empty_first.a = nn.ModuleList()
    empty_first.b = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    assert default_checkpoint(empty_first) == ("b.0", "b.1")


def test_dict_form_example_runs_in_a_scenario() -> None:
    spec = load_model(f"{EXAMPLE}:make_model")
    assert spec.checkpoint == ("blocks.0", "blocks.1", "blocks.2")
    assert spec.description == "A 3-block residual MLP classifier with a cross-entropy loss."
    assert len(spec.inputs) == 1 and spec.inputs[0].shape == (8, 16)  # a tensor became a 1-tuple
    logits = spec.model(*spec.inputs)
    expected = nn.functional.cross_entropy(logits, torch.arange(8) % 4)
    assert torch.equal(spec.loss(logits), expected)
    trace = run_scenario(spec, "reentrant")
    assert trace.count("handle_created") == 3  # one reentrant handle per checkpointed block
    assert trace.meta["model"] == f"{EXAMPLE}:make_model" and trace.meta["source"] == "user"


def test_trial_forward_leaves_buffers_untouched(tmp_path: Path) -> None:
    path = _write(tmp_path, """\
        import torch
        from torch import nn


        def make_model():
            return nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), torch.randn(6, 3) + 5
        """)
    norm = load_model(f"{path}:make_model").model[1]
    assert torch.equal(norm.running_mean, torch.zeros(3))
    assert torch.equal(norm.running_var, torch.ones(3))
    assert int(norm.num_batches_tracked) == 0


def test_package_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = f"ckv_pkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    _write(tmp_path / package, """\
        import torch
        from torch import nn


        def build():
            model = nn.Module()
            model.stages = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
            model.forward = lambda x: model.stages[1](model.stages[0](x))
            return {"model": model, "inputs": torch.randn(3, 2), "checkpoint": ["stages.1"],
                    "stages": ["stages.0", "stages.1"]}
        """, name="models.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        spec = load_model(f"{package}.models:build")
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == package]:
            monkeypatch.delitem(sys.modules, name)
    assert spec.checkpoint == ("stages.1",)
    assert spec.stages == ("stages.0", "stages.1")
    assert spec.extra["file"] == str(tmp_path / package / "models.py")


def test_example_loads_the_same_by_path_and_by_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    by_path = load_model("examples/user_model.py:make_model")
    monkeypatch.syspath_prepend(str(ROOT))
    try:
        by_module = load_model("examples.user_model:make_model")
    finally:
        monkeypatch.delitem(sys.modules, "examples.user_model", raising=False)
        monkeypatch.delitem(sys.modules, "examples", raising=False)
    assert by_module.checkpoint == by_path.checkpoint
    assert torch.equal(by_module.inputs[0], by_path.inputs[0])
    for (name_a, a), (name_b, b) in zip(by_path.model.state_dict().items(), by_module.model.state_dict().items()):
        assert name_a == name_b and torch.equal(a, b)


def test_parse_ref_shapes() -> None:
    assert (parse_ref("a/b.py:build").target, parse_ref("a/b.py:build").factory) == ("a/b.py", "build")
    assert parse_ref("b.py").factory == "make_model" and parse_ref("b.py").is_file
    assert not parse_ref("pkg.mod:make").is_file
    assert parse_ref("C:\\models\\m.py").target == "C:\\models\\m.py"  # a drive colon is not a factory


def test_trial_forward_runs_on_a_copy_of_the_inputs() -> None:
    """A forward that changes its input in place: the recorded run still gets the factory's zeros."""
    spec = load_model(f"{ROOT / 'tests' / 'data' / 'hostile' / 'mutates_inputs.py'}:make_model")
    assert torch.equal(spec.inputs[0], torch.zeros(2, 3))
    seen = []
    spec.model.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    run_scenario(spec, "reentrant")
    assert torch.equal(seen[0], torch.ones(2, 3))  # the first forward of the run: zeros + 1, once
