"""The memory chart of a big trace draws what the full data would show at its width: the upper envelope (every
bucket's largest total, so every peak), both ends and the peak mark (NOTE [ Samples drawn ]); its hover columns
name each drawn sample's part of the step as `analysis.passes` does for every event."""
from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.passes import passes
from ckpt_viz.analysis.words import part_word
from ckpt_viz.render.memory import render_memory
from ckpt_viz.trace import Trace
from traces import synthetic_trace


def test_a_big_traces_chart_keeps_the_envelope_the_peak_and_the_parts(tmp_path: Path) -> None:
    synthetic_trace(40_000, concurrent=100, memory_every=4).save(tmp_path / "t.json.gz")  # 10,000 samples
    trace = Trace.load(tmp_path / "t.json.gz")
    datasets: dict[str, list[dict]] = {}
    render_memory({"run": trace}, cursor_data="cursor", max_points=300, datasets=datasets).to_dict(validate=False)
    area = next(rows for rows in datasets.values() if rows and "category" in rows[0])
    hover = next(rows for rows in datasets.values() if rows and "pass" in rows[0])
    facts = memory(trace)
    seqs, totals = list(facts.seqs), facts.totals
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
    peak = facts.peak
    assert peak is not None and drawn[peak.seq] == peak.total == max(totals)
    step = passes(trace)
    assert {r["pass"] for r in hover} >= {"DX (input grads)", "DW (weight grads)"}
    assert [r["pass"] for r in hover] == [part_word(step.of_event[bisect_right(step.seqs, r["seq"]) - 1])
                                          for r in hover]
