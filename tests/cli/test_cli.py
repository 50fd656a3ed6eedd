"""The command line: record, info, export --perfetto, app, demo; errors are messages, not tracebacks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_viz.cli import app_path, main, summarize
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parent.parent.parent


def test_record_info_export_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json.gz"
    assert main(["record", "mlp", "--mode", "split-reentrant", "-o", str(out)]) == 0
    trace = Trace.load(out)
    assert trace.meta["model"] == "mlp" and trace.meta["mode"] == "split-reentrant"
    assert trace.memory and trace.graphs  # samples at events, module boundaries and high-water marks
    assert {s.seq for s in trace.memory} <= {e.seq for e in trace.events}
    assert [s.seq for s in trace.memory] == sorted(s.seq for s in trace.memory)
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "handles: 4 (reentrant 4)" in text
    assert "replays per handle: 1 x4" in text
    assert "released: dw_complete 4" in text
    assert "peak memory" in text and "parameters" in text
    assert "problems: none" in text
    perfetto = tmp_path / "p.json"
    assert main(["export", str(out), "--perfetto", str(perfetto)]) == 0
    doc = json.loads(perfetto.read_text())
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert any(n.startswith("DX h") for n in names) and any(n.startswith("DW h") for n in names)
    assert any(n.startswith("replay h") for n in names) and any(n.startswith("F h") for n in names)
    assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "C"} >= {"memory: parameters", "memory: gradients"}


def test_record_pipeline_shows_progress_on_request(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_VIZ_PROGRESS", "1")
    out = tmp_path / "pipe.json"
    assert main(["record", "pipeline", "--mode", "pipeline", "--schedule", "ZB-H1", "-o", str(out)]) == 0
    err = capfd.readouterr().err
    assert "100%" in err and "[" + "#" * 30 + "]" in err
    assert Trace.load(out).meta["schedule"] == "ZB-H1"


def test_record_without_memory_or_graphs(tmp_path: Path) -> None:
    out = tmp_path / "bare.json"
    assert main(["record", "closure", "--mode", "reentrant", "--no-memory", "--no-graphs", "-o", str(out)]) == 0
    trace = Trace.load(out)
    assert trace.memory == [] and trace.graphs == [] and trace.count("replay_started") == 3


def test_summary_names_a_refused_replay_as_a_problem() -> None:
    import torch

    import ckpt_viz
    from ckpt_viz.runtime import checkpoint

    x = torch.randn(2, 3, requires_grad=True)
    with ckpt_viz.record() as rec:
        loss = checkpoint(torch.nn.Linear(3, 3), x, use_reentrant=True).sum()
        loss.backward(retain_graph=True)
        try:
            loss.backward()
        except RuntimeError:
            pass
    text = summarize(rec.trace)
    assert "problems: 1" in text and "released_by_ordinary_backward" in text


def test_summary_counts_replays_and_reasons() -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    text = summarize(run_scenario(build_builtin("mlp"), "reentrant"))
    assert "replays per handle: 1 x4  (total 4)" in text
    assert "released: ordinary_backward_complete 4" in text
    assert "handle states at the end:\n  released          4  Its rebuilt activations are freed" in text


def test_summary_counts_nonreentrant_frames_released_without_a_released_event(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    trace = run_scenario(build_builtin("mlp"), "split-nonreentrant")
    assert trace.count("released") == 0
    text = summarize(trace)
    assert "handles: 4 (nonreentrant 4)" in text and "released: consumed 4" in text
    assert "handle states at the end:\n  released          4  " in text
    # After DX's retaining session every frame keeps its recomputed tensors; --at counts them there.
    dx_end = next(e.seq for e in trace.events if e.kind == "session_deactivated")
    trace.save(tmp_path / "t.json")
    capsys.readouterr()
    assert main(["info", str(tmp_path / "t.json"), "--at", str(dx_end)]) == 0
    out = capsys.readouterr().out
    assert f"handle states at event {dx_end}:\n  retained          4  Re-run and kept after use" in out
    assert "released: consumed 4" in out  # the release figures are the whole run's


def test_errors_are_messages_with_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path / "missing.json")]) == 2
    assert "ckpt_viz.Trace.load" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckpt_viz.Trace.load") and "Tip:" in err
    assert main(["export", str(bad)]) == 2


def test_python_dash_m_and_app_entry_point() -> None:
    assert app_path() == ROOT / "app" / "streamlit_app.py"
    done = subprocess.run([sys.executable, "-m", "ckpt_viz", "--help"], capture_output=True, text=True, check=True)
    for command in ("record", "info", "export", "app", "demo"):
        assert command in done.stdout
