"""torchviz's own drawing at snapshot time (ckpt_viz.probe.makedot): make_dot's drawing kept in the trace as data
(never DOT text: NOTE [ make_dot as data ]), taken without a replay."""
from __future__ import annotations

import warnings

import pytest
import torch

from ckpt_viz.probe.graph import capture_graph
from ckpt_viz.run.zoo import build_builtin
from ckpt_viz.runtime.checkpoint import checkpoint
from ckpt_viz.trace import TorchvizGraph, TorchvizNode, Trace

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import torchviz


def _counted_excluded_model() -> tuple[torch.nn.Module, torch.Tensor, list[int]]:
    """The built-in `excluded` model (an excluded LayerNorm inside each non-reentrant block); counts fc1 forwards."""
    spec = build_builtin("excluded")
    calls = [0]
    for block in spec.model.blocks:
        block.fc1.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return spec.model, spec.inputs[0], calls


def _forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return model.head(x).pow(2).sum()


def test_make_dot_of_the_real_graph_replays_a_non_reentrant_checkpoint() -> None:
    """Why the probe does not hand make_dot the real graph: even with show_saved and show_attrs off, make_dot reads
    the recompute boundary's `saved_tensors`, which replays the region outside backward, where the excluded
    LayerNorm has no cached output to serve (this is also the forward counter's control)."""
    from ckpt_viz.errors import ExcludedRegionError

    model, x, calls = _counted_excluded_model()
    loss = _forward(model, x)
    assert calls[0] == 3
    with pytest.raises(ExcludedRegionError, match="No cached forward output"):
        torchviz.make_dot(loss, params=dict(model.named_parameters()), show_attrs=False, show_saved=False)
    assert calls[0] > 3  # blocks ran their forward again before the error
    with pytest.raises(ExcludedRegionError):  # the broken region fails backward too, which releases its frames
        loss.backward()


def test_the_snapshot_keeps_make_dots_drawing_without_a_replay() -> None:
    model, x, calls = _counted_excluded_model()
    loss = _forward(model, x)
    names = {id(p): n for n, p in model.named_parameters()}
    snapshot = capture_graph(loss, label="before backward", names=names)
    assert calls[0] == 3, "taking the snapshot replayed a checkpoint"
    drawing = snapshot.torchviz
    assert isinstance(drawing, TorchvizGraph) and drawing.nodes and drawing.edges
    labels = {n.label for n in drawing.nodes}
    assert "NativeLayerNormBackward0" in labels and "_RecomputeBoundaryBackward" in labels
    assert TorchvizNode(id=next(n.id for n in drawing.nodes if n.label.startswith("blocks.0.fc1.weight")),
                        label="blocks.0.fc1.weight\n (128, 32)", fill="lightblue") in drawing.nodes  # make_dot's own
    assert "darkolivegreen1" in {n.fill for n in drawing.nodes}  # the output tensor, green in torchviz
    ids = {n.id for n in drawing.nodes}
    assert all(e.tail in ids and e.head in ids for e in drawing.edges)
    loss.backward()
    assert calls[0] == 6  # one replay per block, in backward, as without a snapshot
    # make_dot names nodes by id(); the stored drawing is renumbered, so two runs give the same one.
    loss = _forward(model, x)
    again = capture_graph(loss, label="before backward", names=names)
    loss.backward()  # (an excluded region's frames whose outputs die without a backward stay alive: known leak)
    assert again.torchviz == drawing


def test_recorded_traces_keep_the_drawing_through_a_save(tmp_path) -> None:
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    trace = obtain_trace(RunRequest("builtin", "mlp", mode="nonreentrant"))
    assert trace.graphs and all(g.torchviz and "AddmmBackward0" in {n.label for n in g.torchviz.nodes}
                                for g in trace.graphs)
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    assert [g.torchviz for g in loaded.graphs] == [g.torchviz for g in trace.graphs]


def test_without_torchviz_the_snapshot_has_no_drawing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torchviz", None)  # `import torchviz` now raises ImportError
    w = torch.ones(3, requires_grad=True)
    snapshot = capture_graph((w * 2).sum(), label="x")
    assert snapshot.torchviz is None and snapshot.nodes


def test_torchviz_imports_with_the_distutils_of_setuptools() -> None:
    """torchviz 0.0.3 imports `distutils.version`; from Python 3.12 only setuptools' copy exists, and pyproject
    declares setuptools there. The venv already imports that copy (setuptools' distutils-precedence hook),
    so this is the path 3.12 takes."""
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-W", "ignore", "-c",
                          "import torchviz, distutils.version as v; print(v.__file__)"],
                         capture_output=True, text=True, check=True).stdout
    assert "setuptools" in out
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    deps = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert '"torchviz>=0.0.3"' in deps and "\"setuptools>=68; python_version >= '3.12'\"" in deps


def test_a_trace_file_with_a_bad_torchviz_field_is_refused(tmp_path) -> None:
    import json

    from ckpt_viz import TraceError
    from ckpt_viz.trace import GraphSnapshot

    drawing = TorchvizGraph(nodes=(TorchvizNode(id="n0", label="SumBackward0"),), edges=())
    trace = Trace(graphs=[GraphSnapshot(seq=-1, label="x", torchviz=drawing)])
    trace.save(tmp_path / "ok.json")
    assert Trace.load(tmp_path / "ok.json").graphs[0].torchviz == drawing
    doc = json.loads((tmp_path / "ok.json").read_text())
    for bad in (5, "digraph { n0 [URL=\"javascript:alert(1)\"] }", {"nodes": [{"id": "x;y", "label": "a"}],
                                                                     "edges": []}):
        doc["graphs"][0]["torchviz"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        with pytest.raises(TraceError, match=r"field graphs\[0\]\.torchviz"):
            Trace.load(tmp_path / "bad.json")
    with pytest.raises(TraceError, match=r"field graphs\[0\]\.torchviz"):
        Trace(graphs=[GraphSnapshot(seq=-1, label="x", torchviz="digraph {}")]).save(tmp_path / "text.json")
