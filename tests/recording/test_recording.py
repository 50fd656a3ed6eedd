"""`with ckpt_viz.record(memory=True, graphs=True) as rec:` around a user's own training step."""
from __future__ import annotations

import itertools
from pathlib import Path

import torch

import ckpt_viz
from ckpt_viz.runtime import checkpoint


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
                                          for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x


def test_user_script_records_events_memory_and_graphs_and_saves(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    with ckpt_viz.record(memory=True, graphs=True) as rec:  # no model given: parameters are found as ops read them
        for _ in range(2):
            opt.zero_grad()
            loss = net(x).pow(2).sum()
            loss.backward()
            opt.step()
    trace = rec.trace
    assert trace.count("handle_created") == 6 and trace.count("replay_started") == 6
    assert 0 < len(trace.memory) <= len(trace.events)
    readings = [(s.bytes_by_category, s.by_stage) for s in trace.memory]
    assert all(a != b for a, b in itertools.pairwise(readings))  # only the steps are stored
    assert max(s.bytes_by_category["parameters"] for s in trace.memory) == sum(
        p.numel() * p.element_size() for p in net.parameters())
    assert any(s.bytes_by_category["gradients"] > 0 for s in trace.memory)
    assert [g.label for g in trace.graphs] == ["before autograd.backward #1", "before autograd.backward #2"]
    assert {n["handle_id"] for n in trace.graphs[0].nodes if n["handle_id"] is not None} == {
        e.handle_id for e in trace.of_kind("handle_created")[:3]}
    sites = {e.site for e in trace.of_kind("handle_created")}
    assert all(s and s.startswith("tests/recording/test_recording.py:") for s in sites), sites
    path = tmp_path / "mine.json.gz"
    trace.save(path)
    back = ckpt_viz.Trace.load(path)
    assert back.kinds() == trace.kinds() and len(back.memory) == len(trace.memory) and len(back.graphs) == 2
    # The patches are gone after the block: autograd is torch's own again.
    assert not hasattr(torch.autograd.backward, "__wrapped__")


def test_record_restores_autograd_and_hooks_after_an_error() -> None:
    net = Net()
    try:
        with ckpt_viz.record(memory=True, graphs=True) as rec:
            net(torch.randn(2, 8)).sum().backward()
            raise KeyError("boom")
    except KeyError:
        pass
    assert rec.trace.of_kind("error")[-1].data["where"] == "record"
    assert not hasattr(torch.autograd.backward, "__wrapped__")
    from ckpt_viz.runtime import memtags

    assert memtags.enabled is False
