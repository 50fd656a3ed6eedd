"""AppTest of the Schedule timeline page: a merged multi-rank trace (ckpt-viz merge of a real 2-rank ZBV run kept in
tests/data/distributed) and the built-in in-process pipeline run, on the shared cursor."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.analysis.actions import actions, bubble_lines, bubble_rows, bubbles
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")
DATA = ROOT / "tests" / "data" / "distributed"


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ckpt_viz.cli import main

    run = tmp_path_factory.mktemp("merge") / "run"
    shutil.copytree(DATA, run)
    assert main(["merge", str(run)]) == 0
    return run / "merged.json"


def _errors(at: AppTest) -> list[str]:
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]


def _timeline(**state: object) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    at.switch_page("views/timeline.py").run()
    assert not _errors(at), _errors(at)
    assert [t.value for t in at.title] == ["Schedule timeline"]
    return at


def shown(markdown: str) -> str:
    """Markdown written by `ui.text.md` as the browser shows it."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace("\u2060", "")


def _at_cursor(at: AppTest) -> str:
    """The "At the cursor" line as the browser shows it (its trace text written by `ui.text.md`)."""
    (line,) = [m.value for m in at.markdown if m.value.startswith("**At the cursor:**")]
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", line).replace("\u2060", "")


def test_merged_trace_opens_on_the_timeline(merged: Path) -> None:
    at = _timeline(src_kind="Saved trace", src_trace_how="Path", src_trace_path=str(merged))
    trace = Trace.load(merged)
    charts = at.get("vega_lite_chart")
    assert len(charts) == 3  # the timeline, the memory per stage on its x, the bubbles
    spec = json.dumps(json.loads(charts[0].proto.spec), ensure_ascii=False)
    memory_x = json.loads(charts[1].proto.spec)["layer"][0]["encoding"]["x"]
    assert memory_x["title"] == "time (µs from the first event)"  # the timeline's axis, not event seqs
    # the step time and the bubble per rank and stage, as the analysis states them
    found = bubbles(trace)
    assert found.unit == "µs" and found.exact and [s.step for s in found.steps] == [0]
    (line,) = bubble_lines(trace)
    assert line.startswith("step 0: ") and "rank 0 " in line and "rank 1 " in line
    assert any(shown(m.value) == line for m in at.markdown)
    table = at.table[0].value  # its cells as st.table reads them: markdown, the trace's text escaped
    assert [shown(v) for v in table[""]] == ["rank 0", "rank 1", "stage 0", "stage 1", "stage 2", "stage 3"]
    assert [shown(v) for v in table["bubble"]] == [r["bubble"] for r in bubble_rows(trace)]
    lanes = {f"rank {r} · stage {s}" for r, stages in ((0, (0, 3)), (1, (1, 2))) for s in stages}
    assert all(lane in spec for lane in lanes)
    plan = at.dataframe[0].value
    assert list(plan["lane"]) == ["rank 0", "rank 1"] and list(plan["same"]) == [True, True]
    # walk the cursor to the next DW action (torch's W) and read what the page says about it
    at.button(key="timeline_next_DW").click().run()
    assert not _errors(at), _errors(at)
    first_dw = next(a for a in actions(trace) if a.action == "DW")
    assert _at_cursor(at).startswith(f"**At the cursor:** {first_dw.lane} runs **DW (weight grads)** "
                                     f"(torch's W) of micro-batch {first_dw.microbatch}")
    assert at.session_state["cursor"][1] == first_dw.start_seq
    for page in ("overview", "graph", "memory", "handles", "routing", "events"):  # the other pages open it too
        at.switch_page(f"views/{page}.py").run()
        assert not _errors(at), (page, _errors(at))


def test_in_process_pipeline_run_with_two_schedules_side_by_side() -> None:
    at = _timeline(src_model="pipeline", src_mode="pipeline")
    assert at.radio(key="timeline_x").value == "tick"
    assert at.selectbox(key="timeline_other").value == "GPipe"  # the run's own schedule is 1F1B
    charts = at.get("vega_lite_chart")
    assert len(charts) == 5  # the timeline, memory per stage, the bubbles, and the two schedules side by side
    memory_x = json.loads(charts[1].proto.spec)["layer"][0]["encoding"]["x"]
    assert memory_x["title"] == "schedule tick"  # on the timeline's ticks
    titles = [json.loads(c.proto.spec).get("title") for c in charts[3:]]
    assert titles == ["1F1B × 4 mb", "GPipe × 4 mb"]
    plan = at.dataframe[0].value
    assert list(plan["lane"]) == ["stage 0", "stage 1"] and list(plan["same"]) == [True, True]
    at.button(key="timeline_next_B").click().run()
    assert "runs **full backward** of micro-batch 0" in _at_cursor(at)
    assert at.button(key="timeline_next_DW").disabled  # 1F1B runs B, no DW
