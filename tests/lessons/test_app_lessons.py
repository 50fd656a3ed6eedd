"""AppTest of the Lessons page (inside the whole app, whose navigation its links need) and the Glossary page:
predict then see, what each lesson's title promises drawn by the app's own views, knobs, links, Next lesson."""
from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.lessons.loader import load_lessons
from ckpt_viz.lessons.runner import show_step

APP = Path(__file__).resolve().parents[2] / "app"
LESSONS = load_lessons()
ASKED = [(lesson, next(i for i, s in enumerate(lesson.steps) if s.question)) for lesson in LESSONS]


def _plain(markdown: str) -> str:
    """Markdown written by the app's `ui.text.md` as the browser shows it."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown.replace("  \n", "\n")).replace("\u2060", "")


def _app() -> AppTest:
    import sys

    sys.path.insert(0, str(APP))
    at = AppTest.from_file(str(APP / "streamlit_app.py"), default_timeout=300).run()
    assert not at.exception, at.exception
    return at


def _open(at: AppTest, number: int, step: int) -> AppTest:
    """The Lessons page on lesson `number`, stepped with Next to step index `step`."""
    at.switch_page("views/lessons.py").run()
    pick = at.selectbox(key="lesson_pick")
    pick.set_value(next(o for o in pick.options if o.startswith(f"{number}."))).run()
    for _ in range(step):
        next(b for b in at.button if b.label == "Next").click().run()
    assert not at.exception, at.exception
    return at


def _chart_rows(at: AppTest) -> list[dict]:
    """Every row of every chart on the page (their Arrow datasets, named or not), and each spec as a row
    {"spec": text}."""
    import pyarrow as pa

    rows: list[dict] = []
    for chart in at.get("vega_lite_chart"):
        rows.append({"spec": chart.proto.spec})
        for data in [d.data.data for d in chart.proto.datasets] + [chart.proto.data.data]:
            if data:
                rows += pa.ipc.open_stream(io.BytesIO(data)).read_all().to_pylist()
    return rows


def _graphs(at: AppTest) -> list[str]:
    return [base64.b64decode(data).decode() for element in at.get("html")
            for data in re.findall(r'class="ckpt-graph"[^>]*src="data:image/svg\+xml;base64,([^"]+)"',
                                   element.proto.body)]


def _run_shown(at: AppTest) -> int:
    """How many things of the run the page shows: charts, graphs, tables, metrics, the cursor, the claim."""
    return (len(at.get("vega_lite_chart")) + len(_graphs(at)) + len(at.dataframe) + len(at.table) + len(at.metric)
            + len(at.slider) + sum("Checked on the run" in i.value for i in at.info))


@pytest.mark.parametrize(("lesson", "i"), ASKED, ids=[f"lesson{le.number:02d}" for le, _ in ASKED])
def test_predict_then_see_nothing_of_the_run_before_the_answer_then_the_explanation_and_the_figure(lesson, i):
    step = lesson.steps[i]
    at = _open(_app(), lesson.number, i)
    shown = show_step(lesson, step)  # the same process: the same recorded runs as the page's
    radio = at.radio(key=f"answer_{lesson.number}_{i}")
    assert radio.value is None and _plain(radio.label) == shown.question.ask
    # 1. Before an answer: the prose, the code and the question; nothing of the run, no answer.
    assert _run_shown(at) == 0, "the run is shown before the answer"
    assert not at.success and not at.error
    assert any("Predict first" in c.value for c in at.caption)
    assert [c.value for c in at.code][:1] == [shown.code.rstrip("\n")]
    page_text = " ".join(_plain(m.value) for m in (*at.markdown, *at.caption, *at.info))
    assert shown.claim not in page_text and shown.question.explain not in page_text
    # 2. A wrong answer: the right one, the explanation, the claim and the views that show why.
    wrong = next(k for k in range(len(radio.options)) if k != step.question.answer)
    radio.set_value(radio.options[wrong]).run()
    assert not at.exception, at.exception
    error = at.error[0]  # the verdict, above the views (the Debugger shows its own)
    right = shown.question.choices[step.question.answer]
    assert _plain(error.value).startswith(f"Not quite: the answer is **{right}**")
    assert shown.question.explain in _plain(error.value)
    assert any(_plain(i.value) == f"**Checked on the run:** {shown.claim}" for i in at.info)
    assert _run_shown(at) > 0
    # 3. The right answer says so.
    radio.set_value(radio.options[step.question.answer]).run()
    assert at.success and _plain(at.success[0].value) == f"Right. {shown.question.explain}"


def _answered(number: int, step: int) -> AppTest:
    at = _open(_app(), number, step)
    lesson = LESSONS[number - 1]
    if lesson.steps[step].question:
        radio = at.radio(key=f"answer_{number}_{step}")
        radio.set_value(radio.options[lesson.steps[step].question.answer]).run()
        assert not at.exception, at.exception
    return at


def _charts(at: AppTest) -> list[list[dict]]:
    """Each chart's rows (its Arrow datasets), in the page's order: a compared step's left column first."""
    import pyarrow as pa

    return [[row for data in [d.data.data for d in chart.proto.datasets] + [chart.proto.data.data] if data
             for row in pa.ipc.open_stream(io.BytesIO(data)).read_all().to_pylist()]
            for chart in at.get("vega_lite_chart")]


