"""The Streamlit app, driven headless with AppTest: every page, every kind of source, the cursor, failures.

Recordings are cached process-wide by the app's loader (st.cache_resource), so a
source recorded by one test is reused by the next; each AppTest gets 60 s per run
for the first recording (torch import, or the sandbox child for a model file).
"""
from __future__ import annotations

import base64
import gzip
import json
import re
import sys
from pathlib import Path

import msgspec
import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.analysis.words import state_word
from ckpt_viz.errors import TraceError
from ckpt_viz.events import EventBase
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")
PAGES = {
    "views/overview.py": "Overview",
    "views/graph.py": "Autograd graph",
    "views/memory.py": "Memory",
    "views/handles.py": "Handles",
    "views/debugger.py": "Debugger",
    "views/routing.py": "Routing (DX/DW)",
    "views/timeline.py": "Schedule timeline",
    "views/events.py": "Events",
    "views/compare.py": "Compare modes",
    "views/glossary.py": "Glossary",
}
USER_MODEL = "examples/user_model.py:make_model"
BAD_MODELS = ROOT / "tests" / "data" / "bad_models"


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # `streamlit run app` runs from the root; model references are relative to it


def _app(**state: object) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def shown_text(markdown: str) -> str:
    """What the browser shows of markdown written by `ui.text.md`: its escapes and word joiners gone, its hard
    breaks back to line breaks (NOTE [ Text as text ] in app/ui/text.py)."""
    plain = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown.replace("  \n", "\n"))
    return plain.replace("\u2060", "").replace("\u00a0", " ")


def _shown_errors(at: AppTest) -> list[str]:
    """The error boxes' text as the user reads it."""
    return [shown_text(e.value) for e in at.error]


def _errors(at: AppTest) -> list[str]:
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]


VISITED = {**PAGES, "views/plan.py": "Plan"}  # and the Plan page, which has no cursor for bench_app to step


def _visit_every_page(at: AppTest, pages: dict[str, str] = VISITED) -> None:
    for page, title in pages.items():
        at.switch_page(page).run()
        errors = [e for e in _errors(at) if page != "views/debugger.py" and page != "views/handles.py"] \
            if at.session_state["run_config"].source == "broken" else _errors(at)
        assert not errors and not at.exception, (page, _errors(at))
        if page == "views/compare.py" and not at.session_state["run_config"].runs_model:
            title = "Compare two runs"  # a saved trace or a broken run holds one mode: Compare opens on two runs
        assert [t.value for t in at.title] == [title], page


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _handle_table(at: AppTest) -> dict[str, str]:
    """The Handles page's last table: handle -> state at the cursor, in words."""
    df = at.dataframe[-1].value
    return dict(zip(df["handle"], df["state"]))


def charts(at: AppTest) -> list[tuple[dict, dict[str, list[dict]]]]:
    """Every chart on the page: (its Vega-Lite spec, its named datasets' rows, decoded from Arrow)."""
    import pyarrow as pa

    out = []
    for chart in at.get("vega_lite_chart"):
        rows = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pylist() for d in chart.proto.datasets}
        out.append((json.loads(chart.proto.spec), rows))
    return out


def layer_rows(layer: dict, datasets: dict[str, list[dict]]) -> list[dict]:
    data = layer.get("data", {})
    return datasets[data["name"]] if "name" in data else data.get("values", [])


def _lane_states(at: AppTest) -> dict[str, str]:
    """The Handles page's lanes: handle -> the state of the bar under the cursor rule, in words."""
    spec, datasets = next(c for c in charts(at) if c[0].get("title") == "handle lifecycles")
    bars, *rest = spec["layer"]
    cursor = next(layer_rows(layer, datasets)[0]["seq"] for layer in rest if layer["mark"]["type"] == "rule")
    return {r["lane"].split(" ")[0]: state_word(r["state"]) for r in layer_rows(bars, datasets)
            if r["start_seq"] <= cursor < r["end_seq"]}


def graph_svgs(at: AppTest) -> list[str]:
    """The graphs on the page: each an SVG image (a data: URL in an <img>, app/ui/graphview.py), decoded."""
    found = []
    for element in at.get("html"):
        for data in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', element.proto.body):
            found.append(base64.b64decode(data).decode("utf-8"))
    return found


