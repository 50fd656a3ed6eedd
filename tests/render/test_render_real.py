"""Every renderer on real recorded traces (torch runs here): sensible states, charts, graphs and routing.

Split-reentrant mlp: after DX every handle is "retained", after DW "released". A
12-block recording collapses to one "Block x12" node. Renderer output is checked
against the trace itself (counts, seqs), and the DOT is laid out by Graphviz.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ckpt_viz.analysis.diagnosis import diagnose
from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.passes import passes
from ckpt_viz.analysis.routing import routing_at
from ckpt_viz.analysis.words import state_word
from ckpt_viz.render.eventlog import event_rows, filter_events
from ckpt_viz.render.graph import render_graph, render_torchviz_view
from ckpt_viz.render.memory import memory_series, render_memory
from ckpt_viz.render.routing import render_routing
from ckpt_viz.render.svg import dot_svg
from ckpt_viz.render.swimlane import lifecycle_intervals, render_lifecycles
from ckpt_viz.render.text import render_text
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import MLPBlock, ModelSpec, Stack, build_builtin
from ckpt_viz.trace import Trace


@pytest.fixture(scope="module")
def split() -> Trace:
    return run_scenario(build_builtin("mlp"), "split-reentrant", memory=True, graphs=True)


def _last(trace: Trace, kind: str, phase: str) -> int:
    return [e.seq for e in trace.events if e.kind == kind and e.phase == phase][-1]


def _labels(dot: str) -> dict[str, str]:
    """cluster name -> its label."""
    return dict(re.findall(r'subgraph (cluster_h\d+) \{\n\s*[^\n]*label="([^"]*)"', dot))


def test_states_after_dx_are_retained_and_after_dw_released(split: Trace) -> None:
    life = lifecycle(split)
    handles = split.handle_ids()
    assert life.handle_ids == handles and len(handles) == 4
    dx_phases = [e.seq for e in split.of_kind("phase_set") if e.new == "dx"]
    assert len(dx_phases) == 4
    assert set(life.states_at(dx_phases[0] - 1).values()) == {"recorded"}
    assert set(life.states_at(dx_phases[-1]).values()) == {"phase_dx"}
    assert set(life.states_at(_last(split, "grads_routed", "dx")).values()) == {"retained"}
    assert set(life.states_at(None).values()) == {"released"}


def test_graph_snapshots_render_with_their_regions(split: Trace) -> None:
    life = lifecycle(split)
    names = {h: f"blocks.{block}" for block, h in enumerate(sorted(split.handle_ids()))}
    assert handle_labels(split) == names
    assert [g.label for g in split.graphs] == ["before autograd.grad #1", "before autograd.backward #2"]
    for snapshot in split.graphs:
        states = life.states_at(snapshot.seq)
        dot = render_graph(split, snapshot.seq).source
        # "h<id> · <module>" over the state word (a DOT line break)
        assert _labels(dot) == {f"cluster_h{h}": f"h{h} · {names[h]}\\n{state_word(states[h])}"
                                for h in split.handle_ids()}
        assert "<svg" in dot_svg(dot) and "<svg" in dot_svg(render_torchviz_view(split, snapshot.seq).source)
    assert set(life.states_at(split.graphs[1].seq).values()) == {"retained"}  # DW snapshot: replays kept by DX
    # The retained replays are drawn inside their regions: each holds its block's fc1.weight.
    dot = render_graph(split, split.graphs[1].seq, collapse=False).source
    for block, h in enumerate(sorted(split.handle_ids())):
        cluster = dot[dot.index(f"subgraph cluster_h{h} {{"):]
        assert f"blocks.{block}.fc1.weight" in cluster[:cluster.index("\t}")]


def test_the_torchviz_view_draws_make_dots_nodes(split: Trace) -> None:
    for snapshot in split.graphs:
        drawing = snapshot.torchviz
        assert drawing is not None and drawing.nodes
        dot = render_torchviz_view(split, snapshot.seq).source
        assert len(re.findall(r"^\s*n\d+ \[", dot, re.M)) == len(drawing.nodes)
        assert "AccumulateGrad" in dot and "lightblue" in dot


def test_memory_series_and_peak_match_the_samples(split: Trace) -> None:
    peak = memory(split).peak
    totals = [s.total_nbytes for s in split.memory]
    assert peak.total == max(totals) and peak.seq == split.memory[totals.index(max(totals))].seq
    assert sum(b for _, b in peak.top) <= peak.total and len(peak.top) <= 3
    rows = memory_series(split)
    assert {r["seq"] for r in rows} == {s.seq for s in split.memory}
    assert {r["category"] for r in rows} >= {"parameters", "gradients", "checkpoint_inputs"}
    render_memory({"split": split}, cursor=_last(split, "grads_routed", "dx")).to_dict()


def test_compare_memory_of_two_modes(split: Trace) -> None:
    plain = run_scenario(build_builtin("mlp"), "none", memory=True)
    chart = render_memory({"split-reentrant": split, "none": plain}, cursor=10)
    chart.to_dict()
    rows = next(layer for layer in chart.layer if getattr(getattr(layer, "mark", None), "type", None) == "line"
                ).data.values
    assert {r["trace"] for r in rows} == {"split-reentrant", "none"}
    assert all(0.0 <= r["x"] <= 3.0 for r in rows)
    # Aligned by part: both runs' forward samples lie on [0, 1), their backward samples on [1, 3].
    for name, trace in (("split-reentrant", split), ("none", plain)):
        forward_ends = max(s.seq for s in trace.memory if s.seq <= _forward_end(trace))
        assert all((r["x"] < 1.0) == (r["seq"] <= forward_ends) for r in rows if r["trace"] == name), name


def _forward_end(trace: Trace) -> int:
    """The seq of the last sample taken "at loss": the forward's end (the backward starts after it)."""
    return max(e.seq for e in trace.of_kind("memory_sampled") if e.at == "loss")


