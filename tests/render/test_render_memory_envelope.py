"""The memory chart of a big trace draws what the full data would show at its width: the upper envelope
(every bucket's largest total, so every peak), both ends and the peak mark; its hover columns name each drawn
sample's pass as the pass of every event does (`action_at`, not the whole pass over the events)."""
from __future__ import annotations

import sys
from pathlib import Path

from ckpt_viz.render import palette
from ckpt_viz.render.memory import _columns, _totals, memory_peak, render_memory
from ckpt_viz.render.phases import event_actions
from ckpt_viz.trace import Trace
from ckpt_viz.trace.index import TraceIndex

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "benchmarks"))


def test_a_big_traces_chart_keeps_the_envelope_the_peak_and_the_passes(tmp_path: Path) -> None:
    from bench_trace_io import build_trace

    build_trace(40_000, memory_every=4).save(tmp_path / "t.json.gz")  # 10,000 samples, split passes
    trace = Trace.load(tmp_path / "t.json.gz")
    datasets: dict[str, list[dict]] = {}
    render_memory({"run": trace}, cursor_data="cursor", max_points=300, datasets=datasets).to_dict(validate=False)
    area = next(rows for rows in datasets.values() if rows and "category" in rows[0])
    hover = next(rows for rows in datasets.values() if rows and "pass" in rows[0])
    seqs, _ = _columns(trace)
    totals = _totals(trace)
    drawn: dict[int, int] = {}
    for row in area:
        drawn[row["seq"]] = drawn.get(row["seq"], 0) + row["bytes"]
    assert all(drawn[s] == totals[seqs.index(s)] for s in drawn)  # every drawn sample's stack is its total
    drawn_seqs = sorted(drawn)
    assert drawn_seqs[0] == seqs[0] and drawn_seqs[-1] == seqs[-1]
    buckets = 300 - 2
    n = len(seqs)
    for b in range(buckets):  # each bucket's largest total is drawn
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        assert max(totals[lo:hi]) == max(drawn[s] for s in drawn_seqs if seqs[lo] <= s <= seqs[hi - 1])
    peak = memory_peak(trace)
    assert peak is not None and drawn[peak["seq"]] == peak["total"] == max(totals)
    actions, index = event_actions(trace), TraceIndex.of(trace)
    assert [r["pass"] for r in hover] == [palette.action_word(actions[index.position(r["seq"])]) for r in hover]