def _replays_per_lane(rows: list[dict]) -> dict[str, int]:
    """The lanes chart's "replaying" bars, counted per lane."""
    counts: dict[str, int] = {}
    for r in rows:
        if r.get("kind") == "interval" and r.get("state") == "replaying":
            counts[r["lane"]] = counts.get(r["lane"], 0) + 1
    return counts


def _lanes_charts(at: AppTest) -> list[list[dict]]:
    return [rows for rows in _charts(at) if any(r.get("kind") == "interval" for r in rows)]


def _stacked_memory(rows: list[dict]) -> dict[float, dict[str, int]]:
    """The memory chart's stacked rows: bytes by category at each place on the event axis."""
    at: dict[float, dict[str, int]] = {}
    for r in rows:
        if r.get("category") and r.get("bytes") is not None and r.get("x") is not None:
            at.setdefault(r["x"], {})[r["category"]] = r["bytes"]
    return at


def _events_text(at: AppTest) -> str:
    """The Events view: the code block of the events around the cursor (the first code block is the step's)."""
    return "\n".join(c.value for c in at.code if re.search(r"^\s*seq\b", c.value, re.M))


def test_lesson_1_shows_what_autograd_saves_outweighing_the_weights_in_the_memory_chart() -> None:
    from ckpt_viz.lessons.helpers import kib

    lesson = LESSONS[0]
    at = _answered(1, 0)
    shown = show_step(lesson, lesson.steps[0])
    (memory_rows,) = [rows for rows in _charts(at) if _stacked_memory(rows)]
    stacked = _stacked_memory(memory_rows)
    top = max(stacked.values(), key=lambda by: sum(by.values()))  # the drawn peak
    assert max(top, key=top.get) == "activations" and top["activations"] > top["parameters"], top
    assert kib(top["activations"]) == shown.figures["acts"] and kib(top["parameters"]) == shown.figures["params"]
    levels = {kib(by.get("activations", 0)) for by in stacked.values()}
    per_block = float(shown.figures["per_block"].removesuffix(" KiB")) * 1024
    # each block's forward adds the same activations: the chart passes through 1, 2, ... blocks' worth
    assert {kib(int(k * per_block)) for k in range(1, shown.figures["blocks"] + 1)} <= levels, levels