def test_lifecycles_end_released_by_dw(split: Trace) -> None:
    rows = lifecycle_intervals(split)
    for h in split.handle_ids():
        states = [r["state"] for r in rows if r["kind"] == "interval" and r["handle_id"] == h]
        assert states == ["recorded", "phase_dx", "replaying", "replayed", "retained", "released"]
        assert [r["reason"] for r in rows if r["handle_id"] == h and r["state"] == "released"] == ["dw_complete"]
    assert not [r for r in rows if r["kind"] == "refused"]
    render_lifecycles(split, cursor=20).to_dict()


def test_routing_of_dx_then_dw(split: Trace) -> None:
    assert [b.phase for b in passes(split).backwards] == ["dx", "dw"]
    dx = routing_at(split, _last(split, "grads_routed", "dx"))
    handles = split.handle_ids()
    assert sorted(dx.replayed) == sorted(handles)
    assert dx.targets == {h: (0,) for h in reversed(handles)}
    dw = routing_at(split, None)
    assert sorted(dw.released) == sorted(handles) and dw.replayed == ()
    # Each MLPBlock's four parameters are captured (module attributes) and accumulated in DW.
    assert all(len(dw.captured[h]) == 4 for h in handles)
    assert "<svg" in dot_svg(render_routing(split, None).source) and "<svg" in dot_svg(render_routing(split, 0).source)


def test_event_log_text_and_diagnosis(split: Trace) -> None:
    released = filter_events(split, kinds={"released"})
    assert len(released) == 4 and {e.reason for e in released} == {"dw_complete"}
    assert len(event_rows(split.events)) == len(split.events)
    assert len(render_text(split.events).splitlines()) == len(split.events) + 1
    assert diagnose(split) == []


def test_a_loaded_trace_renders_the_same(split: Trace, tmp_path: Path) -> None:
    split.save(tmp_path / "split.json.gz")
    loaded = Trace.load(tmp_path / "split.json.gz")
    a, b = lifecycle(split), lifecycle(loaded)
    assert all(a.states_at(e.seq) == b.states_at(e.seq) for e in split.events[::5])
    assert lifecycle_intervals(loaded) == lifecycle_intervals(split)
    assert routing_at(loaded, None) == routing_at(split, None)
    assert memory_series(loaded) == memory_series(split)
    for seq in (None, split.graphs[1].seq):
        assert render_graph(loaded, seq).source == render_graph(split, seq).source
        assert render_torchviz_view(loaded, seq).source == render_torchviz_view(split, seq).source


@pytest.mark.parametrize("mode", ["nonreentrant", "split-nonreentrant", "pipeline"])
def test_other_modes_render(mode: str) -> None:
    model = "pipeline" if mode == "pipeline" else "mlp"
    trace = run_scenario(build_builtin(model), mode, memory=True, graphs=True)
    assert set(lifecycle(trace).states_at(None).values()) == {"released"}
    for snapshot in trace.graphs:
        assert "<svg" in dot_svg(render_graph(trace, snapshot.seq).source)
    render_memory({mode: trace}).to_dict()
    render_lifecycles(trace).to_dict()
    assert "<svg" in dot_svg(render_routing(trace, None).source)
    if mode == "pipeline":
        lanes = {r["lane"] for r in lifecycle_intervals(trace)}
        assert any("stage 1 · mb 1" in lane for lane in lanes)
        assert routing_at(trace, None).stage == 0


def test_a_recorded_twelve_block_model_collapses_to_one_block() -> None:
    torch.manual_seed(0)
    model = Stack([MLPBlock(8, 16) for _ in range(12)], 8)
    spec = ModelSpec("mlp12", model, (torch.randn(4, 8),), checkpoint=tuple(f"blocks.{i}" for i in range(12)))
    trace = run_scenario(spec, "split-reentrant", graphs=True)
    seq = trace.graphs[1].seq  # before DW: every replay retained
    full = render_graph(trace, seq, collapse=False).source
    collapsed = render_graph(trace, seq).source
    assert len(trace.graphs[1].nodes) > 100
    assert full.count("subgraph cluster_h") == 12
    # NOTE [ Collapsing repeated blocks ], rule 3: the first region stays drawn in full, the other 11 are one node
    first = min(trace.handle_ids())
    assert re.findall(r"subgraph (cluster_h\d+)", collapsed) == [f"cluster_h{first}"]
    assert "Block x11" in collapsed
    assert collapsed.count(" [label=") < 2 * full.count(" [label=") // 12
    assert "<svg" in dot_svg(collapsed)
