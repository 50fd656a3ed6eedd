"""`with ckpt_viz.record(memory=True, graphs=True) as rec:` around a user's own training step."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import ckpt_viz
from ckpt_viz.runtime import checkpoint
from ckpt_viz.trace import MemorySample
from traces import kinds


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
    with ckpt_viz.record(memory=True, graphs=True) as rec:  # no model given: found as the top module runs
        for _ in range(2):
            opt.zero_grad()
            loss = net(x).pow(2).sum()
            loss.backward()
            opt.step()
    trace = rec.trace
    assert trace.count("handle_created") == 6 and trace.count("replay_started") == 6
    samples = list(trace.memory)
    assert samples and {s.seq for s in samples} <= {e.seq for e in trace.events}
    assert all(a.seq <= b.seq and a.t_ns <= b.t_ns for a, b in itertools.pairwise(samples))  # in time order
    assert_only_steps(samples)
    assert max(s.bytes_by_category["parameters"] for s in trace.memory) == sum(
        p.numel() * p.element_size() for p in net.parameters())
    assert any(s.bytes_by_category["gradients"] > 0 for s in trace.memory)
    assert [g.label for g in trace.graphs] == ["before autograd.backward #1", "before autograd.backward #2"]
    assert {n.handle_id for n in trace.graphs[0].nodes if n.handle_id is not None} == {
        e.handle_id for e in trace.of_kind("handle_created")[:3]}
    sites = {e.site for e in trace.of_kind("handle_created")}
    assert all(s and s.startswith("tests/recording/test_recording.py:") for s in sites), sites
    path = tmp_path / "mine.json.gz"
    trace.save(path)
    back = ckpt_viz.Trace.load(path)
    assert kinds(back) == kinds(trace) and len(back.memory) == len(trace.memory) and len(back.graphs) == 2
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
    assert rec.trace.of_kind("error")[-1].where == "record"
    assert not hasattr(torch.autograd.backward, "__wrapped__")
    from ckpt_viz.runtime import memtags

    assert memtags.enabled is False


# ------------------------------------------------------------------ the events and samples a recording keeps

def _step(net: Net, x: torch.Tensor) -> None:
    net(x).sum().backward()


def test_a_recording_keeps_what_a_listener_got() -> None:
    from ckpt_viz import bus
    from ckpt_viz.events import EventBase, MemorySampled

    torch.manual_seed(0)
    net, x = Net(), torch.randn(2, 8)
    seen: list[EventBase] = []
    unsubscribe = bus.subscribe(seen.append)  # a global listener, numbered from 0 like the recording
    try:
        with ckpt_viz.record() as rec:
            _step(net, x)
            last = bus.emit(MemorySampled, capture_site=False, at="here")
    finally:
        unsubscribe()
    events = rec.trace.events
    assert len(events) == len(seen) > 10 and rec.trace.meta["sources"]  # the close read the sites
    assert isinstance(last, MemorySampled) and last is events[-1] and last.seq == len(seen) - 1
    assert events == seen  # equal field by field (each listener gets an event of its own numbering)
    assert kinds(rec.trace) == [e.kind for e in seen] and isinstance(events, list)


def test_reads_and_writes_inside_the_block_keep_the_order_of_a_growing_list() -> None:
    torch.manual_seed(0)
    net, x = Net(), torch.randn(2, 8)
    with ckpt_viz.record() as rec:
        net(x)
        created = len(rec.trace.events)
        first = rec.trace.events[-1]  # a read in the block sees what arrived so far
        rec.trace.events.append(first)  # a write acts on the list; later events come after it
        net(x).sum().backward()
    events = list(rec.trace.events)
    assert events[created] is first and events[created - 1] is first
    rest = [e.seq for e in events[created + 1:]]
    assert rest == list(range(created, created + len(rest))) and len(rest) > 0


def test_threads_handed_one_recording_number_its_events_in_order() -> None:
    import threading

    from ckpt_viz import bus
    from ckpt_viz.events import MemorySampled

    with ckpt_viz.record() as rec:
        def work(name: str) -> None:
            with rec.attach():
                for i in range(300):
                    bus.emit(MemorySampled, capture_site=False, at=f"{name}{i}")
        threads = [threading.Thread(target=work, args=(n,)) for n in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    events = rec.trace.events
    assert [e.seq for e in events] == list(range(600))
    for name in "ab":  # each thread's own events stay in its order
        assert [e.at for e in events if e.at[0] == name] == [f"{name}{i}" for i in range(300)]


def assert_only_steps(samples: list[MemorySample]) -> None:
    """Only the steps are stored: an event's reading equal to the last one is kept only where later samples share
    its seq (sampling points, high-water marks), so that the first sample of a seq is the reading after it."""
    for i, (a, b) in enumerate(itertools.pairwise(samples)):
        if (a.bytes_by_category, a.by_stage) == (b.bytes_by_category, b.by_stage):
            assert a.seq < b.seq and i + 2 < len(samples) and samples[i + 2].seq == b.seq


@pytest.mark.parametrize("probe", ["allocation-stream", "dispatch-tracker"])
def test_memory_is_kept_as_samples_of_its_steps_and_saves_what_it_reads(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        probe: str) -> None:
    if probe == "dispatch-tracker":  # torch's profiler taken: the fallback (probe/stream.py NOTE rule 1)
        from ckpt_viz.probe.stream import AllocationStream

        monkeypatch.setattr(AllocationStream, "acquire", staticmethod(lambda on_batch: None))
    torch.manual_seed(0)
    net = Net()
    with ckpt_viz.record(memory=True, model=net) as rec:
        net(torch.randn(4, 8)).sum().backward()
    assert rec._probe is None  # handed back on close
    samples = rec.trace.memory
    assert isinstance(samples, list) and len(samples) > 3 and all(isinstance(s, MemorySample) for s in samples)
    assert_only_steps(samples)
    assert samples[0].bytes_by_category["parameters"] == sum(p.numel() * p.element_size() for p in net.parameters())
    assert [s.seq for s in samples] == sorted(s.seq for s in samples) and samples[-1].seq <= rec.trace.events[-1].seq
    rec.trace.save(tmp_path / "t.json.gz")
    back = ckpt_viz.Trace.load(tmp_path / "t.json.gz")
    assert back.memory == samples and back.events == rec.trace.events