def _shown_trace(at: AppTest) -> Trace:
    """The trace the app recorded or read for its current source (from its process-wide cache)."""
    from ui import runs  # AppTest put app/ on sys.path

    return runs.load_run(at.session_state["run_config"]).run.trace


def _stable(trace: Trace) -> list[tuple]:
    """Each event without its clock and thread: what a deterministic recording repeats (its site too: a built-in
    run's events name ckpt_viz's own step, whoever calls it, the app or a test; sites.py NOTE [ The user's line ])."""
    common = set(EventBase.__struct_fields__) - {"t_ns", "thread_id"}
    return [(e.kind, {k: v for k, v in msgspec.structs.asdict(e).items() if k in common or k not in
                      EventBase.__struct_fields__}) for e in trace]


def _same_recording(shown: Trace, expected: Trace) -> None:
    """Same events as an independent run: recordings are deterministic (tests/run/test_determinism.py)."""
    assert _stable(shown) == _stable(expected)
    assert [m.bytes_by_category for m in shown.memory] == [m.bytes_by_category for m in expected.memory]


def _move(at: AppTest, label: str) -> AppTest:
    return at.button(key=f"cursor_{label}").click().run()


# 1. The first screen: a real run of the default built-in model, without any click.


def test_first_screen_shows_a_recorded_run_of_the_default_model() -> None:
    at = _app()
    assert not _errors(at), _errors(at)
    assert at.title[0].value == "Overview"
    shown = _shown_trace(at)
    _same_recording(shown, run_scenario(build_builtin("mlp"), "split-reentrant", memory=True, graphs=True))
    assert _metric(at, "Events") == f"{len(shown):,}"
    assert _metric(at, "Handles") == "4"
    assert _metric(at, "Replays") == "4"  # split reentrant: DX replays each of the 4 blocks once, DW reuses it
    assert _metric(at, "Released") == "4"
    assert _metric(at, "Refused replays") == "0"
    assert at.radio(key="src_kind").value == "Built-in model"
    assert at.selectbox(key="src_mode").value == "split-reentrant"
    # the cursor starts at the first event of the run, so "Next replay" has somewhere to go
    assert at.slider(key="cursor_slider").value == 0
    assert not at.button(key="cursor_next_replay").disabled


def test_every_page_renders_for_a_built_in_model() -> None:
    _visit_every_page(_app())


def test_every_page_renders_for_a_model_file_run_in_the_sandbox() -> None:
    at = _app(src_kind="Model file (.py)", src_file_how="Path", src_ref=USER_MODEL)
    assert not _errors(at), _errors(at)
    assert _metric(at, "Handles") == "3"  # the example checkpoints blocks.0, blocks.1, blocks.2
    assert _metric(at, "Replays") == "3"
    _visit_every_page(at)


def test_every_page_renders_for_a_saved_trace_path(tmp_path: Path) -> None:
    trace = run_scenario(build_builtin("transformer"), "split-reentrant", memory=True, graphs=True)
    path = tmp_path / "transformer.json.gz"
    trace.save(path)
    at = _app(src_kind="Saved trace", src_trace_how="Path", src_trace_path=str(path))
    assert not _errors(at), _errors(at)
    assert _metric(at, "Events") == f"{len(trace):,}"
    _visit_every_page(at)
    # Compare opens on two runs for a saved trace (it holds one mode), and asks for the other one
    at.switch_page("views/compare.py").run()
    assert any("Pick the run to compare this one with" in i.value for i in at.info)
    at.radio(key="compare_view").set_value("Modes of this model").run()
    assert any("a saved trace holds one mode" in i.value for i in at.info)


def test_every_page_renders_for_an_uploaded_trace(tmp_path: Path) -> None:
    trace = run_scenario(build_builtin("dropout"), "nonreentrant", memory=True, graphs=True)
    trace.save(tmp_path / "t.json")
    at = _app(src_kind="Saved trace")
    assert any("Pick a source" in i.value for i in at.info)  # nothing uploaded yet
    at.file_uploader(key="src_trace_upload").upload("dropout.json", (tmp_path / "t.json").read_bytes(),
                                                    "application/json").run()
    assert not _errors(at), _errors(at)
    assert _metric(at, "Events") == f"{len(trace):,}"
    assert _metric(at, "Replays") == str(trace.count("replay_started"))
    _visit_every_page(at)


