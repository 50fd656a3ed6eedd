"""`record(memory=True)`'s allocation probe reads what the dispatch tracker reads, category by category.

Each run records as `record(memory=True)` comes (an `AllocationProbe` on torch's memory-only
profiler) while the dispatch tracker (`MemoryProbe`, the oracle) samples the same events and
sampling points beside it; the reading right after every event must be the tracker's exactly
(bytes by category and by stage), every tracker sample must be among the recording's in the same
order (the recording adds only high-water marks), and both must add up to the independent ground
truth of test_probe_memory.
"""
from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
import torch
from test_probe_memory import MODES, GroundTruth, reading_at

import ckpt_viz
from ckpt_viz import bus
from ckpt_viz.probe import points
from ckpt_viz.probe.allocations import AllocationProbe, open_probe
from ckpt_viz.probe.memory import MemoryProbe
from ckpt_viz.recording import Recording
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import BUILTIN_MODELS, build_builtin
from ckpt_viz.trace import MemorySample

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="sizes are storage bytes on CPU only")


def _side_by_side(model_name: str, mode: str, monkeypatch: pytest.MonkeyPatch,
                  **options: Any) -> tuple[Any, list[Any], dict[int, int]]:
    """(the recorded trace, the tracker's samples of the same run, the ground truth's live bytes at each event)."""
    spec = build_builtin(model_name)
    inputs = [t for t in (*spec.inputs, *spec.kwargs.values(), spec.targets) if isinstance(t, torch.Tensor)]
    existing = [*spec.model.parameters(), *spec.model.buffers(), *inputs]
    truth = GroundTruth(existing)
    oracle = MemoryProbe(params=list(spec.model.parameters()), tensors=inputs, buffers=list(spec.model.buffers()))
    original, opened = Recording.assign_stage, Recording._open_memory

    def assign_stage(self: Recording, tensors: Any, stage: Any) -> None:
        original(self, tensors, stage)
        oracle.assign_stage(tensors, stage)

    def open_memory(self: Recording) -> None:  # the oracle counts what the recording is given, as it does
        opened(self)
        for tensor in points.tensors_in(self._tensors):
            oracle.hold(None, tensor, "inputs")

    monkeypatch.setattr(Recording, "assign_stage", assign_stage)
    monkeypatch.setattr(Recording, "_open_memory", open_memory)
    kept: list[Any] = []
    per_event: dict[int, int] = {}
    sampling = points.Sampling(oracle, lambda *reading: kept.append(_sample(*reading)), {})

    def after(event: Any) -> None:
        per_event[event.seq] = truth.total()
        sampling.on_event(event)

    with truth:
        oracle.__enter__()
        detach = points.attach(sampling)
        channel = bus.open_channel(after)
        try:
            trace = run_scenario(spec, mode, memory=True, **options)
        finally:
            channel.close()
            detach()
            oracle.__exit__(None, None, None)
    return trace, kept, per_event


def _sample(seq: int, t_ns: int, totals: dict, device: Any, by_stage: dict) -> MemorySample:
    return MemorySample(seq=seq, t_ns=t_ns, bytes_by_category=totals, device_allocated=device, by_stage=by_stage)


class _Samples:
    def __init__(self, samples: list[Any]) -> None:
        self.memory = samples