def test_lesson_2_shows_holders_the_recompute_and_early_stop_in_its_views() -> None:
    lesson = LESSONS[1]
    holders = _answered(2, 0)  # the events at the end of the forward: one tensor_packed per holder
    assert "tensor_packed" in _events_text(holders)
    assert any(r.get("category") == "checkpoint_inputs" for rows in _charts(holders) for r in rows)
    replay = _answered(2, 1)  # the lanes: each block's handle replays once; the events: it stops early
    (lanes,) = _lanes_charts(replay)
    assert sorted(_replays_per_lane(lanes).values()) == [1, 1, 1, 1]
    assert "replay_started" in _events_text(replay) and "early_stopped" in _events_text(replay)
    trade = _answered(2, 2)  # both sides of the trade: the peaks side by side, the recompute beside them
    shown = show_step(lesson, lesson.steps[2])
    peaks = [max(sum(by.values()) for by in _stacked_memory(rows).values())
             for rows in _charts(trade) if _stacked_memory(rows)]
    assert len(peaks) == 2 and peaks[1] < peaks[0], peaks  # left: without checkpointing; right: every block
    metrics = [(m.label, m.value) for m in trade.metric]
    assert ("Replays", str(shown.figures["replays"])) in metrics and ("Recompute time", shown.figures["recompute"]) \
        in metrics


def test_lesson_3_draws_one_region_per_block_and_the_replay_inside_each_backward() -> None:
    at = _answered(3, 0)
    (graph,) = _graphs(at)
    regions = set(re.findall(r"h(\d+) · ", graph))
    assert regions == {"0", "1", "2", "3"}, regions  # one checkpoint region per block, no holders
    at = _answered(3, 1)
    (lanes,) = _lanes_charts(at)
    assert sorted(_replays_per_lane(lanes).values()) == [1, 1, 1, 1]
    for lane in _replays_per_lane(lanes):  # replaying, then released: the replay ran inside the node's backward
        states = [r["state"] for r in sorted((r for r in lanes if r.get("lane") == lane and r.get("kind") ==
                                              "interval"), key=lambda r: r["start_seq"])]
        assert states.index("replaying") < states.index("released"), (lane, states)
    text = _events_text(at)
    assert text.index("backward_entered") < text.index("replay_started"), text


def test_lesson_7_lanes_show_one_replay_per_handle_with_a_session_and_two_without() -> None:
    at = _answered(7, 0)
    assert [_plain(s.value) for s in at.subheader][:2] == ["with a session", "without a session"]
    with_session, without = _lanes_charts(at)
    assert set(_replays_per_lane(with_session).values()) == {1} and len(_replays_per_lane(with_session)) == 4
    assert set(_replays_per_lane(without).values()) == {2} and len(_replays_per_lane(without)) == 4
    assert [m.value for m in at.metric if m.label == "Replays"] == ["4", "8"]
    prefire = _answered(7, 1)
    text = _events_text(prefire)
    assert "prefired" in text and text.index("prefired") < text.index("replay_started"), text


def test_lesson_11_lanes_show_the_replays_make_dot_caused_and_the_snapshot_none() -> None:
    lesson = LESSONS[10]
    at = _answered(11, 0)
    shown = show_step(lesson, lesson.steps[0])
    (lanes,) = _lanes_charts(at)
    assert list(_replays_per_lane(lanes).values()) == [shown.figures["replays"]] and shown.figures["replays"] > 1
    assert "replay_started" in _events_text(at)
    at = _answered(11, 1)
    (graph,) = _graphs(at)
    assert graph.count("<g id=\"node") == show_step(lesson, lesson.steps[1]).figures["nodes"]
    assert _events_text(at).count("replay_started") == 1  # the backward's own replay, no other


def test_lesson_4_shows_the_bubble_on_the_schedule_timeline_of_both_schedules() -> None:
    at = _answered(4, 2)
    rows = _chart_rows(at)
    actions = {r.get("action") for r in rows}
    assert {"F", "B"} <= actions and {"DX", "DW"} <= actions  # 1F1B's B beside ZB-H1's DX and DW
    lines = [_plain(m.value) for m in at.markdown if m.value.startswith("the step")]
    assert len(lines) == 2 and all("ticks" in line and "bubble" in line for line in lines), lines
    assert [_plain(s.value) for s in at.subheader][:2] == ["1F1B: DX and DW together",
                                                           "ZB-H1: DW deferred into the bubble"]


