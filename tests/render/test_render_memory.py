"""memory_series / render_memory / render_peaks on hand-built traces: rows, peak, chart layers; and the memory
facts they draw (`ckpt_viz.analysis.memory`: the peak, the tables in words)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_viz.analysis.memory import memory, memory_table, other_note
from ckpt_viz.analysis.words import CATEGORY_MEANINGS, category_word, format_bytes
from ckpt_viz.render import palette
from ckpt_viz.render.memory import CURSOR_PICK, memory_series, render_memory, render_peaks
from ckpt_viz.trace import MemorySample, Trace
from traces import Builder, split_trace


def memory_peak(trace: Trace) -> dict[str, Any] | None:
    """The analysis's peak as the old renderer's dict (seq, total, top)."""
    peak = memory(trace).peak
    return None if peak is None else {"seq": peak.seq, "total": peak.total, "top": list(peak.top)}


def _layers(chart: Any) -> list[Any]:
    """Every single-mark chart inside a (nested) layer chart, in drawing order."""
    out = []
    for layer in getattr(chart, "layer", [chart]):
        out += _layers(layer) if hasattr(layer, "layer") else [layer]
    return out


def _mark(layer: Any) -> str:
    return layer.mark if isinstance(layer.mark, str) else layer.mark.type


def _by_mark(chart: Any, mark: str) -> list[Any]:
    return [layer for layer in _layers(chart) if _mark(layer) == mark]


def test_series_has_one_row_per_sample_and_non_zero_category() -> None:
    trace = split_trace()
    rows = memory_series(trace)
    categories = ["parameters", "gradients", "activations", "checkpoint_inputs", "replay_activations"]
    assert rows[:len(categories)] == [
        {"seq": 0, "category": c, "bytes": {"parameters": 2048}.get(c, 0)} for c in categories]
    assert len(rows) == len(trace.memory) * len(categories)
    at_14 = {r["category"]: r["bytes"] for r in rows if r["seq"] == 14}
    assert at_14 == {"parameters": 2048, "gradients": 0, "activations": 0, "checkpoint_inputs": 256,
                     "replay_activations": 1024}


def test_peak_names_the_top_three_contributors() -> None:
    peak = memory_peak(split_trace())
    # DW: gradients grow to 2048 at seq 22 while h0's replay (512) is still held.
    assert peak == {"seq": 22, "total": 2048 + 2048 + 256 + 512,
                    "top": [("parameters", 2048), ("gradients", 2048), ("replay_activations", 512)]}
    assert memory_peak(Trace()) is None


def test_downsampling_keeps_the_peak_and_the_ends() -> None:
    b = Builder()
    for i in range(10_000):
        b.ev("memory_sampled")
        b.mem(activations=5_000 if i == 6_789 else i % 100)
    trace = b.trace()
    rows = memory_series(trace, max_points=50)
    seqs = sorted({r["seq"] for r in rows})
    assert len(seqs) <= 50
    assert 6_789 in seqs and seqs[0] == 0 and seqs[-1] == 9_999
    assert max(r["bytes"] for r in rows) == 5_000
    assert {r["category"] for r in rows} == {"activations"}  # all-zero categories are left out


def test_single_trace_chart_parameters_at_the_base_in_the_palette_with_passes_cursor_and_peak() -> None:
    trace = split_trace()
    chart = render_memory({"run": trace}, cursor=12)
    spec = chart.to_dict()  # validates against the Vega-Lite schema
    (area,) = _by_mark(chart, "area")
    rows = area.data.values
    assert [{k: r[k] for k in ("seq", "category", "bytes")} for r in rows] == memory_series(trace)
    # Parameters are the base band (stacked first), every category in its palette colour and word.
    assert {r["order"] for r in rows if r["category"] == "parameters"} == {0}
    assert all(r["what"] == category_word(r["category"]) for r in rows)
    area_spec = next(layer for layer in spec["layer"] if layer.get("mark", {}).get("type") == "area")
    assert area_spec["encoding"]["y"]["stack"] == "zero" and area_spec["encoding"]["order"]["field"] == "order"
    scale = area_spec["encoding"]["color"]["scale"]
    assert dict(zip(scale["domain"], scale["range"])) == {
        category_word(c): palette.CATEGORY_COLOURS[c]
        for c in ("parameters", "gradients", "activations", "checkpoint_inputs", "replay_activations")}
    # The x axis ends where the run ends.
    assert area_spec["encoding"]["x"]["scale"]["domain"] == [0, 25]
    # Bands for the parts of the step: forward 0-6, DX 6-16, DW 16-25, labelled in words.
    bands = _by_mark(chart, "rect")[0].data.values
    assert [(b["action"], b["start_seq"], b["end_seq"]) for b in bands] == [("F", 0, 6), ("DX", 6, 16), ("DW", 16, 25)]
    assert [b["what"] for b in bands] == ["forward", "DX (input grads)", "DW (weight grads)"]
    (point,) = _by_mark(chart, "point")
    assert point.data.values[0]["seq"] == 22 and point.data.values[0]["bytes"] == 4864
    label = "peak 4.8 KiB: parameters 2.0 KiB, gradients 2.0 KiB, replay activations 512 B"
    assert point.data.values[0]["label"] == label  # tooltip of the peak point
    assert spec["title"]["subtitle"] == [label]  # and the subtitle, clear of the legend
    (rule,) = _by_mark(chart, "rule")
    assert rule.data.values == [{"seq": 12}] and rule.mark.color == palette.CURSOR_COLOUR


def test_hover_columns_explain_each_sample_and_a_click_selects_its_seq() -> None:
    trace = split_trace()
    chart = render_memory({"run": trace}, cursor=0)
    spec = chart.to_dict()
    columns = _by_mark(chart, "rect")[-1]
    rows = {r["seq"]: r for r in columns.data.values}
    at_22 = rows[22]
    assert at_22["total"] == "4.8 KiB" and at_22["pass"] == "DW (weight grads)"
    assert at_22["at"] == "grads routed (h0)" and at_22["next"] == 23
    hover = next(layer for layer in spec["layer"] if "y2" in layer.get("encoding", {}))
    titles = [t["title"] for t in hover["encoding"]["tooltip"]]
    assert titles[:4] == ["event seq", "event", "part of the step", "total"] and "replay activations" in titles
    values = {t["title"]: at_22[t["field"]] for t in hover["encoding"]["tooltip"]}
    assert values["gradients"] == "2.0 KiB" and values["replay activations"] == "512 B"
    params = {p["name"]: p for p in spec["params"]}
    assert params[CURSOR_PICK]["select"] == {"type": "point", "on": "click", "fields": ["seq"], "clear": False}


def test_axis_labels_are_in_the_unit_of_the_peak() -> None:
    b = Builder()
    b.ev("memory_sampled")
    b.mem(activations=3 * 1024 ** 2)
    spec = render_memory({"run": b.trace()}).to_dict()
    area = next(layer for layer in spec["layer"] if layer.get("mark", {}).get("type") == "area")
    assert area["encoding"]["y"]["axis"]["title"] == "memory (MiB)"
    assert "/ 1048576" in area["encoding"]["y"]["axis"]["labelExpr"]
    assert area["encoding"]["y"]["axis"]["values"] == [i * 1024 ** 2 for i in range(5)]  # round MiB ticks


def test_compare_draws_one_line_per_trace_aligned_by_pass() -> None:
    a = split_trace()
    b = split_trace()
    b.memory = [MemorySample(seq=s.seq, t_ns=s.t_ns, bytes_by_category={"activations": 100})
                for s in b.memory]
    long = Builder()  # a run twice as long in its forward: its forward still ends at x = 1
    for h in range(4):
        long.ev("handle_created", h, phase="ordinary")
        long.mem(activations=10)
        long.ev("forward_finished", h, phase="ordinary")
        long.mem(activations=10)
    for h in reversed(range(4)):
        long.ev("backward_entered", h, phase="ordinary")
        long.mem(activations=10)
    chart = render_memory({"with ckpt": a, "flat": b, "long": long.trace()}, cursor=15, cursor_in="flat")
    chart.to_dict()
    (line,) = _by_mark(chart, "line")
    rows = line.data.values
    assert {r["trace"] for r in rows} == {"with ckpt", "flat", "long"}
    first = [r for r in rows if r["trace"] == "with ckpt"]
    assert first[0]["x"] == 0.0 and first[-1]["x"] == 3.0
    assert [r["bytes"] for r in first] == [s.total_nbytes for s in a.memory]
    # forward on [0, 1), DX on [1, 2), DW on [2, 3]: seq 6 starts DX, seq 16 starts DW
    assert [r["x"] for r in first if r["seq"] in (5, 6, 16)] == [5 / 6, 1.0, 2.0]
    longs = [r for r in rows if r["trace"] == "long"]
    assert [r["x"] for r in longs][:8] == [k / 8 for k in range(8)] and longs[8]["x"] == 1.0
    assert longs[-1]["x"] == 3.0  # a full backward spans DX and DW
    assert all(r["bytes"] == 100 for r in rows if r["trace"] == "flat")
    peaks = _by_mark(chart, "point")[-1].data.values
    assert [p["trace"] for p in peaks] == ["with ckpt", "flat", "long"] and peaks[0]["bytes"] == 4864
    (rule,) = _by_mark(chart, "rule")
    assert rule.data.values == [{"x": 1.0 + 9 / 10}] and rule.mark.color == palette.CURSOR_COLOUR
    scale = line.to_dict()["encoding"]["color"]["scale"]
    assert scale["domain"] == ["with ckpt", "flat", "long"] and len(set(scale["range"])) == 3
    assert set(scale["range"]) <= set(palette.MODE_COLOURS.values())


def test_chart_rows_stay_under_altairs_limit() -> None:
    b = Builder()
    for i in range(20_000):
        b.ev("memory_sampled")
        b.mem(parameters=1, gradients=2, activations=i, checkpoint_inputs=4, replay_activations=5)
    chart = render_memory({"big": b.trace()})
    rows = _by_mark(chart, "area")[0].data.values
    assert len(rows) <= 5000 and max(r["bytes"] for r in rows) == 19_999  # the peak is the last sample


def test_a_loaded_trace_draws_the_same_rows(tmp_path: Path) -> None:
    trace = split_trace()
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    assert memory_series(loaded) == memory_series(trace)
    assert memory_peak(loaded) == memory_peak(trace)


def test_empty_trace_still_gives_a_valid_chart() -> None:
    chart = render_memory({"empty": Trace()}, cursor=3)
    chart.to_dict()
    assert _by_mark(chart, "area")[0].data.values == []


def test_tables_use_the_metric_units_and_other_is_explained_when_large() -> None:
    rows = memory_table({"parameters": 2048, "activations": 1024, "other": 1024})
    assert rows[0] == {"category": "parameters", "size": "2.0 KiB", "share": "50%",
                       "what it is": CATEGORY_MEANINGS["parameters"]}
    assert [r["size"] for r in rows] == ["2.0 KiB", "1.0 KiB", "1.0 KiB"]
    note = other_note({"parameters": 2048, "activations": 1024, "other": 1024})
    assert note is not None and note.startswith('"other" is 25% of the total here (1.0 KiB)')
    # what "other" holds since the probe names the passes' own tensors (ckpt_viz/probe/memory.py NOTE rule 3):
    # the gradients in flight are "gradients" now, the model's input and output "inputs" and "outputs"
    assert "your own code makes" in note and "gradients flowing" not in note
    assert other_note({"parameters": 2048, "other": 100}) is None and other_note({}) is None


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 512, 1536, 5 * 1024 ** 2, 3 * 1024 ** 3)] == [
        "0 B", "512 B", "1.5 KiB", "5.0 MiB", "3.0 GiB"]


def test_peaks_by_category_use_the_palette_with_parameters_first() -> None:
    a, b = split_trace(), split_trace()
    b.memory = [MemorySample(seq=m.seq, t_ns=m.t_ns, bytes_by_category={"activations": 100, "parameters": 50})
                for m in b.memory]
    chart = render_peaks({"split": a, "flat": b})
    spec = chart.to_dict()
    rows = chart.data.values
    assert [(r["trace"], r["category"], r["bytes"]) for r in rows] == [
        ("split", "parameters", 2048), ("split", "gradients", 2048), ("split", "checkpoint_inputs", 256),
        ("split", "replay_activations", 512), ("flat", "parameters", 50), ("flat", "activations", 100)]
    assert rows[0]["size"] == "2.0 KiB" and rows[0]["total"] == "4.8 KiB" and rows[0]["order"] == 0
    scale = spec["encoding"]["color"]["scale"]
    assert dict(zip(scale["domain"], scale["range"])) == {
        category_word(c): palette.CATEGORY_COLOURS[c]
        for c in ("parameters", "gradients", "activations", "checkpoint_inputs", "replay_activations")}


def test_many_interleaved_passes_draw_no_bands_and_few_hover_columns() -> None:
    b = Builder()
    for i in range(300):  # forward and backward events alternating: 300 passes (as in a pipeline)
        b.ev("handle_created" if i % 2 == 0 else "backward_entered", i, phase="ordinary")
        b.mem(activations=i)
    b.ev("memory_sampled")
    for i in range(1000):
        b.ev("memory_sampled")
        b.mem(activations=i)
    chart = render_memory({"run": b.trace()})
    chart.to_dict()
    (hover,) = _by_mark(chart, "rect")  # the parts' bands are left out
    assert len(hover.data.values) <= 400 and not _by_mark(chart, "text")