def test_an_uploaded_model_file_runs_in_the_sandbox() -> None:
    at = _app(src_kind="Model file (.py)", src_file_how="Upload")
    at.file_uploader(key="src_py").upload("user_model.py", (ROOT / "examples" / "user_model.py").read_bytes(),
                                          "text/x-python").run()
    assert not _errors(at), _errors(at)
    assert _metric(at, "Handles") == "3"


def test_pipeline_mode_offers_a_schedule_and_micro_batches() -> None:
    at = _app(src_model="pipeline", src_mode="pipeline")
    batch = build_builtin("pipeline").inputs[0].shape[0]  # only the counts that split the model's batch are offered
    assert at.selectbox(key="src_microbatches").options == [str(m) for m in range(1, 17) if batch % m == 0]
    assert at.selectbox(key="src_microbatches").value == 4  # the default: GPipe and 1F1B differ at 4
    at.selectbox(key="src_schedule").set_value("ZB-H1")
    at.selectbox(key="src_microbatches").set_value(4).run()
    assert not _errors(at), _errors(at)
    shown = _shown_trace(at)
    _same_recording(shown, run_scenario(build_builtin("pipeline"), "pipeline", schedule="ZB-H1", microbatches=4,
                                        memory=True, graphs=True))
    assert shown.meta["schedule"] == "ZB-H1"
    assert _metric(at, "Events") == f"{len(shown):,}"
    assert _metric(at, "Handles") == "16"  # 2 stages x 2 checkpointed blocks x 4 micro-batches
    assert _metric(at, "Replays") == "16"  # each handle replays exactly once per micro-batch
    _visit_every_page(at)


# 2. One time cursor, shared by every page.


def test_moving_the_cursor_changes_what_the_pages_show() -> None:
    at = _app()
    at.switch_page("views/handles.py").run()
    _move(at, "last")
    # Handles in order of first appearance: h_a, h_b, h_c, h_d (their ids depend on earlier recordings)
    assert list(_handle_table(at).values()) == ["released"] * 4
    _move(at, "first")
    assert at.slider(key="cursor_slider").value == 0  # the memory sample as the model's forward opens
    assert list(_handle_table(at).values()) == ["not created yet"] * 4
    _move(at, "next")  # the first checkpoint's handle
    assert list(_handle_table(at).values()) == ["recorded", "not created yet", "not created yet", "not created yet"]
    # Next replay: the first replay_started of the run; DX replays the last block first, every handle set to dx
    _move(at, "next_replay")
    assert list(_handle_table(at).values()) == ["waiting for DX", "waiting for DX", "waiting for DX", "replaying"]
    assert _lane_states(at) == _handle_table(at)  # the lanes and the table read one lifecycle
    _move(at, "next")
    assert list(_handle_table(at).values()) == ["waiting for DX", "waiting for DX", "waiting for DX", "replayed"]
    assert _lane_states(at) == _handle_table(at)

    at.switch_page("views/events.py").run()
    position = at.slider(key="cursor_slider").value
    before = [c.value for c in at.code]
    _move(at, "prev")
    assert at.slider(key="cursor_slider").value == position - 1
    after = [c.value for c in at.code]
    assert "replay finished" in before[0] and "replay started" in after[0]  # the cursor's own event, in words
    assert before[1] != after[1]  # the plain-text log window moved with it
    table = at.dataframe[0].value
    assert list(table.loc[table[""] == "▶", "kind"]) == ["replay_started"]


def test_nonreentrant_frames_count_as_released_on_the_overview_and_the_handles_page() -> None:
    at = _app(src_mode="nonreentrant")
    assert not _errors(at), _errors(at)
    assert _shown_trace(at).count("released") == 0  # non-reentrant frames emit no `released` event
    assert _metric(at, "Released") == "4" and _metric(at, "Replays") == "4"
    _move(at, "last")
    table = at.dataframe[0].value
    assert list(table["state"]) == ["released"] and list(table["handles"]) == [4]
    assert table["meaning"][0].startswith("Its rebuilt activations are freed")
    at.switch_page("views/handles.py").run()
    df = at.dataframe[-1].value
    assert list(df["state"]) == ["released"] * 4
    assert list(df["reason"]) == ["the backward used every recomputed tensor"] * 4  # words, not "consumed"
    assert _lane_states(at) == _handle_table(at)
    _move(at, "first")
    _move(at, "next_replay")
    assert list(_handle_table(at).values()) == ["recorded", "recorded", "recorded", "replaying"]
    assert _lane_states(at) == _handle_table(at)
    at.switch_page("views/overview.py").run()
    table = at.dataframe[0].value
    assert dict(zip(table["state"], table["handles"])) == {"recorded": 3, "replaying": 1}