def test_lesson_5_draws_the_trigger_in_the_graph() -> None:
    at = _answered(5, 1)
    graphs = _graphs(at)
    assert graphs and all(f"trigger h{h}" in graphs[0] for h in (0, 1, 2)), graphs[:1]
    assert at.select_slider(key="lesson_5_1_graph_zoom").value == "Fit"  # the graph helper's zoom, fitted


def test_lesson_6_lanes_show_waiting_for_dw_and_retained() -> None:
    at = _answered(6, 1)
    states = {r.get("state") for r in _chart_rows(at)}
    assert {"phase_dw", "released"} <= states  # the broken run's lane: DW asked first
    assert "retained" in states  # the fixed run's lane beside it: kept for DW


def test_lesson_8_shows_three_broken_runs_beside_their_fixes_and_the_debuggers_story() -> None:
    from ckpt_viz.analysis.diagnosis import diagnose

    lesson = LESSONS[7]
    for k in range(3):
        at = _answered(8, k)
        shown = show_step(lesson, lesson.steps[k])
        codes = [c.value for c in at.code]
        assert shown.code.rstrip("\n") in codes and shown.other_code.rstrip("\n") in codes  # broken beside fixed
        assert [m.value for m in at.markdown if m.value in ("**broken**", "**fixed**")] == ["**broken**", "**fixed**"]
        finding = next(f for f in diagnose(shown.trace) if not f.ok)
        assert any(_plain(e.value) == f"**{finding.cause}**" for e in at.error)
        assert finding.explanation in codes
        assert any(_plain(i.value) == f"**Fix:** {finding.fix}" for i in at.info)
        assert any(s.value == "The Debugger finds no problem in this run." for s in at.success)


def test_lesson_9_shows_the_recompute_time_beside_the_memory_kept() -> None:
    at = _answered(9, 1)
    metrics = {m.label: m.value for m in at.metric}
    assert "Recompute time" in metrics and metrics["Recompute time"].endswith(" ms")
    assert len([m for m in at.metric if m.label == "Recompute time"]) == 2  # both sides
    assert any("excluded outputs" in str(row) for df in at.dataframe for row in df.value.to_dict("records"))


def test_lesson_10_shows_memory_per_stage_side_by_side() -> None:
    at = _answered(10, 0)
    tables = [t.value for t in at.table if "stage" in t.value.columns]
    assert len(tables) == 2 and all(set(t["stage"]) == {"0", "1"} for t in tables)
    assert any(r.get("stage") is not None and r.get("bytes") is not None for r in _chart_rows(at))


def test_lesson_12_shows_what_keeping_an_op_costs_beside_keeping_nothing() -> None:
    lesson = LESSONS[11]
    at = _answered(12, 1)
    shown = show_step(lesson, lesson.steps[1])
    assert [_plain(s.value) for s in at.subheader][:2] == ["keep addmm", "keep nothing"]
    times = [m.value for m in at.metric if m.label == "Recompute time"]
    assert len(times) == 2 and all(t.endswith(" ms") for t in times)  # the compute side, both runs
    peaks = [df.value for df in at.dataframe if "category" in df.value.columns]
    assert len(peaks) == 2  # the memory side, both runs: the peak by category
    claim = next(_plain(i.value) for i in at.info if "Checked on the run" in i.value)
    assert f"recompute {shown.figures['recompute_keep']} MFLOP" in claim
    assert f"recompute {shown.figures['recompute_all']} MFLOP" in claim


def test_lesson_13_names_your_own_layers_in_the_lanes() -> None:
    at = _answered(13, 0)
    lanes = {r["lane"] for r in _chart_rows(at) if r.get("kind") == "interval"}
    assert lanes == {"h0 layers.0", "h1 layers.1", "h2 layers.2"}, lanes
    assert any(m.label == "Recompute time" for m in at.metric)


