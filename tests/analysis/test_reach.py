"""`analysis.routing.reach_after`: the graph colours only the DX / DW reach that happened (issue 28, item 6).

The mistakes corpus (tests/data/mistakes, recorded with graphs=True) holds runs whose DW skipped handles; the
finding's handles must be the ones whose nodes lose DW, and the drawn edges into their triggers stay grey. Clean
runs of the built-in models keep every flag the snapshot has, at every cursor, and draw the same edges.
"""
from __future__ import annotations

import os
import re

import pytest

from ckpt_viz import Trace
from ckpt_viz.analysis.diagnosis import diagnose
from ckpt_viz.analysis.routing import reach_after, snapshot_before
from ckpt_viz.render.graph import EDGE_COLOURS, render_graph
from ckpt_viz.trace import GraphSnapshot

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "mistakes")
_EDGE = re.compile(r'^\s*(n\d+) -> (n\d+) \[color="([^"]+)"', re.M)


def _load(name: str) -> Trace:
    return Trace.load(os.path.join(CORPUS, f"{name}.json.gz"))


def _edge_colours(trace: Trace, seq: int | None) -> dict[tuple[int, int], str]:
    """(source index, destination index) -> colour, as `render_graph` drew them (collapse off)."""
    graph = render_graph(trace, seq, collapse=False)
    assert graph is not None
    return {(int(s[1:]), int(d[1:])): c for s, d, c in _EDGE.findall(graph.source)}


def _flag_colours(snapshot: GraphSnapshot) -> dict[tuple[int, int], str]:
    """The colours the snapshot's own flags give each edge (what the graph drew before reach_after)."""
    index = {n.id: i for i, n in enumerate(snapshot.nodes)}
    colours = {}
    for s, d in snapshot.edges:
        a, b = snapshot.nodes[index[s]], snapshot.nodes[index[d]]
        dx, dw = a.dx_reached and b.dx_reached, a.dw_reached and b.dw_reached
        colours[index[s], index[d]] = EDGE_COLOURS["both" if dx and dw else "dx" if dx else "dw" if dw else "none"]
    return colours


def _trigger_edges(snapshot: GraphSnapshot, handles: set[int]) -> list[tuple[int, int]]:
    index = {n.id: i for i, n in enumerate(snapshot.nodes)}
    return [(index[s], index[d]) for s, d in snapshot.edges
            if snapshot.nodes[index[d]].kind == "trigger" and snapshot.nodes[index[d]].handle_id in handles]


@pytest.mark.parametrize("name", ["missing-trigger", "forgotten-handles"])
def test_a_skipped_dw_is_not_coloured(name: str) -> None:
    trace = _load(name)
    findings = diagnose(trace)
    blamed = {f.handle_id for f in findings}
    skipped = {int(h) for f in findings for h in re.findall(r"\bh(\d+)\b", f.summary)}
    assert skipped == {0, 1, 2} and blamed <= skipped  # the findings name every handle of the step in words
    before_dx, before_dw = trace.graphs
    end = trace.events[-1].seq
    assert snapshot_before(trace, end) is before_dw

    reach = reach_after(trace, before_dw)
    assert set(reach.missed_dw) == skipped and blamed <= set(reach.missed_dw) and reach.missed_dx == ()
    for node in before_dw.nodes:
        if node.handle_id in skipped and not node.replay:  # its checkpoint node and its trigger
            assert node.dw_reached and node.id not in reach.dw, node
            assert (node.id in reach.dx) == node.dx_reached  # its DX ran: kept
        elif node.handle_id is None:  # loss, inputs: the snapshot's flags
            assert (node.id in reach.dx, node.id in reach.dw) == (node.dx_reached, node.dw_reached), node

    # drawn: no edge into a skipped handle's trigger is DW-coloured; the snapshot's flags alone made them orange
    drawn, flags = _edge_colours(trace, end), _flag_colours(before_dw)
    into = _trigger_edges(before_dw, skipped)
    assert len(into) == 3
    assert {flags[e] for e in into} == {EDGE_COLOURS["dw"]}
    assert {drawn[e] for e in into} == {EDGE_COLOURS["none"]}
    touching = [e for e in drawn if {before_dw.nodes[e[0]].handle_id, before_dw.nodes[e[1]].handle_id} & skipped]
    assert touching and not {drawn[e] for e in touching} & {EDGE_COLOURS["dw"], EDGE_COLOURS["both"]}

    # before the DW call ended nothing is judged (the cursor before it shows the DX snapshot, unchanged)
    assert reach_after(trace, before_dw, before_dw.seq - 1).missed_dw == ()
    first = reach_after(trace, before_dx, end)
    assert first.missed_dx == first.missed_dw == ()
    assert _edge_colours(trace, before_dw.seq - 1) == _flag_colours(before_dx)


def test_a_second_backward_reaches_no_released_handle() -> None:
    trace = _load("second-backward")
    (finding,) = diagnose(trace)
    first, second = trace.graphs
    assert reach_after(trace, first).missed_dx == ()
    reach = reach_after(trace, second)
    assert finding.handle_id in reach.missed_dx and set(reach.missed_dx) == {0, 1, 2}
    assert not [n for n in second.nodes if n.kind == "checkpoint" and n.id in reach.dx]
    drawn = _edge_colours(trace, None)
    loss_to_h2 = [(s, d) for s, d in drawn if second.nodes[d].kind == "checkpoint" and second.nodes[d].handle_id == 2]
    assert len(loss_to_h2) == 1 and drawn[loss_to_h2[0]] == EDGE_COLOURS["none"]
    assert _flag_colours(second)[loss_to_h2[0]] == EDGE_COLOURS["dx"]  # the snapshot alone said DX reached it


def _clean_runs() -> list[tuple[str, str, dict]]:
    single = [("mlp", mode, {}) for mode in ("reentrant", "nonreentrant", "split-reentrant", "split-nonreentrant")]
    return [*single, ("excluded", "split-reentrant", {}), ("pipeline", "pipeline", {"schedule": "ZB-H1"}),
            ("pipeline", "pipeline", {"schedule": "1F1B"})]


@pytest.mark.parametrize(("model", "mode", "options"), _clean_runs())
def test_a_clean_run_keeps_every_flag(model: str, mode: str, options: dict) -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    trace = run_scenario(build_builtin(model), mode, graphs=True, **options)
    assert trace.graphs and not diagnose(trace)
    seqs = [e.seq for e in trace.events]
    for snapshot in trace.graphs:
        flags = (frozenset(n.id for n in snapshot.nodes if n.dx_reached),
                 frozenset(n.id for n in snapshot.nodes if n.dw_reached))
        for cursor in (None, snapshot.seq, *seqs[::7]):
            reach = reach_after(trace, snapshot, cursor)
            assert (reach.dx, reach.dw) == flags and reach.missed_dx == reach.missed_dw == (), (snapshot.label, cursor)
    if mode == "split-reentrant":  # the edges drawn are those of the snapshot's flags, DX and DW alike
        for snapshot in trace.graphs:
            assert _edge_colours(trace, snapshot.seq) == _flag_colours(snapshot)
        assert set(_edge_colours(trace, None).values()) >= {EDGE_COLOURS["dw"], EDGE_COLOURS["both"]}
