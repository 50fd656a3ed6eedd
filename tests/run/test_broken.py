"""Broken runs to explore, and the debugger's findings: each broken run gets its code, clean runs get none.

Every broken scenario of `ckpt_viz.run.broken.BROKEN` is recorded once (module-scoped) with the real
runtime; its findings are checked against the code it declares, and their stories against the
recorded trace. Clean runs of every built-in model in every mode it runs give no finding.
"""
from __future__ import annotations

import importlib.util
import io
import linecache
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ckpt_viz
from ckpt_viz import catalog
from ckpt_viz.analysis.diagnosis import diagnose, explain
from ckpt_viz.codes import DIAGNOSIS_CODES
from ckpt_viz.run.broken import BROKEN, broken_scenarios, record_broken
from ckpt_viz.run.obtain import RunRequest, obtain_trace
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
BROKEN_PY = "ckpt_viz/run/broken.py"


@pytest.fixture(scope="module")
def broken() -> dict[str, Trace]:
    return {name: record_broken(name) for name in list(broken_scenarios())}


def test_the_catalog_names_the_broken_runs() -> None:
    assert catalog.BROKEN_SCENARIO_NAMES == tuple(broken_scenarios())
    for name, scenario in BROKEN.items():
        assert scenario.expected_code in DIAGNOSIS_CODES, name


def test_every_broken_run_gets_its_code(broken: dict[str, Trace]) -> None:
    for name, trace in broken.items():
        expected = BROKEN[name].expected_code
        codes = [f.code for f in diagnose(trace)]
        assert expected in codes, (name, codes)
        if BROKEN[name].run.__module__ == "ckpt_viz.run.broken":  # ours: that one finding and nothing else
            assert codes == [expected], (name, codes)
        assert trace.meta["source"] == "broken" and trace.meta["expected_code"] == expected


def test_every_code_is_reached_by_a_broken_run_or_a_recorded_test() -> None:
    by_broken = {s.expected_code for s in BROKEN.values()}
    # the refusal codes not reproduced by a broken run are recorded in tests/core/test_diagnose.py
    others = {"session_not_retaining", "released_after_backward_error", "released_after_forward_error"}
    silent = {c for c, d in DIAGNOSIS_CODES.items() if d.spec_id.startswith("S")}
    assert silent <= by_broken
    assert {c for c, d in DIAGNOSIS_CODES.items() if d.spec_id.startswith("R")} <= by_broken | others


def test_stories_are_short_and_name_the_reason_and_the_recorded_line(broken: dict[str, Trace]) -> None:
    lengths = []
    for name, trace in broken.items():
        sources = trace.meta["sources"]
        for f in diagnose(trace):
            lines = f.explanation.splitlines()
            lengths.append(len(lines))
            assert len(lines) <= 25, (name, f.explanation)
            assert lines[-1] == f"Fix: {f.fix}" and f.fix == DIAGNOSIS_CODES[f.code].fix
            assert re.search(r"\bR\d+\b|\bS\d+\b", f.explanation) is None, name  # no spec ids
            assert [e.seq for e in f.events] == sorted({e.seq for e in f.events}), name
            if f.release_event is not None and f.release_event.kind == "released":
                assert f"reason {f.release_event.reason}" in f.explanation, name
                assert f.release_event in f.events
            if f.site is not None and BROKEN[name].run.__module__ == "ckpt_viz.run.broken":
                assert f.site.startswith(BROKEN_PY + ":"), (name, f.site)  # the scenario's line, not the runtime
                assert f.site in f.explanation and sources[f.site] in f.explanation, name
    assert statistics.median(lengths) <= 15, lengths


def test_user_actions_are_among_the_events(broken: dict[str, Trace]) -> None:
    kinds = {name: {e.kind for f in diagnose(t) for e in f.events} for name, t in broken.items()}
    assert {"phase_set", "backward_entered", "released", "error"} <= kinds["dx-after-dw"]
    assert "session_cleared" in kinds["session-cleared-early"]
    assert "prefired" in kinds["prefire-after-backward"]
    assert "released" in kinds["released-by-hand"]
    (f,) = diagnose(broken["released-by-hand"])
    assert f.release_event.reason == "explicit_release"
    assert f.refused_event.kind == "replay_refused" and f.seq == f.release_event.seq


def test_a_missing_trigger_and_a_dx_without_retain_graph_are_told_apart_by_the_recorded_fact(
        broken: dict[str, Trace]) -> None:
    for name, code, freed in (("dw-without-trigger", "trigger_missing_in_dw", False),
                              ("dx-without-retain-graph", "dx_without_retain_graph", True)):
        trace = broken[name]
        (mark,) = [e for e in trace.of_kind("phase_set") if e.new == "dw"]
        assert mark.outer_graph_freed is freed
        # without torch's error (e.g. the user caught it outside the recording) the fact alone decides
        quiet = Trace(events=[e for e in trace.events if e.kind != "error"], meta=trace.meta)
        assert [f.code for f in diagnose(quiet)] == [code], name