def test_lesson_14_draws_the_trade_off_curve_of_its_profile() -> None:
    import ckpt_viz.plan as plan

    lesson = LESSONS[13]
    at = _answered(14, 0)
    shown = show_step(lesson, lesson.steps[0])
    points = plan.curve(plan.profile_of(shown.trace))
    drawn = [r for r in _chart_rows(at) if "peak_mib" in r]  # the curve chart's points
    assert len(drawn) == len(points) == shown.figures["points"]
    assert sorted(r["peak_mib"] for r in drawn) == pytest.approx(sorted(p.peak / 2**20 for p in points))
    assert any(r.get("category") == "activations" for r in _chart_rows(at))  # the memory view beside it


def test_a_knob_records_again_and_redraws() -> None:
    at = _open(_app(), 1, 1)
    before = next(i.value for i in at.info if "Checked on the run" in i.value)
    at.select_slider(key="knob_1_1_depth").set_value(8).run()
    assert not at.exception, at.exception
    after = next(i.value for i in at.info if "Checked on the run" in i.value)
    assert before != after and _plain(after).startswith("**Checked on the run:** 8 blocks keep")
    assert at.code[0].value.rstrip().endswith("trace = record_none(depth=8, batch=384)")


def test_links_to_the_pages_that_go_deeper_and_the_next_lesson() -> None:
    at = _open(_app(), 1, 1)
    links = [link for link in at.get("page_link") if link.proto.label.startswith("See it on")]
    assert [link.proto.label for link in links] == ["See it on the Memory page", "See it on the Overview page"]
    from urllib.parse import parse_qs

    from ckpt_viz.trace import Trace

    for link in links:  # the page opens this step's own run, saved, at its cursor
        query = parse_qs(link.proto.query_string)
        saved = Trace.load(query["trace"][0])
        assert len(saved.events) == len(show_step(LESSONS[0], LESSONS[0].steps[1]).trace.events)
        assert query["cursor"] == [str(show_step(LESSONS[0], LESSONS[0].steps[1]).seq)]
    nxt = next(b for b in at.button if b.label.startswith("Next lesson: 2."))
    nxt.click().run()
    assert at.selectbox(key="lesson_pick").value.startswith("2.")
    assert "Step 1 of" in at.get("progress")[0].proto.text


def test_glossary_lists_states_categories_and_terms_in_the_pages_words() -> None:
    from ckpt_viz.analysis.words import CATEGORY_WORDS, STATE_WORDS

    at = _app()
    at.switch_page("views/glossary.py").run()
    assert not at.exception, at.exception
    assert [s.value for s in at.subheader][:3] == ["Terms", "Memory categories", "Handle states"]
    assert set(at.dataframe[1].value["word"]) == set(CATEGORY_WORDS.values())
    assert set(at.dataframe[2].value["word"]) == set(STATE_WORDS.values())  # "waiting for DX", never "phase_dx"


def test_overview_says_what_to_look_at_and_memory_explains_the_split_cost() -> None:
    from ckpt_viz.catalog import DEFAULT_MODEL
    from ckpt_viz.lessons.glossary import SPLIT_COST
    from ckpt_viz.run.zoo import build_builtin

    at = _app()
    look_at = build_builtin(DEFAULT_MODEL).look_at
    assert look_at and any(look_at in _plain(i.value) for i in at.info), [i.value for i in at.info]
    at.switch_page("views/memory.py").run()  # the default mode is split-reentrant
    assert not at.exception, at.exception
    assert any(SPLIT_COST in _plain(c.value) for c in at.caption), [c.value for c in at.caption]


def test_a_graph_step_draws_the_server_side_svg_of_its_own_run() -> None:
    """Lesson 3's first step shows the graph: drawn by `dot` and shown as an image (as on the graph page, so
    nothing in it runs), with the checkpoint regions of the step's own run."""
    at = _open(_app(), 3, 0)
    graphs = _graphs(at)
    assert len(graphs) == 1 and "<svg" in graphs[0] and re.search(r"h\d+ · ", graphs[0]), graphs[:1]
    assert not at.get("iframe") and not at.get("graphviz_chart")
