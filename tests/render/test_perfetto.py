"""Perfetto export: proper nesting on every track, flows from a release to a refused replay, memory counters."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import torch

import ckpt_viz
from ckpt_viz.render.perfetto import render_perfetto
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin
from ckpt_viz.runtime import checkpoint


def nesting_errors(doc: dict[str, Any]) -> list[str]:
    """Slices on one (pid, tid) track must nest: none may start inside another and end after it."""
    tracks: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    errors = []
    for track, slices in tracks.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1] + 1e-6:
                errors.append(f"{track}: {name} overlaps {stack[-1][2]}")
            stack.append((start, end, name))
    return errors


@pytest.mark.parametrize("mode", ["reentrant", "nonreentrant", "split-reentrant", "split-nonreentrant", "pipeline"])
def test_every_mode_exports_properly_nested_tracks(mode: str) -> None:
    model = "pipeline" if mode == "pipeline" else "excluded"
    trace = run_scenario(build_builtin(model), mode, memory=True, schedule="ZB-H1", microbatches=4)
    doc = render_perfetto(trace)
    assert nesting_errors(doc) == []
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sum(e["name"].startswith("replay") for e in slices) == trace.count("replay_started")
    assert all(isinstance(e["pid"], int) and isinstance(e["tid"], int) for e in doc["traceEvents"])
    counters = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C"}
    assert "memory: checkpoint_inputs" in counters
    if mode == "pipeline":
        stages = {e["pid"] for e in slices}
        assert stages == {0, 1}  # one process per stage


def test_flow_links_a_release_to_the_refused_replay() -> None:
    lin = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    with ckpt_viz.record() as rec:
        loss = checkpoint(lin, x, use_reentrant=True).sum()
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="Cannot replay a released reentrant checkpoint"):
            loss.backward()
    doc = render_perfetto(rec.trace)
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    finishes = [e for e in doc["traceEvents"] if e["ph"] == "f"]
    released = rec.trace.of_kind("released")[0]
    assert [s["id"] for s in starts] == [released.seq]
    assert [f["id"] for f in finishes] == [released.seq]
    assert finishes[0]["ts"] > starts[0]["ts"]
    assert nesting_errors(doc) == []


def test_checker_catches_a_bad_nesting() -> None:
    doc = {"traceEvents": [{"ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": 10, "name": "a"},
                           {"ph": "X", "pid": 0, "tid": 1, "ts": 5, "dur": 10, "name": "b"}]}
    assert nesting_errors(doc) == ["(0, 1): b overlaps a"]


def test_a_merged_run_keeps_each_ranks_memory_counters_apart() -> None:
    """Per-rank counters in the rank's process, never one track zig-zagging between the ranks' readings."""
    import os

    from ckpt_viz.analysis.memory import rank_memory
    from ckpt_viz.cli.merge import merge_run

    merged, _ = merge_run(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                                       "distributed"))
    doc = render_perfetto(merged)
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {0, 1}  # the ranks' processes; no pooled "memory" process
    assert not any(e["ph"] == "M" and e["args"].get("name") == "memory" for e in doc["traceEvents"])
    for rank, facts in rank_memory(merged).items():
        for category in facts.categories:
            values = [e["args"]["bytes"] for e in counters if e["pid"] == rank and e["name"] == f"memory: {category}"]
            assert values == list(facts.by_category[category])  # every reading of that rank, in order
    stages = {(e["pid"], e["name"]) for e in counters if e["name"].startswith("memory of stage")}
    assert stages == {(0, "memory of stage 0"), (0, "memory of stage 3"), (1, "memory of stage 1"),
                      (1, "memory of stage 2")}


def test_an_in_process_pipeline_draws_each_stages_memory_in_its_process() -> None:
    trace = run_scenario(build_builtin("pipeline"), "pipeline", memory=True, schedule="1F1B", microbatches=2)
    doc = render_perfetto(trace)
    stage_counters = {(e["pid"], e["name"]) for e in doc["traceEvents"]
                      if e["ph"] == "C" and e["name"].startswith("memory of")}
    assert stage_counters == {(0, "memory of stage 0"), (1, "memory of stage 1")}