def _assert_same(trace: Any, oracle: list[Any], truth: dict[int, int], label: str) -> None:
    recorded = list(trace.memory)
    assert recorded and oracle
    for event in trace.events:
        want, got = reading_at(_Samples(oracle), event.seq), reading_at(trace, event.seq)
        assert got.bytes_by_category == want.bytes_by_category, (label, event.seq, event.kind)
        assert got.by_stage == want.by_stage, (label, event.seq, event.kind)
        assert sum(got.bytes_by_category.values()) == pytest.approx(truth[event.seq], rel=0.01), (label, event.seq)
    # every tracker sample is one of the recording's, in order: the recording adds only high-water marks
    found = iter([(s.seq, s.bytes_by_category, s.by_stage) for s in recorded])
    missing = [s.seq for s in oracle if (s.seq, s.bytes_by_category, s.by_stage) not in found]
    assert not missing, (label, missing[:5])
    highest = max(sum(s.bytes_by_category.values()) for s in recorded)
    assert highest >= max(sum(s.bytes_by_category.values()) for s in oracle), label


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_name", sorted(set(BUILTIN_MODELS) - {"pipeline"}))
def test_allocation_probe_reads_what_the_tracker_reads(model_name: str, mode: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    trace, oracle, truth = _side_by_side(model_name, mode, monkeypatch)
    _assert_same(trace, oracle, truth, f"{model_name}/{mode}")


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B", "ZB-H1"])
def test_allocation_probe_reads_what_the_tracker_reads_in_pipelines(schedule: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    trace, oracle, truth = _side_by_side("pipeline", "pipeline", monkeypatch, schedule=schedule, microbatches=4)
    _assert_same(trace, oracle, truth, schedule)


def test_draining_often_changes_no_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    import ckpt_viz.probe.allocations as allocations

    monkeypatch.setattr(allocations, "DRAIN_EVERY", 5)  # many drains, each cutting the log between two events
    for model_name, mode in (("mlp", "split-nonreentrant"), ("excluded", "reentrant")):
        trace, oracle, truth = _side_by_side(model_name, mode, monkeypatch)
        _assert_same(trace, oracle, truth, f"{model_name}/{mode}, drained every 5 marks")


def test_nested_recordings_each_read_the_stream_and_another_threads_probe_is_the_tracker() -> None:
    w = torch.nn.Parameter(torch.randn(3))
    first = open_probe(params=[w])
    first.__enter__()
    second = open_probe(params=[w])  # nested on this thread: a second reader of the same stream
    second.__enter__()
    elsewhere: list[Any] = []
    worker = threading.Thread(target=lambda: elsewhere.append(open_probe(params=[w])))
    worker.start()
    worker.join()
    try:
        assert isinstance(first, AllocationProbe) and isinstance(second, AllocationProbe)
        assert isinstance(elsewhere[0], MemoryProbe)  # the stream's readers are all on one thread
        first.mark(0, 0)
        kept = torch.ones(256)  # 1 KiB "other", seen by both
        second.mark(1, 0)
        first.mark(1, 0)
    finally:
        first.__exit__(None, None, None)  # closed out of order
        second.__exit__(None, None, None)
    readings = [[s.bytes_by_category["other"] for s in probe.finish()] for probe in (first, second)]
    assert readings[0][-1] - readings[0][0] == kept.nbytes and readings[1][-1] == kept.nbytes
    third = open_probe(params=[w])  # every reader handed back on close
    third.__enter__()
    third.__exit__(None, None, None)
    assert isinstance(third, AllocationProbe)


def test_a_closed_allocation_probe_is_freed() -> None:
    import weakref

    probe = open_probe(params=[torch.nn.Parameter(torch.randn(3))])
    probe.__enter__()
    probe.mark(0, 0)
    probe.__exit__(None, None, None)
    ref = weakref.ref(probe)
    del probe
    gc.collect()
    assert ref() is None


def test_the_users_torch_profiler_runs_while_memory_is_recorded() -> None:
    """A profiler already running takes torch's profiler: the recording reads with the tracker, the same memory at
    every event, and the user's profile still sees the ops and their memory."""
    alone = run_scenario(build_builtin("mlp"), "reentrant", memory=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        with ckpt_viz.record(memory=True) as rec:
            assert isinstance(rec._probe, MemoryProbe)
        profiled = run_scenario(build_builtin("mlp"), "reentrant", memory=True)
    names = {event.key for event in prof.key_averages()}
    assert "aten::addmm" in names or "aten::mm" in names  # the user's profile saw the ops
    assert any(event.cpu_memory_usage for event in prof.key_averages())  # and their memory
    assert [e.seq for e in profiled.events] == [e.seq for e in alone.events]
    for event in alone.events:
        assert reading_at(profiled, event.seq).bytes_by_category == reading_at(alone, event.seq).bytes_by_category


def test_no_profiler_records_with_the_tracker_and_says_so() -> None:
    """The app's warm sandbox forks every run from one process, which must not hold torch's profiler thread
    (probe/stream.py NOTE rule 8): recordings inside `no_profiler()` read with the dispatch tracker."""
    from ckpt_viz.probe.stream import no_profiler

    with no_profiler():
        inside = run_scenario(build_builtin("mlp"), "reentrant", memory=True)
    outside = run_scenario(build_builtin("mlp"), "reentrant", memory=True)
    assert inside.meta["memory_probe"] == "dispatch" and outside.meta["memory_probe"] == "allocator"
    for event in outside.events:
        assert reading_at(inside, event.seq).bytes_by_category == reading_at(outside, event.seq).bytes_by_category
