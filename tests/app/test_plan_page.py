"""AppTest of the Plan page: a saved trace with a plan profile (every sentence, figure and the code equal to
ckpt_viz.plan's for the same file and budget; a crafted profile's text shown as text), a built-in profiled by the
page's button, a pipeline planned per schedule, and a trace the app cannot profile (how to record one)."""
from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.plan.profile import attach, profile_spec
from ckpt_viz.plan.schema import profile_of
from ckpt_viz.plan.search import format_bytes, parse_bytes, recommend
from ckpt_viz.plan.snippets import code
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")
CRAFTED = "**bold** <img src=x onerror=alert(1)> [link](http://evil.example)"


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recorded mlp run (non-reentrant) with its plan profile, the profile's label crafted."""
    trace = run_scenario(build_builtin("mlp"), "nonreentrant", memory=True)
    profile = profile_spec(build_builtin("mlp"))
    profile.label = CRAFTED
    attach(trace, profile)
    path = tmp_path_factory.mktemp("plan") / "mlp_plan.json.gz"
    trace.save(path)
    return path


def shown(markdown: str) -> str:
    """Markdown written by `ui.text.md` as the browser shows it."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown.replace("  \n", "\n")).replace("\u2060", "")


def _errors(at: AppTest) -> list[str]:
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]


def _plan(**state: object) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    at.switch_page("views/plan.py").run()
    assert not _errors(at), _errors(at)
    assert [t.value for t in at.title] == ["Plan"]
    return at


def _saved(path: Path) -> AppTest:
    return _plan(src_kind="Saved trace", src_trace_how="Path", src_trace_path=str(path))


def test_saved_trace_plan_is_the_planners_for_the_same_file_and_budget(saved: Path) -> None:
    at = _saved(saved)
    profile = profile_of(Trace.load(saved))
    assert at.selectbox(key="plan_kind").value == "nonreentrant"  # the trace's own mode
    whole = recommend(profile, 1 << 62, kind="nonreentrant")
    for text in (format_bytes((whole.floor + whole.baseline.peak) / 2), f"{whole.floor} B"):  # with units, and bytes
        at.text_input[0].set_value(text).run()
        assert not _errors(at), _errors(at)
        budget = parse_bytes(text)
        rec = recommend(profile, budget, kind="nonreentrant")
        assert rec.prediction is not None and rec.prediction.peak <= budget
        assert [shown(s.value) for s in at.success] == [rec.words]
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["Predicted peak"] == format_bytes(rec.prediction.peak)
        assert metrics["Budget"] == format_bytes(budget)
        assert metrics["Recompute per step"] == f"{rec.prediction.recompute_ns / 1e6:.2f} ms"
        rows = at.dataframe[0].value
        assert len(rows) == len(rec.curve) and list(rows["chosen"]).count("yes") == 1
        assert [c.value for c in at.code] == [code(rec.prediction.policy, runtime="torch", comment=rec.words).rstrip()]
    # the crafted label is text: escaped wherever markdown is read
    line = next(m.value for m in at.markdown if m.value.startswith("Profile of"))
    assert shown(line).startswith(f"Profile of {CRAFTED}: 4 blocks (blocks.0-3)")
    assert shown(line).endswith("the recompute is each block's replay as timed in runs of the model.")
    assert "\\<img" in line and "\\*\\*bold\\*\\*" in line and "\\]\\(http\u2060" in line  # each escaped


def test_a_budget_below_every_policy_says_the_lowest_reachable(saved: Path) -> None:
    at = _saved(saved)
    at.text_input[0].set_value("10 KiB").run()
    rec = recommend(profile_of(Trace.load(saved)), parse_bytes("10 KiB"), kind="nonreentrant")
    assert rec.prediction is None
    assert [shown(w.value) for w in at.warning] == [rec.words] and f"{format_bytes(rec.floor)}" in rec.words
    assert not at.success and not at.code
    at.text_input[0].set_value("lots").run()
    assert [shown(e.value) for e in at.error] == ["Plan: cannot read 'lots' as a size; expected a number with an "
                                                  "optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB).\nTip: e.g. "
                                                  "'1.5GiB' or '96MiB'."]


def test_a_builtin_is_profiled_by_the_button_and_planned() -> None:
    at = _plan(src_mode="reentrant")
    assert [b.label for b in at.button] == ["Profile the model"]
    assert "holds no plan profile" in shown(at.info[0].value)
    at.button(key="plan_profile_button").click().run()
    assert not _errors(at), _errors(at)
    assert at.selectbox(key="plan_kind").value == "reentrant"
    (words,) = [shown(s.value) for s in at.success]
    metrics = {m.label: m.value for m in at.metric}
    assert words.startswith("checkpoint ") and f"peak {metrics['Predicted peak']}, budget {metrics['Budget']}" in words
    assert parse_bytes(metrics["Predicted peak"]) <= parse_bytes(metrics["Budget"]) * 1.0005  # both rounded to 0.1
    assert len(at.code) == 1 and "use_reentrant=True" in at.code[0].value


def test_a_pipeline_is_planned_per_schedule(tmp_path: Path) -> None:
    spec = build_builtin("pipeline")
    trace = run_scenario(spec, "pipeline", memory=True, microbatches=4, schedule="GPipe")
    profile = profile_spec(build_builtin("pipeline"), microbatch=4, costs=False, replays=False)
    attach(trace, profile)
    trace.save(tmp_path / "pipe.json")
    at = _saved(tmp_path / "pipe.json")
    line = next(m.value for m in at.markdown if m.value.startswith("Profile of"))  # what this profile holds
    assert shown(line).endswith("no replay costs measured: the recompute is the forward alone.")
    assert at.selectbox(key="plan_schedule").value == "GPipe"
    assert at.selectbox(key="plan_kind_pipeline").value == "split-reentrant"
    for schedule in ("GPipe", "ZB-H1"):
        at.selectbox(key="plan_schedule").set_value(schedule).run()
        budget = parse_bytes(at.text_input[0].value)
        rec = recommend(profile_of(Trace.load(tmp_path / "pipe.json")), budget, schedule=schedule, microbatches=4)
        assert [shown(s.value) for s in at.success] == [rec.words] and f"under {schedule}" in rec.words


def test_a_trace_without_a_profile_says_how_to_record_one(tmp_path: Path) -> None:
    trace = run_scenario(build_builtin("mlp"), "nonreentrant")
    meta = msgspec.json.decode(msgspec.json.encode(trace.meta))
    trace.meta = {**meta, "source": "user", "model": "mine.py:make_model"}
    trace.save(tmp_path / "user.json")
    at = _saved(tmp_path / "user.json")
    assert not at.button and "ckpt_viz.plan.profiling" in at.code[0].value and "ckpt-viz plan" in at.code[0].value
