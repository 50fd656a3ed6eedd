"""The command line: record, info, export --perfetto, app, demo; errors are messages, not tracebacks."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ckpt_viz import catalog
from ckpt_viz.analysis.summary import summary
from ckpt_viz.analysis.words import STATE_WORDS, format_bytes
from ckpt_viz.cli import app_path, main, summarize
from ckpt_viz.cli.info import handle_states_block
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
    assert text.startswith("model mlp  mode split-reentrant\n")
    assert "handles: 4 (reentrant 4)" in text
    assert "replays: 4\n" in text
    assert "released: 4 (DW finished: 4)" in text
    assert "peak memory" in text and "\n  parameters " in text and "checkpoint inputs" in text
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
    assert "replays: 4\n" in text
    assert "released: 4 (its backward finished: 4)" in text
    assert "handle states at the end:\n  released             4  Its rebuilt activations are freed" in text


def test_summary_counts_nonreentrant_frames_released_without_a_released_event(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    trace = run_scenario(build_builtin("mlp"), "split-nonreentrant")
    assert trace.count("released") == 0
    text = summarize(trace)
    assert "handles: 4 (nonreentrant 4)" in text
    assert "released: 4 (the backward used every recomputed tensor: 4)" in text
    assert "handle states at the end:\n  released             4  " in text
    # After DX's retaining session every frame keeps its recomputed tensors; --at counts them there.
    dx_end = next(e.seq for e in trace.events if e.kind == "session_deactivated")
    trace.save(tmp_path / "t.json")
    capsys.readouterr()
    assert main(["info", str(tmp_path / "t.json"), "--at", str(dx_end)]) == 0
    out = capsys.readouterr().out
    assert f"handle states at event {dx_end}:\n  retained             4  Re-run and kept after use" in out
    assert "released: 4 (the backward used every recomputed tensor: 4)" in out  # the whole run's figures


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


# ---------------------------------------------------------------- `info` states the analysis's figures

def test_info_says_the_model_and_mode_it_was_given_and_when_none_was(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_viz.events import HandleCreated

    given = Trace.from_events([HandleCreated(seq=0, t_ns=0, handle_id=0, mode="reentrant", function="f")],
                              model="my <b>model</b>", mode="reentrant", schedule="1F1B")
    assert summarize(given).startswith("model my <b>model</b>  mode reentrant  schedule 1F1B\n")  # as given
    bare = Trace.from_events([HandleCreated(seq=0, t_ns=0, handle_id=0, mode="reentrant", function="f")])
    bare.save(tmp_path / "bare.json")
    assert main(["info", str(tmp_path / "bare.json")]) == 0
    # no model given: "?"; no mode given: the kinds its handles used, and whose (analysis.handles.observed_mode)
    assert capsys.readouterr().out.startswith("model ?  mode reentrant (ckpt_viz)\n")


def test_errors_and_partial_runs_are_never_reported_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An error no cause names, and a run that stopped early, are problems in `info` and `explain` alike."""
    from ckpt_viz.events import Error, HandleCreated

    created = HandleCreated(seq=0, t_ns=0, handle_id=0, mode="reentrant", function="f")
    raised = Trace.from_events([created, Error(seq=1, t_ns=1, where="user code", type="ValueError",
                                               message="bad shape")], model="m", mode="reentrant")
    partial = Trace.from_events([created], model="m", mode="reentrant", partial=True, partial_reason="SIGTERM")
    for name, trace, code in (("raised", raised, "error_raised"), ("partial", partial, "run_partial")):
        text = summarize(trace)
        assert "problems: none" not in text and "problems: 1\n" in text and f": {code}: " in text, text
        path = tmp_path / f"{name}.json"
        trace.save(path)
        capsys.readouterr()
        assert main(["explain", str(path), "--strict"]) == 1
        out = capsys.readouterr().out
        assert "no problem found" not in out and f"[1] {code}" in out, out
    assert "errors: 1\n" in summarize(raised) and "partial: " in summarize(partial)


_STATE_OF_WORD = {word: state for state, word in STATE_WORDS.items()}


def _figures(text: str) -> dict:
    """The figures `ckpt-viz info` printed, read back as the analysis names them."""
    lines = text.splitlines()
    found: dict = {"states": {}, "errors": 0, "refused": 0, "peak": None}
    found["model"], found["mode"] = re.match(r"^model (.*?)  mode (.*?)(  schedule .*)?$", lines[0]).group(1, 2)
    found["events"] = int(lines[1].split()[0])
    for i, line in enumerate(lines):
        if m := re.match(r"^handles: (\d+)", line):
            found["handles"] = int(m[1])
        elif m := re.match(r"^replays: (\d+)(?:, refused (\d+))?$", line):
            found["replays"], found["refused"] = int(m[1]), int(m[2] or 0)
        elif m := re.match(r"^released: (\d+)", line):
            found["released"] = int(m[1])
        elif m := re.match(r"^errors: (\d+)$", line):
            found["errors"] = int(m[1])
        elif m := re.match(r"^peak memory (.+) at event (\d+):$", line):
            found["peak"] = (m[1], int(m[2]))
        elif line.startswith("handle states at the end:"):
            for state_line in lines[i + 1:]:
                m = re.match(r"^  (\S.*?) +(\d+)  ", state_line)
                if not m:
                    break
                found["states"][_STATE_OF_WORD[m[1]]] = int(m[2])
        elif m := re.match(r"^problems: (none|\d+|not checked: this trace holds no checkpoint handle)$", line):
            found["problems"] = int(m[1]) if m[1].isdigit() else 0
            found["codes"] = tuple(re.match(r"^  (?:-|h\d+): (\w+): ", f)[1] for f in lines[i + 1:i + 1 + found[
                "problems"]])
    return found