def test_the_cursor_survives_a_page_change_and_drives_the_graph() -> None:
    at = _app()
    at.switch_page("views/graph.py").run()
    _move(at, "last")
    svg_end = _graphviz(at)
    at.slider(key="cursor_slider").set_value(20).run()
    svg_20 = _graphviz(at)
    assert svg_end != svg_20
    assert "released" in svg_end and "released" not in svg_20
    at.switch_page("views/memory.py").run()
    assert at.slider(key="cursor_slider").value == 20
    assert any("seq 20" in h.value for h in at.subheader)
    from ckpt_viz.analysis.words import format_bytes

    shown = _shown_trace(at)
    at_20 = [m for m in shown.memory if m.seq <= shown.events[20].seq][-1]
    assert _metric(at, "Total") == format_bytes(at_20.total_nbytes)
    _move(at, "last")
    assert _metric(at, "Total") == format_bytes(shown.memory[-1].total_nbytes)
    _move(at, "first")
    _move(at, "next")
    _move(at, "next")
    _move(at, "next")
    _move(at, "prev")
    assert at.slider(key="cursor_slider").value == 2
    at.switch_page("views/events.py").run()
    assert at.slider(key="cursor_slider").value == 2


def _graphviz(at: AppTest) -> str:
    """The graph page's drawing: an SVG drawn on the server by `dot`, shown as an image (app/ui/graphview.py)."""
    svgs = graph_svgs(at)
    assert svgs, "no graph on the page"
    return svgs[0]


def test_a_new_source_resets_the_cursor_to_the_start_of_its_run() -> None:
    at = _app()
    _move(at, "last")
    at.selectbox(key="src_mode").set_value("nonreentrant").run()
    shown = _shown_trace(at)
    assert shown.meta["mode"] == "nonreentrant"
    assert at.slider(key="cursor_slider").value == 0


# 3. Failures show a message; the app keeps working.


def test_a_broken_model_file_shows_its_error_and_the_app_recovers() -> None:
    at = _app(src_kind="Model file (.py)", src_file_how="Path", src_ref=f"{BAD_MODELS / 'factory_raises.py'}")
    assert not at.exception
    assert len(at.error) == 1
    message = _shown_errors(at)[0]
    assert "factory_raises.py" in message and "ckpt_viz" in message
    assert [e.label for e in at.expander if e.label == "Traceback"] == ["Traceback"]
    assert any("Traceback (most recent call last)" in c.value for c in at.code)
    at.radio(key="src_kind").set_value("Built-in model").run()
    assert not _errors(at), _errors(at)
    assert _metric(at, "Handles") == "4"
    _visit_every_page(at)


def test_a_model_file_that_runs_too_long_is_stopped_by_the_time_limit() -> None:
    at = _app(src_kind="Model file (.py)", src_file_how="Path", src_ref=f"{BAD_MODELS / 'sleeps_forever.py'}",
              src_timeout=5)
    assert not at.exception
    assert "did not finish within 5 s" in _shown_errors(at)[0]


def test_a_bad_trace_file_shows_the_trace_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b'{"format": "ckpt_viz.trace", "schema_version": 1, "events": '))
    with pytest.raises(TraceError) as expected:
        Trace.load(bad)
    at = _app(src_kind="Saved trace", src_trace_how="Path", src_trace_path=str(bad))
    assert not at.exception
    assert _shown_errors(at) == [str(expected.value)]
    at.switch_page("views/memory.py").run()
    assert _shown_errors(at) == [str(expected.value)]


def test_pipeline_mode_is_offered_only_for_a_model_with_stages() -> None:
    at = _app(src_model="mlp")
    assert not at.exception
    assert "pipeline" not in at.selectbox(key="src_mode").options
    at.selectbox(key="src_model").set_value("pipeline").run()
    assert "pipeline" in at.selectbox(key="src_mode").options


