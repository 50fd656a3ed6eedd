"""Graph snapshots: plain data, named leaves, checkpoint nodes with handle ids, triggers, DX/DW reach, no replays."""
from __future__ import annotations

import json

import msgspec
import torch

import ckpt_viz
from ckpt_viz.probe.graph import capture_graph
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    recompute_handle_collector_ctx,
    reentrant_checkpoint_scope,
)
from ckpt_viz.trace import GraphNode


def _stage() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4)), \
        torch.randn(2, 4, requires_grad=True)


def test_reentrant_split_snapshot_names_leaves_handles_and_triggers() -> None:
    model, x = _stage()
    names = {id(p): n for n, p in model.named_parameters()}
    params = list(model.parameters())
    with reentrant_checkpoint_scope(params) as handles:
        # Handle 0 takes its parameters explicitly; handle 1 (Tanh) has none.
        h = checkpoint(torch.nn.functional.linear, x, model[0].weight, model[0].bias, use_reentrant=True)
        y = model[2](checkpoint(model[1], h, use_reentrant=True))
    snap = capture_graph(y, label="after forward", seq=3, names=names)
    json.loads(msgspec.json.encode({"nodes": snap.nodes, "edges": snap.edges}))  # plain data
    assert all(isinstance(n, GraphNode) for n in snap.nodes) and all(len(e) == 2 for e in snap.edges)
    kinds = {n.kind for n in snap.nodes}
    assert {"checkpoint", "trigger", "leaf", "input", "backward"} <= kinds
    ckpts = sorted(n.handle_id for n in snap.nodes if n.kind == "checkpoint")
    assert ckpts == sorted(hd.handle_id for hd in handles)
    triggers = sorted(n.handle_id for n in snap.nodes if n.kind == "trigger")
    assert triggers == ckpts
    leaves = {n.name for n in snap.nodes if n.kind == "leaf"}
    assert leaves == {"0.weight", "0.bias", "2.weight", "2.bias"}  # 0.* are explicit inputs of handle 0
    by_id = {n.id: n for n in snap.nodes}
    # DX reaches the checkpoint nodes (they lead to x); DW reaches every parameter and trigger.
    assert all(n.dx_reached for n in snap.nodes if n.kind == "checkpoint")
    assert all(n.dw_reached for n in snap.nodes if n.kind in ("leaf", "trigger"))
    assert not any(n.dx_reached for n in snap.nodes if n.kind in ("leaf", "trigger"))
    assert all(by_id[dst] for _, dst in snap.edges)


def test_snapshot_after_dx_shows_the_retained_replay_inside_its_handle() -> None:
    model, x = _stage()
    params = list(model.parameters())
    with reentrant_checkpoint_scope(params) as handles:
        y = checkpoint(model, x, use_reentrant=True)
    backward_input(y.sum(), None, [x], handles=handles)
    snap = capture_graph(y, label="after DX")
    replay = [n for n in snap.nodes if n.replay]
    assert replay and all(n.handle_id == handles[0].handle_id for n in replay)
    assert not any(n.dx_reached or n.dw_reached for n in replay)
    backward_weight(y.sum(), None, params, handles=handles)
    assert not any(n.replay for n in capture_graph(y, label="after DW").nodes)


def test_nonreentrant_nodes_carry_their_frame_and_snapshots_never_replay() -> None:
    model, x = _stage()
    with ckpt_viz.record() as rec:  # nodes are marked while recording
        with recompute_handle_collector_ctx() as frames:
            y = checkpoint(model, x, use_reentrant=False)
        for _ in range(3):
            snap = capture_graph(y, label="again")
    assert rec.trace.count("replay_started") == 0
    assert rec.trace.count("tensor_unpacked") == 0
    inside = [n for n in snap.nodes if n.handle_id == frames[0].handle_id]
    assert {n.name for n in inside} >= {"AddmmBackward0", "TanhBackward0"}


def test_torchviz_style_saved_read_would_replay_but_ours_does_not() -> None:
    """The contrast: reading a node's `_saved_*` attribute on a checkpointed graph recomputes the region."""
    model, x = _stage()
    with ckpt_viz.record() as rec:
        y = checkpoint(model, x, use_reentrant=False)
        capture_graph(y, label="ours")
        assert rec.trace.count("replay_started") == 0
        node = y.grad_fn
        while node is not None and not any(a.startswith("_saved_") for a in dir(node)):
            node = node.next_functions[0][0]
        saved = [a for a in dir(node) if a.startswith("_saved_") and "raw" not in a]
        for attr in saved:
            getattr(node, attr)
    assert rec.trace.count("replay_started") >= 1


def test_record_graphs_snapshots_every_top_level_backward_with_zero_extra_replays() -> None:
    for mode in ("reentrant", "split-reentrant", "split-nonreentrant", "nonreentrant"):
        spec = build_builtin("mlp")
        with_graphs = run_scenario(spec, mode, graphs=True)
        spec = build_builtin("mlp")
        without = run_scenario(spec, mode)
        assert with_graphs.count("replay_started") == without.count("replay_started"), mode
        labels = [g.label for g in with_graphs.graphs]
        expected = 1 if mode in ("reentrant", "nonreentrant") else 2
        assert len(labels) == expected, (mode, labels)
        first = with_graphs.graphs[0]
        assert any(n.kind == "leaf" and n.name == "head.weight" for n in first.nodes)


def test_a_reentrant_replay_shows_its_excluded_region() -> None:
    """In a reentrant replay the excluded LayerNorm sits behind one bridge node; the snapshot before DW draws the
    bridge and the region's own graph (kept from the forward) with `exclude` set, and nothing else of the replay."""
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    trace = obtain_trace(RunRequest("builtin", "excluded", mode="split-reentrant"))
    before_dw = trace.graphs[-1]
    excluded = [n for n in before_dw.nodes if n.exclude is not None]
    handles = [n.handle_id for n in before_dw.nodes if n.kind == "checkpoint"]  # blocks 2, 1, 0
    assert len(handles) == 3  # the bridge is not a second checkpoint node
    # Handle ids count on from earlier recordings in the process; region k is block k's LayerNorm.
    assert sorted({(n.handle_id, n.exclude) for n in excluded}) == [(h, 2 - i) for i, h in
                                                                          reversed(list(enumerate(handles)))]
    names = sorted(n.name for n in excluded if n.exclude == 0)
    assert names == ["NativeLayerNormBackward0", "_ExcludeBridgeBackward", "blocks.0.norm.module.bias",
                     "blocks.0.norm.module.weight", "input"]
