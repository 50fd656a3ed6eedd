"""memory_series / memory_peak / render_memory on hand-built traces: rows, downsampling, peak, chart data."""
from __future__ import annotations

from pathlib import Path

from ckpt_viz.render.memory import format_bytes, memory_peak, memory_series, render_memory
from ckpt_viz.trace import MemorySample, Trace
from traces import Builder, split_trace


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


def test_single_trace_chart_stacks_categories_with_cursor_and_peak() -> None:
    trace = split_trace()
    chart = render_memory({"run": trace}, cursor=12)
    spec = chart.to_dict()  # validates against the Vega-Lite schema
    area, point, rule = chart.layer
    assert area.mark.type == "area" and spec["layer"][0]["encoding"]["y"]["stack"] == "zero"
    assert area.data.values == memory_series(trace, max_points=len(area.data.values))
    assert point.data.values[0]["seq"] == 22 and point.data.values[0]["bytes"] == 4864
    label = "peak 4.8 KiB: parameters 2.0 KiB, gradients 2.0 KiB, replay_activations 512 B"
    assert point.data.values[0]["label"] == label  # tooltip of the peak point
    assert spec["title"]["subtitle"] == [label]  # and the subtitle, clear of the legend
    assert rule.mark.type == "rule" and rule.data.values == [{"seq": 12}]
    assert spec["layer"][0]["mark"]["type"] == "area"


def test_compare_mode_draws_one_total_line_per_trace_on_the_run_position() -> None:
    a = split_trace()
    b = split_trace()
    b.memory = [MemorySample(seq=s.seq, t_ns=s.t_ns, bytes_by_category={"activations": 100})
                for s in b.memory]
    chart = render_memory({"with ckpt": a, "flat": b}, cursor=25)
    chart.to_dict()
    line = chart.layer[0]
    assert line.mark.type == "line"
    rows = line.data.values
    assert {r["trace"] for r in rows} == {"with ckpt", "flat"}
    first = [r for r in rows if r["trace"] == "with ckpt"]
    assert first[0]["position"] == 0.0 and first[-1]["position"] == 1.0
    assert [r["bytes"] for r in first] == [s.total_nbytes for s in a.memory]
    assert all(r["bytes"] == 100 for r in rows if r["trace"] == "flat")
    peaks = chart.layer[1].data.values
    assert [p["trace"] for p in peaks] == ["with ckpt", "flat"] and peaks[0]["bytes"] == 4864
    assert chart.layer[-1].data.values == [{"position": 1.0}]


def test_chart_rows_stay_under_altairs_limit() -> None:
    b = Builder()
    for i in range(20_000):
        b.ev("memory_sampled")
        b.mem(parameters=1, gradients=2, activations=i, checkpoint_inputs=4, replay_activations=5)
    chart = render_memory({"big": b.trace()})
    rows = chart.layer[0].data.values
    assert len(rows) <= 5000 and max(r["bytes"] for r in rows) == 19_999  # the peak is the last sample


def test_loaded_trace_reads_memory_columns(tmp_path: Path) -> None:
    trace = split_trace()
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    assert memory_series(loaded) == memory_series(trace)
    assert memory_peak(loaded) == memory_peak(trace)
    assert not loaded.memory.materialized


def test_empty_trace_still_gives_a_valid_chart() -> None:
    chart = render_memory({"empty": Trace()}, cursor=3)
    chart.to_dict()
    assert chart.layer[0].data.values == []


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 512, 1536, 5 * 1024 ** 2, 3 * 1024 ** 3)] == [
        "0 B", "512 B", "1.5 KiB", "5.0 MiB", "3.0 GiB"]