# 4. Downloads (built on click; the builders are tested directly).


@pytest.fixture
def downloads():
    sys.path.insert(0, str(ROOT / "app"))
    try:
        from ui import downloads as module

        yield module
    finally:
        sys.path.remove(str(ROOT / "app"))


def test_download_builders_make_real_files(downloads, tmp_path: Path) -> None:
    from ckpt_viz.render.eventlog import event_rows
    from ckpt_viz.render.graph import render_graph
    from ckpt_viz.render.memory import render_memory
    from ui.runs import Run, RunConfig  # on sys.path (the fixture), as downloads imports it

    trace = run_scenario(build_builtin("mlp"), "split-reentrant", memory=True, graphs=True)
    run = Run(RunConfig("builtin", "mlp"), trace)

    saved = tmp_path / "down.json"
    saved.write_bytes(downloads._trace_bytes(run))
    assert [e.kind for e in Trace.load(saved)] == [e.kind for e in trace]

    perfetto = json.loads(downloads.perfetto_bytes(run))
    assert any(e.get("name", "").startswith("replay h") for e in perfetto["traceEvents"])

    svg = downloads.svg_bytes(render_graph(trace, trace.graphs[0].seq).source)
    first_handle = trace.handle_ids()[0]
    assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg and f"h{first_handle} · ".encode() in svg
    assert b"<a " not in svg and b"xlink:href" not in svg and b"<script" not in svg

    rows = event_rows(trace.events[:5])
    assert downloads.rows_csv(rows).decode().splitlines()[0] == ",".join(rows[0])

    png = downloads.png_bytes(render_memory({"mlp": trace}, cursor=10))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000


# 5. The benchmark script keeps working (its 1M-event figures are measured by running it, not here).


def test_bench_app_runs_on_a_small_trace() -> None:
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_app.py"), "--events", "20000"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    # 0: every target met, 1: one missed (timing is the benchmark's business, not a test's), 2: a page broke
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "first page (load + index + Overview)" in proc.stdout
    import re

    # each page the benchmark visits steps the cursor once: -1, or +1 where the cursor is at the first event
    stepped = re.findall(r"^(\w+): cursor [-+]1 \(step button\) ", proc.stdout, flags=re.MULTILINE)
    with_cursor = [p for p in PAGES if "timeline" not in p and "glossary" not in p]  # the glossary has no cursor
    assert sorted(stepped) == sorted(Path(p).stem for p in with_cursor), proc.stdout
    assert "error on the page" not in proc.stdout


# 6. Every figure comes from the trace on show, however many sources were opened before.


def _memory_page_peaks(at: AppTest) -> tuple[str, str]:
    """The Memory page's peak as the chart's subtitle says it, and as the table's metric says it."""
    at.switch_page("views/memory.py").run()
    assert not _errors(at), _errors(at)
    specs = [spec for spec, _ in charts(at)]
    subtitles = [s["title"]["subtitle"][0] for s in specs if isinstance(s.get("title"), dict)]
    assert len(subtitles) == 1, specs
    return subtitles[0], _metric(at, "Total at the peak")


def test_chart_and_table_agree_after_more_than_16_sources(tmp_path: Path) -> None:
    import os

    from ckpt_viz.analysis.memory import memory
    from ckpt_viz.analysis.words import format_bytes

    first = run_scenario(build_builtin("mlp"), "split-reentrant", memory=True, graphs=True)
    second = run_scenario(build_builtin("transformer"), "split-reentrant", memory=True, graphs=True)
    first_peak, second_peak = (format_bytes(memory(t).peak.total) for t in (first, second))
    assert first_peak != second_peak
    first.save(tmp_path / "first.json")
    second.save(tmp_path / "second.json")
    texts = [(tmp_path / name).read_bytes() for name in ("first.json", "second.json")]
    size = max(map(len, texts))
    texts = [t + b" " * (size - len(t)) for t in texts]  # same size: the source's settings cannot tell them apart
    shown = tmp_path / "shown.json"
    shown.write_bytes(texts[0])
    stamp = os.stat(shown).st_mtime_ns

    at = _app(src_kind="Saved trace", src_trace_how="Path", src_trace_path=str(shown))
    subtitle, metric = _memory_page_peaks(at)
    assert subtitle.startswith(f"peak {first_peak}:") and metric == first_peak
    for i in range(16):  # the loader keeps 16 runs: `shown` is dropped and read again below
        other = tmp_path / f"other{i}.json"
        other.write_bytes(texts[0])
        at.text_input(key="src_trace_path").set_value(str(other)).run()
        assert not _errors(at), _errors(at)
    shown.write_bytes(texts[1])
    os.utime(shown, ns=(stamp, stamp))
    at.text_input(key="src_trace_path").set_value(str(shown)).run()
    subtitle, metric = _memory_page_peaks(at)
    assert subtitle.startswith(f"peak {second_peak}:"), subtitle
    assert metric == second_peak, f"the chart says {subtitle!r}, the table says {metric!r}"