def test_the_per_handle_form(broken: dict[str, Trace]) -> None:
    trace = broken["dw-skips-a-handle"]
    assert [f.code for f in diagnose(trace, handle=0)] == ["dw_skipped_handles"]
    assert diagnose(trace, handle=1) == []
    assert "h1" in diagnose(trace, handle=0)[0].explanation  # DW reached h1, not h0


def test_a_saved_trace_shows_the_line_as_recorded_after_the_file_changed(tmp_path: Path) -> None:
    script = tmp_path / "my_schedule.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from ckpt_viz.runtime import backward_input, backward_weight, checkpoint, reentrant_checkpoint_scope

        def step():
            x, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
            with reentrant_checkpoint_scope([w]) as handles:
                out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
            loss = (out * out).sum()
            backward_weight(loss, None, [w], handles=handles)
            try:
                backward_input(loss, None, [x], handles=handles)
            except Exception:
                pass
        """))
    spec = importlib.util.spec_from_file_location("my_schedule", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with ckpt_viz.record() as rec:
        module.step()
    rec.trace.save(tmp_path / "t.json")
    # The user edits the script: the DW line now says something else.
    lines = script.read_text().splitlines()
    dw_line = next(i for i, line in enumerate(lines, 1) if "backward_weight(" in line)
    lines[dw_line - 1] = "    pass  # edited after the run"
    script.write_text("\n".join(lines) + "\n")
    linecache.checkcache(str(script))
    (f,) = diagnose(Trace.load(tmp_path / "t.json"))
    assert f.code == "released_by_dw" and f.site.endswith(f"my_schedule.py:{dw_line}")
    assert "backward_weight(loss, None, [w], handles=handles)" in f.explanation
    assert "edited after the run" not in f.explanation


def test_explain_prints_the_last_recorded_run(broken: dict[str, Trace]) -> None:
    trace = record_broken("phase-never-set")
    out = io.StringIO()
    text = explain(file=out)
    assert out.getvalue() == text + "\n"
    assert text.startswith("phase-never-set: 1 problem found.") and "[1] phase_not_set" in text
    assert diagnose(trace)[0].explanation in text


def test_explain_before_any_recording_says_what_to_do() -> None:
    code = ("import ckpt_viz\ntry:\n    ckpt_viz.explain()\nexcept ckpt_viz.CkptVizError as exc:\n    print(exc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.startswith("ckpt_viz.explain: no run was recorded") and "\nTip: " in proc.stdout, proc


def test_ckpt_viz_explain_reads_a_saved_trace_without_torch(broken: dict[str, Trace], tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    broken["session-cleared-early"].save(path)
    code = ("import sys; from ckpt_viz.cli import main; rc = main(['explain', sys.argv[1]]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    (f,) = diagnose(broken["session-cleared-early"])
    assert proc.stdout.startswith("session-cleared-early: 1 problem found.")
    assert f.explanation in proc.stdout and "clear_recompute_session(sid)  # cleared before DW ran" in proc.stdout
    strict = subprocess.run([sys.executable, "-m", "ckpt_viz", "explain", str(path), "--strict", "--handle", "0"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert strict.returncode == 1 and "[1] session_cleared_early" in strict.stdout


def test_ckpt_viz_record_records_a_broken_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_viz.cli import main

    assert main(["record", "released-by-hand", "-o", str(tmp_path / "b.json"), "--no-memory", "--no-graphs"]) == 0
    assert "ckpt-viz explain" in capsys.readouterr().out
    assert [f.code for f in diagnose(Trace.load(tmp_path / "b.json"))] == ["released_explicitly"]


def test_the_broken_runs_are_offered_by_obtain_trace() -> None:
    trace = obtain_trace(RunRequest("broken", "dx-after-dw", memory=True, graphs=True))
    assert [f.code for f in diagnose(trace)] == ["released_by_dw"]
    assert trace.graphs and trace.memory  # the app records them with graphs and memory


# ---------------------------------------------------------------- clean runs: no finding

_CLEAN = [(model, mode) for model in catalog.BUILTIN_MODEL_NAMES for mode in catalog.MODES
          if mode != "pipeline" or model == "pipeline"]  # mode "pipeline" needs a model split into stages


@pytest.mark.parametrize(("model", "mode"), _CLEAN)
def test_clean_runs_of_every_built_in_model_give_no_finding(model: str, mode: str) -> None:
    trace = obtain_trace(RunRequest("builtin", model, mode=mode, memory=False, graphs=False))
    assert diagnose(trace) == [], [f.explanation for f in diagnose(trace)]