def _summary_figures(trace: Trace) -> dict:
    s = summary(trace)
    return {"model": s.model, "mode": s.mode, "events": s.events, "handles": s.handles, "replays": s.replays,
            "refused": s.refused, "released": s.released, "states": dict(s.states), "errors": s.errors,
            "peak": None if s.peak is None else (format_bytes(s.peak.total), s.peak.seq),
            "problems": len(s.findings), "codes": s.findings}


_BUILT_IN = [("builtin", model, mode) for model in catalog.BUILTIN_MODEL_NAMES for mode in catalog.MODES
             if mode != "pipeline" or model == "pipeline"]
_BROKEN = [("broken", name, None) for name in catalog.BROKEN_SCENARIO_NAMES]


@pytest.mark.slow
@pytest.mark.parametrize(("source", "target", "mode"), _BUILT_IN + _BROKEN,
                         ids=[f"{t}-{m}" if m else t for _, t, m in _BUILT_IN + _BROKEN])
def test_info_states_the_summary_of_every_built_in_run_and_broken_run(source: str, target: str, mode: str | None,
                                                                       tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`ckpt-viz info` prints `ckpt_viz.analysis.summary.summary(trace)`'s counts, states, peak and findings (the
    object the app's pages read), from the saved file as from the recorded run."""
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    request = RunRequest(source, target, **({"mode": mode} if mode else {}), memory=True, graphs=False)
    trace = obtain_trace(request)
    expected = _summary_figures(trace)
    assert expected["peak"] is not None and expected["handles"] == sum(expected["states"].values())
    assert _figures(summarize(trace)) == expected
    trace.save(tmp_path / "t.json")
    capsys.readouterr()
    assert main(["info", str(tmp_path / "t.json")]) == 0
    assert _figures(capsys.readouterr().out) == expected == _summary_figures(Trace.load(tmp_path / "t.json"))


_RUNS = [(model, mode) for model in catalog.BUILTIN_MODEL_NAMES for mode in catalog.MODES
         if mode != "pipeline" or model == "pipeline"]
_LINE = re.compile(r"^  (\S.*?) +(\d+)  (.+)$")


@pytest.mark.slow
@pytest.mark.parametrize(("model", "mode"), _RUNS, ids=[f"{m}-{mode}" for m, mode in _RUNS])
def test_info_at_every_seq_states_the_lifecycle_counts_in_words(model: str, mode: str) -> None:
    """`ckpt-viz info --at N`'s "handle states at event N" block is the lifecycle's counts at N, each state in its
    word (`STATE_WORDS`) with its meaning, at every seq of every built-in run."""
    from ckpt_viz.analysis.lifecycle import lifecycle
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin
    from ckpt_viz.vocabulary import STATE_MEANINGS, STATES

    trace = run_scenario(build_builtin(model), mode)
    life = lifecycle(trace)
    for seq in [e.seq for e in trace.events]:
        head, *lines = handle_states_block(trace, seq)
        assert head == f"handle states at event {seq}:"
        counts = {}
        for line in lines:
            word, n, meaning = _LINE.match(line).groups()
            state = _STATE_OF_WORD[word]
            assert meaning == STATE_MEANINGS[state]
            counts[state] = int(n)
        by_handle = Counter(life.states_at(seq).values())  # each handle's own state, counted here
        assert counts == life.counts_at(seq) == {s: by_handle[s] for s in STATES if by_handle[s]}, f"seq {seq}"


def test_info_counts_handles_by_kind_of_checkpoint_from_their_events() -> None:
    """`analysis.handles.mode_counts`: a handle's kind is the mode its first event with one names; a handle whose
    events name none (created before a hand-made trace began) is "unknown"."""
    from ckpt_viz.analysis.handles import mode_counts
    from ckpt_viz.events import HandleCreated, NodeCollected, ReplayStarted

    trace = Trace.from_events([
        NodeCollected(seq=0, t_ns=0, handle_id=5),  # no mode on h5's only event
        ReplayStarted(seq=1, t_ns=1, handle_id=2, trigger="backward"),  # h2: first event without a mode...
        HandleCreated(seq=2, t_ns=2, handle_id=3, mode="nonreentrant"),
        ReplayStarted(seq=3, t_ns=3, handle_id=2, mode="reentrant", trigger="backward"),  # ...then one with it
    ])
    assert mode_counts(trace) == {"reentrant": 1, "nonreentrant": 1, "unknown": 1}
    assert "handles: 3 (reentrant 1, nonreentrant 1, unknown 1)\n" in summarize(trace)
