"""The allocation-stream probe reads what the dispatch tracker reads, at every event, category by category.

Each run records with the tracker (the oracle) while an `AllocationProbe` on one of
its two sources (the native allocation log, `record(memory=True)`'s, and torch's
memory-only profiler) marks the same events through a channel around the recording;
every event's reading must be the tracker's exactly (bytes by category and by
stage), and both must add up to the independent ground truth of test_probe_memory.
"""
from __future__ import annotations

import bisect
import gc
from typing import Any

import pytest
import torch
from test_probe_memory import MODES, GroundTruth

from ckpt_viz import bus
from ckpt_viz.probe.allocations import AllocationProbe, open_probe
from ckpt_viz.probe.memory import MemoryProbe
from ckpt_viz.probe.native import NativeStream
from ckpt_viz.probe.stream import AllocationStream
from ckpt_viz.recording import Recording
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import BUILTIN_MODELS, build_builtin

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the allocation stream is CPU-only")
SOURCES = {"native": NativeStream, "profiler": AllocationStream}


def _at(samples: list[Any], seq: int) -> Any:
    seqs = [s.seq for s in samples]
    index = bisect.bisect_right(seqs, seq) - 1
    return samples[index] if index >= 0 else None


def _side_by_side(model_name: str, mode: str, monkeypatch: pytest.MonkeyPatch, source: str = "native",
                  **options: Any) -> tuple[Any, list[Any], dict[int, int]]:
    spec = build_builtin(model_name)
    inputs = [t for t in spec.inputs if isinstance(t, torch.Tensor)]
    existing = [*spec.model.parameters(), *spec.model.buffers(), *inputs]
    truth = GroundTruth(existing)
    import ckpt_viz.probe.allocations as allocations

    stream = SOURCES[source].acquire()
    assert stream is not None
    monkeypatch.setattr(allocations, "open_probe", MemoryProbe)  # the recording's probe is the oracle
    fast = AllocationProbe(stream, params=list(spec.model.parameters()),
                           tensors=[*spec.model.buffers(), *inputs])
    original = Recording.assign_stage

    def assign_stage(self: Recording, tensors: Any, stage: Any) -> None:
        original(self, tensors, stage)
        fast.assign_stage(tensors, stage)

    monkeypatch.setattr(Recording, "assign_stage", assign_stage)
    per_event: dict[int, int] = {}

    def after(row: Any) -> None:
        per_event[row[0]] = truth.total()
        fast.mark(row[0], row[1][0])

    with truth:
        fast.__enter__()
        channel = bus.open_channel(rows=lambda row: None, after=after)
        try:
            trace = run_scenario(spec, mode, memory=True, **options)
        finally:
            channel.close()
            fast.__exit__(None, None, None)
    return trace, fast.finish(), per_event


def _assert_same(trace: Any, samples: list[Any], truth: dict[int, int], label: str) -> None:
    assert trace.memory and samples
    for event in trace.events:
        want, got = _at(trace.memory, event.seq), _at(samples, event.seq)
        assert got is not None, (label, event.seq)
        assert got.bytes_by_category == want.bytes_by_category, (label, event.seq, event.kind)
        assert got.by_stage == want.by_stage, (label, event.seq, event.kind)
        assert sum(got.bytes_by_category.values()) == pytest.approx(truth[event.seq], rel=0.01), (label, event.seq)


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_name", sorted(set(BUILTIN_MODELS) - {"pipeline"}))
def test_allocation_probe_reads_what_the_tracker_reads(model_name: str, mode: str, source: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    trace, samples, truth = _side_by_side(model_name, mode, monkeypatch, source)
    _assert_same(trace, samples, truth, f"{model_name}/{mode}/{source}")


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B", "ZB-H1"])
def test_allocation_probe_reads_what_the_tracker_reads_in_pipelines(schedule: str, source: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    trace, samples, truth = _side_by_side("pipeline", "pipeline", monkeypatch, source, schedule=schedule,
                                          microbatches=4)
    _assert_same(trace, samples, truth, f"{schedule}/{source}")


def test_nested_probes_on_one_thread_read_the_log_and_another_threads_probe_is_the_tracker() -> None:
    import threading

    w = torch.nn.Parameter(torch.randn(3))
    assert isinstance(open_probe(), MemoryProbe)  # no parameters given: the tracker finds them
    first = open_probe(params=[w])
    first.__enter__()
    second = open_probe(params=[w])  # nested on this thread: a second reader of the same log
    second.__enter__()
    elsewhere: list[Any] = []
    worker = threading.Thread(target=lambda: elsewhere.append(open_probe(params=[w])))
    worker.start()
    worker.join()
    try:
        assert isinstance(first, AllocationProbe) and isinstance(second, AllocationProbe)
        assert isinstance(elsewhere[0], MemoryProbe)  # the log's readers are all on one thread
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


def test_a_closed_allocation_probe_is_freed_and_restores_get_rng_state() -> None:
    import weakref

    before = torch.get_rng_state
    probe = open_probe(params=[torch.nn.Parameter(torch.randn(3))])
    probe.__enter__()
    assert torch.get_rng_state is not before
    probe.mark(0, 0)
    probe.__exit__(None, None, None)
    assert torch.get_rng_state is before and torch.random.get_rng_state is before
    ref = weakref.ref(probe)
    del probe
    gc.collect()
    assert ref() is None


def test_draining_often_changes_no_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    import ckpt_viz.probe.allocations as allocations

    monkeypatch.setattr(allocations, "DRAIN_EVERY", 5)  # many drains, each cutting the log between two events
    for source in sorted(SOURCES):
        for model_name, mode in (("mlp", "split-nonreentrant"), ("excluded", "reentrant")):
            trace, samples, truth = _side_by_side(model_name, mode, monkeypatch, source)
            _assert_same(trace, samples, truth, f"{model_name}/{mode}/{source}, drained every 5 events")