# 7. Hostile saved traces (issue 13): a clear error each, the app's memory bounded, nothing read outside the trace.


@pytest.mark.serial  # this process's memory peak (ru_maxrss) may grow by less than 400 MiB
def test_hostile_saved_traces_show_a_clear_error_and_the_app_keeps_working(tmp_path: Path) -> None:
    import os
    import resource
    import zlib

    max_bytes = 1 << 30  # Trace.load's default cap on the JSON read (after gzip)

    bomb = tmp_path / "bomb.json.gz"  # 1 MiB that inflates past the 1 GiB cap
    packer, block = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS), b" " * (16 << 20)
    bomb.write_bytes(b"".join([*(packer.compress(block) for _ in range((max_bytes >> 24) + 4)),
                               packer.flush()]))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    good = run_scenario(build_builtin("mlp"), "split-reentrant", memory=True, graphs=True)
    good.save(tmp_path / "good.json")
    doc = json.loads((tmp_path / "good.json").read_text())
    doc["memory"][1]["bytes_by_category"]["activations"] = 10**40
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(doc))

    at = _app(src_kind="Saved trace", src_trace_how="Path", src_trace_path=str(tmp_path / "good.json"))
    assert not _errors(at), _errors(at)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for path in (bomb, "/dev/zero", fifo, loop, huge):
        with pytest.raises(TraceError) as expected:
            Trace.load(path)
        at.text_input(key="src_trace_path").set_value(str(path)).run(timeout=60)
        assert not at.exception, at.exception
        assert _shown_errors(at) == [str(expected.value)], path
        assert str(expected.value).startswith("ckpt_viz.Trace.load: ") and str(path) in str(expected.value)
        at.switch_page("views/memory.py").run()
        assert _shown_errors(at) == [str(expected.value)], path
        at.switch_page("views/overview.py").run()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kib) / 1024
    assert grown_mib < 400, f"the app's peak memory grew by {grown_mib:.0f} MiB on hostile traces"
    at.text_input(key="src_trace_path").set_value(str(tmp_path / "good.json")).run()
    assert not _errors(at), _errors(at)  # the app keeps working
    assert _metric(at, "Events") == f"{len(good):,}"


def test_a_site_pointing_at_etc_passwd_shows_no_line_of_it(tmp_path: Path) -> None:
    trace = run_scenario(build_builtin("mlp"), "split-reentrant", memory=True, graphs=True)
    trace.save(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    for event in doc["events"]:
        event["site"] = "/etc/passwd:1"  # the site of every event
    doc["meta"].pop("sources", None)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    secret = Path("/etc/passwd").read_text().splitlines()[0] if Path("/etc/passwd").is_file() else "root:x:0:0"

    at = _app(src_kind="Saved trace", src_trace_how="Path", src_trace_path=str(tmp_path / "t.json"))
    at.switch_page("views/handles.py").run()
    assert not _errors(at), _errors(at)
    shown = [c.value for c in at.code] + [m.value for m in at.markdown]
    assert "(source not recorded)" in shown
    assert any("/etc/passwd:1" in text for text in shown)  # the site is named, its file is not read
    assert not any(secret in text or "root:" in text for text in shown), shown

    trace.save(tmp_path / "recorded.json")  # a recorded trace shows its own lines, as recorded
    at = _app(src_kind="Saved trace", src_trace_how="Path", src_trace_path=str(tmp_path / "recorded.json"))
    at.switch_page("views/handles.py").run()
    recorded = trace.meta["sources"]
    assert any(f": {line}" in c.value for c in at.code for line in recorded.values()), [c.value for c in at.code]
